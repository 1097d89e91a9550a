"""Per-distance biases (SPEC §2.10): relative_bias, T5 buckets, DeBERTa-v2 log buckets, ALiBi.

The references are written here from their sources and share no code with relattn:

- ``_expand_loop``: ``out[..., i, j] = values[..., δ(i, j) + Lk - 1]``, one pair at a time;
- ``_mesh_tf_bucket``: Mesh TensorFlow's ``transformer_layers._relative_position_bucket``,
  op for op (``mtf.to_float`` is float32; HF's T5 also takes the log in float32);
- ``_deberta_log_bucket``: DeBERTa-v2's ``make_log_bucket_position`` (the authors' NumPy
  version, float64);
- ``_get_slopes``: the ALiBi authors' ``get_slopes`` recursion;
- T5 and ALiBi attention: the bias of every ``(h, i, j)`` written out, then
  ``reference.attention`` (softmax one query at a time).

Attention goes through ``scaled_dot_product_attention(..., relative_bias=values)`` dense and
blockwise, on every backend, float32 and float64 (float16 and bfloat16 where they exist).
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
from hypothesis import example, given, settings
from hypothesis import strategies as st

import relattn

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (
    relattn.relative_bias_matrix,
    relattn.relative_position_bucket,
    relattn.log_bucket_position,
    relattn.scaled_dot_product_attention,
):
    lazy_xp_function(_function)

EXAMPLES = Path(__file__).parents[1] / "examples"
BLOCK_SIZES = (None, 4)  # dense, and blockwise with uneven blocks (test_blockwise: 1 and > L)


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


def _delta(i, j, lq, lk):
    """Key minus query, the last query aligned with the last key."""
    return j - (i + lk - lq)


def _expand_loop(values, lq, lk, dtype):
    """``out[..., i, j] = values[..., δ + Lk - 1]``; causal layout: ``finfo.min / 2`` for δ > 0."""
    values = np.asarray(values, dtype=np.float64)
    width = values.shape[-1]
    fill = float(np.finfo(dtype).min) / 2
    out = np.zeros((*values.shape[:-1], lq, lk))
    for i in range(lq):
        for j in range(lk):
            column = _delta(i, j, lq, lk) + lk - 1
            out[..., i, j] = values[..., column] if column < width else fill
    return out


def _mesh_tf_bucket(
    relative_position, bidirectional=True, num_buckets=32, max_distance=128, float_type=np.float32
):
    """Mesh TensorFlow ``_relative_position_bucket`` (T5), op for op; ``mtf.to_float`` is float32.

    ``relative_position = memory_position - query_position``; ``mtf.to_int32`` truncates.
    """
    ret = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int64) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    # now n is in the range [0, inf)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        val_if_large = max_exact + (
            np.log(n.astype(float_type) / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).astype(np.int64)
    val_if_large = np.minimum(val_if_large, num_buckets - 1)
    ret += np.where(is_small, n, val_if_large)
    return ret


def _deberta_log_bucket(relative_pos, bucket_size, max_position, float_type=np.float64):
    """DeBERTa-v2 ``make_log_bucket_position`` (the authors' NumPy version; HF's is float32)."""
    sign = np.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = np.where((relative_pos < mid) & (relative_pos > -mid), mid - 1, np.abs(relative_pos))
    with np.errstate(divide="ignore", invalid="ignore"):  # bucket_size 2: log(0)·0, not taken
        log_pos = (
            np.ceil(
                np.log(abs_pos.astype(float_type) / mid)
                / np.log(float_type((max_position - 1) / mid))
                * (mid - 1)
            )
            + mid
        )
    return np.where(abs_pos <= mid, relative_pos, log_pos * sign).astype(np.int64)


def _get_slopes(n):
    """ALiBi's ``get_slopes`` (github.com/ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + _get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def _pair_bias(lq, lk, heads, bias_of):
    """``bias[h, i, j] = bias_of(h, δ(i, j))`` and the causal ``δ <= 0`` mask, pair by pair."""
    bias = np.zeros((heads, lq, lk))
    past = np.zeros((lq, lk), bool)
    for i in range(lq):
        for j in range(lk):
            delta = _delta(i, j, lq, lk)
            past[i, j] = delta <= 0
            for h in range(heads):
                bias[h, i, j] = bias_of(h, delta)
    return bias, past


