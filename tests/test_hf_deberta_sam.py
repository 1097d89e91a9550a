"""DeBERTa-v2 and SAM's image encoder patched by ``relattn.huggingface.patch``.

Tiny randomly initialised models built from configs (no download), their
parameters redrawn larger than ``transformers``' initialisation so that the
attention is far from uniform. A patched copy of each model gives the outputs
of the unpatched one (DeBERTa: the masked-LM logits of the real tokens; SAM:
the image encoder's last hidden state and ``SamModel``'s masks), and the same
gradients. Two references share no code with relattn nor with ``transformers``:
a NumPy float64 loop over the pairs of one DeBERTa layer (He et al. 2021,
eq. (2)–(4), with the v2 log buckets) and of one SAM layer (Li et al. 2022,
MViTv2 §3.1, decomposed relative positions; SAM's linear resize of the tables).
"""

from __future__ import annotations

import copy
import importlib.util
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("transformers") is None:
    pytest.skip("transformers is not installed", allow_module_level=True)

import relattn.huggingface  # noqa: E402 - after the skips

# transformers itself is imported by the functions that build a model, not at collection.

VOCAB, LENGTH = 61, 20
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}


def _redraw(model, seed=0, std=0.3):
    """Every parameter drawn again from N(0, std²), in place (float64 draws, cast)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            values = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.copy_(values * std)
    return model


def _patched(model):
    patched = copy.deepcopy(model)
    assert relattn.huggingface.patch(patched) is patched
    return patched


# ===============================================================================================
# DeBERTa-v2
# ===============================================================================================

CONFIGS = {
    "c2p+p2c": {},
    "c2p": {"pos_att_type": ["c2p"], "share_att_key": False},
    "p2c": {"pos_att_type": ["p2c"], "share_att_key": False},
    "c2p+p2c-unshared": {"share_att_key": False, "norm_rel_ebd": "none"},
    "no-buckets": {"position_buckets": -1, "max_relative_positions": 6},
    "no-relative": {"relative_attention": False, "position_biased_input": True},
    "no-terms": {"pos_att_type": []},
}
PADDING = ("none", "right", "left", "inside")


def _deberta_config(**overrides):
    import transformers

    fields = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, relative_attention=True,
        position_buckets=4, max_relative_positions=16, pos_att_type=["c2p", "p2c"],
        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    fields.update(overrides)
    return transformers.DebertaV2Config(**fields)


def _deberta(dtype=torch.float64, **overrides):
    import transformers

    torch.manual_seed(0)
    model = transformers.DebertaV2ForMaskedLM(_deberta_config(**overrides))
    return _redraw(model).to(dtype).eval()


def _batch(padding):
    """Token ids and the attention mask of three rows; row 1 padded as ``padding`` says."""
    ids = torch.randint(1, VOCAB, (3, LENGTH), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    if padding == "right":
        mask[1, -6:] = 0
    elif padding == "left":
        mask[1, :5] = 0
    elif padding == "inside":
        mask[1, 7:11] = 0
    return ids * mask, mask


def deberta_difference(case, padding, dtype):
    """Max |Δ| of the masked-LM logits of the real tokens, patched against transformers."""
    model = _deberta(dtype, **CONFIGS[case])
    patched = _patched(model)
    ids, mask = _batch(padding)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        got = patched(ids, attention_mask=mask).logits
    real = mask.bool()
    return (got[real] - expected[real]).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("padding", PADDING)
@pytest.mark.parametrize("case", CONFIGS)
def test_deberta_logits_equal_transformers(case, padding, dtype):
    assert deberta_difference(case, padding, dtype) <= TOLERANCE[dtype]


def test_deberta_patches_every_layer():
    model = _patched(_deberta())
    layers = [m for m in model.modules() if type(m).__name__ == "DisentangledSelfAttention"]
    assert len(layers) == 2
    assert all("forward" in vars(layer) for layer in layers)


def deberta_gradient_difference(training=False):
    """Max |Δ| of the gradients (every parameter; the shared relative embeddings alone)."""
    overrides = {"hidden_dropout_prob": 0.1} if training else {}
    model = _deberta(**overrides)
    patched = _patched(model)
    ids, mask = _batch("right")
    weights = torch.randn(3, LENGTH, VOCAB, generator=torch.Generator().manual_seed(3),
                          dtype=torch.float64)  # fmt: skip
    grads = []
    for m in (model, patched):
        m.train(training)
        torch.manual_seed(4)  # the same dropout masks (pos_dropout included) in both
        logits = m(ids, attention_mask=mask).logits
        (logits * weights)[mask.bool()].sum().backward()
        grads.append({name: p.grad for name, p in m.named_parameters() if p.grad is not None})
    expected, got = grads
    assert expected.keys() == got.keys()
    rel = "deberta.encoder.rel_embeddings.weight"
    assert torch.isfinite(got[rel]).all() and got[rel].abs().max() > 0
    overall = max((got[n] - expected[n]).abs().max().item() for n in expected)
    return overall, (got[rel] - expected[rel]).abs().max().item()


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train-pos-dropout"])
def test_deberta_gradients_equal_transformers(training):
    overall, rel_embeddings = deberta_gradient_difference(training)
    assert overall <= 1e-10 and rel_embeddings <= 1e-10


def test_deberta_raises_on_attention_dropout_in_training():
    model = _patched(_deberta(attention_probs_dropout_prob=0.1)).train()
    ids, mask = _batch("none")
    with pytest.raises(ValueError, match="attention_probs_dropout_prob must be 0"):
        model(ids, attention_mask=mask)
    model.eval()(ids, attention_mask=mask)  # evaluation: no dropout, no error


def test_deberta_raises_on_output_attentions():
    model = _patched(_deberta())
    ids, mask = _batch("none")
    with pytest.raises(ValueError, match="output_attentions must be False"):
        model(ids, attention_mask=mask, output_attentions=True)


def test_deberta_raises_on_positions_not_per_distance():
    layer = _patched(_deberta()).deberta.encoder.layer[0].attention.self
    hidden = torch.randn(1, 5, 32, dtype=torch.float64)
    rel_embeddings = torch.randn(8, 32, dtype=torch.float64)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    positions = torch.arange(5)[:, None] - torch.arange(5)[None, :]
    layer(hidden, mask, relative_pos=positions[None], rel_embeddings=rel_embeddings)
    positions[2, 0] = 0
    with pytest.raises(ValueError, match="relative_pos must depend on the distance"):
        layer(hidden, mask, relative_pos=positions[None], rel_embeddings=rel_embeddings)
    with pytest.raises(ValueError, match=r"relative_pos must hold one \(5, 5\) matrix"):
        layer(hidden, mask, relative_pos=positions[:4, :4], rel_embeddings=rel_embeddings)
    with pytest.raises(ValueError, match="rel_embeddings is required"):
        layer(hidden, mask)


def test_deberta_v1_is_not_patched():
    """DeBERTa v1's ``DisentangledSelfAttention`` has the same name and other parameters."""
    import transformers

    config = transformers.DebertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=48, relative_attention=True, pos_att_type=["c2p", "p2c"],
    )  # fmt: skip
    with pytest.raises(TypeError, match="DeBERTa-v2"):
        relattn.huggingface.patch(transformers.DebertaModel(config))


