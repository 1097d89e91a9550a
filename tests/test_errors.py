"""Bad input raises ValueError or TypeError with a message naming the argument.

The checks read metadata only (type, dtype, shape), so every backend raises the
same error with the same message. Where the checks' code differs by library
(dtype objects, array types, arrays of two libraries, what the values allow) a
test runs on every backend (``backend``); the checks of shapes, values and
Python arguments run on ``checks_backend``, one target per path the checks take
(``CHECK_TARGETS`` in ``conftest.py``; ``-m full_matrix`` runs them on the
others).
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import array_api_compat
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn
from relattn.capabilities import SETTINGS, unsupported
from relattn.testing import assert_close, target


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
    ("pe-base-0", lambda b: _pe(b, 3, 4, base=0.0), V, r"^base must be positive and finite, got 0"),
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
                r">= 0, got -1",
            ),
            (
                relattn.relative_distances,
                "key_length",
                0,
                lambda b: relattn.relative_distances(3, -5, xp=b.lib),
                V,
                r">= 0, got -5",
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
                lambda b: relattn.relative_positions(-1, 3, xp=b.lib),
                V,
                r">= 0, got -1",
            ),
            (
                relattn.relative_positions,
                "key_length",
                -2,
                lambda b: relattn.relative_positions(3, -2, xp=b.lib),
                V,
                r">= 0, got -2",
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
                r">= 0, got -1",
            ),
            (
                relattn.causal_mask,
                "key_length",
                -1,
                lambda b: relattn.causal_mask(2, -1, xp=b.lib),
                V,
                r">= 0, got -1",
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
                r">= 0, got -3",
            ),
            (
                relattn.forward_mask,
                "length",
                0,
                lambda b: relattn.forward_mask(-3, xp=b.lib),
                V,
                r">= 0, got -3",
            ),
            (
                relattn.backward_mask,
                "length",
                -1,
                lambda b: relattn.backward_mask(-1, xp=b.lib),
                V,
                r">= 0, got -1",
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
                lambda b: relattn.rel_shift(_f(b, 3, 2), -1),
                V,
                r">= 0, got -1",
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
                r">= 0, got -4",
            ),
            (
                relattn.relative_table,
                "query_length",
                -1,
                lambda b: relattn.relative_table(_f(b, 3, 4), -1, 3),
                V,
                r">= 0, got -1",
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


def _errors(exc: type[Exception]) -> list[Any]:
    return [pytest.param(call, match, id=name) for name, call, e, match in ERRORS if e is exc]


@pytest.mark.parametrize(("call", "match"), _errors(ValueError))
def test_bad_value_raises(checks_backend, call, match):
    """Shapes and values: metadata that every library reports alike."""
    with pytest.raises(ValueError, match=match) as info:
        call(checks_backend)
    assert type(info.value) is ValueError


@pytest.mark.parametrize(("call", "match"), _errors(TypeError))
def test_bad_type_raises(backend, call, match):
    """Types and dtypes: each library has its own dtype objects and array types."""
    with pytest.raises(TypeError, match=match) as info:
        call(backend)
    assert type(info.value) is TypeError


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
        np.testing.assert_array_equal(backend.to_host(out), expected)
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

    if {first, second} in ({"numpy", "jax.numpy"}, {"numpy", "dask.array"}):
        # JAX and Dask take NumPy operands themselves, and so does relattn (issue 12).
        other = first if first != "numpy" else second
        out = call(maker(first), maker(second))
        assert type(out).__module__.partition(".")[0] in ({"jax", "jaxlib"} if "jax" in other
                                                          else {"dask"})  # fmt: skip
        return
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
    "mixed_rotary_frequencies": lambda xp: relattn.mixed_rotary_frequencies(8, 2, xp=xp),
    "grid_positions": lambda xp: relattn.grid_positions(2, 3, xp=xp),
    "grid_positions[reference_shape]": lambda xp: relattn.grid_positions(
        2, 4, reference_shape=(4, 4), merge_size=2, xp=xp
    ),
    "grid_relative_index": lambda xp: relattn.grid_relative_index(2, 3, xp=xp),
    "shifted_window_mask": lambda xp: relattn.shifted_window_mask(4, 4, 2, 1, xp=xp),
    "continuous_position_coordinates": lambda xp: relattn.continuous_position_coordinates(3, xp=xp),
    "sinusoidal_position_encoding": lambda xp: relattn.sinusoidal_position_encoding(3, 4, xp=xp),
    "relative_distances": lambda xp: relattn.relative_distances(2, 3, xp=xp),
    "relative_positions": lambda xp: relattn.relative_positions(2, 3, xp=xp),
    "causal_mask": lambda xp: relattn.causal_mask(2, 3, xp=xp),
    "local_window_mask": lambda xp: relattn.local_window_mask(2, 3, 1, xp=xp),
    "forward_mask": lambda xp: relattn.forward_mask(3, xp=xp),
    "backward_mask": lambda xp: relattn.backward_mask(3, xp=xp),
    "diagonal_disabled_mask": lambda xp: relattn.diagonal_disabled_mask(3, xp=xp),
    "rope_frequencies": lambda xp: relattn.rope_frequencies(4, xp=xp),
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


# ============================================================================================
# Every public function × every class of bad input × every backend
# ============================================================================================
#
# SIGNATURES describes one valid call of each public function that takes arrays: its
# required and optional array arguments (shape and kind: "f" real floating, "c" complex,
# "i" integer, "b" boolean) and a call that takes them from a dict. The classes of bad
# input below are generated from it, so a new function only needs its row here — and
# ``test_every_public_function_is_covered`` fails until it has one.


@dataclasses.dataclass(frozen=True)
class Signature:
    call: Callable[[dict[str, Any]], Any]
    required: dict[str, tuple[tuple[int, ...], str]]
    optional: dict[str, tuple[tuple[int, ...], str]] = dataclasses.field(default_factory=dict)
    #: name -> (shapes that differ from ``required``/``optional``, expected result shape)
    empty: dict[str, tuple[dict[str, tuple[int, ...]], tuple[int, ...]]] = dataclasses.field(
        default_factory=dict
    )
    #: Arguments that accept a Python integer instead of an array (no "not an array" case).
    scalar_ok: tuple[str, ...] = ()
    #: Required arguments that may be None (a term left out).
    nullable: tuple[str, ...] = ()
    #: name -> a dtype kind that is wrong for it, where the default one is not.
    wrong: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Arguments of any dtype (no wrong-dtype case).
    any_dtype: tuple[str, ...] = ()
    #: Arguments that may be 0-d (they broadcast), where the default shape has axes.
    zero_d_ok: tuple[str, ...] = ()


def _attention_empties(table: str | None = None, width: Callable[[int, int], int] | None = None):
    """Lq = 0, Lk = 0 and a batch of 0 for an attention function ``(B, Lq, d) …``."""

    def shapes(b, lq, lk):
        out = {"q": (b, lq, 4), "k": (b, lk, 4), "v": (b, lk, 2)}
        if table is not None:
            out[table] = (width(lq, lk), 4)
        return out

    return {
        "Lq=0": (shapes(2, 0, 5), (2, 0, 2)),
        "Lk=0": (shapes(2, 3, 0), (2, 3, 2)),
        "batch=0": (shapes(0, 3, 5), (0, 3, 2)),
    }


_QKV = {"q": ((2, 3, 4), "f"), "k": ((2, 5, 4), "f"), "v": ((2, 5, 2), "f")}
_ATTENTION_OPTIONAL = {
    "mask": ((3, 5), "b"),
    "bias": ((3, 5), "f"),
    "relative_bias": ((7,), "f"),
}


def _grid_mod_call(table: Any) -> Any:
    """grid_bias_mod's score_mod run blockwise over a 3×2 grid, q = k = v from the table."""
    mod = relattn.grid_bias_mod(table, 3, 2)
    x = table[None, :, :6, None]  # (1, H, 6, 1)
    return relattn.scaled_dot_product_attention(x, x, x, score_mod=mod, block_size=4)