def test_references_agree_with_published_values():
    # T5's defaults, 32 buckets bidirectional: |δ| < 8 exact, δ > 0 in buckets 16 … 31.
    deltas = np.arange(-8, 9)
    expected = [-d if d <= 0 else 16 + d for d in deltas]
    np.testing.assert_array_equal(_mesh_tf_bucket(deltas), expected)
    assert _mesh_tf_bucket(np.array([-1000, 1000])).tolist() == [15, 31]
    # ALiBi paper, §3: 8 heads -> 1/2 … 1/2^8; 16 heads interleave the geometric means.
    assert _get_slopes(8) == [2.0**-h for h in range(1, 9)]
    assert _get_slopes(16)[:2] == pytest.approx([2**-0.5, 2**-1.0])
    # DeBERTa-v2: the identity inside ±mid, odd outside.
    r = np.arange(-50, 51)
    b = _deberta_log_bucket(r, 8, 64)
    np.testing.assert_array_equal(b[46:55], r[46:55])
    np.testing.assert_array_equal(b, -b[::-1])


# ===============================================================================================
# relative_bias
# ===============================================================================================

SHAPES = [(4, 4), (3, 5), (5, 3), (1, 4), (4, 1)]
SHAPE_IDS = ["self", "memory", "lq>lk", "one-query", "one-key"]


