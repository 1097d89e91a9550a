"""disentangled_attention (DeBERTa, SPEC §2.12), DeBERTa-v2 and TENER as released (SPEC §2.7).

References, written here and sharing no code with relattn:

- ``_disentangled_loop``: ``A_ij = q_i·k_j + q_i·Kʳ[m] + k_j·Qʳ[m]``,
  ``m = j - i_aligned + Lk - 1``, one pair at a time; ``_disentangled_gather``: the same
  with the tables gathered into ``(Lq, Lk, d)`` tensors;
- ``_hf_deberta_v2``: HF transformers' DeBERTa-v2 ``DisentangledSelfAttention.forward`` and
  ``disentangled_attention_bias`` (c2p and p2c gathers, shared keys) transcribed to NumPy;
- ``_tener_released``: fastnlp/TENER ``RelativeMultiHeadAttn.forward`` (HEAD of
  ``modules/relative_transformer.py``) transcribed to NumPy: its position table, ``_shift``,
  ``_transpose_shift``, ``masked_fill(-inf)`` and softmax.

Every backend, float32 and float64 (float16 and bfloat16 where they exist).
On JAX and Dask these run in float64 only (``FLOAT64_TARGETS`` in ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn
import relattn.disentangled

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (
    relattn.disentangled_attention,
    relattn.relative_attention,
    relattn.log_bucket_position,
    relattn.sinusoidal_position_encoding,
):
    lazy_xp_function(_function)

EXAMPLES = Path(__file__).parents[1] / "examples"
BATCH, HEADS, D, DV = 2, 2, 4, 3


def _load_example(name):
    spec = importlib.util.spec_from_file_location(
        f"relattn_example_{name}", EXAMPLES / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ===============================================================================================
# references
# ===============================================================================================


def _lead(*arrays):
    return np.broadcast_shapes(*arrays)


def _disentangled_loop(q, k, v, key_table=None, query_table=None, *, mask=None, bias=None,
                       relative_bias=None, causal=False, scale=None):  # fmt: skip
    """He et al. 2021 eq. (2)–(4), one pair at a time, in relattn's relative layout.

    ``m = δ + Lk - 1`` indexes the tables and ``relative_bias``; a column beyond their
    width (the causal layout, ``W = Lk``) is masked, like ``causal``.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    tables = [t for t in (key_table, query_table) if t is not None]
    scale = 1 / math.sqrt((1 + len(tables)) * d) if scale is None else scale
    leads = [q.shape[:-2], k.shape[:-2], v.shape[:-2], *(t.shape[:-2] for t in tables)]
    widths = [t.shape[-2] for t in tables]
    if relative_bias is not None:
        leads.append(relative_bias.shape[:-1])
        widths.append(relative_bias.shape[-1])
    if bias is not None:
        leads.append(bias.shape[:-2])
    if mask is not None:
        leads.append(np.shape(mask)[:-2])
    lead = _lead(*leads)

    def full(a, tail):
        return None if a is None else np.broadcast_to(np.asarray(a, np.float64), (*lead, *tail))

    q, k, v = full(q, (lq, d)), full(k, (lk, d)), full(v, (lk, v.shape[-1]))
    kr = None if key_table is None else full(key_table, key_table.shape[-2:])
    qr = None if query_table is None else full(query_table, query_table.shape[-2:])
    rb = None if relative_bias is None else full(relative_bias, relative_bias.shape[-1:])
    b_ = full(bias, (lq, lk))
    allowed_all = np.broadcast_to(
        np.ones((lq, lk), bool) if mask is None else mask, (*lead, lq, lk)
    )
    out = np.zeros((*lead, lq, v.shape[-1]))
    for idx in np.ndindex(lead):
        for i in range(lq):
            e = np.zeros(lk)
            allowed = allowed_all[idx][i].copy()
            for j in range(lk):
                delta = j - (i + lk - lq)
                m = delta + lk - 1
                if (causal and delta > 0) or any(m >= w for w in widths):
                    allowed[j] = False
                    continue
                a = q[idx][i] @ k[idx][j]
                if kr is not None:
                    a += q[idx][i] @ kr[idx][m]
                if qr is not None:
                    a += k[idx][j] @ qr[idx][m]
                e[j] = a * scale
                if b_ is not None:
                    e[j] += b_[idx][i, j]
                if rb is not None:
                    e[j] += rb[idx][m]
            w = reference.softmax_row(e, allowed)
            out[idx][i] = sum(w[j] * v[idx][j] for j in range(lk))
    return out