def _full(lq: int, lk: int) -> int:
    return lq + lk - 1


SIGNATURES: dict[str, Signature] = {
    "fire_bias": Signature(
        lambda a: relattn.fire_bias(
            a["query_positions"],
            a["key_positions"],
            [a["weights"]],
            [a["biases"]],
            a["c"],
            a["threshold"],
        ),
        {
            "query_positions": ((3,), "i"),
            "key_positions": ((5,), "i"),
            "weights": ((1, 2), "f"),
            "biases": ((2,), "f"),
            "c": ((), "f"),
            "threshold": ((), "f"),
        },
        empty={
            "Lq=0": ({"query_positions": (0,)}, (2, 0, 5)),
            "Lk=0": ({"key_positions": (0,)}, (2, 3, 0)),
            "heads=0": ({"weights": (1, 0), "biases": (0,)}, (0, 3, 5)),
        },
        scalar_ok=("c", "threshold"),
        wrong={"query_positions": "b", "key_positions": "b"},
    ),
    "fire_score_mod": Signature(
        lambda a: relattn.scaled_dot_product_attention(
            a["q"],
            a["k"],
            a["v"],
            causal=True,
            score_mod=relattn.fire_score_mod([a["weights"]], [a["biases"]], a["c"], a["threshold"]),
        ),
        {
            "weights": ((1, 2), "f"),
            "biases": ((2,), "f"),
            "c": ((), "f"),
            "threshold": ((), "f"),
            "q": ((2, 3, 4), "f"),
            "k": ((2, 5, 4), "f"),
            "v": ((2, 5, 2), "f"),
        },
        scalar_ok=("c", "threshold"),
    ),
    "dynamic_position_bias": Signature(
        lambda a: relattn.dynamic_position_bias(
            a["distances"], [a["weights"]], [a["biases"]], log_distance=True
        ),
        {"distances": ((7,), "i"), "weights": ((1, 2), "f"), "biases": ((2,), "f")},
        empty={
            "W=0": ({"distances": (0,)}, (2, 0)),
            "heads=0": ({"weights": (1, 0), "biases": (0,)}, (0, 7)),
        },
        zero_d_ok=("distances",),
    ),
    "cope_bias": Signature(
        lambda a: relattn.cope_bias(a["q"], a["k"], a["embeddings"], mask=a.get("mask")),
        {"q": ((2, 3, 4), "f"), "k": ((2, 5, 4), "f"), "embeddings": ((6, 4), "f")},
        {"mask": ((3, 5), "b")},
        empty={
            "Lq=0": ({"q": (2, 0, 4)}, (2, 0, 5)),
            "Lk=0": ({"k": (2, 0, 4)}, (2, 3, 0)),
            "batch=0": ({"q": (0, 3, 4), "k": (0, 5, 4)}, (0, 3, 5)),
        },
        zero_d_ok=("mask",),
    ),
    "xpos_embedding": Signature(
        lambda a: relattn.xpos_embedding(
            a["x"], a.get("positions"), layout="interleaved", frequencies=a.get("frequencies")
        ),
        {"x": ((2, 3, 4), "f")},
        {"positions": ((3,), "i"), "frequencies": ((2,), "f")},
        {"L=0": ({"x": (2, 0, 4), "positions": (0,)}, (2, 0, 4))},
        wrong={"positions": "b"},
    ),
    "multimodal_rotary_embedding": Signature(
        lambda a: relattn.multimodal_rotary_embedding(
            a["x"], a["positions"], mrope_section=[1, 0, 1], frequencies=a.get("frequencies")
        ),
        {"x": ((2, 3, 4), "f"), "positions": ((3, 3), "i")},
        {"frequencies": ((2,), "f")},
        {"L=0": ({"x": (2, 0, 4), "positions": (0, 3)}, (2, 0, 4))},
        wrong={"positions": "b"},
    ),
    "axial_rotary_embedding": Signature(
        lambda a: relattn.axial_rotary_embedding(
            a["x"], a["positions"], layout="interleaved", frequencies=a.get("frequencies")
        ),
        {"x": ((2, 3, 4), "f"), "positions": ((3, 2), "i")},
        {"frequencies": ((1,), "f")},
        {"L=0": ({"x": (2, 0, 4), "positions": (0, 2)}, (2, 0, 4))},
        wrong={"positions": "b"},
    ),
    "mixed_rotary_embedding": Signature(
        lambda a: relattn.mixed_rotary_embedding(
            a["x"], a["positions"], a["frequencies"], layout="interleaved"
        ),
        {"x": ((2, 3, 4), "f"), "positions": ((3, 2), "i"), "frequencies": ((2, 2, 2), "f")},
        empty={"L=0": ({"x": (2, 0, 4), "positions": (0, 2)}, (2, 0, 4))},
        wrong={"positions": "b"},
    ),
    "rope_index": Signature(
        lambda a: relattn.rope_index(
            a["input_ids"],
            image_token_id=7,
            video_token_id=8,
            image_grid_thw=a.get("image_grid_thw"),
            video_grid_thw=a.get("video_grid_thw"),
            attention_mask=a.get("attention_mask"),
            second_per_grid_ts=a.get("second_per_grid_ts"),
            tokens_per_second=2,
        )[0],
        {"input_ids": ((2, 5), "i")},
        {
            "image_grid_thw": ((0, 3), "i"),
            "video_grid_thw": ((0, 3), "i"),
            "attention_mask": ((2, 5), "b"),
            "second_per_grid_ts": ((0,), "f"),
        },
        {"L=0": ({"input_ids": (2, 0), "attention_mask": (2, 0)}, (2, 0, 3))},
        wrong={"input_ids": "f", "attention_mask": "f"},
    ),
    "decomposed_relative_attention": Signature(
        lambda a: relattn.decomposed_relative_attention(
            a["q"], a["k"], a["v"], a["table_h"], a["table_w"], query_grid=(2, 3), key_grid=(1, 2)
        ),
        {
            "q": ((2, 6, 4), "f"),
            "k": ((2, 2, 4), "f"),
            "v": ((2, 2, 2), "f"),
            "table_h": ((3, 4), "f"),
            "table_w": ((5, 4), "f"),
        },
        empty={"batch=0": ({"q": (0, 6, 4), "k": (0, 2, 4), "v": (0, 2, 2)}, (0, 6, 2))},
    ),
    "decomposed_relative_terms": Signature(
        lambda a: relattn.decomposed_relative_terms(
            a["q"], a["table_h"], a["table_w"], (2, 3), (1, 2)
        )[0],
        {"q": ((2, 6, 4), "f"), "table_h": ((3, 4), "f"), "table_w": ((5, 4), "f")},
        empty={"batch=0": ({"q": (0, 6, 4)}, (0, 6, 1))},
    ),
    "resize_relative_table": Signature(
        lambda a: relattn.resize_relative_table(a["table"], 5),
        {"table": ((3, 4), "f")},
        empty={"d=0": ({"table": (3, 0)}, (5, 0))},
    ),
    "grid_relative_bias": Signature(
        lambda a: relattn.grid_relative_bias(a["table"], 3, 2),
        {"table": ((2, 15), "f")},
        empty={"heads=0": ({"table": (0, 15)}, (0, 6, 6))},
    ),
    "grid_bias_mod": Signature(lambda a: _grid_mod_call(a["table"]), {"table": ((2, 15), "f")}),
    "window_partition": Signature(
        lambda a: relattn.window_partition(a["x"], 2),
        {"x": ((2, 4, 4, 3), "f")},
        empty={"batch=0": ({"x": (0, 4, 4, 3)}, (0, 4, 3))},
        any_dtype=("x",),
    ),
    "window_merge": Signature(
        lambda a: relattn.window_merge(a["windows"], 2, 4, 4),
        {"windows": ((8, 4, 3), "f")},
        empty={"batch=0": ({"windows": (0, 4, 3)}, (0, 4, 4, 3))},
        any_dtype=("windows",),
    ),
    "zigzag_shard": Signature(
        lambda a: relattn.zigzag_shard(a["x"], 2, axis=-2),
        {"x": ((2, 8, 3), "f")},
        empty={"batch=0": ({"x": (0, 8, 3)}, (0, 8, 3))},
        any_dtype=("x",),
    ),
    "zigzag_unshard": Signature(
        lambda a: relattn.zigzag_unshard(a["x"], 2, axis=-1),
        {"x": ((3, 8), "f")},
        empty={"batch=0": ({"x": (0, 8)}, (0, 8))},
        any_dtype=("x",),
    ),
    "continuous_position_bias": Signature(
        lambda a: relattn.continuous_position_bias(a["values"], 3, 2),
        {"values": ((2, 15), "f")},
        empty={"heads=0": ({"values": (0, 15)}, (0, 6, 6))},
    ),
    "scaled_dot_product_attention": Signature(
        lambda a: relattn.scaled_dot_product_attention(
            a["q"],
            a["k"],
            a["v"],
            mask=a.get("mask"),
            bias=a.get("bias"),
            relative_bias=a.get("relative_bias"),
        ),
        dict(_QKV),
        dict(_ATTENTION_OPTIONAL),
        _attention_empties(),
        zero_d_ok=("mask", "bias"),
    ),
    "relative_attention": Signature(
        lambda a: relattn.relative_attention(
            a["q"],
            a["k"],
            a["v"],
            a["position_table"],
            content_bias=a.get("content_bias"),
            position_bias=a.get("position_bias"),
            mask=a.get("mask"),
            bias=a.get("bias"),
            relative_bias=a.get("relative_bias"),
            value_table=a.get("value_table"),
        ),
        {**_QKV, "position_table": ((7, 4), "f")},
        {
            **_ATTENTION_OPTIONAL,
            "content_bias": ((4,), "f"),
            "position_bias": ((4,), "f"),
            "value_table": ((7, 2), "f"),
        },
        _attention_empties("position_table", _full),
        nullable=("position_table",),
        zero_d_ok=("mask", "bias", "content_bias", "position_bias"),
    ),
    "shaw_attention": Signature(
        lambda a: relattn.shaw_attention(
            a["q"],
            a["k"],
            a["v"],
            a["key_embeddings"],
            a.get("value_embeddings"),
            mask=a.get("mask"),
            bias=a.get("bias"),
            relative_bias=a.get("relative_bias"),
        ),
        {**_QKV, "key_embeddings": ((5, 4), "f")},
        {**_ATTENTION_OPTIONAL, "value_embeddings": ((3, 2), "f")},
        _attention_empties(),
        nullable=("key_embeddings",),
        zero_d_ok=("mask", "bias"),
    ),
    "disentangled_attention": Signature(
        lambda a: relattn.disentangled_attention(
            a["q"],
            a["k"],
            a["v"],
            a["position_table"],
            a["query_position_table"],
            mask=a.get("mask"),
            bias=a.get("bias"),
            relative_bias=a.get("relative_bias"),
        ),
        {**_QKV, "position_table": ((7, 4), "f"), "query_position_table": ((7, 4), "f")},
        dict(_ATTENTION_OPTIONAL),
        {
            name: ({**shapes, "position_table": (w, 4), "query_position_table": (w, 4)}, out)
            for (name, (shapes, out)), w in zip(
                _attention_empties().items(), (4, 2, 7), strict=True
            )
        },
        nullable=("position_table", "query_position_table"),
        zero_d_ok=("mask", "bias"),
    ),
    "complex_attention": Signature(
        lambda a: relattn.complex_attention(a["q"], a["k"], a["v"], mask=a.get("mask")),
        {"q": ((2, 3, 4), "c"), "k": ((2, 5, 4), "c"), "v": ((2, 5, 2), "c")},
        {"mask": ((3, 5), "b")},
        {
            "Lq=0": ({"q": (2, 0, 4)}, (2, 0, 2)),
            "Lk=0": ({"k": (2, 0, 4), "v": (2, 0, 2)}, (2, 3, 2)),
        },
        wrong={"v": "i"},
        zero_d_ok=("mask",),
    ),
    "complex_linear": Signature(
        lambda a: relattn.complex_linear(a["x"], a["weight"], bias=a.get("bias")),
        {"x": ((3, 4), "c"), "weight": ((4, 2), "c")},
        {"bias": ((2,), "c")},
        {"L=0": ({"x": (0, 4)}, (0, 2))},
        wrong={"x": "i", "bias": "i"},
        zero_d_ok=("bias",),
    ),
    "complex_order_embedding": Signature(
        lambda a: relattn.complex_order_embedding(
            a["amplitude"], a["frequency"], a["phase"], a["positions"]
        ),
        {
            "amplitude": ((3, 4), "f"),
            "frequency": ((3, 4), "f"),
            "phase": ((3, 4), "f"),
            "positions": ((3,), "i"),
        },
        wrong={"positions": "b"},
        empty={
            "L=0": (
                {"amplitude": (0, 4), "frequency": (0, 4), "phase": (0, 4), "positions": (0,)},
                (0, 4),
            )
        },
    ),
    "masked_softmax": Signature(
        lambda a: relattn.masked_softmax(a["scores"], a.get("mask")),
        {"scores": ((2, 3, 5), "f")},
        {"mask": ((3, 5), "b")},
        {"Lk=0": ({"scores": (2, 3, 0)}, (2, 3, 0)), "Lq=0": ({"scores": (2, 0, 5)}, (2, 0, 5))},
        zero_d_ok=("mask",),
    ),
    "dot_product_scores": Signature(
        lambda a: relattn.dot_product_scores(a["q"], a["k"]),
        {"q": ((3, 4), "f"), "k": ((5, 4), "f")},
        empty={"Lq=0": ({"q": (0, 4)}, (0, 5)), "Lk=0": ({"k": (0, 4)}, (3, 0))},
    ),
    "scaled_dot_product_scores": Signature(
        lambda a: relattn.scaled_dot_product_scores(a["q"], a["k"]),
        {"q": ((3, 4), "f"), "k": ((5, 4), "f")},
        empty={"Lq=0": ({"q": (0, 4)}, (0, 5)), "Lk=0": ({"k": (0, 4)}, (3, 0))},
    ),
    "cosine_scores": Signature(
        lambda a: relattn.cosine_scores(a["q"], a["k"]),
        {"q": ((3, 4), "f"), "k": ((5, 4), "f")},
        empty={"Lq=0": ({"q": (0, 4)}, (0, 5)), "d=0": ({"q": (3, 0), "k": (5, 0)}, (3, 5))},
    ),
    "bilinear_scores": Signature(
        lambda a: relattn.bilinear_scores(a["q"], a["k"], a["weight"]),
        {"q": ((3, 4), "f"), "k": ((5, 2), "f"), "weight": ((4, 2), "f")},
        empty={"Lq=0": ({"q": (0, 4)}, (0, 5)), "Lk=0": ({"k": (0, 2)}, (3, 0))},
    ),
    "additive_scores": Signature(
        lambda a: relattn.additive_scores(
            a["q"], a["k"], a["query_weight"], a["key_weight"], a["v"], bias=a.get("bias")
        ),
        {
            "q": ((3, 4), "f"),
            "k": ((5, 2), "f"),
            "query_weight": ((4, 6), "f"),
            "key_weight": ((2, 6), "f"),
            "v": ((6,), "f"),
        },
        {"bias": ((6,), "f")},
        {"Lq=0": ({"q": (0, 4)}, (0, 5)), "Lk=0": ({"k": (0, 2)}, (3, 0))},
    ),
    "location_scores": Signature(
        lambda a: relattn.location_scores(a["q"], a["weight"]),
        {"q": ((3, 4), "f"), "weight": ((4, 6), "f")},
        empty={"Lq=0": ({"q": (0, 4)}, (0, 6))},
    ),
    "relative_scores": Signature(
        lambda a: relattn.relative_scores(a["q"], a["table"], 5, bias=a.get("bias")),
        {"q": ((3, 4), "f"), "table": ((7, 4), "f")},
        {"bias": ((4,), "f")},
        {"Lq=0": ({"q": (0, 4), "table": (4, 4)}, (0, 5))},
        zero_d_ok=("bias",),
    ),
    "relative_bias_matrix": Signature(
        lambda a: relattn.relative_bias_matrix(a["values"], 3, 5),
        {"values": ((2, 7), "f")},
        empty={"heads=0": ({"values": (0, 7)}, (0, 3, 5))},
    ),
    "relative_position_bucket": Signature(
        lambda a: relattn.relative_position_bucket(a["distances"]),
        {"distances": ((7,), "i")},
        empty={"W=0": ({"distances": (0,)}, (0,))},
        zero_d_ok=("distances",),
    ),
    "log_bucket_position": Signature(
        lambda a: relattn.log_bucket_position(a["distances"], bucket_size=8, max_position=64),
        {"distances": ((7,), "i")},
        empty={"W=0": ({"distances": (0,)}, (0,))},
        zero_d_ok=("distances",),
    ),
    "kerple_bias": Signature(
        lambda a: relattn.kerple_bias(a["distances"], a["r1"], a["r2"], kind="power"),
        {"distances": ((7,), "i"), "r1": ((2,), "f"), "r2": ((2,), "f")},
        empty={
            "W=0": ({"distances": (0,)}, (2, 0)),
            "heads=0": ({"r1": (0,), "r2": (0,)}, (0, 7)),
        },
        zero_d_ok=("distances",),
    ),
    "sandwich_bias": Signature(
        lambda a: relattn.sandwich_bias(a["distances"], 8, num_heads=2),
        {"distances": ((7,), "i")},
        empty={"W=0": ({"distances": (0,)}, (2, 0))},
        zero_d_ok=("distances",),
    ),
    "rotary_position_embedding": Signature(
        lambda a: relattn.rotary_position_embedding(
            a["x"], a.get("positions"), layout="interleaved", frequencies=a.get("frequencies")
        ),
        {"x": ((2, 3, 4), "f")},
        {"positions": ((3,), "i"), "frequencies": ((2,), "f")},
        {"L=0": ({"x": (2, 0, 4), "positions": (0,)}, (2, 0, 4))},
        wrong={"positions": "b"},
    ),
    "rel_shift": Signature(
        lambda a: relattn.rel_shift(a["x"], 5),
        {"x": ((2, 3, 7), "f")},
        empty={"Lq=0": ({"x": (2, 0, 4)}, (2, 0, 5))},
        any_dtype=("x",),
    ),
    "rel_unshift": Signature(
        lambda a: relattn.rel_unshift(a["x"]),
        {"x": ((2, 3, 5), "f")},
        empty={"Lq=0": ({"x": (2, 0, 5)}, (2, 0, 4)), "Lk=0": ({"x": (2, 3, 0)}, (2, 3, 2))},
        any_dtype=("x",),
    ),
    "relative_table": Signature(
        lambda a: relattn.relative_table(a["table"], 3, 5),
        {"table": ((5, 4), "f")},
        any_dtype=("table",),
    ),
    "mask_to_bias": Signature(
        lambda a: relattn.mask_to_bias(a["mask"], dtype=_dtype_of(a["mask"], "float64")),
        {"mask": ((3, 5), "b")},
        empty={"empty": ({"mask": (0, 5)}, (0, 5))},
        zero_d_ok=("mask",),
    ),
    "padding_mask": Signature(
        lambda a: relattn.padding_mask(a["lengths"], 4),
        {"lengths": ((3,), "i")},
        empty={"B=0": ({"lengths": (0,)}, (0, 4))},
    ),
    "split_heads": Signature(
        lambda a: relattn.split_heads(a["x"], 2),
        {"x": ((3, 4), "f")},
        empty={"L=0": ({"x": (0, 4)}, (2, 0, 2))},
        any_dtype=("x",),
    ),
    "merge_heads": Signature(
        lambda a: relattn.merge_heads(a["x"]),
        {"x": ((2, 3, 4), "f")},
        empty={"L=0": ({"x": (2, 0, 4)}, (0, 8))},
        any_dtype=("x",),
    ),
    "update_memory": Signature(
        lambda a: relattn.update_memory(a.get("memory"), a["hidden"], 3),
        {"hidden": ((2, 4), "f")},
        {"memory": ((3, 4), "f")},
        {"L=0": ({"hidden": (0, 4)}, (0, 4))},
    ),
    "stop_gradient": Signature(
        lambda a: relattn.stop_gradient(a["x"]),
        {"x": ((3,), "f")},
        any_dtype=("x",),
        zero_d_ok=("x",),
    ),
    "sinusoidal_position_encoding": Signature(
        lambda a: relattn.sinusoidal_position_encoding(
            a["positions"], 4, frequencies=a.get("frequencies")
        ),
        {"positions": ((3,), "f")},
        {"frequencies": ((2,), "f")},
        {"P=0": ({"positions": (0,)}, (0, 4))},
        scalar_ok=("positions",),
        wrong={"positions": "b"},
    ),
    "multi_dimensional_attention": Signature(
        lambda a: relattn.multi_dimensional_attention(
            a["h"], a["query_weight"], a["key_weight"], a["bias"], mask=a.get("mask")
        ),
        {
            "h": ((2, 3, 4), "f"),
            "query_weight": ((4, 4), "f"),
            "key_weight": ((4, 4), "f"),
            "bias": ((4,), "f"),
        },
        {"mask": ((3, 3), "b")},
        {"L=0": ({"h": (2, 0, 4)}, (2, 0, 4))},
        zero_d_ok=("mask",),
    ),
    "source2token_attention": Signature(
        lambda a: relattn.source2token_attention(
            a["h"], a["weight1"], a["bias1"], a["weight"], a["bias"], mask=a.get("mask")
        ),
        {
            "h": ((2, 3, 4), "f"),
            "weight1": ((4, 4), "f"),
            "bias1": ((4,), "f"),
            "weight": ((4, 4), "f"),
            "bias": ((4,), "f"),
        },
        {"mask": ((3,), "b")},
        {"L=0": ({"h": (2, 0, 4)}, (2, 4))},
        zero_d_ok=("mask",),
    ),
    "predicted_positions": Signature(
        lambda a: relattn.predicted_positions(a["q"], a["weight"], a["v"], 5),
        {"q": ((3, 4), "f"), "weight": ((4, 6), "f"), "v": ((6,), "f")},
        empty={"Lq=0": ({"q": (0, 4)}, (0,))},
    ),
    "local_p_weights": Signature(
        lambda a: relattn.local_p_weights(a["scores"], a["positions"], 2, mask=a.get("mask")),
        {"scores": ((3, 5), "f"), "positions": ((3,), "f")},
        {"mask": ((3, 5), "b")},
        {"Lq=0": ({"scores": (0, 5), "positions": (0,)}, (0, 5))},
        wrong={"positions": "b"},
        zero_d_ok=("mask",),
    ),
}

