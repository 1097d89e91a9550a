"""Bad input raises ValueError or TypeError with a message naming the argument.

The checks read metadata only (type, dtype, shape), so every backend raises the
same error with the same message: the table runs on every backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import relattn


def _f(b: Any, *shape: int) -> Any:
    """Floating (float64) backend array of ``shape``."""
    return b.asarray(np.random.default_rng(0).normal(size=shape), "float64")


def _i(b: Any, *shape: int) -> Any:
    """Integer backend array of ``shape``."""
    return b.asarray(np.ones(shape, dtype=np.int64))


def _m(b: Any, *shape: int) -> Any:
    """Boolean backend array of ``shape``, all True."""
    return b.asarray(np.ones(shape, dtype=bool))


def _sdpa(b: Any, q=(3, 4), k=(5, 4), v=(5, 2), **kw: Any) -> Any:
    return relattn.scaled_dot_product_attention(_f(b, *q), _f(b, *k), _f(b, *v), **kw)


def _rel(b: Any, q=(3, 4), k=(5, 4), v=(5, 2), table=(5, 4), **kw: Any) -> Any:
    return relattn.relative_attention(_f(b, *q), _f(b, *k), _f(b, *v), _f(b, *table), **kw)


def _pe(b: Any, positions: Any, d_model: Any, **kw: Any) -> Any:
    return relattn.sinusoidal_position_encoding(positions, d_model, xp=b.lib, device=b.device, **kw)


V, T = ValueError, TypeError

#: (id, call(backend), exception, regex the message must match)
ERRORS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    # -- sinusoidal_position_encoding --------------------------------------------------------
    ("pe-odd-d_model", lambda b: _pe(b, 4, 5), V, r"^d_model must be even.*got 5"),
    ("pe-odd-d_model-array", lambda b: _pe(b, _f(b, 3), 3), V, r"^d_model must be even.*got 3"),
    ("pe-d_model-0", lambda b: _pe(b, 4, 0), V, r"^d_model must be >= 1, got 0"),
    ("pe-d_model-negative", lambda b: _pe(b, 4, -2), V, r"^d_model must be >= 1, got -2"),
    ("pe-d_model-float", lambda b: _pe(b, 4, 4.0), T, r"^d_model must be an integer, got float"),
    ("pe-d_model-bool", lambda b: _pe(b, 4, True), T, r"^d_model must be an integer, got bool"),
    ("pe-layout", lambda b: _pe(b, 4, 4, layout="sideways"), V, r"^layout must be one of .*"),
    ("pe-positions-2d", lambda b: _pe(b, _f(b, 2, 3), 4), V, r"^positions .*shape \(2, 3\)"),
    ("pe-positions-negative", lambda b: _pe(b, -1, 4), V, r"^positions must be >= 0, got -1"),
    ("pe-positions-float", lambda b: _pe(b, 3.0, 4), T, r"^positions must be an array"),
    ("pe-positions-bool-array", lambda b: _pe(b, _m(b, 3), 4), T, r"^positions must be a real"),
    ("pe-base-0", lambda b: _pe(b, 3, 4, base=0.0), V, r"^base must be positive, got 0"),
    ("pe-dtype-int", lambda b: _pe(b, 3, 4, dtype=b.xp.int64), T, r"^dtype must be a real float"),
    # -- scaled_dot_product_attention ----------------------------------------------------------
    ("sdpa-feature", lambda b: _sdpa(b, k=(5, 3)), V, r"^k must have the feature size of q, d = 4"),
    ("sdpa-kv-length", lambda b: _sdpa(b, v=(4, 2)), V, r"^v must have one row per key, Lk = 5"),
    ("sdpa-q-1d", lambda b: _sdpa(b, q=(4,)), V, r"^q must have shape \(\.\.\., Lq, d\)"),
    ("sdpa-k-1d", lambda b: _sdpa(b, k=(4,)), V, r"^k must have shape \(\.\.\., Lk, d\)"),
    (
        "sdpa-leading",
        lambda b: _sdpa(b, q=(2, 3, 4), k=(3, 5, 4), v=(3, 5, 2)),
        V,
        r"leading .* q \(2,\), k \(3,\)",
    ),
    ("sdpa-mask-shape", lambda b: _sdpa(b, mask=_m(b, 3, 4)), V, r"^mask must be broadcastable"),
    ("sdpa-bias-shape", lambda b: _sdpa(b, bias=_f(b, 4, 5)), V, r"^bias must be broadcastable"),
    ("sdpa-mask-float", lambda b: _sdpa(b, mask=_f(b, 3, 5)), T, r"^mask must be a boolean"),
    ("sdpa-mask-int", lambda b: _sdpa(b, mask=_i(b, 3, 5)), T, r"^mask must be a boolean"),
    ("sdpa-bias-int", lambda b: _sdpa(b, bias=_i(b, 3, 5)), T, r"^bias must have a real float"),
    (
        "sdpa-q-int",
        lambda b: relattn.scaled_dot_product_attention(_i(b, 3, 4), _f(b, 5, 4), _f(b, 5, 2)),
        T,
        r"^q must have a real floating dtype",
    ),
    (
        "sdpa-v-int",
        lambda b: relattn.scaled_dot_product_attention(_f(b, 3, 4), _f(b, 5, 4), _i(b, 5, 2)),
        T,
        r"^v must have a real floating dtype",
    ),
    (
        "sdpa-q-list",
        lambda b: relattn.scaled_dot_product_attention([[1.0]], _f(b, 1, 1), _f(b, 1, 1)),
        T,
        r"^q must be an array, got list",
    ),
    # -- relative_attention --------------------------------------------------------------------
    ("rel-feature", lambda b: _rel(b, k=(5, 3)), V, r"^k must have the feature size of q, d = 4"),
    ("rel-kv-length", lambda b: _rel(b, v=(4, 2)), V, r"^v must have one row per key, Lk = 5"),
    (
        "rel-table-width",
        lambda b: _rel(b, table=(4, 4)),
        V,
        r"^position_table must have W = Lk = 5 rows .*W = Lq \+ Lk - 1 = 7 .*got W = 4",
    ),
    (
        "rel-table-width-too-wide",
        lambda b: _rel(b, table=(8, 4)),
        V,
        r"^position_table must have W .*got W = 8",
    ),
    (
        "rel-table-features",
        lambda b: _rel(b, table=(7, 3)),
        V,
        r"^position_table must have the feature size of q, d = 4",
    ),
    ("rel-table-1d", lambda b: _rel(b, table=(5,)), V, r"^position_table must have shape"),
    (
        "rel-table-leading",
        lambda b: _rel(b, q=(2, 3, 4), k=(2, 5, 4), v=(2, 5, 2), table=(3, 5, 4)),
        V,
        r"leading .*position_table \(3,\)",
    ),
    (
        "rel-content_bias-features",
        lambda b: _rel(b, content_bias=_f(b, 3)),
        V,
        r"^content_bias must be broadcastable to q \(3, 4\), got shape \(3,\)",
    ),
    (
        "rel-content_bias-lead",
        lambda b: _rel(b, q=(2, 3, 4), content_bias=_f(b, 5, 1, 4)),
        V,
        r"^content_bias must be broadcastable to q",
    ),
    (
        "rel-content_bias-grows-q",
        lambda b: _rel(b, content_bias=_f(b, 2, 1, 4)),
        V,
        r"^content_bias must be broadcastable to q",
    ),
    (
        "rel-position_bias",
        lambda b: _rel(b, position_bias=_f(b, 2, 4)),
        V,
        r"^position_bias must be broadcastable to q",
    ),
    ("rel-mask-float", lambda b: _rel(b, mask=_f(b, 3, 5)), T, r"^mask must be a boolean"),
    ("rel-mask-int", lambda b: _rel(b, mask=_i(b, 3, 5)), T, r"^mask must be a boolean"),
    ("rel-mask-shape", lambda b: _rel(b, mask=_m(b, 5, 3)), V, r"^mask must be broadcastable"),
    (
        "rel-q-int",
        lambda b: relattn.relative_attention(_i(b, 3, 4), _f(b, 5, 4), _f(b, 5, 2), _f(b, 5, 4)),
        T,
        r"^q must have a real floating dtype",
    ),
    (
        "rel-table-int",
        lambda b: relattn.relative_attention(_f(b, 3, 4), _f(b, 5, 4), _f(b, 5, 2), _i(b, 5, 4)),
        T,
        r"^position_table must have a real floating dtype",
    ),
    (
        "rel-content_bias-int",
        lambda b: _rel(b, content_bias=_i(b, 4)),
        T,
        r"^content_bias must have a real floating dtype",
    ),
    # -- masked_softmax ------------------------------------------------------------------------
    (
        "softmax-int",
        lambda b: relattn.masked_softmax(_i(b, 3, 4)),
        T,
        r"^scores must have a real floating dtype",
    ),
    (
        "softmax-mask-float",
        lambda b: relattn.masked_softmax(_f(b, 3, 4), _f(b, 3, 4)),
        T,
        r"^mask must be a boolean",
    ),
    (
        "softmax-mask-int",
        lambda b: relattn.masked_softmax(_f(b, 3, 4), _i(b, 3, 4)),
        T,
        r"^mask must be a boolean",
    ),
    (
        "softmax-mask-shape",
        lambda b: relattn.masked_softmax(_f(b, 3, 4), _m(b, 2, 3, 4)),
        V,
        r"^mask must be broadcastable to the scores",
    ),
    # -- relative_scores -----------------------------------------------------------------------
    (
        "scores-table-width",
        lambda b: relattn.relative_scores(_f(b, 3, 4), _f(b, 5, 4), 4),
        V,
        r"^table must have W = Lk = 4 rows",
    ),
    (
        "scores-table-features",
        lambda b: relattn.relative_scores(_f(b, 3, 4), _f(b, 6, 2), 4),
        V,
        r"^table must have the feature size of q",
    ),
    (
        "scores-bias",
        lambda b: relattn.relative_scores(_f(b, 3, 4), _f(b, 6, 4), 4, bias=_f(b, 3)),
        V,
        r"^bias must be broadcastable to q",
    ),
    (
        "scores-q-int",
        lambda b: relattn.relative_scores(_i(b, 3, 4), _f(b, 6, 4), 4),
        T,
        r"^q must have a real floating dtype",
    ),
    # -- lengths: negative or zero (ValueError), not an integer (TypeError) ---------------------
    *[
        (f"{fn.__name__}-{arg}-{value!r}", call, exc, rf"^{arg} must be {expect}")
        for fn, arg, value, call, exc, expect in [
            (
                relattn.relative_distances,
                "query_length",
                -1,
                lambda b: relattn.relative_distances(-1, 3, xp=b.lib),
                V,
                r">= 1, got -1",
            ),
            (
                relattn.relative_distances,
                "key_length",
                0,
                lambda b: relattn.relative_distances(3, 0, xp=b.lib),
                V,
                r">= 1, got 0",
            ),
            (
                relattn.relative_distances,
                "query_length",
                3.0,
                lambda b: relattn.relative_distances(3.0, 3, xp=b.lib),
                T,
                r"an integer, got float",
            ),
            (
                relattn.relative_distances,
                "key_length",
                True,
                lambda b: relattn.relative_distances(3, True, causal=True, xp=b.lib),
                T,
                r"an integer, got bool",
            ),
            (
                relattn.relative_positions,
                "query_length",
                0,
                lambda b: relattn.relative_positions(0, 3, xp=b.lib),
                V,
                r">= 1, got 0",
            ),
            (
                relattn.relative_positions,
                "key_length",
                -2,
                lambda b: relattn.relative_positions(3, -2, xp=b.lib),
                V,
                r">= 1, got -2",
            ),
            (
                relattn.relative_positions,
                "key_length",
                2.5,
                lambda b: relattn.relative_positions(3, 2.5, xp=b.lib),
                T,
                r"an integer, got float",
            ),
            (
                relattn.causal_mask,
                "query_length",
                -1,
                lambda b: relattn.causal_mask(-1, 2, xp=b.lib),
                V,
                r">= 1, got -1",
            ),
            (
                relattn.causal_mask,
                "key_length",
                -1,
                lambda b: relattn.causal_mask(2, -1, xp=b.lib),
                V,
                r">= 1, got -1",
            ),
            (
                relattn.causal_mask,
                "query_length",
                True,
                lambda b: relattn.causal_mask(True, 3, xp=b.lib),
                T,
                r"an integer, got bool",
            ),
            (
                relattn.local_window_mask,
                "window",
                -1,
                lambda b: relattn.local_window_mask(3, 3, -1, xp=b.lib),
                V,
                r">= 0, got -1",
            ),
            (
                relattn.local_window_mask,
                "window",
                1.5,
                lambda b: relattn.local_window_mask(3, 3, 1.5, xp=b.lib),
                T,
                r"an integer, got float",
            ),
            (
                relattn.local_window_mask,
                "query_length",
                -3,
                lambda b: relattn.local_window_mask(-3, 3, 1, xp=b.lib),
                V,
                r">= 1, got -3",
            ),
            (
                relattn.forward_mask,
                "length",
                0,
                lambda b: relattn.forward_mask(0, xp=b.lib),
                V,
                r">= 1, got 0",
            ),
            (
                relattn.backward_mask,
                "length",
                -1,
                lambda b: relattn.backward_mask(-1, xp=b.lib),
                V,
                r">= 1, got -1",
            ),
            (
                relattn.diagonal_disabled_mask,
                "length",
                2.0,
                lambda b: relattn.diagonal_disabled_mask(2.0, xp=b.lib),
                T,
                r"an integer, got float",
            ),
            (
                relattn.forward_mask,
                "length",
                False,
                lambda b: relattn.forward_mask(False, xp=b.lib),
                T,
                r"an integer, got bool",
            ),
            (
                relattn.padding_mask,
                "max_length",
                -1,
                lambda b: relattn.padding_mask(_i(b, 2), -1),
                V,
                r">= 0, got -1",
            ),
            (
                relattn.padding_mask,
                "max_length",
                3.0,
                lambda b: relattn.padding_mask(_i(b, 2), 3.0),
                T,
                r"an integer, got float",
            ),
            (
                relattn.update_memory,
                "memory_length",
                -1,
                lambda b: relattn.update_memory(_f(b, 2, 4), _f(b, 3, 4), -1),
                V,
                r">= 0, got -1",
            ),
            (
                relattn.update_memory,
                "memory_length",
                2.0,
                lambda b: relattn.update_memory(None, _f(b, 3, 4), 2.0),
                T,
                r"an integer, got float",
            ),
            (
                relattn.rel_shift,
                "key_length",
                0,
                lambda b: relattn.rel_shift(_f(b, 3, 2), 0),
                V,
                r">= 1, got 0",
            ),
            (
                relattn.rel_shift,
                "key_length",
                True,
                lambda b: relattn.rel_shift(_f(b, 1, 1), True),
                T,
                r"an integer, got bool",
            ),
            (
                relattn.relative_scores,
                "key_length",
                -4,
                lambda b: relattn.relative_scores(_f(b, 3, 4), _f(b, 6, 4), -4),
                V,
                r">= 1, got -4",
            ),
            (
                relattn.relative_table,
                "query_length",
                -1,
                lambda b: relattn.relative_table(_f(b, 3, 4), -1, 3),
                V,
                r">= 1, got -1",
            ),
            (
                relattn.relative_table,
                "key_length",
                3.0,
                lambda b: relattn.relative_table(_f(b, 3, 4), 3, 3.0),
                T,
                r"an integer, got float",
            ),
            (
                relattn.split_heads,
                "num_heads",
                0,
                lambda b: relattn.split_heads(_f(b, 3, 4), 0),
                V,
                r">= 1, got 0",
            ),
            (
                relattn.split_heads,
                "num_heads",
                2.0,
                lambda b: relattn.split_heads(_f(b, 3, 4), 2.0),
                T,
                r"an integer, got float",
            ),
        ]
    ],
    # -- padding_mask --------------------------------------------------------------------------
    (
        "padding-float-lengths",
        lambda b: relattn.padding_mask(_f(b, 3), 4),
        T,
        r"^lengths must have an integer dtype",
    ),
    (
        "padding-bool-lengths",
        lambda b: relattn.padding_mask(_m(b, 3), 4),
        T,
        r"^lengths must have an integer dtype",
    ),
    (
        "padding-2d-lengths",
        lambda b: relattn.padding_mask(_i(b, 2, 3), 4),
        V,
        r"^lengths must have shape \(B,\), got shape \(2, 3\)",
    ),
    ("padding-list", lambda b: relattn.padding_mask([1, 2], 4), T, r"^lengths must be an array"),
    # -- rel_shift / rel_unshift ---------------------------------------------------------------
    (
        "rel_shift-width",
        lambda b: relattn.rel_shift(_f(b, 3, 5), 4),
        V,
        r"^x must have width W = Lq \+ Lk - 1 = 6 .*Lk = 4 .*got W = 5",
    ),
    ("rel_shift-1d", lambda b: relattn.rel_shift(_f(b, 4), 4), V, r"^x must have shape"),
    ("rel_shift-list", lambda b: relattn.rel_shift([[1.0]], 1), T, r"^x must be an array"),
    ("rel_unshift-1d", lambda b: relattn.rel_unshift(_f(b, 4)), V, r"^x must have shape"),
    # -- relative_table ------------------------------------------------------------------------
    (
        "table-even-rows",
        lambda b: relattn.relative_table(_f(b, 4, 2), 3, 3),
        V,
        r"^table must have an odd number 2K\+1 of rows .*got 4",
    ),
    (
        "table-out_of_range",
        lambda b: relattn.relative_table(_f(b, 3, 2), 3, 3, out_of_range="wrap"),
        V,
        r"^out_of_range must be one of \('clip', 'zero'\), got 'wrap'",
    ),
    ("table-1d", lambda b: relattn.relative_table(_f(b, 3), 3, 3), V, r"^table must have shape"),
    # -- heads ---------------------------------------------------------------------------------
    (
        "split_heads-divide",
        lambda b: relattn.split_heads(_f(b, 2, 3, 6), 4),
        V,
        r"^num_heads must divide the last dimension of x, got num_heads = 4",
    ),
    ("split_heads-1d", lambda b: relattn.split_heads(_f(b, 6), 2), V, r"^x must have shape"),
    ("merge_heads-2d", lambda b: relattn.merge_heads(_f(b, 3, 4)), V, r"^x must have shape"),
    # -- update_memory -------------------------------------------------------------------------
    (
        "memory-features",
        lambda b: relattn.update_memory(_f(b, 2, 3, 4), _f(b, 2, 2, 5), 3),
        V,
        r"^memory and hidden must agree .*memory \(2, 3, 4\) and hidden \(2, 2, 5\)",
    ),
    (
        "memory-batch",
        lambda b: relattn.update_memory(_f(b, 3, 3, 4), _f(b, 2, 2, 4), 3),
        V,
        r"^memory and hidden must agree",
    ),
    ("memory-hidden-1d", lambda b: relattn.update_memory(None, _f(b, 4), 3), V, r"^hidden must"),
    (
        "memory-memory-1d",
        lambda b: relattn.update_memory(_f(b, 4), _f(b, 2, 4), 3),
        V,
        r"^memory must have shape",
    ),
    # -- mask_to_bias / stop_gradient ----------------------------------------------------------
    (
        "bias-dtype-int",
        lambda b: relattn.mask_to_bias(_m(b, 2, 2), dtype=b.xp.int64),
        T,
        r"^dtype must be a real floating dtype",
    ),
    (
        "bias-dtype-bool",
        lambda b: relattn.mask_to_bias(_m(b, 2, 2), dtype=b.xp.bool),
        T,
        r"^dtype must be a real floating dtype",
    ),
    (
        "bias-mask-float",
        lambda b: relattn.mask_to_bias(_f(b, 2, 2), dtype=b.xp.float32),
        T,
        r"^mask must be a boolean",
    ),
    (
        "bias-mask-int",
        lambda b: relattn.mask_to_bias(_i(b, 2, 2), dtype=b.xp.float32),
        T,
        r"^mask must be a boolean",
    ),
    ("stop_gradient-list", lambda b: relattn.stop_gradient([1.0]), T, r"^x must be an array"),
]


@pytest.mark.parametrize(
    ("call", "exc", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_bad_input_raises(backend, call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call(backend)
    assert type(info.value) is exc


def test_error_ids_are_unique():
    ids = [e[0] for e in ERRORS]
    assert len(ids) == len(set(ids))


def test_integer_like_lengths_are_accepted():
    """Lengths need ``operator.index``, not ``int``: NumPy integers are fine."""
    out = relattn.relative_distances(np.int64(2), np.int32(3))
    np.testing.assert_array_equal(out, [-2, -1, 0, 1])
    assert relattn.causal_mask(np.int64(2), 3).shape == (2, 3)


# --------------------------------------------------------------------------------------------
# padding_mask: negative lengths are a ValueError whenever the values can be read
# --------------------------------------------------------------------------------------------


def test_padding_mask_negative_length(backend):
    lengths = backend.asarray(np.array([2, -1, 3]))
    if backend.module == "dask.array":
        # A lazy graph cannot be read without computing it: the check is skipped.
        out = relattn.padding_mask(lengths, 3)
        expected = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]], bool)
        np.testing.assert_array_equal(backend.to_numpy(out), expected)
        return
    with pytest.raises(ValueError, match=r"^lengths must be >= 0, got a length of -1"):
        relattn.padding_mask(lengths, 3)


# --------------------------------------------------------------------------------------------
# Arrays of two libraries
# --------------------------------------------------------------------------------------------


def _lib_array(module: str, a: np.ndarray) -> Any:
    lib = pytest.importorskip(module)
    if module == "numpy":
        return np.array(a)
    if module == "array_api_strict":
        return lib.asarray(a)
    if module == "dask.array":
        return lib.from_array(a)
    return lib.asarray(a)


PAIRS = [
    ("numpy", "torch"),
    ("numpy", "jax.numpy"),
    ("torch", "array_api_strict"),
    ("torch", "numpy"),
    ("jax.numpy", "torch"),
    ("numpy", "dask.array"),
]

#: (id, call(first-library array maker, second-library array maker), first name, second name)
MIXED = [
    (
        "sdpa",
        lambda a, b: relattn.scaled_dot_product_attention(a(3, 4), b(5, 4), a(5, 2)),
        "q",
        "k",
    ),
    (
        "sdpa-bias",
        lambda a, b: relattn.scaled_dot_product_attention(a(3, 4), a(5, 4), a(5, 2), bias=b(3, 5)),
        "q",
        "bias",
    ),
    (
        "relative_attention-table",
        lambda a, b: relattn.relative_attention(a(3, 4), a(5, 4), a(5, 2), b(5, 4)),
        "q",
        "position_table",
    ),
    (
        "relative_attention-content_bias",
        lambda a, b: relattn.relative_attention(
            a(3, 4), a(5, 4), a(5, 2), a(5, 4), content_bias=b(4)
        ),
        "q",
        "content_bias",
    ),
    (
        "masked_softmax",
        lambda a, b: relattn.masked_softmax(a(3, 4), b(3, 4) > 0),
        "scores",
        "mask",
    ),
    (
        "relative_scores",
        lambda a, b: relattn.relative_scores(a(3, 4), b(6, 4), 4),
        "q",
        "table",
    ),
    (
        "update_memory",
        lambda a, b: relattn.update_memory(a(2, 4), b(3, 4), 3),
        "memory",
        "hidden",
    ),
]


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=["+".join(p) for p in PAIRS])
@pytest.mark.parametrize(
    ("call", "name_a", "name_b"), [m[1:] for m in MIXED], ids=[m[0] for m in MIXED]
)
def test_mixed_libraries_raise_type_error(first, second, call, name_a, name_b):
    rng = np.random.default_rng(0)

    def maker(module):
        return lambda *shape: _lib_array(module, rng.normal(size=shape))

    with pytest.raises(TypeError, match=r"different libraries") as info:
        call(maker(first), maker(second))
    message = str(info.value)
    top_a, top_b = first.partition(".")[0], second.partition(".")[0]
    assert f"{name_a} is a {top_a}" in message
    assert f"{name_b} is a {top_b}" in message  # JAX arrays are "jaxlib" ones


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=["+".join(p) for p in PAIRS])
def test_xp_not_matching_positions(first, second):
    positions = _lib_array(first, np.arange(3.0))
    other = pytest.importorskip(second)
    with pytest.raises(TypeError, match=r"^xp=.* does not match the library of positions"):
        relattn.sinusoidal_position_encoding(positions, 4, xp=other)


# --------------------------------------------------------------------------------------------
# xp that is not an array library
# --------------------------------------------------------------------------------------------

CREATION = {
    "sinusoidal_position_encoding": lambda xp: relattn.sinusoidal_position_encoding(3, 4, xp=xp),
    "relative_distances": lambda xp: relattn.relative_distances(2, 3, xp=xp),
    "relative_positions": lambda xp: relattn.relative_positions(2, 3, xp=xp),
    "causal_mask": lambda xp: relattn.causal_mask(2, 3, xp=xp),
    "local_window_mask": lambda xp: relattn.local_window_mask(2, 3, 1, xp=xp),
    "forward_mask": lambda xp: relattn.forward_mask(3, xp=xp),
    "backward_mask": lambda xp: relattn.backward_mask(3, xp=xp),
    "diagonal_disabled_mask": lambda xp: relattn.diagonal_disabled_mask(3, xp=xp),
}

BAD_XP = {
    "string": "numpy",
    "math": math,
    "object": object(),
    "numpy.linalg": np.linalg,
    "list": [],
}


@pytest.mark.parametrize("bad", sorted(BAD_XP))
@pytest.mark.parametrize("name", sorted(CREATION))
def test_xp_not_an_array_library(name, bad):
    with pytest.raises(TypeError, match=r"^xp must be an array library module"):
        CREATION[name](BAD_XP[bad])


def test_xp_top_level_jax_is_not_an_array_library():
    jax = pytest.importorskip("jax")
    with pytest.raises(TypeError, match=r"^xp must be an array library module"):
        relattn.causal_mask(2, 2, xp=jax)


@pytest.mark.parametrize(
    "module", ["numpy", "torch", "jax.numpy", "dask.array", "array_api_strict"]
)
def test_xp_library_modules_are_accepted(module):
    lib = pytest.importorskip(module)
    assert relattn.causal_mask(2, 2, xp=lib).shape == (2, 2)