@pytest.mark.grid
@pytest.mark.parametrize("layout", ["full", "causal"])
@pytest.mark.parametrize(("lq", "lk"), SHAPES, ids=SHAPE_IDS)
def test_relative_bias_matches_pair_definition(backend, dtype, rng, lq, lk, layout):
    width = lq + lk - 1 if layout == "full" else lk
    values = rng.normal(size=(2, 3, width))
    out = relattn.relative_bias_matrix(backend.asarray(values, dtype), lq, lk)
    assert tuple(out.shape) == (2, 3, lq, lk)
    backend.assert_close(out, _expand_loop(values, lq, lk, dtype), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_relative_bias_low_precision(backend, rng, dtype):
    values = backend.asarray(rng.normal(size=(3, 5)), dtype)  # causal layout of (4, 5)
    out = relattn.relative_bias_matrix(values, 4, 5)
    xp = backend.xp
    fill = float(xp.finfo(backend.dtype(dtype)).min) / 2
    # The values as the backend holds them, rounded to ``dtype``: the expansion copies them,
    # and half of the most negative value is a power-of-2 scaling, exact; so all of it is.
    expected = _expand_loop(backend.to_host(values).astype(np.float64), 4, 5, "float64")
    expected[expected < -1e300] = fill
    backend.assert_close(out, expected, dtype)
    np.testing.assert_array_equal(backend.to_host(out).astype(np.float64), expected)
    assert (expected == fill).sum() == 3 * 6  # the pairs with δ > 0, for each of 3 rows


@settings(max_examples=50)
@example(lq=0, lk=3, lead=(), causal=False, seed=0)
@example(lq=3, lk=0, lead=(2,), causal=True, seed=0)
@example(lq=1, lk=1, lead=(), causal=True, seed=0)
@given(
    lq=st.integers(0, 7),
    lk=st.integers(0, 7),
    lead=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    causal=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_relative_bias_property(lq, lk, lead, causal, seed):
    if lq + lk == 0 and not causal:
        causal = True  # W = -1 does not exist
    width = lk if causal else lq + lk - 1
    values = np.random.default_rng(seed).normal(size=(*lead, width))
    out = relattn.relative_bias_matrix(values, lq, lk)
    np.testing.assert_array_equal(out, _expand_loop(values, lq, lk, "float64"))


# ===============================================================================================
# T5 buckets, DeBERTa-v2 log buckets, ALiBi slopes
# ===============================================================================================

DISTANCES = np.arange(-300, 301)

T5_CONFIGS = [
    (32, 128, True),  # T5
    (32, 128, False),  # T5 decoder
    (8, 20, True),
    (7, 20, True),  # odd: n = 3 per direction, bucket 6 unused
    (7, 20, False),  # odd: n = 7, 3 exact buckets, 4 logarithmic
    (33, 64, False),
    (5, 10, True),  # n = 2: one exact bucket per direction
    (2, 8, False),  # two buckets: δ >= 0 and δ < 0
    (16, 9, True),  # max_distance just above n/2
]


@pytest.mark.parametrize(("num_buckets", "max_distance", "bidirectional"), T5_CONFIGS)
def test_t5_bucket_matches_mesh_tensorflow(backend, num_buckets, max_distance, bidirectional):
    """T5's own defaults include boundaries that fall on whole numbers (δ = ±64 with 32
    buckets and max_distance 128): a device logarithm that is not correctly rounded (XLA's
    on CPU) would put them one bucket low.
    """
    expected = _mesh_tf_bucket(DISTANCES, bidirectional, num_buckets, max_distance)
    # the float32 log of Mesh TensorFlow and HF gives the same buckets as float64 here
    np.testing.assert_array_equal(
        expected, _mesh_tf_bucket(DISTANCES, bidirectional, num_buckets, max_distance, np.float64)
    )
    distances = backend.asarray(DISTANCES.reshape(1, 601, 1))  # any shape
    out = relattn.relative_position_bucket(
        distances, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional
    )
    assert backend.is_array(out)
    assert backend.xp.isdtype(out.dtype, "integral")
    got = backend.to_host(out)
    assert got.shape == (1, 601, 1)
    np.testing.assert_array_equal(got.reshape(-1), expected)
    assert 0 <= got.min() and got.max() < num_buckets


@pytest.mark.parametrize("num_buckets", [2, 3])
def test_t5_one_bucket_per_direction(backend, num_buckets):
    """n = 1 bucket per direction: Mesh TensorFlow divides by n/2 = 0; the only bucket is 0 (+1)."""
    with pytest.raises(ZeroDivisionError):
        _mesh_tf_bucket(DISTANCES, True, num_buckets, 8)
    out = relattn.relative_position_bucket(
        backend.asarray(DISTANCES), num_buckets=num_buckets, max_distance=8, bidirectional=True
    )
    np.testing.assert_array_equal(backend.to_host(out), (DISTANCES > 0).astype(np.int64))


def test_t5_bucket_with_relative_positions(backend):
    """Buckets of relative_positions (Lq, Lk) equal the loop over pairs (Lk > Lq, ends aligned)."""
    lq, lk = 5, 40
    positions = relattn.relative_positions(lq, lk, xp=backend.lib, device=backend.device)
    got = backend.to_host(relattn.relative_position_bucket(positions, num_buckets=16))
    for i in range(lq):
        for j in range(lk):
            assert got[i, j] == _mesh_tf_bucket(np.array(_delta(i, j, lq, lk)), True, 16, 128)


# (8, 8) and (16, 12): ln((max_position - 1) / mid) < 1, where one step of |r| skips a bucket.
DEBERTA_CONFIGS = [
    (256, 512),
    (8, 64),
    (4, 16),
    (5, 16),
    (2, 8),
    (32, 128),
    (16, 20),
    (8, 8),
    (16, 12),
]


@pytest.mark.parametrize(("bucket_size", "max_position"), DEBERTA_CONFIGS)
def test_log_bucket_position_matches_deberta_v2(backend, bucket_size, max_position):
    expected = _deberta_log_bucket(DISTANCES, bucket_size, max_position)
    # HF's float32 log gives the same buckets here
    np.testing.assert_array_equal(
        expected, _deberta_log_bucket(DISTANCES, bucket_size, max_position, np.float32)
    )
    out = relattn.log_bucket_position(
        backend.asarray(DISTANCES), bucket_size=bucket_size, max_position=max_position
    )
    assert backend.xp.isdtype(out.dtype, "integral")
    np.testing.assert_array_equal(backend.to_host(out), expected)


def test_alibi_slopes_match_authors(backend, dtype):
    for heads in range(1, 17):
        out = relattn.alibi_slopes(
            heads, dtype=backend.dtype(dtype), device=backend.device, xp=backend.lib
        )
        assert tuple(out.shape) == (heads,)
        backend.assert_close(out, np.asarray(_get_slopes(heads)), dtype)


def test_alibi_slopes_default_namespace():
    out = relattn.alibi_slopes(6)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, _get_slopes(6), rtol=1e-15)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: relattn.alibi_slopes(0), ValueError, "num_heads"),
        (lambda: relattn.alibi_slopes(2.0), TypeError, "num_heads"),
        (lambda: relattn.relative_position_bucket(np.arange(3), num_buckets=1), ValueError,
         "num_buckets"),
        (lambda: relattn.relative_position_bucket(np.arange(3), num_buckets=32, max_distance=8),
         ValueError, "max_distance"),
        (lambda: relattn.relative_position_bucket(np.arange(3.0)), TypeError, "distances"),
        (lambda: relattn.log_bucket_position(np.arange(3), bucket_size=8, max_position=5),
         ValueError, "max_position"),
        (lambda: relattn.log_bucket_position(np.arange(3), bucket_size=1, max_position=5),
         ValueError, "bucket_size"),
        (lambda: relattn.log_bucket_position(np.arange(3.0), bucket_size=8, max_position=64),
         TypeError, "distances"),
        (lambda: relattn.relative_bias_matrix(np.zeros(4), 3, 3), ValueError, "values"),
        (lambda: relattn.relative_bias_matrix(np.zeros(()), 3, 3), ValueError, "values"),
        (
            lambda: relattn.relative_bias_matrix(np.zeros(5, dtype=np.int64), 3, 3),
            TypeError,
            "values",
        ),
        (lambda: relattn.relative_bias_matrix(np.zeros(5), -1, 3), ValueError, "query_length"),
        (lambda: relattn.relative_bias_matrix(None, 3, 3), TypeError, "values"),
    ],
    ids=[
        "alibi-zero", "alibi-float", "t5-one-bucket", "t5-max-distance", "t5-float",
        "deberta-max-position", "deberta-bucket-size", "deberta-float", "bias-width",
        "bias-0d", "bias-int", "bias-negative-length", "bias-none",
    ],
)  # fmt: skip
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ===============================================================================================
# T5 and ALiBi attention through scaled_dot_product_attention(relative_bias=...)
# ===============================================================================================