def test_deberta_layer_alone_with_few_relative_positions():
    """A layer called without ``relative_pos`` builds its own buckets with relattn's."""
    model = _deberta(position_buckets=8, max_relative_positions=8)
    layer = model.deberta.encoder.layer[0].attention.self
    patched = copy.deepcopy(layer)
    relattn.huggingface._deberta.patch_deberta_v2(patched)
    hidden = torch.randn(1, 12, 32, dtype=torch.float64)
    rel_embeddings = model.deberta.encoder.get_rel_embedding()
    mask = torch.ones(1, 1, 12, 12, dtype=torch.bool)
    with torch.no_grad():
        expected = layer(hidden, mask, rel_embeddings=rel_embeddings)[0]
        got = patched(hidden, mask, rel_embeddings=rel_embeddings)[0]
    assert (got - expected).abs().max() <= 1e-10


# -- the NumPy loop (He et al. 2021, eq. (2)–(4)) --------------------------------------------


def _log_bucket(r, bucket_size, max_position):
    """DeBERTa-v2's bucket of a relative position ``r`` (query minus key), float64."""
    mid = bucket_size // 2
    if abs(r) <= mid:
        return r
    steps = math.log(abs(r) / mid) / math.log((max_position - 1) / mid) * (mid - 1)
    return int(math.copysign(mid + math.ceil(steps), r))