SIGNATURES["attention_block"] = Signature(
    lambda a: (
        relattn.attention_block(
            a["q"],
            a["k"],
            a["v"],
            a["position_table"],
            query_start=1,
            key_start=2,
            query_length=5,
            key_length=7,
            content_bias=a.get("content_bias"),
            position_bias=a.get("position_bias"),
            value_table=a.get("value_table"),
            relative_bias=a.get("relative_bias"),
            mask=a.get("mask"),
            bias=a.get("bias"),
        ).accumulator
    ),
    {
        "q": ((2, 3, 4), "f"),
        "k": ((2, 5, 4), "f"),
        "v": ((2, 5, 2), "f"),
        "position_table": ((11, 4), "f"),
    },
    {
        "content_bias": ((4,), "f"),
        "position_bias": ((4,), "f"),
        "value_table": ((11, 2), "f"),
        "relative_bias": ((11,), "f"),
        "mask": ((3, 5), "b"),
        "bias": ((3, 5), "f"),
    },
    nullable=("position_table",),
    zero_d_ok=("mask", "bias", "content_bias", "position_bias"),
)

#: Public names that take a BlockState (tested below) or run only inside jax.shard_map
#: (tests/test_devices.py), or are a type.
OTHER = {
    "BlockState", "finish_block_state", "merge_block_states", "ring_attention",
    "ulysses_attention", *SETTINGS,
}  # fmt: skip