BATCH, HEADS, D = 2, 3, 4

T5_ATTENTION = {
    # name: (Lq, Lk, bidirectional, causal flag, layout of the values)
    "encoder": (7, 7, True, False, "full"),
    "cross-lq<lk": (4, 9, True, False, "full"),
    "decoder-causal-flag": (4, 9, False, True, "full"),
    "decoder-causal-layout": (4, 9, False, False, "causal"),
}


def _qkv(rng, lq, lk, d=D, dv=3):
    return (
        rng.normal(size=(BATCH, HEADS, lq, d)),
        rng.normal(size=(BATCH, HEADS, lk, d)),
        rng.normal(size=(BATCH, HEADS, lk, dv)),
    )


def _t5_values(backend, table, lq, lk, *, bidirectional, causal_layout, max_distance):
    """``values (H, W)``: the table row of each column's bucket, in relattn calls."""
    xp = backend.xp
    distances = relattn.relative_distances(
        lq, lk, causal=causal_layout, xp=backend.lib, device=backend.device
    )
    buckets = relattn.relative_position_bucket(
        distances,
        num_buckets=table.shape[0],
        max_distance=max_distance,
        bidirectional=bidirectional,
    )
    return xp.matrix_transpose(xp.take(table, buckets, axis=0))


@pytest.mark.parametrize("case", list(T5_ATTENTION))
def test_t5_attention(backend, dtype, rng, case):
    lq, lk, bidirectional, causal, layout = T5_ATTENTION[case]
    num_buckets, max_distance = 8, 6  # saturates within the |δ| <= 8 of these lengths
    q, k, v = _qkv(rng, lq, lk)
    table = rng.normal(size=(num_buckets, HEADS))
    padding = np.ones((BATCH, 1, 1, lk), bool)
    padding[1, ..., lk - 2 :] = False  # the second sequence has two padding keys

    def t5(h, delta):
        return table[_mesh_tf_bucket(np.array(delta), bidirectional, num_buckets, max_distance), h]

    bias, past = _pair_bias(lq, lk, HEADS, t5)
    is_causal = causal or layout == "causal"
    mask = padding & past if is_causal else padding
    expected = reference.attention(q, k, v, mask=mask, bias=bias, scale=1.0)
    # the bias matters: without it the result is different
    assert np.abs(expected - reference.attention(q, k, v, mask=mask, scale=1.0)).max() > 1e-2

    values = _t5_values(
        backend,
        backend.asarray(table, dtype),
        lq,
        lk,
        bidirectional=bidirectional,
        causal_layout=layout == "causal",
        max_distance=max_distance,
    )
    xq, xk, xv = (backend.asarray(a, dtype) for a in (q, k, v))
    for block_size in BLOCK_SIZES:
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, mask=backend.asarray(padding), relative_bias=values,
            causal=causal, scale=1.0, block_size=block_size,
        )  # fmt: skip
        backend.assert_close(out, expected, dtype)