def deberta_loop(h, mask, rel_embeddings, w, *, heads, k, buckets, max_position, p2c="code",
                 float32_root=True):  # fmt: skip
    """One disentangled attention layer, one pair at a time: ``(B, L, H·d)``.

    ``A_ij = Q^c_i·K^c_j + Q^c_i·K^r_δ(i,j) + K^c_j·Q^r_δ(?)``, ``δ(i, j) = clip(bucket(i - j)
    + k, 0, 2k - 1)`` (the paper's ``δ``, with the v2 buckets), divided by ``√(3d)``. The
    p2c term's index is ``δ(i, j)`` as DeBERTa's code has it (``p2c="code"``), or
    ``δ(j, i)`` as the paper's eq. (4) writes (``p2c="paper"``); ``√(3d)`` is rounded to
    float32 as ``transformers`` rounds it (``float32_root``), or exact.
    """
    batch, length, width = h.shape
    d = width // heads

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def index(a, b):
        return min(max(_log_bucket(a - b, buckets, max_position) + k, 0), 2 * k - 1)

    root = math.sqrt(3 * d)
    root = float(np.float32(root)) if float32_root else root
    qc, kc, vc = (linear(h, n) for n in ("query_proj", "key_proj", "value_proj"))
    rows = rel_embeddings[: 2 * k]
    kr, qr = linear(rows, "key_proj"), linear(rows, "query_proj")  # share_att_key
    out = np.zeros((batch, length, width))
    for b in range(batch):
        for head in range(heads):
            c = slice(head * d, (head + 1) * d)
            for i in range(length):
                scores = np.empty(length)
                for j in range(length):
                    p2c_index = index(i, j) if p2c == "code" else index(j, i)
                    scores[j] = (qc[b, i, c] @ kc[b, j, c] + qc[b, i, c] @ kr[index(i, j), c]
                                 + kc[b, j, c] @ qr[p2c_index, c]) / root  # fmt: skip
                allowed = mask[b, i]
                if not allowed.any():
                    continue  # a padding query: relattn's zero row
                e = np.where(allowed, np.exp(scores - scores[allowed].max()), 0.0)
                out[b, i, c] = e / e.sum() @ vc[b, :, c]
    return out


def deberta_loop_differences():
    """Max |Δ| of one patched layer against the loop: as ``transformers`` computes it
    (``"code"``), with the exact ``√(3d)`` (``"exact-root"``), with the paper's p2c index."""
    length, buckets, max_position = 40, 8, 32  # |i - j| up to 39: log buckets and the clip
    model = _deberta(position_buckets=buckets, max_relative_positions=max_position)
    layer = _patched(model).deberta.encoder.layer[0].attention.self
    rng = np.random.default_rng(5)
    h = rng.normal(size=(2, length, 32))
    valid = np.arange(length)[None, :] < np.array([length, 31])[:, None]
    mask = valid[:, None, :] & valid[:, :, None]
    rel_embeddings = model.deberta.encoder.get_rel_embedding()
    with torch.no_grad():
        got = layer(torch.from_numpy(h), torch.from_numpy(mask[:, None]),
                    rel_embeddings=rel_embeddings)[0].numpy()  # fmt: skip
    w = {n: p.detach().numpy() for n, p in layer.named_parameters()}
    args = (h, mask, rel_embeddings.detach().numpy(), w)
    options = dict(heads=4, k=buckets, buckets=buckets, max_position=max_position)
    return {
        "code": np.abs(got - deberta_loop(*args, **options)).max(),
        "exact-root": np.abs(got - deberta_loop(*args, **options, float32_root=False)).max(),
        "paper-p2c": np.abs(got - deberta_loop(*args, **options, p2c="paper")).max(),
    }


def test_deberta_layer_equals_numpy_loop():
    differences = deberta_loop_differences()
    assert differences["code"] <= 1e-10
    # transformers' float32 √(3d) (2e-7 measured) and the paper's δ(j, i) for p2c (another
    # model): see the guide.
    assert 1e-10 < differences["exact-root"] <= 1e-6
    assert differences["paper-p2c"] > 1e-3


# ===============================================================================================
# SAM's image encoder
# ===============================================================================================