#: Public functions without array arguments: they take ``xp=`` (see CREATION above).
NO_ARRAYS = {
    "mixed_rotary_frequencies",
    "continuous_position_coordinates",
    "grid_positions",
    "grid_relative_index",
    "shifted_window_mask",
    "alibi_slopes",
    "backward_mask",
    "causal_mask",
    "diagonal_disabled_mask",
    "forward_mask",
    "inverse_frequencies",
    "local_window_mask",
    "relative_distances",
    "relative_positions",
    "rope_frequencies",
}

_KIND_DTYPES = {"f": "float64", "c": "complex128", "i": "int64", "b": "bool"}


def _dtype_of(x: Any, name: str) -> Any:
    """The dtype ``name`` of ``x``'s library (NumPy's when ``x`` is not an array)."""
    if not array_api_compat.is_array_api_obj(x):
        return getattr(np, name)
    return getattr(array_api_compat.array_namespace(x), name)


def _make(b: Any, shape: tuple[int, ...], kind: str, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    if kind == "f":
        a = rng.normal(size=shape)
    elif kind == "c":
        a = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    elif kind == "i":
        a = rng.integers(0, 4, size=shape)
    else:
        a = rng.random(shape) < 0.7
    return b.asarray(a, _KIND_DTYPES[kind])


def _arrays(b: Any, sig: Signature, *, optional: tuple[str, ...] = (), **shapes: Any) -> dict:
    specs = {**sig.required, **{n: sig.optional[n] for n in optional}}
    return {
        name: _make(b, shapes.get(name, shape), kind, seed)
        for seed, (name, (shape, kind)) in enumerate(specs.items())
    }


def _cases(select: Callable[[str, Signature], list]) -> list:
    return [
        pytest.param(name, *case, id="-".join([name, *(str(c) for c in case)]))
        for name, sig in SIGNATURES.items()
        for case in select(name, sig)
    ]


def test_every_public_function_is_covered():
    """A new public function needs a row in SIGNATURES (or NO_ARRAYS and CREATION)."""
    missing = set(relattn.__all__) - set(SIGNATURES) - NO_ARRAYS - OTHER
    assert not missing, f"add these to SIGNATURES in tests/test_errors.py: {sorted(missing)}"
    assert set(SIGNATURES) | NO_ARRAYS | OTHER <= set(relattn.__all__)
    assert NO_ARRAYS - {"alibi_slopes", "inverse_frequencies"} <= set(CREATION)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_row_is_a_valid_call(backend, name):
    """The rows themselves are right: every optional array given, the call succeeds."""
    sig = SIGNATURES[name]
    out = sig.call(_arrays(backend, sig, optional=tuple(sig.optional)))
    assert backend.is_array(out)


_NOT_ARRAYS = {"None": None, "list": [[1.0, 2.0]], "float": 1.5}


@pytest.mark.parametrize(
    ("name", "arg", "what"),
    _cases(
        lambda name, sig: [
            (arg, what)
            for arg in sig.required
            for what in _NOT_ARRAYS
            if not (arg in sig.scalar_ok and what == "float")
            and not (arg in sig.nullable and what == "None")
        ]
    ),
)
def test_missing_array_is_a_type_error(checks_backend, name, arg, what):
    sig = SIGNATURES[name]
    arrays = _arrays(checks_backend, sig)
    arrays[arg] = _NOT_ARRAYS[what]
    with pytest.raises(TypeError, match=rf"^{arg} must be an array.*got {what}") as info:
        sig.call(arrays)
    assert type(info.value) is TypeError


@pytest.mark.parametrize(
    ("name", "arg", "what"),
    _cases(lambda name, sig: [(arg, what) for arg in sig.optional for what in ("list", "float")]),
)
def test_optional_argument_not_an_array_is_a_type_error(checks_backend, name, arg, what):
    sig = SIGNATURES[name]
    arrays = _arrays(checks_backend, sig)
    arrays[arg] = _NOT_ARRAYS[what]
    with pytest.raises(TypeError, match=rf"^{arg} must be an array.*got {what}"):
        sig.call(arrays)


_WRONG_KIND = {"f": "i", "c": "f", "i": "f", "b": "f"}


@pytest.mark.parametrize(
    ("name", "arg"),
    _cases(
        lambda name, sig: [
            (arg,) for arg in (*sig.required, *sig.optional) if arg not in sig.any_dtype
        ]
    ),
)
def test_wrong_dtype_is_a_type_error_naming_the_argument(backend, name, arg):
    sig = SIGNATURES[name]
    shape, kind = {**sig.required, **sig.optional}[arg]
    arrays = _arrays(backend, sig, optional=(arg,) if arg in sig.optional else ())
    arrays[arg] = _make(backend, shape, sig.wrong.get(arg, _WRONG_KIND[kind]))
    with pytest.raises(TypeError, match=rf"^{arg} must "):
        sig.call(arrays)


@pytest.mark.parametrize(
    ("name", "arg"),
    _cases(
        lambda name, sig: [
            (arg,)
            for arg, (shape, _) in {**sig.required, **sig.optional}.items()
            if shape and arg not in sig.zero_d_ok
        ]
    ),
)
def test_zero_dimensional_array_is_rejected_naming_the_argument(checks_backend, name, arg):
    """A 0-d array where an axis is needed: ValueError naming the argument (never IndexError)."""
    sig = SIGNATURES[name]
    _, kind = {**sig.required, **sig.optional}[arg]
    arrays = _arrays(checks_backend, sig, optional=(arg,) if arg in sig.optional else ())
    arrays[arg] = _make(checks_backend, (), kind)
    with pytest.raises((ValueError, TypeError), match=rf"^{arg} must "):
        sig.call(arrays)


def _other_library(b: Any) -> str:
    """A library whose arrays cannot join ``b``'s (JAX and Dask take NumPy's, not torch's)."""
    return "torch" if b.module in ("numpy", "jax.numpy", "dask.array") else "numpy"


def _mixable(name: str, sig: Signature) -> list[tuple[str]]:
    """The arguments of ``name`` that can come from another library than a second array's."""
    return [(arg,) for arg in (*sig.required, *sig.optional)
            if len(sig.required) + (arg in sig.optional) >= 2]  # fmt: skip


@pytest.mark.parametrize(("name", "arg"), _cases(_mixable))
def test_mixed_libraries_name_the_argument(backend, name, arg):
    sig = SIGNATURES[name]
    other = _other_library(backend)
    module = pytest.importorskip(other)
    arrays = _arrays(backend, sig, optional=(arg,) if arg in sig.optional else ())
    arrays[arg] = module.asarray(np.array(backend.to_host(arrays[arg])))
    with pytest.raises(TypeError, match=rf"different libraries.*{arg} is a {other}"):
        sig.call(arrays)


@pytest.mark.parametrize(("name", "arg"), _cases(_mixable))
@pytest.mark.parametrize("library", ["jax.numpy", "dask.array"])
def test_numpy_operands_join_jax_and_dask(library, name, arg):
    """JAX and Dask accept NumPy operands themselves: relattn converts them (SPEC §1)."""
    sig = SIGNATURES[name]
    other = target({"jax.numpy": "jax", "dask.array": "dask"}[library])
    if other.unavailable:
        pytest.skip(other.unavailable)
    optional = (arg,) if arg in sig.optional else ()
    numpy_arrays = _arrays(target("numpy"), sig, optional=optional)
    arrays = {n: other.from_host(a) for n, a in numpy_arrays.items()}
    arrays[arg] = numpy_arrays[arg]
    out = sig.call(arrays)
    assert other.is_array(out)
    assert_close(out, sig.call(numpy_arrays), dtype="float64")


@pytest.mark.parametrize(
    ("name", "case"), _cases(lambda name, sig: [(case,) for case in sig.empty])
)
def test_empty_axes(backend, name, case):
    """SPEC §1: Lq = 0 gives an empty result, Lk = 0 zeros, a batch of 0 an empty result."""
    sig = SIGNATURES[name]
    shapes, expected = sig.empty[case]
    optional = tuple(n for n in sig.optional if n in shapes)
    out = sig.call(_arrays(backend, sig, optional=optional, **shapes))
    assert tuple(out.shape) == expected
    host = backend.to_host(out)
    if host.dtype.kind in "fc":
        assert np.all(np.isfinite(host))
        if case == "Lk=0":
            assert np.all(host == 0)


ATTENTION = ("scaled_dot_product_attention", "relative_attention", "shaw_attention",
             "disentangled_attention")  # fmt: skip


def _attend(b: Any, name: str, **kw: Any) -> Any:
    sig = SIGNATURES[name]
    a = _arrays(b, sig)
    fn = getattr(relattn, name)
    return fn(*(a[n] for n in sig.required), **kw)


@pytest.mark.parametrize("name", [*ATTENTION, "complex_attention", "scaled_dot_product_scores"])
@pytest.mark.parametrize(
    ("scale", "error", "match"),
    [
        ("a", TypeError, r"^scale must be a real number, got str"),
        (True, TypeError, r"^scale must be a real number, got bool"),
        (float("nan"), ValueError, r"^scale must be finite"),
        (float("inf"), ValueError, r"^scale must be finite"),
        ([1.0], TypeError, r"^scale must be a real number, got list"),
    ],
    ids=["str", "bool", "nan", "inf", "list"],
)
def test_bad_scale(checks_backend, name, scale, error, match):
    with pytest.raises(error, match=match):
        _attend(checks_backend, name, scale=scale)


@pytest.mark.parametrize("name", ATTENTION)
@pytest.mark.parametrize("causal", ["yes", 1, None])
def test_causal_must_be_a_bool(checks_backend, name, causal):
    with pytest.raises(TypeError, match=r"^causal must be a bool"):
        _attend(checks_backend, name, causal=causal)


@pytest.mark.parametrize("name", ATTENTION)
@pytest.mark.parametrize(
    ("block_size", "error"),
    [
        (0, ValueError),
        (-2, ValueError),
        (2.5, TypeError),
        (True, TypeError),
        ((2, 0), ValueError),
        ((2, 2.5), TypeError),
        ((2, 3, 4), ValueError),
        ("8", TypeError),
    ],
)
def test_bad_block_size(checks_backend, name, block_size, error):
    with pytest.raises(error, match=r"^block_size(\[[01]\])? must be"):
        _attend(checks_backend, name, block_size=block_size)


@pytest.mark.parametrize("name", [*ATTENTION, "complex_attention", "scaled_dot_product_scores"])
def test_zero_features_need_an_explicit_scale(backend, name):
    """d = 0 with the default 1/√d: ValueError naming q; with a scale, a defined result."""
    sig = SIGNATURES[name]
    shapes = {n: (*s[:-1], 0) for n, (s, _) in sig.required.items() if n != "v"}
    arrays = _arrays(backend, sig, **shapes)
    fn = getattr(relattn, name)
    with pytest.raises(ValueError, match=r"^q must have a feature size d >= 1"):
        fn(*(arrays[n] for n in sig.required))
    out = fn(*(arrays[n] for n in sig.required), scale=1.0)
    assert np.all(np.isfinite(backend.to_host(out)))


@pytest.mark.parametrize(
    ("axis", "error", "match"),
    [
        (5, ValueError, r"^axis must be in \[-3, 3\).*got 5"),
        (-4, ValueError, r"^axis must be in \[-3, 3\)"),
        (1.5, TypeError, r"^axis must be an integer, got float"),
        (None, TypeError, r"^axis must be an integer, got NoneType"),
    ],
)
def test_masked_softmax_bad_axis(checks_backend, axis, error, match):
    with pytest.raises(error, match=match):
        relattn.masked_softmax(_f(checks_backend, 2, 3, 4), axis=axis)


@pytest.mark.parametrize("dtype", ["float32", "numpy.float32", "torch.float32", "strict.float32"])
# NumPy warns that it compares a strict dtype with its own: the comparison the test provokes.
@pytest.mark.filterwarnings("ignore:You are comparing a array_api_strict dtype:UserWarning")
def test_mask_to_bias_dtype_of_another_library(backend, dtype):
    """A string or another library's dtype is a TypeError naming dtype (never accepted by luck)."""
    if dtype == "float32":
        value: Any = "float32"
    else:
        library = {"numpy": "numpy", "torch": "torch", "strict": "array_api_strict"}[
            dtype.partition(".")[0]
        ]
        module = pytest.importorskip(library)
        if library == backend.module or (library == "numpy" and backend.module in
                                          ("jax.numpy", "dask.array")):  # fmt: skip
            pytest.skip("that library's dtype is this backend's own")
        value = module.float32
    with pytest.raises(TypeError, match=r"^dtype must be a"):
        relattn.mask_to_bias(_m(backend, 2, 2), dtype=value)


@pytest.mark.parametrize("kind", ["i", "b"])
@pytest.mark.parametrize("which", ["memory", "hidden"])
def test_update_memory_needs_floating_arrays(backend, kind, which):
    arrays = {"memory": _f(backend, 2, 4), "hidden": _f(backend, 3, 4)}
    arrays[which] = _make(backend, (2, 4) if which == "memory" else (3, 4), kind)
    with pytest.raises(TypeError, match=rf"^{which} must have a real floating dtype"):
        relattn.update_memory(arrays["memory"], arrays["hidden"], 3)


def test_wrong_key_features_are_reported_under_k(checks_backend):
    with pytest.raises(ValueError, match=r"^k must have 3 features to match weight"):
        relattn.bilinear_scores(
            _f(checks_backend, 3, 4), _f(checks_backend, 5, 2), _f(checks_backend, 4, 3)
        )
    with pytest.raises(ValueError, match=r"^k must have 2 features to match key_weight"):
        relattn.additive_scores(
            _f(checks_backend, 3, 4),
            _f(checks_backend, 5, 3),
            _f(checks_backend, 4, 6),
            _f(checks_backend, 2, 6),
            _f(checks_backend, 6),
        )


@pytest.mark.parametrize("fn", ["relative_distances", "relative_table"])
@pytest.mark.parametrize("causal", ["yes", 1])
def test_causal_flag_of_the_layout_functions(checks_backend, fn, causal):
    with pytest.raises(TypeError, match=r"^causal must be a bool"):
        if fn == "relative_distances":
            relattn.relative_distances(2, 3, causal=causal, xp=checks_backend.lib)
        else:
            relattn.relative_table(_f(checks_backend, 3, 2), 2, 3, causal=causal)


# --------------------------------------------------------------------------------------------
# Fuzz: random shapes, dtypes and missing arrays never escape as anything but
# ValueError / TypeError raised by relattn itself
# --------------------------------------------------------------------------------------------

_RELATTN_DIR = str(Path(relattn.__file__).parent)


def _raised_by_relattn(error: BaseException) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_RELATTN_DIR)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_fuzz_bad_input_is_a_clean_error(checks_backend, data):
    name = data.draw(st.sampled_from(sorted(SIGNATURES)), label="function")
    sig = SIGNATURES[name]
    arrays: dict[str, Any] = {}
    for arg, (_, kind) in {**sig.required, **sig.optional}.items():
        if arg in sig.optional and data.draw(st.booleans(), label=f"{arg} absent"):
            continue
        choice = data.draw(st.sampled_from(["array", "array", "array", "None", "list"]))
        if choice != "array":
            arrays[arg] = None if choice == "None" else [1.0]
            continue
        shape = tuple(data.draw(st.lists(st.integers(0, 4), max_size=3), label=f"{arg} shape"))
        drawn = data.draw(st.sampled_from([kind, kind, "f", "i", "b", "c"]), label=f"{arg} kind")
        arrays[arg] = _make(checks_backend, shape, drawn)
    try:
        out = sig.call(arrays)
    except (ValueError, TypeError) as e:
        assert _raised_by_relattn(e), f"{type(e).__name__} from inside a library: {e}"
        return
    host = checks_backend.to_host(out)
    if host.dtype.kind in "fc":
        assert not np.any(np.isnan(host)), "NaN in a result"