ALIBI_ATTENTION = {
    # name: (Lq, Lk, bidirectional)
    "causal": (6, 6, False),
    "causal-cache": (3, 8, False),
    "bidirectional-cross": (4, 7, True),
}


@pytest.mark.parametrize("case", list(ALIBI_ATTENTION))
def test_alibi_attention(backend, dtype, rng, case):
    lq, lk, bidirectional = ALIBI_ATTENTION[case]
    heads = 4
    q = rng.normal(size=(BATCH, heads, lq, D))
    k = rng.normal(size=(BATCH, heads, lk, D))
    v = rng.normal(size=(BATCH, heads, lk, 3))
    m = _get_slopes(heads)

    def alibi(h, delta):
        return -m[h] * abs(delta) if bidirectional else m[h] * delta

    bias, past = _pair_bias(lq, lk, heads, alibi)
    expected = reference.attention(q, k, v, mask=None if bidirectional else past, bias=bias)

    slopes = relattn.alibi_slopes(
        heads, dtype=backend.dtype(dtype), device=backend.device, xp=backend.lib
    )
    delta = relattn.relative_distances(
        lq, lk, causal=not bidirectional, xp=backend.lib, device=backend.device
    )
    delta = backend.xp.astype(delta, backend.dtype(dtype))
    if bidirectional:
        values = -slopes[:, None] * backend.xp.abs(delta)[None, :]  # full layout
    else:
        values = slopes[:, None] * delta[None, :]  # causal layout: W = Lk, δ > 0 masked
    xq, xk, xv = (backend.asarray(a, dtype) for a in (q, k, v))
    for block_size in BLOCK_SIZES:
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, relative_bias=values, block_size=block_size
        )
        backend.assert_close(out, expected, dtype)