IMAGE, PATCH, WINDOW = 48, 8, 4  # a 6 × 6 grid; windows of 4 × 4 after padding it to 8 × 8


def _sam_vision_config(**overrides):
    import transformers

    fields = dict(
        hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=4,
        image_size=IMAGE, patch_size=PATCH, window_size=WINDOW, global_attn_indexes=[1],
        mlp_dim=48, attention_dropout=0.0, num_pos_feats=8,
    )  # fmt: skip
    fields.update(overrides)
    return transformers.SamVisionConfig(**fields)


def _sam(implementation, dtype=torch.float64, *, resized=False, hq=False, **overrides):
    """A SAM (or SAM-HQ) vision model; ``resized``: tables of another length than ``2s - 1``."""
    import transformers

    config = _sam_vision_config(**overrides)
    config._attn_implementation = implementation
    torch.manual_seed(0)
    model = (transformers.SamHQVisionModel if hq else transformers.SamVisionModel)(config)
    if resized:
        # layer 0 (windows of 4: 7 rows) gets 11 and 5 rows; layer 1 (global, 6: 11 rows) 7, 16
        for attention, (rows_h, rows_w) in zip(
            (layer.attn for layer in model.vision_encoder.layers), ((11, 5), (7, 16)), strict=True
        ):
            d = attention.rel_pos_h.shape[1]
            attention.rel_pos_h = torch.nn.Parameter(torch.zeros(rows_h, d))
            attention.rel_pos_w = torch.nn.Parameter(torch.zeros(rows_w, d))
    return _redraw(model).to(dtype).eval()


def _pixels(dtype):
    generator = torch.Generator().manual_seed(6)
    return torch.randn(2, 3, IMAGE, IMAGE, generator=generator, dtype=torch.float64).to(dtype)


def sam_difference(implementation, dtype, *, resized=False, hq=False, **overrides):
    """Max |Δ| of the encoder's last hidden state, patched against transformers."""
    model = _sam(implementation, dtype, resized=resized, hq=hq, **overrides)
    patched = _patched(model)
    with torch.no_grad():
        expected = model(_pixels(dtype)).last_hidden_state
        got = patched(_pixels(dtype)).last_hidden_state
    return (got - expected).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("resized", [False, True], ids=["native-tables", "resized-tables"])
def test_sam_encoder_equals_transformers_sdpa(resized, dtype):
    assert sam_difference("sdpa", dtype, resized=resized) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_sam_encoder_equals_transformers_eager(dtype):
    # The eager module computes its softmax in float32 whatever the model's dtype: in
    # float64 it is that far (3e-8 measured) from the float64 result.
    assert sam_difference("eager", dtype, resized=True) <= TOLERANCE[torch.float32]


def test_sam_hq_and_no_relative_positions():
    assert sam_difference("sdpa", torch.float64, hq=True) <= 1e-10
    assert sam_difference("sdpa", torch.float64, use_rel_pos=False) <= 1e-10


def sam_model_difference():
    """Max |Δ| of ``SamModel``'s predicted masks and IoU scores (float64, point prompts)."""
    import transformers

    config = transformers.SamConfig(
        vision_config=_sam_vision_config(),
        prompt_encoder_config=transformers.SamPromptEncoderConfig(
            hidden_size=16, image_size=IMAGE, patch_size=PATCH, mask_input_channels=4
        ),
        mask_decoder_config=transformers.SamMaskDecoderConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, mlp_dim=32,
            iou_head_hidden_dim=16,
        ),
    )  # fmt: skip
    torch.manual_seed(0)
    model = _redraw(transformers.SamModel(config), std=0.2).double().eval()
    patched = _patched(model)
    points = torch.tensor([[[[10.0, 20.0]]], [[[30.0, 5.0]]]], dtype=torch.float64)
    with torch.no_grad():
        expected = model(pixel_values=_pixels(torch.float64), input_points=points)
        got = patched(pixel_values=_pixels(torch.float64), input_points=points)
    assert expected.pred_masks.abs().max() > 1e-3
    return max((got[n] - expected[n]).abs().max().item() for n in ("pred_masks", "iou_scores"))


def test_sam_model_masks_equal_transformers():
    assert sam_model_difference() <= 1e-10