# --------------------------------------------------------------------------------------------
# Block states and the ring
# --------------------------------------------------------------------------------------------


def _state(b: Any, rows: int = 3) -> Any:
    q = _f(b, rows, 4)
    return relattn.attention_block(
        q, _f(b, 5, 4), _f(b, 5, 2), query_start=0, key_start=0, query_length=rows, key_length=5
    )


@pytest.mark.parametrize("bad", [None, [1.0], (1, 2, 3)], ids=["None", "list", "tuple"])
def test_block_states_must_be_block_states(checks_backend, bad):
    state = _state(checks_backend)
    with pytest.raises(TypeError, match=r"^state must be a BlockState"):
        relattn.finish_block_state(bad)
    with pytest.raises(TypeError, match=r"^b must be a BlockState"):
        relattn.merge_block_states(state, bad)
    if bad is None:
        return  # attention_block's default: no state yet
    with pytest.raises(TypeError, match=r"^state must be a BlockState"):
        relattn.attention_block(
            _f(checks_backend, 3, 4),
            _f(checks_backend, 5, 4),
            _f(checks_backend, 5, 2),
            query_start=0,
            key_start=0,
            query_length=3,
            key_length=5,
            state=bad,
        )


def test_block_states_of_other_queries(checks_backend):
    with pytest.raises(ValueError, match=r"^a and b must hold the same queries"):
        relattn.merge_block_states(_state(checks_backend, 3), _state(checks_backend, 2))
    with pytest.raises(ValueError, match=r"^state must hold these queries' statistics"):
        relattn.attention_block(
            _f(checks_backend, 2, 4),
            _f(checks_backend, 5, 4),
            _f(checks_backend, 5, 2),
            query_start=0,
            key_start=0,
            query_length=3,
            key_length=5,
            state=_state(checks_backend, 3),
        )


