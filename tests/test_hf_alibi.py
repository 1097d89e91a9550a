"""BLOOM, MPT and Falcon with ALiBi computed by relattn (``relattn.huggingface.patch``).

Tiny randomly initialised models built from configs (no download). The
patched models' logits equal ``transformers``' own in float64 (1e-10) and
float32 (1e-4), on batches without padding, left-padded, and with padding
inside a row; greedy generation with a cache gives the same tokens. The
float64 reference is ``transformers``' own forward with its softmax kept in
float64 (BLOOM and MPT compute it in float32 whatever the dtype), and
Falcon's ``sdpa`` path (its ``eager`` path adds ALiBi twice). Other tests show
the ``transformers`` (5.24.0) defects that ``docs/guide/huggingface_patch.md``
documents, and check one MPT layer against a NumPy loop from the formula.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("transformers") is None:
    pytest.skip("transformers is not installed", allow_module_level=True)

import relattn  # noqa: E402 - after the skips
import relattn.huggingface  # noqa: E402
from relattn.huggingface import _alibi  # noqa: E402

# transformers itself (1.5 s) is imported by the tests that build a model, not at collection.

VOCAB, LENGTH = 97, 10
#: Tolerances on the logits, per dtype.
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}


def _bloom(heads=4, **config):
    import transformers

    config = transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=heads, initializer_range=0.2, **config
    )
    torch.manual_seed(0)
    return transformers.BloomForCausalLM(config).eval()


def _mpt(heads=4, alibi_bias_max=8, **attn_config):
    import transformers

    config = transformers.MptConfig(
        vocab_size=VOCAB, d_model=48, n_layers=2, n_heads=heads, max_seq_len=32,
        initializer_range=0.2, attn_config={"alibi_bias_max": alibi_bias_max, **attn_config},
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.MptForCausalLM(config).eval()


def _falcon(heads=4, implementation="sdpa", hidden=32, **config):
    import transformers

    config = transformers.FalconConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
        alibi=config.pop("alibi", True), initializer_range=0.2,
        attn_implementation=implementation, **config,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.FalconForCausalLM(config).eval()


MODELS = {"bloom": _bloom, "mpt": _mpt, "falcon": _falcon}


def _batch(kind, length=LENGTH, seed=1):
    """Token ids and a 2-D attention mask: no padding, left padding, padding inside rows."""
    ids = torch.randint(1, VOCAB, (3, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    if kind == "left":
        mask[1, :3] = 0
        mask[2, :5] = 0
    elif kind == "inside":
        mask[1, 4:6] = 0
        mask[2, :2] = 0
        mask[2, 6] = 0
    return ids.masked_fill(mask == 0, 0), mask


@contextlib.contextmanager
def _softmax_in_float64():
    """``transformers``' BLOOM and MPT with their softmax in float64 for float64 models.

    BLOOM calls ``softmax(scores, dtype=float32)`` and MPT ``softmax(scores.float())``
    whatever the model's dtype; within this block float64 tensors stay float64 there,
    so that their float64 logits are a float64 reference.
    """
    softmax, to_float = torch.nn.functional.softmax, torch.Tensor.float

    def softmax64(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    def keep64(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else to_float(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(torch.nn.functional, "softmax", softmax64)
        patches.setattr(torch.Tensor, "float", keep64)
        yield


def _logits(model, ids, mask, reference=False):
    with torch.no_grad(), _softmax_in_float64() if reference else contextlib.nullcontext():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.fixture
def calls(monkeypatch):
    """The number of relattn calls the patched layers make."""
    made = []
    real = _alibi.scaled_dot_product_attention

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_alibi, "scaled_dot_product_attention", counted)
    return made


@pytest.fixture(scope="module")
def models():
    """``(reference, patched)`` per model and dtype; built once."""
    pairs = {}
    for name, make in MODELS.items():
        for dtype in ("float32", "float64"):
            reference = make().to(getattr(torch, dtype))
            pairs[name, dtype] = reference, relattn.huggingface.patch(copy.deepcopy(reference))
    return pairs


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["none", "left", "inside"])
@pytest.mark.parametrize("name", list(MODELS))
def test_logits_equal_transformers(name, kind, dtype, models, calls):
    reference, patched = models[name, dtype]
    ids, mask = _batch(kind)
    want = _logits(reference, ids, mask, reference=dtype == "float64")
    got = _logits(patched, ids, mask)
    real = mask.bool()  # the outputs at padding tokens are not used
    assert torch.isfinite(want[real]).all()
    np.testing.assert_allclose(got[real].numpy(), want[real].numpy(), rtol=0, atol=TOLERANCE[dtype])
    assert len(calls) == 2  # one per layer


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_generation_with_a_cache_is_identical(name, models):
    reference, patched = models[name, "float64"]
    ids, mask = _batch("left", length=7, seed=2)
    mask[0, 3] = 0  # and padding inside the other row
    options = {"attention_mask": mask, "max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        with _softmax_in_float64():
            want = reference.generate(ids, **options)
        got = patched.generate(ids, **options)
    assert torch.equal(got, want)
    assert len(set(got[:, 7:].flatten().tolist())) > 2  # the models do not repeat one token


def test_bloom_static_cache_generation_is_identical(models):
    """A static cache: keys are the cache's slots; positions come from the mask."""
    reference, patched = models["bloom", "float64"]
    ids, mask = _batch("left", length=7, seed=2)
    options = {
        "attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0,
        "cache_implementation": "static",
    }  # fmt: skip
    with torch.no_grad():
        with _softmax_in_float64():
            want = reference.generate(ids, **options)
        got = patched.generate(ids, **options)
    assert torch.equal(got, want)


