"""relattn inside Hugging Face ``transformers`` models (``relattn.huggingface``).

Tiny randomly initialised models built from configs (no download): LLaMA with
grouped-query heads, and T5, whose relative bias reaches the attention function
as ``position_bias``. The logits with ``attn_implementation="relattn"`` equal
those of ``transformers``' own ``sdpa`` and ``eager``, and greedy generation with
a cache gives the same tokens.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("transformers") is None:
    pytest.skip("transformers is not installed", allow_module_level=True)

import relattn.huggingface  # noqa: E402 - after the skips

# transformers itself (1.5 s) is imported by the tests that build a model, not at collection.


@pytest.fixture(scope="module")
def name():
    """relattn registered with transformers (its first call imports the model code: seconds,
    paid by the tests here, not by collection)."""
    return relattn.huggingface.register()


def _llama():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _t5():
    import transformers

    config = transformers.T5Config(
        vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        decoder_start_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


def _with(model, implementation):
    model.set_attn_implementation(implementation)
    return model


@pytest.fixture
def calls(monkeypatch):
    """The number of relattn calls the layers make."""
    made = []
    real = relattn.huggingface.scaled_dot_product_attention

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(relattn.huggingface, "scaled_dot_product_attention", counted)
    return made


@pytest.mark.parametrize("reference", ["sdpa", "eager"])
def test_llama_logits_equal_transformers(reference, calls, name):
    model = _llama()
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded row
    with torch.no_grad():
        want = _with(model, reference)(input_ids=ids, attention_mask=mask).logits
        got = _with(model, name)(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    np.testing.assert_allclose(got[keep].numpy(), want[keep].numpy(), rtol=1e-5, atol=1e-5)
    assert len(calls) == 2  # one per layer


def test_llama_greedy_generation_with_a_cache_is_identical(name):
    model = _llama()
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = _with(model, "sdpa").generate(ids, max_new_tokens=10, do_sample=False)
        got = _with(model, name).generate(ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(got, want)


@pytest.mark.parametrize("reference", ["sdpa", "eager"])
def test_t5_logits_equal_transformers(reference, calls, name):
    """T5's bucketed relative bias reaches relattn as ``position_bias``."""
    model = _t5()
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    labels = torch.randint(1, 97, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = _with(model, reference)(input_ids=ids, labels=labels).logits
        got = _with(model, name)(input_ids=ids, labels=labels).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert len(calls) == 6  # encoder self, decoder self and cross attention, 2 layers each


def test_t5_greedy_generation_with_a_cache_is_identical(name):
    model = _t5()
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = _with(model, "sdpa").generate(ids, max_new_tokens=8, do_sample=False)
        got = _with(model, name).generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)


def test_dropout_is_refused():
    q = torch.ones(1, 2, 3, 4)
    with pytest.raises(ValueError, match="dropout must be 0"):
        relattn.huggingface.attention_forward(None, q, q, q, None, dropout=0.1)