def _disentangled_gather(q, k, v, key_table, query_table, scale=None):
    """The same scores with ``Kʳ``, ``Qʳ`` gathered into ``(Lq, Lk, d)`` tensors (full layout)."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(3 * d) if scale is None else scale
    m = np.arange(lk)[None, :] - (np.arange(lq)[:, None] + lk - lq) + lk - 1
    kr, qr = key_table[..., m, :], query_table[..., m, :]  # (..., Lq, Lk, d)
    scores = (
        np.einsum("...id,...jd->...ij", q, k)
        + np.einsum("...id,...ijd->...ij", q, kr)
        + np.einsum("...jd,...ijd->...ij", k, qr)
    ) * scale
    return reference.masked_softmax(scores) @ v


def _inputs(rng, lq, lk, *, table_lead=(), width=None):
    width = lq + lk - 1 if width is None else width
    return (
        rng.normal(size=(BATCH, HEADS, lq, D)),
        rng.normal(size=(BATCH, HEADS, lk, D)),
        rng.normal(size=(BATCH, HEADS, lk, DV)),
        rng.normal(size=(*table_lead, width, D)),
        rng.normal(size=(*table_lead, width, D)),
    )


def test_references_agree(rng):
    for lq, lk, table_lead in [(4, 4, ()), (3, 5, (HEADS,)), (5, 2, ())]:
        args = _inputs(rng, lq, lk, table_lead=table_lead)
        np.testing.assert_allclose(
            _disentangled_loop(*args), _disentangled_gather(*args), rtol=1e-12, atol=1e-12
        )


# ===============================================================================================
# values on every backend
# ===============================================================================================

SHAPES = [(4, 4), (3, 5), (5, 3)]
SHAPE_IDS = ["self", "lq<lk", "lq>lk"]


@pytest.mark.parametrize("per_head", [False, True], ids=["shared-table", "per-head-table"])
@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_matches_loop(backend, dtype, rng, lq, lk, per_head):
    args = _inputs(rng, lq, lk, table_lead=(HEADS,) if per_head else ())
    out = relattn.disentangled_attention(*(backend.asarray(a, dtype) for a in args))
    assert tuple(out.shape) == (BATCH, HEADS, lq, DV)
    backend.assert_close(out, _disentangled_loop(*args), dtype)  # default scale 1/√(3d)
    if per_head:  # each head really uses its own table
        shared = _disentangled_loop(*args[:3], args[3][0], args[4][0])
        assert np.abs(_disentangled_loop(*args) - shared)[:, 1:].max() > 1e-3


@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_one_table(backend, dtype, rng, lq, lk):
    """c2p only or p2c only: the default scale is 1/√(2d); an explicit scale is used as given."""
    q, k, v, kr, qr = _inputs(rng, lq, lk)
    arrays = [backend.asarray(a, dtype) for a in (q, k, v, kr, qr)]
    c2p = relattn.disentangled_attention(*arrays[:4], None)
    backend.assert_close(c2p, _disentangled_loop(q, k, v, kr, None), dtype)
    p2c = relattn.disentangled_attention(*arrays[:3], None, arrays[4])
    backend.assert_close(p2c, _disentangled_loop(q, k, v, None, qr), dtype)
    scaled = relattn.disentangled_attention(*arrays, scale=0.3)
    backend.assert_close(scaled, _disentangled_loop(q, k, v, kr, qr, scale=0.3), dtype)
    neither = relattn.disentangled_attention(*arrays[:3], None, None)
    backend.assert_close(neither, reference.attention(q, k, v), dtype)


@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_mask_causal_and_biases(backend, dtype, rng, lq, lk):
    """mask (a fully masked row), causal, relative_bias (H, W) and bias, dense and blockwise."""
    q, k, v, kr, qr = _inputs(rng, lq, lk, table_lead=(HEADS,))
    mask = rng.random((BATCH, 1, lq, lk)) < 0.7
    mask[..., 0] = True
    mask[0, 0, lq - 1] = False  # the last query of batch 0 sees no key
    rb = rng.normal(size=(HEADS, lq + lk - 1))
    bias = rng.normal(size=(BATCH, 1, 1, lk))  # a per-key bias, broadcast over rows
    expected = _disentangled_loop(
        q, k, v, kr, qr, mask=mask, bias=bias, relative_bias=rb, causal=True
    )
    xs = [backend.asarray(a, dtype) for a in (q, k, v, kr, qr)]
    options = {
        "mask": backend.asarray(mask),
        "bias": backend.asarray(bias, dtype),
        "relative_bias": backend.asarray(rb, dtype),
        "causal": True,
    }
    for block_size in (None, 3):
        out = relattn.disentangled_attention(*xs, block_size=block_size, **options)
        backend.assert_close(out, expected, dtype)
        got = backend.to_host(out)
        assert np.isfinite(got).all() and np.all(got[0, :, lq - 1] == 0)
        if lq > lk:  # the first Lq - Lk queries have no key at δ <= 0
            assert np.all(got[:, :, : lq - lk] == 0)


@pytest.mark.parametrize("which", ["both", "key", "query"])
def test_causal_layout_tables(backend, dtype, rng, which):
    """Tables of width Lk (δ <= 0 only) imply causal; the same rows of a full table agree."""
    lq, lk = 3, 5
    q, k, v, kr, qr = _inputs(rng, lq, lk)
    kr_c = kr[:lk] if which != "query" else None
    qr_c = qr[:lk] if which != "key" else None
    expected = _disentangled_loop(q, k, v, kr_c, qr_c)
    assert np.abs(expected - _disentangled_loop(q, k, v, kr_c, qr_c, causal=False)).max() == 0
    xs = [backend.asarray(a, dtype) for a in (q, k, v)]
    tables = [None if t is None else backend.asarray(t, dtype) for t in (kr_c, qr_c)]
    out = relattn.disentangled_attention(*xs, *tables)
    backend.assert_close(out, expected, dtype)
    full = [None if t is None else backend.asarray(f, dtype)
            for t, f in zip((kr_c, qr_c), (kr, qr), strict=True)]  # fmt: skip
    causal = relattn.disentangled_attention(*xs, *full, causal=True)
    backend.assert_close(causal, expected, dtype)


def test_blockwise_equals_dense(backend, dtype, rng):
    """block_size 1, 3 and one larger than L equal the dense result, Lk > Lq, every term."""
    lq, lk = 3, 5
    q, k, v, kr, qr = _inputs(rng, lq, lk)
    rb = rng.normal(size=(HEADS, lq + lk - 1))
    xs = [backend.asarray(a, dtype) for a in (q, k, v, kr, qr)]
    xrb = backend.asarray(rb, dtype)
    dense = relattn.disentangled_attention(*xs, relative_bias=xrb)
    backend.assert_close(dense, _disentangled_loop(q, k, v, kr, qr, relative_bias=rb), dtype)
    for block_size in (1, 3, 64):
        out = relattn.disentangled_attention(*xs, relative_bias=xrb, block_size=block_size)
        backend.assert_close(out, backend.to_host(dense), dtype)


def test_key_table_only_is_relative_attention(backend, dtype, rng):
    """The c2p term alone is Transformer-XL's position term: the two functions agree."""
    q, k, v, kr, _ = _inputs(rng, 3, 5)
    xs = [backend.asarray(a, dtype) for a in (q, k, v, kr)]
    a = relattn.disentangled_attention(*xs, None, scale=0.4)
    b = relattn.relative_attention(*xs, scale=0.4)
    backend.assert_close(a, backend.to_host(b), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision(backend, rng, dtype):
    q, k, v, kr, qr = (a * 0.5 for a in _inputs(rng, 3, 5))
    mask = np.ones((3, 5), bool)
    mask[0] = False
    arrays = [backend.asarray(a, dtype) for a in (q, k, v, kr, qr)]
    # The reference of the inputs as the backend holds them, rounded to ``dtype``. The
    # tolerance stays ``dtype``'s: the first-order bound of scores (three products of d
    # terms), softmax and weighted sum computed in ``dtype`` is about 25u here (u = 2^-11
    # or 2^-8), no tighter.
    exact = [backend.to_host(a).astype(np.float64) for a in arrays]
    expected = _disentangled_loop(*exact, mask=mask, causal=True)
    for block_size in (None, 3):
        out = relattn.disentangled_attention(
            *arrays, mask=backend.asarray(mask), causal=True, block_size=block_size
        )
        assert out.dtype == backend.dtype(dtype)
        backend.assert_close(out, expected, dtype)


@settings(max_examples=30)
@given(
    lq=st.integers(1, 5),
    lk=st.integers(1, 5),
    causal_layout=st.booleans(),
    tables=st.sampled_from(["both", "key", "query"]),
    block_size=st.sampled_from([None, 1, 2, 4]),
    seed=st.integers(0, 2**32 - 1),
)
def test_property(lq, lk, causal_layout, tables, block_size, seed):
    rng = np.random.default_rng(seed)
    width = lk if causal_layout else lq + lk - 1
    q, k, v, kr, qr = _inputs(rng, lq, lk, width=width)
    kr = kr if tables != "query" else None
    qr = qr if tables != "key" else None
    out = relattn.disentangled_attention(q, k, v, kr, qr, block_size=block_size)
    np.testing.assert_allclose(out, _disentangled_loop(q, k, v, kr, qr), rtol=1e-10, atol=1e-12)


# ===============================================================================================
# transforms: jit, gradients
# ===============================================================================================


def test_jit_equals_eager(jit_backend, dtype, rng):
    q, k, v, kr, qr = _inputs(rng, 3, 5, table_lead=(HEADS,))
    rb = rng.normal(size=(HEADS, 7))
    mask = np.ones((3, 5), bool)
    mask[1, :2] = False

    def f(q, k, v, kr, qr, rb, mask):
        return (
            relattn.disentangled_attention(q, k, v, kr, qr, relative_bias=rb, mask=mask),
            relattn.disentangled_attention(
                q, k, v, kr, qr, relative_bias=rb, mask=mask, causal=True, block_size=3
            ),
        )

    arrays = [jit_backend.asarray(a, dtype) for a in (q, k, v, kr, qr, rb)]
    arrays.append(jit_backend.asarray(mask))
    compiled = jit_backend.jit(f)(*arrays)
    eager = f(*arrays)
    for a, b in zip(compiled, eager, strict=True):
        jit_backend.assert_close(a, jit_backend.to_host(b), dtype)
    expected = _disentangled_loop(q, k, v, kr, qr, relative_bias=rb, mask=mask, causal=True)
    jit_backend.assert_close(compiled[1], expected, dtype)


@pytest.mark.parametrize("block_size", [None, 2])
def test_gradcheck(torch_backend, rng, block_size):
    """Gradients w.r.t. q, k, v, both tables, relative_bias and bias."""
    torch = torch_backend.lib
    lq, lk = 3, 4
    q, k, v, kr, qr = _inputs(rng, lq, lk)
    q, k, v = q[:1], k[:1], v[:1]
    leaves = tuple(
        torch_backend.asarray(a, "float64").requires_grad_(True)
        for a in (q, k, v, kr, qr, rng.normal(size=(HEADS, lq + lk - 1)),
                  rng.normal(size=(1, 1, 1, lk)))
    )  # fmt: skip
    mask = torch_backend.asarray(np.array([True, True, False, True]))

    def f(q, k, v, kr, qr, rb, bias):
        return relattn.disentangled_attention(
            q, k, v, kr, qr, relative_bias=rb, bias=bias, mask=mask, block_size=block_size
        )

    assert torch.autograd.gradcheck(f, leaves)
    f(*leaves).square().sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and torch.count_nonzero(leaf.grad) > 0


def test_jax_grad_matches_central_differences(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    def on(a):
        return jax_backend.asarray(a, "float64")

    lq, lk = 3, 5
    params = [on(a) for a in _inputs(rng, lq, lk)]
    params.append(on(rng.normal(size=(HEADS, lq + lk - 1))))
    weights = on(rng.normal(size=(BATCH, HEADS, lq, DV)))

    def loss(p, block_size):
        out = relattn.disentangled_attention(
            *p[:5], relative_bias=p[5], causal=True, block_size=block_size
        )
        return jnp.sum(out * weights)

    for block_size in (None, 3):
        f = jax.jit(lambda p, b=block_size: loss(p, b))
        grad = jax.jit(jax.grad(f))(params)
        jax_backend.assert_directional_derivatives(f, grad, params, rng, count=2)


# ===============================================================================================
# bad input
# ===============================================================================================

_disentangled = relattn.disentangled.disentangled_attention  # unpatched: None and lists


def _call(b, q=(3, 4), k=(5, 4), v=(5, 2), kr=(7, 4), qr=(7, 4), position_table_int=False,
          **kw):  # fmt: skip
    def f(shape):
        return None if shape is None else b.asarray(np.zeros(shape), "float64")

    key_table = b.asarray(np.zeros((7, 4), dtype=np.int64)) if position_table_int else f(kr)
    return _disentangled(f(q), f(k), f(v), key_table, f(qr), **kw)


V, T = ValueError, TypeError
ERRORS = [
    ("key-table-width", lambda b: _call(b, kr=(6, 4)), V, r"^position_table must have W"),
    ("query-table-width", lambda b: _call(b, qr=(4, 4)), V, r"^query_position_table must have W"),
    ("table-features", lambda b: _call(b, kr=(7, 3)), V, r"^position_table .*feature size"),
    ("table-1d", lambda b: _call(b, qr=(4,)), V, r"^query_position_table must have"),
    ("relative-bias-width", lambda b: _call(b, relative_bias=b.asarray(np.zeros(6))), V,
     r"^relative_bias must have W"),
    ("bias-shape", lambda b: _call(b, bias=b.asarray(np.zeros((4, 5)))), V, r"^bias must be"),
    ("mask-float", lambda b: _call(b, mask=b.asarray(np.ones((3, 5)))), T, r"^mask must be"),
    ("causal-int", lambda b: _call(b, causal=1), T, r"causal"),
    ("block-size", lambda b: _call(b, block_size=0), V, r"block_size"),
    ("q-none", lambda b: _call(b, q=None), T, r"^q must be an array"),
    ("table-int", lambda b: _call(b, kr=None, position_table_int=True), T,
     r"^position_table must have a real floating dtype"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_bad_input(backend, call, error, match):
    with pytest.raises(error, match=match):
        call(backend)


# ===============================================================================================
# DeBERTa-v2: HF transformers' DisentangledSelfAttention, transcribed
# ===============================================================================================

POSITION_BUCKETS, MAX_RELATIVE_POSITIONS, DEBERTA_LENGTH = 4, 6, 14  # φ clips at both ends


def _hf_make_log_bucket_position(relative_pos, bucket_size, max_position):
    sign = np.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = np.where((relative_pos < mid) & (relative_pos > -mid), mid - 1, np.abs(relative_pos))
    log_pos = np.ceil(np.log(abs_pos / mid) / np.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(abs_pos <= mid, relative_pos, log_pos * sign)


def _hf_build_relative_position(query_size, key_size, bucket_size=-1, max_position=-1):
    q_ids = np.arange(query_size)
    k_ids = np.arange(key_size)
    rel_pos_ids = q_ids[:, None] - k_ids[None, :]
    if bucket_size > 0 and max_position > 0:
        rel_pos_ids = _hf_make_log_bucket_position(rel_pos_ids, bucket_size, max_position)
    rel_pos_ids = rel_pos_ids.astype(np.int64)
    rel_pos_ids = rel_pos_ids[:query_size, :]
    return rel_pos_ids[None]


def _hf_deberta_v2(hidden_states, attention_mask, rel_embeddings, weights, *, heads,
                   position_buckets, max_relative_positions):  # fmt: skip
    """``DisentangledSelfAttention.forward`` (relative_attention, pos_att_type c2p|p2c,
    share_att_key, no dropout), with ``weights`` the ``nn.Linear`` weights ``(out, in)``."""

    def linear(x, name):
        return x @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]

    def transpose_for_scores(x, attention_heads):
        x = x.reshape(*x.shape[:-1], attention_heads, -1)
        return x.transpose(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[-1])

    query_layer = transpose_for_scores(linear(hidden_states, "query_proj"), heads)
    key_layer = transpose_for_scores(linear(hidden_states, "key_proj"), heads)
    value_layer = transpose_for_scores(linear(hidden_states, "value_proj"), heads)
    scale_factor = 1 + 1 + 1  # c2p, p2c
    scale = math.sqrt(query_layer.shape[-1] * scale_factor)
    attention_scores = query_layer @ (key_layer.transpose(0, 2, 1) / scale)

    # disentangled_attention_bias
    relative_pos = _hf_build_relative_position(
        query_layer.shape[-2], key_layer.shape[-2], position_buckets, max_relative_positions
    )[:, None]  # bsz x height x query x key
    att_span = position_buckets  # pos_ebd_size
    rel = rel_embeddings[0 : att_span * 2, :][None]
    batch = query_layer.shape[0] // heads
    pos_query_layer = np.tile(transpose_for_scores(linear(rel, "query_proj"), heads), (batch, 1, 1))
    pos_key_layer = np.tile(transpose_for_scores(linear(rel, "key_proj"), heads), (batch, 1, 1))
    score = 0
    # content -> position
    scale = math.sqrt(pos_key_layer.shape[-1] * scale_factor)
    c2p_att = query_layer @ pos_key_layer.transpose(0, 2, 1)
    c2p_pos = np.clip(relative_pos + att_span, 0, att_span * 2 - 1)
    index = np.broadcast_to(c2p_pos[0], (*query_layer.shape[:2], relative_pos.shape[-1]))
    score = score + np.take_along_axis(c2p_att, index, axis=-1) / scale
    # position -> content (Lq = Lk: r_pos = relative_pos)
    scale = math.sqrt(pos_query_layer.shape[-1] * scale_factor)
    p2c_pos = np.clip(-relative_pos + att_span, 0, att_span * 2 - 1)
    p2c_att = key_layer @ pos_query_layer.transpose(0, 2, 1)
    index = np.broadcast_to(p2c_pos[0], (query_layer.shape[0], *key_layer.shape[1:2] * 2))
    score = score + np.take_along_axis(p2c_att, index, axis=-1).transpose(0, 2, 1) / scale

    attention_scores = (attention_scores + score).reshape(-1, heads, *attention_scores.shape[1:])
    attention_scores = np.where(attention_mask, attention_scores, np.finfo(np.float64).min)
    attention_scores = attention_scores - attention_scores.max(axis=-1, keepdims=True)
    probs = np.exp(attention_scores)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    context = probs.reshape(-1, *probs.shape[2:]) @ value_layer
    context = context.reshape(-1, heads, *context.shape[1:]).transpose(0, 2, 1, 3)
    return context.reshape(*context.shape[:2], -1)


def _deberta_case(seed=0):
    example = _load_example("deberta")
    p = example.inputs(seed)
    rng = np.random.default_rng(seed + 1)
    p["h"] = rng.normal(size=(BATCH, DEBERTA_LENGTH, p["h"].shape[-1]))
    lengths = np.array([DEBERTA_LENGTH, DEBERTA_LENGTH - 3])
    valid = np.arange(DEBERTA_LENGTH)[None, :] < lengths[:, None]
    # DebertaV2Model.get_attention_mask: key valid and query valid, (B, 1, L, L)
    mask = (valid[:, None, None, :] & valid[:, None, :, None]).astype(np.int64)
    weights = {}
    for name in ("query", "key", "value"):
        weights[f"{name}_proj.weight"] = p[f"w_{name[0]}"].T
        weights[f"{name}_proj.bias"] = p[f"b_{name[0]}"]
    expected = _hf_deberta_v2(
        p["h"], mask.astype(bool), p["rel_embeddings"], weights, heads=example.HEADS,
        position_buckets=POSITION_BUCKETS, max_relative_positions=MAX_RELATIVE_POSITIONS,
    )  # fmt: skip
    return example, p, mask, valid, expected


def test_deberta_phi_clips_at_both_ends():
    delta = np.arange(-(DEBERTA_LENGTH - 1), DEBERTA_LENGTH)
    bucket = _hf_make_log_bucket_position(-delta, POSITION_BUCKETS, MAX_RELATIVE_POSITIONS)
    phi = bucket + POSITION_BUCKETS
    assert phi.min() < 0 and phi.max() > 2 * POSITION_BUCKETS - 1


def test_deberta_v2_matches_hf_transcription(backend, dtype):
    example, p, mask, valid, expected = _deberta_case()
    xs = {name: backend.asarray(a, dtype) for name, a in p.items()}
    out = example.deberta_v2_self_attention(
        xs["h"], xs, mask=backend.asarray(mask.astype(bool)),
        position_buckets=POSITION_BUCKETS, max_position=MAX_RELATIVE_POSITIONS,
    )  # fmt: skip
    got = backend.to_host(out)
    # HF gives the padding queries (all keys masked) uniform weights; relattn gives them 0.
    expected = np.where(valid[..., None], expected, 0.0)
    backend.assert_close(out, expected, dtype)
    assert np.all(got[~valid] == 0)


def test_deberta_v2_against_transformers():
    """The real HF module with copied weights (skipped where transformers is not installed)."""
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    example, p, mask, valid, _ = _deberta_case()
    config = DebertaV2Config(
        hidden_size=p["h"].shape[-1], num_attention_heads=example.HEADS, intermediate_size=16,
        relative_attention=True, position_buckets=POSITION_BUCKETS,
        max_relative_positions=MAX_RELATIVE_POSITIONS, pos_att_type=["c2p", "p2c"],
        share_att_key=True, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
    )  # fmt: skip
    module = DisentangledSelfAttention(config).double().eval()
    with torch.no_grad():
        for name in ("query", "key", "value"):
            layer = getattr(module, f"{name}_proj")
            layer.weight.copy_(torch.from_numpy(p[f"w_{name[0]}"].T.copy()))
            layer.bias.copy_(torch.from_numpy(p[f"b_{name[0]}"]))
        result = module(
            torch.from_numpy(p["h"]), torch.from_numpy(mask), output_attentions=False,
            query_states=None, relative_pos=None,
            rel_embeddings=torch.from_numpy(p["rel_embeddings"]),
        )  # fmt: skip
    hf = (result[0] if isinstance(result, tuple) else result).numpy()
    ours = example.deberta_v2_self_attention(
        p["h"], p, mask=mask.astype(bool),
        position_buckets=POSITION_BUCKETS, max_position=MAX_RELATIVE_POSITIONS,
    )  # fmt: skip
    # transformers computes the scale √(3d) in float32 (scaled_size_sqrt: torch.tensor(d,
    # dtype=torch.float)), whatever the module's dtype: a relative error up to 6e-8 in every
    # score, about 1e-6 in the output. relattn's scale is float64.
    np.testing.assert_allclose(ours[valid], hf[valid], rtol=1e-5, atol=1e-7)


# ===============================================================================================
# TENER as released: fastnlp/TENER RelativeMultiHeadAttn.forward, transcribed
# ===============================================================================================


def _tener_get_embedding(num_embeddings, embedding_dim, padding_idx=None):
    """``RelativeSinusoidalPositionalEmbedding.get_embedding`` (in float64)."""
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = np.exp(np.arange(half_dim, dtype=np.float64) * -emb)
    emb = (
        np.arange(-num_embeddings // 2, num_embeddings // 2, dtype=np.float64)[:, None] * emb[None]
    )
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=1).reshape(num_embeddings, -1)
    if embedding_dim % 2 == 1:
        emb = np.concatenate([emb, np.zeros((num_embeddings, 1))], axis=1)
    if padding_idx is not None:
        emb[padding_idx, :] = 0
    origin_shift = num_embeddings // 2 + 1
    return emb, origin_shift


def _tener_pos_embed(seq_len, embedding_dim, padding_idx=0, init_size=1200):
    """``RelativeSinusoidalPositionalEmbedding(d_head, 0, 1200)(mask)``: positions -L … L-1."""
    weights, origin_shift = _tener_get_embedding(init_size + 1, embedding_dim, padding_idx)
    max_pos = padding_idx + seq_len
    if max_pos > origin_shift:
        weights, _ = _tener_get_embedding(max_pos * 2, embedding_dim, padding_idx)
        origin_shift = weights.shape[0] // 2
    positions = np.arange(-seq_len, seq_len) + origin_shift  # 2*seq_len
    return weights[positions]


def _tener_shift(BD):
    bsz, n_head, max_len, _ = BD.shape
    zero_pad = np.zeros((bsz, n_head, max_len, 1))
    BD = np.concatenate([BD, zero_pad], axis=-1).reshape(bsz, n_head, -1, max_len)
    BD = BD[:, :, :-1].reshape(bsz, n_head, max_len, -1)
    return BD[:, :, :, max_len:]


def _tener_transpose_shift(E):
    bsz, n_head, max_len, _ = E.shape
    zero_pad = np.zeros((bsz, n_head, max_len, 1))
    E = np.concatenate([E, zero_pad], axis=-1).reshape(bsz, n_head, -1, max_len)
    indice = np.arange(max_len) * 2 + 1
    return E[:, :, indice].transpose(0, 1, 3, 2)


def _tener_released(x, mask, w_qkv, r_r_bias, r_w_bias, *, n_head, scale=False):
    """``RelativeMultiHeadAttn(d_model, n_head, dropout=0, scale=scale).forward(x, mask)``;
    ``w_qkv`` is ``qkv_linear.weight`` ``(3d, d)``."""
    batch_size, max_len, d_model = x.shape
    pos_embed = _tener_pos_embed(max_len, d_model // n_head)
    divisor = math.sqrt(d_model // n_head) if scale else 1
    qkv = x @ w_qkv.T
    q, k, v = np.split(qkv, 3, axis=-1)
    q = q.reshape(batch_size, max_len, n_head, -1).transpose(0, 2, 1, 3)
    k = k.reshape(batch_size, max_len, n_head, -1).transpose(0, 2, 1, 3)
    v = v.reshape(batch_size, max_len, n_head, -1).transpose(0, 2, 1, 3)
    rw_head_q = q + r_r_bias[:, None]
    AC = np.einsum("bnqd,bnkd->bnqk", rw_head_q, k)
    D_ = np.einsum("nd,ld->nl", r_w_bias, pos_embed)[None, :, None]
    B_ = np.einsum("bnqd,ld->bnql", q, pos_embed)
    E_ = np.einsum("bnqd,ld->bnql", k, pos_embed)
    BD = B_ + D_
    BDE = _tener_shift(BD) + _tener_transpose_shift(E_)
    attn = (AC + BDE) / divisor
    attn = np.where(mask[:, None, None, :] == 0, -np.inf, attn)
    attn = np.exp(attn - attn.max(axis=-1, keepdims=True))
    attn = attn / attn.sum(axis=-1, keepdims=True)
    return (attn @ v).transpose(0, 2, 1, 3).reshape(batch_size, max_len, d_model)


def _tener_inputs(example, seed=0):
    p = example.inputs(seed)
    lengths = np.asarray(example.LENGTHS)
    key_mask = np.arange(example.LENGTH)[None, :] < lengths[:, None]
    return p, key_mask


def test_tener_transcription_is_the_released_formula():
    """The transcription (pad/reshape tricks) scores (Q+u)·K + (Q+v)·R_{j-t} + K·R_{t-j}."""
    example = _load_example("tener_released")
    p, key_mask = _tener_inputs(example)
    for scale in (False, True):
        np.testing.assert_allclose(
            _tener_released(p["x"], key_mask.astype(np.int64), p["w_qkv"].T, p["r_r_bias"],
                            p["r_w_bias"], n_head=example.HEADS, scale=scale),
            example.loop_reference(p["x"], p, key_mask=key_mask, scale=scale),
            rtol=1e-12, atol=1e-12,
        )  # fmt: skip
    # the position table is the sinusoid of -L … L-1 with 10000^(-k/(d/2 - 1))
    table = _tener_pos_embed(5, 8)
    omega = 10000.0 ** (-np.arange(4) / 3)
    angles = np.arange(-5, 5)[:, None] * omega
    np.testing.assert_allclose(table, np.concatenate([np.sin(angles), np.cos(angles)], 1))
    # Beyond init_size / 2 the table is rebuilt, and its padding row is position -L (zeroed,
    # never read by the shifts, which reach -(L-1) … L-1).
    long = _tener_pos_embed(700, 8)
    assert np.all(long[0] == 0)
    angles = np.arange(-699, 700)[:, None] * omega
    np.testing.assert_allclose(long[1:], np.concatenate([np.sin(angles), np.cos(angles)], 1))


@pytest.mark.parametrize("scale", [False, True], ids=["scale-1", "scale-sqrt-d"])
def test_tener_released_matches_transcription(backend, dtype, scale):
    example = _load_example("tener_released")
    p, key_mask = _tener_inputs(example)
    expected = _tener_released(
        p["x"], key_mask.astype(np.int64), p["w_qkv"].T, p["r_r_bias"], p["r_w_bias"],
        n_head=example.HEADS, scale=scale,
    )  # fmt: skip
    xs = {name: backend.asarray(a, dtype) for name, a in p.items()}
    out = example.tener_released_layer(xs["x"], xs, mask=backend.asarray(key_mask), scale=scale)
    backend.assert_close(out, expected, dtype)


def test_tener_paper_form_differs_from_released(backend):
    """Checkpoints need the released form: the paper's (examples/tener.py) gives other numbers."""
    example = _load_example("tener_released")
    p, key_mask = _tener_inputs(example)
    xs = {name: backend.asarray(a, "float64") for name, a in p.items()}
    mask = backend.asarray(key_mask)
    released = backend.to_host(example.tener_released_layer(xs["x"], xs, mask=mask))
    paper = backend.to_host(example.paper_layer(xs["x"], xs, mask=mask))
    assert np.abs(released - paper).max() > 0.1
    # the paper's form, per pair: (Q+u)·K + (Q+v)·R_{t-j}, Vaswani's frequencies, scale 1
    d_head = p["x"].shape[-1] // example.HEADS
    length = example.LENGTH
    table = reference.sinusoid(np.arange(length - 1, -length, -1), d_head, layout="concatenated")
    qkv = p["x"] @ p["w_qkv"]
    d = p["x"].shape[-1]
    outs = []
    for h in range(example.HEADS):
        c = slice(h * d_head, (h + 1) * d_head)
        outs.append(reference.relative_attention(
            qkv[..., c], qkv[..., d:][..., c], qkv[..., 2 * d:][..., c], table,
            p["r_r_bias"][h], p["r_w_bias"][h], mask=key_mask[:, None, :], scale=1.0,
        ))  # fmt: skip
    np.testing.assert_allclose(paper, np.concatenate(outs, axis=-1), rtol=1e-10, atol=1e-12)


# ===============================================================================================
# the examples' own checks
# ===============================================================================================


@pytest.mark.parametrize("name", ["deberta", "tener_released"])
def test_example_main(name, capsys):
    assert _load_example(name).main() < 1e-10
    assert "max |relattn - per-pair loop|" in capsys.readouterr().out