# The defects of transformers 5.24.0 that the guide documents.


def test_falcon_eager_adds_alibi_twice():
    """Falcon's ``eager`` path adds ALiBi to its mask and to the scores: its logits are those
    of ALiBi with doubled slopes, not those of its ``sdpa`` path (ALiBi once, as relattn)."""
    eager, sdpa = (_falcon(implementation=i).double() for i in ("eager", "sdpa"))
    ids, mask = _batch("inside")
    want_eager, want_sdpa = _logits(eager, ids, mask), _logits(sdpa, ids, mask)
    real = mask.bool()
    assert (want_eager - want_sdpa)[real].abs().max() > 0.1
    got = _logits(relattn.huggingface.patch(eager), ids, mask)  # whatever the implementation
    assert (got - want_sdpa)[real].abs().max() <= 1e-10
    doubled = copy.deepcopy(sdpa)
    for layer in doubled.transformer.h:
        module = layer.self_attention
        slopes = 2 * relattn.alibi_slopes(module.num_heads) * module.inv_norm_factor
        module.forward = _alibi._falcon_forward(torch.as_tensor(slopes)).__get__(module)
    got_doubled = _logits(doubled, ids, mask)
    assert (got_doubled - want_eager)[real].abs().max() <= 1e-10


def test_falcon_rounds_slope_times_position_to_bfloat16(monkeypatch):
    """Falcon rounds its slopes to bfloat16 (relattn takes those slopes) and then each
    ``slope · position`` too: with 12 heads (slopes that are not powers of 2) relattn's exact
    distances differ from transformers by that rounding, and only by it."""
    from transformers.models.falcon import modeling_falcon

    model = _falcon(heads=12, hidden=48).double()
    ids, mask = _batch("inside")
    got = _logits(relattn.huggingface.patch(copy.deepcopy(model)), ids, mask)
    real = mask.bool()
    assert (got - _logits(model, ids, mask))[real].abs().max() > 1e-4

    def exact_product(attention_mask, num_heads, dtype):
        slopes = torch.as_tensor(relattn.alibi_slopes(num_heads)).bfloat16().double()
        positions = (attention_mask.cumsum(-1) - 1) * attention_mask
        alibi = slopes[:, None] * positions[:, None, :]
        return alibi.reshape(-1, 1, attention_mask.shape[-1]).to(dtype)

    monkeypatch.setattr(modeling_falcon, "build_alibi_tensor", exact_product)
    want = _logits(model, ids, mask)
    np.testing.assert_allclose(got[real].numpy(), want[real].numpy(), rtol=0, atol=1e-10)


def test_mpt_alibi_bias_max_is_ignored_by_transformers():
    """With ``alibi_bias_max=16`` transformers still uses the slopes of 8; relattn follows the
    configuration, and equals transformers' model whose ALiBi tensor is built with 16."""
    from transformers.models.mpt import modeling_mpt

    model = _mpt(heads=12, alibi_bias_max=16).double()
    ids, mask = _batch("left")
    patched = relattn.huggingface.patch(copy.deepcopy(model))
    got = _logits(patched, ids, mask)
    transformers_logits = _logits(model, ids, mask, reference=True)
    real = mask.bool()
    assert (got - transformers_logits)[real].abs().max() > 1e-2
    model.transformer.build_mpt_alibi_tensor = functools.partial(
        modeling_mpt.build_mpt_alibi_tensor, alibi_bias_max=16
    )
    fixed = _logits(model, ids, mask, reference=True)
    np.testing.assert_allclose(got[real].numpy(), fixed[real].numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["bloom", "mpt"])
def test_float64_left_padding_gives_nan_in_transformers(name, models):
    """Their float32 softmax turns float64's ``finfo.min`` into ``-inf``: a fully masked
    row (a left padding query) is NaN, and the NaN reaches every token in the next layer."""
    reference, patched = models[name, "float64"]
    ids, mask = _batch("left")
    assert torch.isnan(_logits(reference, ids, mask)[mask.bool()]).any()
    assert torch.isfinite(_logits(patched, ids, mask)).all()