@pytest.mark.parametrize(
    ("starts", "error", "match"),
    [
        ((4, 0), ValueError, r"^query_start must place the block inside the problem"),
        ((0, 3), ValueError, r"^key_start must place the block inside the problem"),
        ((-1, 0), ValueError, r"^query_start must place the block"),
        ((1.5, 0), TypeError, r"^query_start must be an integer, got float"),
        ((0, True), TypeError, r"^key_start must be an integer, got bool"),
    ],
)
def test_block_outside_its_problem(checks_backend, starts, error, match):
    with pytest.raises(error, match=match):
        relattn.attention_block(
            _f(checks_backend, 3, 4),
            _f(checks_backend, 5, 4),
            _f(checks_backend, 5, 2),
            query_start=starts[0],
            key_start=starts[1],
            query_length=6,
            key_length=7,
        )


@pytest.mark.parametrize(
    ("block_size", "error"), [(0, ValueError), (2.5, TypeError), ((2, 0), ValueError)]
)
def test_bad_block_size_of_a_block(checks_backend, block_size, error):
    b = checks_backend
    with pytest.raises(error, match=r"^block_size(\[[01]\])? must be"):
        relattn.attention_block(
            _f(b, 3, 4), _f(b, 5, 4), _f(b, 5, 2), query_start=0, key_start=0,
            query_length=3, key_length=5, block_size=block_size,
        )  # fmt: skip


def test_block_table_is_the_whole_problems(checks_backend):
    with pytest.raises(ValueError, match=r"^position_table must have W = Lk = 7 rows"):
        relattn.attention_block(
            _f(checks_backend, 3, 4),
            _f(checks_backend, 5, 4),
            _f(checks_backend, 5, 2),
            _f(checks_backend, 8, 4),
            query_start=0,
            key_start=0,
            query_length=3,
            key_length=7,
        )


@pytest.mark.parametrize("name", ["ring_attention", "ulysses_attention"])
def test_context_parallel_needs_a_collective(backend, name):
    """Where relattn declares the ring missing (relattn.capabilities), the call says so."""
    if unsupported(name, backend.library, "run") is None:
        pytest.skip(f"{backend.name} runs it: see test_devices.py, test_torch_ring.py")
    with pytest.raises(TypeError, match=rf"^{name} needs JAX arrays inside jax.shard_map"):
        getattr(relattn, name)(
            _f(backend, 2, 3, 4), _f(backend, 2, 3, 4), _f(backend, 2, 3, 2), axis_name="seq"
        )