def sam_gradient_difference():
    """Max |Δ| of the gradients (every parameter; ``rel_pos_h`` of each layer), resized tables."""
    grads = []
    weights = torch.randn(2, 16, 6, 6, generator=torch.Generator().manual_seed(7),
                          dtype=torch.float64)  # fmt: skip
    model = _sam("sdpa", resized=True)
    for m in (model, _patched(model)):
        (m(_pixels(torch.float64)).last_hidden_state * weights).sum().backward()
        grads.append({name: p.grad for name, p in m.named_parameters()})
    expected, got = grads
    tables = [n for n in expected if n.endswith("rel_pos_h")]
    assert len(tables) == 2
    for name in tables:
        assert torch.isfinite(got[name]).all() and got[name].abs().max() > 0
    overall = max((got[n] - expected[n]).abs().max().item() for n in expected)
    return overall, max((got[n] - expected[n]).abs().max().item() for n in tables)


def test_sam_gradients_equal_transformers():
    overall, tables = sam_gradient_difference()
    assert overall <= 1e-10 and tables <= 1e-10


def test_sam_attention_dropout():
    """The eager module applies its attention dropout (relattn cannot: an error); the SDPA
    module ignores it (so does its patched version)."""
    eager = _patched(_sam("eager", attention_dropout=0.1)).train()
    with pytest.raises(ValueError, match="attention_dropout must be 0"):
        eager(_pixels(torch.float64))
    model = _sam("sdpa", attention_dropout=0.1).train()
    expected = model(_pixels(torch.float64)).last_hidden_state
    got = _patched(model)(_pixels(torch.float64)).last_hidden_state
    assert (got - expected).abs().max() <= 1e-10


# -- the NumPy loop (MViTv2 §3.1, SAM's resize) ------------------------------------------------


def _resize(table, size):
    """Linear interpolation of the rows, half-pixel centres (``align_corners=False``)."""
    width = table.shape[0]
    if width == size:
        return table
    src = (np.arange(size) + 0.5) * width / size - 0.5
    return np.stack([np.interp(src, np.arange(width), column) for column in table.T], axis=1)


def sam_loop(x, w, table_h, table_w, heads):
    """One SAM attention layer on ``(N, h, w, C)``, one pair at a time.

    ``a_ij = scale·q_i·k_j + q_i·Rʰ[y_i - y_j + h - 1] + q_i·Rʷ[x_i - x_j + w - 1]``.
    """
    n, height, width, channels = x.shape
    d = channels // heads
    qkv = x.reshape(n, height * width, channels) @ w["qkv.weight"].T + w["qkv.bias"]
    rh, rw = _resize(table_h, 2 * height - 1), _resize(table_w, 2 * width - 1)
    out = np.zeros((n, height * width, channels))
    for b in range(n):
        for head in range(heads):
            q, k, v = (qkv[b, :, s * channels + head * d : s * channels + (head + 1) * d]
                       for s in range(3))  # fmt: skip
            for i in range(height * width):
                yi, xi = divmod(i, width)
                scores = np.empty(height * width)
                for j in range(height * width):
                    yj, xj = divmod(j, width)
                    scores[j] = (q[i] @ k[j] / math.sqrt(d) + q[i] @ rh[yi - yj + height - 1]
                                 + q[i] @ rw[xi - xj + width - 1])  # fmt: skip
                e = np.exp(scores - scores.max())
                out[b, i, head * d : (head + 1) * d] = e / e.sum() @ v
    out = out @ w["proj.weight"].T + w["proj.bias"]
    return out.reshape(n, height, width, channels)


def sam_loop_differences():
    """Max |Δ| of a patched window layer and global layer against the loop (resized tables)."""
    model = _patched(_sam("sdpa", resized=True))
    rng = np.random.default_rng(8)
    differences = []
    for layer, side in zip(model.vision_encoder.layers, (WINDOW, IMAGE // PATCH), strict=True):
        x = rng.normal(size=(2, side, side, 32))
        with torch.no_grad():
            got = layer.attn(torch.from_numpy(x))[0].numpy()
        w = {n: p.detach().numpy() for n, p in layer.attn.named_parameters()}
        expected = sam_loop(x, w, w["rel_pos_h"], w["rel_pos_w"], heads=4)
        differences.append(np.abs(got - expected).max())
    return differences


def test_sam_layers_equal_numpy_loop():
    assert max(sam_loop_differences()) <= 1e-10