def _numpy_slopes_mpt(heads, alibi_bias_max):
    """llm-foundry's ``gen_slopes``, in NumPy: 2^(-b·i/n) for n = 2^⌈log2 H⌉, interleaved."""
    n = 2 ** int(np.ceil(np.log2(heads)))
    slopes = 2.0 ** (-alibi_bias_max * np.arange(1, n + 1) / n)
    return np.concatenate([slopes[1::2], slopes[::2]])[:heads] if n != heads else slopes


def test_mpt_layer_equals_a_numpy_loop():
    """One MPT attention layer (12 heads, ``alibi_bias_max=16``, ``clip_qkv``, a
    ``softmax_scale``) against ``softmax_j(q_i·k_j·scale + m_h·(j - i)) v_j`` looped in NumPy."""
    model = _mpt(heads=12, alibi_bias_max=16, clip_qkv=0.5, softmax_scale=0.3).double()
    relattn.huggingface.patch(model)
    module = model.transformer.blocks[0].attn
    batch, length, heads, d = 2, 9, 12, 4
    x = torch.randn(batch, length, 48, generator=torch.Generator().manual_seed(3)).double()
    keep = np.ones((batch, length), dtype=bool)
    keep[1, :3] = keep[1, 6] = False  # left padding and padding inside the row
    allowed = np.tril(np.ones((length, length), dtype=bool)) & keep[:, None, None, :]
    with torch.no_grad():
        got = module(x, position_bias=None, attention_mask=torch.as_tensor(~allowed))[0].numpy()

    qkv = np.clip(x.numpy() @ module.Wqkv.weight.detach().numpy().T, -0.5, 0.5)
    q, k, v = (a.reshape(batch, length, heads, d) for a in np.split(qkv, 3, axis=-1))
    slopes = _numpy_slopes_mpt(heads, 16)
    context = np.zeros((batch, length, heads, d))
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                js = [j for j in range(length) if allowed[b, 0, i, j]]
                if not js:
                    continue  # no key: a zero row
                e = np.array([q[b, i, h] @ k[b, j, h] * 0.3 + slopes[h] * (j - i) for j in js])
                w = np.exp(e - e.max())
                context[b, i, h] = (w / w.sum()) @ v[b, js, h]
    want = context.reshape(batch, length, heads * d) @ module.out_proj.weight.detach().numpy().T
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_mpt_slopes():
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    for heads in range(1, 17):
        np.testing.assert_allclose(
            _alibi.mpt_alibi_slopes(heads), relattn.alibi_slopes(heads), rtol=1e-15
        )
        for bias_max in (4, 16):
            want = _numpy_slopes_mpt(heads, bias_max)
            np.testing.assert_allclose(_alibi.mpt_alibi_slopes(heads, bias_max), want, rtol=1e-15)
            # transformers' own function, when it is given alibi_bias_max (float32)
            tensor = build_mpt_alibi_tensor(heads, 2, alibi_bias_max=bias_max)
            np.testing.assert_allclose(-tensor[:, 0, 0].numpy(), want, rtol=1e-6)
    with pytest.raises(TypeError, match="num_heads"):
        _alibi.mpt_alibi_slopes(2.0)
    with pytest.raises(ValueError, match="num_heads"):
        _alibi.mpt_alibi_slopes(0)
    with pytest.raises(ValueError, match="alibi_bias_max"):
        _alibi.mpt_alibi_slopes(4, 0)


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("bloom", "attention_dropout"),
        ("mpt", "attn_config.attn_pdrop"),
        ("falcon", "attention_dropout"),
    ],
)
def test_attention_dropout_is_refused_in_training(name, field):
    if name == "mpt":  # MptAttentionConfig types attn_pdrop as an int: set the module's
        model = _mpt()
        for block in model.transformer.blocks:
            block.attn.attn_dropout_p = 0.1
    else:
        model = MODELS[name](attention_dropout=0.1)
    relattn.huggingface.patch(model)
    ids, mask = _batch("none")
    assert torch.isfinite(_logits(model, ids, mask)).all()  # eval: no dropout
    model.train()
    with pytest.raises(ValueError, match=re.escape(field) + " must be 0"):
        model(input_ids=ids, attention_mask=mask)


def test_refusals():
    with pytest.raises(TypeError, match="Falcon"):  # rotary Falcon: not patched
        relattn.huggingface.patch(_falcon(alibi=False))
    with pytest.raises(ValueError, match=r"attn_config\.alibi"):
        relattn.huggingface.patch(_mpt(alibi=False))
    with pytest.raises(ValueError, match=r"attn_config\.qk_ln"):
        relattn.huggingface.patch(_mpt(qk_ln=True))
    model = relattn.huggingface.patch(_bloom())
    ids, mask = _batch("none")
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=ids, attention_mask=mask, output_attentions=True)