@pytest.mark.parametrize("causal_layout", [False, True], ids=["full+causal", "causal-layout"])
def test_blockwise_equals_dense(backend, dtype, rng, causal_layout):
    """block_size 1, 3 and one larger than L equal the dense result and the loop, Lk > Lq."""
    lq, lk = 3, 5
    q, k, v = _qkv(rng, lq, lk)
    width = lk if causal_layout else lq + lk - 1
    values = rng.normal(size=(HEADS, width))
    bias, past = _pair_bias(
        lq, lk, HEADS, lambda h, delta: values[h, delta + lk - 1] if delta <= 0 else 0.0
    )
    expected = reference.attention(q, k, v, mask=past, bias=bias)
    xq, xk, xv, xb = (backend.asarray(a, dtype) for a in (q, k, v, values))
    dense = relattn.scaled_dot_product_attention(xq, xk, xv, relative_bias=xb, causal=True)
    backend.assert_close(dense, expected, dtype)
    for block_size in (1, 3, 64):
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, relative_bias=xb, causal=not causal_layout, block_size=block_size
        )
        backend.assert_close(out, backend.to_host(dense), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_fully_masked_rows_are_zero(backend, dtype, rng):
    """Lq > Lk with the causal layout: the first Lq - Lk queries have no key; one sequence is
    all padding. Their rows are exactly 0, never NaN, dense and blockwise, in every dtype."""
    lq, lk = 5, 3
    q, k, v = _qkv(rng, lq, lk)
    values = rng.normal(size=(HEADS, lk))  # causal layout
    padding = np.ones((BATCH, 1, 1, lk), bool)
    padding[1] = False
    bias, past = _pair_bias(
        lq, lk, HEADS, lambda h, delta: values[h, delta + lk - 1] if delta <= 0 else 0.0
    )
    expected = reference.attention(q, k, v, mask=padding & past, bias=bias)
    assert np.all(expected[:, :, : lq - lk] == 0) and np.all(expected[1] == 0)
    xq, xk, xv, xb = (backend.asarray(a, dtype) for a in (q, k, v, values))
    for block_size in (None, 3):
        out = relattn.scaled_dot_product_attention(
            xq, xk, xv, mask=backend.asarray(padding), relative_bias=xb, block_size=block_size
        )
        backend.assert_close(out, expected, dtype)
        got = backend.to_host(backend.xp.astype(out, backend.dtype("float32")))
        assert np.isfinite(got).all()
        assert np.all(got[:, :, : lq - lk] == 0) and np.all(got[1] == 0)


def test_relative_bias_equals_its_expansion(backend, dtype, rng):
    """relative_bias=values gives the same as bias=relative_bias(values, Lq, Lk), both layouts."""
    lq, lk = 4, 6
    q, k, v = _qkv(rng, lq, lk)
    xq, xk, xv = (backend.asarray(a, dtype) for a in (q, k, v))
    for width in (lq + lk - 1, lk):
        values = backend.asarray(rng.normal(size=(HEADS, width)), dtype)
        expanded = relattn.relative_bias_matrix(values, lq, lk)
        causal = width == lk
        a = relattn.scaled_dot_product_attention(xq, xk, xv, relative_bias=values)
        b = relattn.scaled_dot_product_attention(xq, xk, xv, bias=expanded, causal=causal)
        backend.assert_close(a, backend.to_host(b), dtype)


# ===============================================================================================
# transforms: jit, gradients
# ===============================================================================================


def test_jit_equals_eager(jit_backend, dtype, rng):
    lq, lk, num_buckets = 3, 6, 8
    q, k, v = _qkv(rng, lq, lk)
    table = rng.normal(size=(num_buckets, HEADS))
    xp, lib, device = jit_backend.xp, jit_backend.lib, jit_backend.device

    def f(q, k, v, table):
        distances = relattn.relative_distances(lq, lk, xp=lib, device=device)
        buckets = relattn.relative_position_bucket(
            distances, num_buckets=num_buckets, max_distance=5, bidirectional=False
        )
        values = xp.matrix_transpose(xp.take(table, buckets, axis=0))
        return (
            relattn.scaled_dot_product_attention(q, k, v, relative_bias=values, causal=True),
            relattn.scaled_dot_product_attention(
                q, k, v, relative_bias=values, causal=True, block_size=3
            ),
            relattn.relative_bias_matrix(values, lq, lk),
        )

    arrays = [jit_backend.asarray(a, dtype) for a in (q, k, v, table)]
    eager = f(*arrays)
    compiled = jit_backend.jit(f)(*arrays)
    for a, b in zip(compiled, eager, strict=True):
        jit_backend.assert_close(a, jit_backend.to_host(b), dtype)

    def t5(h, delta):
        return table[_mesh_tf_bucket(np.array(delta), False, num_buckets, 5), h]

    bias, past = _pair_bias(lq, lk, HEADS, t5)
    jit_backend.assert_close(compiled[0], reference.attention(q, k, v, mask=past, bias=bias), dtype)


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("layout", ["full", "causal"])
def test_gradcheck(torch_backend, rng, layout, block_size):
    """Gradients w.r.t. q, k, v, the per-distance values and the T5 table they are gathered from."""
    torch = torch_backend.lib
    lq, lk = 3, 4
    width = lq + lk - 1 if layout == "full" else lk
    q, k, v = (a[:1, :2] for a in _qkv(rng, lq, lk, d=2, dv=2))
    leaves = tuple(
        torch_backend.asarray(a, "float64").requires_grad_(True)
        for a in (q, k, v, rng.normal(size=(2, width)))
    )
    mask = torch_backend.asarray(np.array([True, True, True, False]))  # a padding key

    def f(q, k, v, values):
        return relattn.scaled_dot_product_attention(
            q, k, v, relative_bias=values, mask=mask, causal=True, block_size=block_size
        )

    assert torch.autograd.gradcheck(f, leaves)
    f(*leaves).square().sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and torch.count_nonzero(leaf.grad) > 0
    if layout == "causal":
        return
    table = torch_backend.asarray(rng.normal(size=(4, 2)), "float64").requires_grad_(True)
    buckets = relattn.relative_position_bucket(
        relattn.relative_distances(lq, lk, xp=torch), num_buckets=4, max_distance=3
    )

    def g(table):
        return f(*leaves[:3], table[buckets].T)

    assert torch.autograd.gradcheck(g, (table,))


def test_jax_grad_matches_central_differences(jax_backend, rng):
    import jax
    import jax.numpy as jnp

    def on(a):
        return jax_backend.asarray(a, "float64")

    lq, lk = 3, 5
    q, k, v = _qkv(rng, lq, lk)
    params = [on(a) for a in (q, k, v, rng.normal(size=(HEADS, lk)))]  # causal layout values
    weights = on(rng.normal(size=(BATCH, HEADS, lq, 3)))

    def loss(p, block_size):
        out = relattn.scaled_dot_product_attention(
            *p[:3], relative_bias=p[3], block_size=block_size
        )
        return jnp.sum(out * weights)

    for block_size in (None, 3):
        f = jax.jit(lambda p, b=block_size: loss(p, b))
        grad = jax.jit(jax.grad(f))(params)
        assert float(jnp.abs(grad[3]).max()) > 0
        jax_backend.assert_directional_derivatives(f, grad, params, rng)


# ===============================================================================================
# examples/t5.py and examples/alibi.py
# ===============================================================================================


def _t5_example_reference(example, p, x, context, *, bidirectional, causal, key_mask):
    """The example's layer, attention from this file's Mesh TensorFlow buckets and loops."""
    heads, lq, lk = example.HEADS, x.shape[1], context.shape[1]
    dh = x.shape[-1] // heads

    def split(a):
        return a.reshape(a.shape[0], a.shape[1], heads, dh).transpose(0, 2, 1, 3)

    q, k, v = split(x @ p["w_q"]), split(context @ p["w_k"]), split(context @ p["w_v"])
    table = p["relative_table"]

    def t5(h, delta):
        bucket = _mesh_tf_bucket(
            np.array(delta), bidirectional, example.NUM_BUCKETS, example.MAX_DISTANCE
        )
        return table[bucket, h]

    bias, past = _pair_bias(lq, lk, heads, t5)
    mask = key_mask[:, None, None, :] & (past if causal else True)
    z = reference.attention(q, k, v, mask=mask, bias=bias, scale=1.0)
    return z.transpose(0, 2, 1, 3).reshape(x.shape) @ p["w_o"]


def test_t5_example(backend, dtype):
    example = _load_example("t5")
    p = example.inputs(0)
    xs = {name: backend.asarray(a, dtype) for name, a in p.items()}
    lengths = np.asarray(example.LENGTHS)
    key_mask = np.arange(example.LENGTH)[None, :] < lengths[:, None]
    encoder = example.encoder_self_attention(xs["x"], xs, backend.asarray(lengths))
    expected = _t5_example_reference(
        example, p, p["x"], p["x"], bidirectional=True, causal=False, key_mask=key_mask
    )
    backend.assert_close(encoder, expected, dtype)

    decoder = example.decoder_self_attention(xs["x"], xs["cache"], xs)
    context = np.concatenate((p["cache"], p["x"]), axis=1)
    expected = _t5_example_reference(
        example, p, p["x"], context, bidirectional=False, causal=True,
        key_mask=np.ones((2, context.shape[1]), bool),
    )  # fmt: skip
    backend.assert_close(decoder, expected, dtype)


def test_alibi_example(backend, dtype):
    example = _load_example("alibi")
    p = example.inputs(0)
    xs = {name: backend.asarray(a, dtype) for name, a in p.items()}
    heads = example.HEADS
    m = _get_slopes(heads)
    for cache in (None, "prompt"):
        x = p["x"] if cache else p["prompt"]
        context = np.concatenate((p["prompt"], x), axis=1) if cache else x
        lq, lk, dh = x.shape[1], context.shape[1], x.shape[-1] // heads

        def split(a, lq=lq, dh=dh):
            return a.reshape(a.shape[0], a.shape[1], heads, dh).transpose(0, 2, 1, 3)

        bias, past = _pair_bias(lq, lk, heads, lambda h, delta: m[h] * delta)
        z = reference.attention(
            split(x @ p["w_q"]), split(context @ p["w_k"]), split(context @ p["w_v"]),
            mask=past, bias=bias,
        )  # fmt: skip
        expected = z.transpose(0, 2, 1, 3).reshape(x.shape) @ p["w_o"]
        out = example.alibi_self_attention(
            xs["x"] if cache else xs["prompt"], xs, cache=xs["prompt"] if cache else None
        )
        backend.assert_close(out, expected, dtype)


@pytest.mark.parametrize("name", ["t5", "alibi"])
def test_example_main(name, capsys):
    worst = _load_example(name).main()
    assert worst < 1e-10
    assert "max |relattn - per-pair loop|" in capsys.readouterr().out
