"""``rel_shift`` and ``rel_unshift`` against their gather definitions (SPEC §2.4, §5).

``rel_shift``:   ``out[..., i, j] = x[..., i, j - i + Lq - 1]``, 0 where that column is absent.
``rel_unshift``: ``out[..., i, j - i + Lq - 1] = x[..., i, j]``, 0 in the columns no key reaches.

Both are copies (no arithmetic), so results are compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from hypothesis import given, settings
from hypothesis import strategies as st

from relattn import rel_shift, rel_unshift

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
lazy_xp_function(rel_shift)
lazy_xp_function(rel_unshift)

#: Examples per backend and dtype. JAX compiles every new shape and Dask builds a graph per
#: call, so they get fewer; the NumPy-only test below runs thousands.
EXAMPLES = 150
SLOW_EXAMPLES = {"jax": 10, "jax_gpu": 10, "dask": 30}
MANY_EXAMPLES = 2000

lengths = st.integers(min_value=1, max_value=9)
leading = st.lists(st.integers(min_value=1, max_value=3), min_size=0, max_size=2).map(tuple)


def _gather_shift(x: np.ndarray, lk: int) -> np.ndarray:
    """Second, independent reference: one fancy-indexed gather over all (i, j)."""
    lq, width = x.shape[-2:]
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    col = j - i + lq - 1
    valid = col < width
    taken = x[..., np.broadcast_to(i, (lq, lk)), np.minimum(col, width - 1)]
    return np.where(valid, taken, np.zeros((), x.dtype))


def _reachable(lq: int, lk: int) -> np.ndarray:
    """(Lq, Lq + Lk - 1) booleans: column m of row i is some key j = m + i - (Lq - 1)."""
    i = np.arange(lq)[:, None]
    m = np.arange(lq + lk - 1)[None, :]
    j = m + i - (lq - 1)
    return (j >= 0) & (j < lk)


def _values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Nonzero, distinct-looking float64 values (so a misplaced or dropped entry shows)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(1.0, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)


def _draw_case(data: st.DataObject) -> tuple[tuple[int, ...], int, int, bool, int]:
    lead = data.draw(leading, label="leading")
    lq = data.draw(lengths, label="Lq")
    lk = data.draw(lengths, label="Lk")
    causal = data.draw(st.booleans(), label="causal")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return lead, lq, lk, causal, seed


def _property(backend):
    """``@given(data=st.data())`` with this backend's number of examples, deterministic."""
    examples = SLOW_EXAMPLES.get(backend.name, EXAMPLES)

    def decorate(check):
        return settings(max_examples=examples, derandomize=True, database=None)(
            given(data=st.data())(check)
        )

    return decorate


def _check_float_result(backend, out, expected: np.ndarray, dtype: str) -> None:
    assert backend.is_array(out), f"{backend.name} returned a {type(out)}"
    assert out.dtype == backend.dtype(dtype)
    assert tuple(out.shape) == expected.shape
    np.testing.assert_array_equal(backend.to_host(out), expected)


# -- the reference itself ---------------------------------------------------


def test_gather_references_agree():
    """The loop reference (reference.py) and the gather reference here agree."""
    rng = np.random.default_rng(0)
    for lq in range(1, 6):
        for lk in range(1, 6):
            for width in {lq + lk - 1, lk}:
                x = rng.normal(size=(2, lq, width))
                np.testing.assert_array_equal(
                    reference.rel_shift(x, lk), _gather_shift(x, lk), err_msg=f"{lq=} {lk=}"
                )


def test_worked_example():
    """Each cell holding its own δ shifts to the δ(i, j) matrix (Lq=2, Lk=3)."""
    x = np.array([[-2, -1, 0, 1], [-2, -1, 0, 1]])
    np.testing.assert_array_equal(np.asarray(rel_shift(x, 3)), [[-1, 0, 1], [-2, -1, 0]])
    np.testing.assert_array_equal(
        np.asarray(rel_unshift(np.array([[1, 2], [3, 4]]))), [[0, 1, 2], [3, 4, 0]]
    )


# -- every backend, both float dtypes -----------------------------------------


def test_rel_shift_matches_gather(backend, dtype):
    """Random Lq, Lk, layout and leading dims: exact copy of the gather definition."""

    @_property(backend)
    def check(data):
        lead, lq, lk, causal, seed = _draw_case(data)
        width = lk if causal else lq + lk - 1
        x_np = np.asarray(_values(seed, (*lead, lq, width)), dtype=dtype)
        expected = reference.rel_shift(x_np, lk)
        out = rel_shift(backend.asarray(x_np, dtype), lk)
        _check_float_result(backend, out, expected, dtype)

    check()


def test_rel_unshift_matches_gather(backend, dtype):
    """Random Lq, Lk and leading dims: exact scatter definition, zeros where unreachable."""

    @_property(backend)
    def check(data):
        lead, lq, lk, _, seed = _draw_case(data)
        x_np = np.asarray(_values(seed, (*lead, lq, lk)), dtype=dtype)
        expected = reference.rel_unshift(x_np)
        out = rel_unshift(backend.asarray(x_np, dtype))
        _check_float_result(backend, out, expected, dtype)
        # Columns no key of the row reaches are exactly zero; every other one is not.
        got = backend.to_host(out)
        reach = np.broadcast_to(_reachable(lq, lk), got.shape)
        assert np.all(got[~reach] == 0)
        assert np.all(got[reach] != 0)

    check()


def test_shift_of_unshift_is_identity(backend, dtype):
    """rel_shift(rel_unshift(x), Lk) == x, and rel_unshift(rel_shift(x)) keeps reachable cells."""

    @_property(backend)
    def check(data):
        lead, lq, lk, _, seed = _draw_case(data)
        x_np = np.asarray(_values(seed, (*lead, lq, lk)), dtype=dtype)
        back = rel_shift(rel_unshift(backend.asarray(x_np, dtype)), lk)
        _check_float_result(backend, back, x_np, dtype)

        rel_np = np.asarray(_values(seed + 1, (*lead, lq, lq + lk - 1)), dtype=dtype)
        round_trip = rel_unshift(rel_shift(backend.asarray(rel_np, dtype), lk))
        _check_float_result(backend, round_trip, np.where(_reachable(lq, lk), rel_np, 0), dtype)

    check()


@pytest.mark.grid
@pytest.mark.parametrize(("lq", "lk"), [(1, 1), (1, 5), (5, 1), (4, 4), (6, 3), (3, 7)])
@pytest.mark.parametrize("causal", [False, True])
def test_rel_shift_edge_lengths(backend, dtype, lq, lk, causal):
    """Lq = 1, Lk = 1, Lq > Lk and Lk > Lq, with two leading dims."""
    width = lk if causal else lq + lk - 1
    x_np = _values(lq * 100 + lk, (2, 3, lq, width))
    out = rel_shift(backend.asarray(x_np, dtype), lk)
    expected = reference.rel_shift(np.asarray(x_np, dtype=dtype), lk)
    _check_float_result(backend, out, expected, dtype)
    if causal:
        # δ > 0 has no column in the causal layout: those scores are zero.
        delta = np.arange(lk)[None, :] - (np.arange(lq)[:, None] + lk - lq)
        got = backend.to_host(out)
        assert np.all(got[..., delta > 0] == 0)
        assert np.all(got[..., delta <= 0] != 0)


@pytest.mark.parametrize(("lq", "lk"), [(1, 1), (1, 5), (5, 1), (4, 4), (6, 3), (3, 7)])
def test_rel_unshift_edge_lengths(backend, dtype, lq, lk):
    x_np = _values(lq * 100 + lk, (2, 3, lq, lk))
    out = rel_unshift(backend.asarray(x_np, dtype))
    expected = reference.rel_unshift(np.asarray(x_np, dtype=dtype))
    _check_float_result(backend, out, expected, dtype)


def test_causal_and_full_layout_agree_where_both_defined(backend, dtype):
    """The causal layout is the full layout's first Lk columns: same scores for δ <= 0."""
    lq, lk = 4, 6
    full_np = _values(7, (2, lq, lq + lk - 1))
    full = backend.to_host(rel_shift(backend.asarray(full_np, dtype), lk))
    causal = backend.to_host(rel_shift(backend.asarray(full_np[..., :lk], dtype), lk))
    delta = np.arange(lk)[None, :] - (np.arange(lq)[:, None] + lk - lq)
    np.testing.assert_array_equal(causal[..., delta <= 0], full[..., delta <= 0])
    np.testing.assert_array_equal(causal[..., delta > 0], 0)


# -- dtypes that are not floating pass through --------------------------------


@pytest.mark.parametrize("int_dtype", ["int32", "int64", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_non_float_dtypes_pass_through(backend, int_dtype, causal):
    lq, lk = 4, 3
    width = lk if causal else lq + lk - 1
    rng = np.random.default_rng(11)
    if int_dtype == "bool":
        x_np = np.ones((2, lq, width), dtype=bool)
        x_np[0, 1, 2] = False
        x_np[1, 3, 0] = False
    else:
        x_np = rng.integers(1, 1000, size=(2, lq, width)).astype(int_dtype)
    shifted = rel_shift(backend.asarray(x_np, int_dtype), lk)
    assert backend.is_array(shifted)
    assert shifted.dtype == backend.dtype(int_dtype)
    np.testing.assert_array_equal(backend.to_host(shifted), reference.rel_shift(x_np, lk))

    y_np = x_np[..., :lk]
    unshifted = rel_unshift(backend.asarray(y_np, int_dtype))
    assert backend.is_array(unshifted)
    assert unshifted.dtype == backend.dtype(int_dtype)
    np.testing.assert_array_equal(backend.to_host(unshifted), reference.rel_unshift(y_np))


# -- inputs are never mutated; strided inputs -----------------------------------


@pytest.mark.parametrize(("lq", "lk"), [(1, 4), (4, 4), (5, 2)])
def test_inputs_not_mutated(backend, dtype, lq, lk):
    x_np = _values(3, (2, lq, lq + lk - 1))
    x = backend.asarray(x_np, dtype)
    before = np.array(backend.to_host(x), copy=True)
    out = rel_shift(x, lk)
    backend.to_host(out)  # force evaluation (dask)
    np.testing.assert_array_equal(backend.to_host(x), before)

    y_np = _values(4, (2, lq, lk))
    y = backend.asarray(y_np, dtype)
    before = np.array(backend.to_host(y), copy=True)
    out = rel_unshift(y)
    backend.to_host(out)
    np.testing.assert_array_equal(backend.to_host(y), before)
    causal = backend.asarray(y_np, dtype)
    before = np.array(backend.to_host(causal), copy=True)
    backend.to_host(rel_shift(causal, lk))
    np.testing.assert_array_equal(backend.to_host(causal), before)


def test_strided_and_transposed_inputs(backend, dtype):
    """Non-contiguous inputs (a step slice, a transposed view) give the same results."""
    xp = backend.xp
    lq, lk = 4, 5
    width = lq + lk - 1
    wide_np = _values(5, (2, lq, 2 * width))
    strided = backend.asarray(wide_np, dtype)[..., ::2]
    expected = reference.rel_shift(np.asarray(wide_np[..., ::2], dtype=dtype), lk)
    _check_float_result(backend, rel_shift(strided, lk), expected, dtype)

    t_np = _values(6, (2, width, lq))  # transposed to (2, lq, width)
    transposed = xp.permute_dims(backend.asarray(t_np, dtype), (0, 2, 1))
    expected = reference.rel_shift(np.asarray(np.swapaxes(t_np, -1, -2), dtype=dtype), lk)
    _check_float_result(backend, rel_shift(transposed, lk), expected, dtype)

    k_np = _values(8, (2, lk, lq))
    k_t = xp.permute_dims(backend.asarray(k_np, dtype), (0, 2, 1))
    expected = reference.rel_unshift(np.asarray(np.swapaxes(k_np, -1, -2), dtype=dtype))
    _check_float_result(backend, rel_unshift(k_t), expected, dtype)


# -- thousands of random cases (NumPy) ------------------------------------------

big_lengths = st.integers(min_value=1, max_value=16)


@settings(max_examples=MANY_EXAMPLES, derandomize=True, database=None)
@given(
    lead=leading,
    lq=big_lengths,
    lk=big_lengths,
    causal=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_many_random_cases_numpy(lead, lq, lk, causal, seed):
    """SPEC §5: thousands of random (Lq, Lk, W) cases, both layouts, both directions."""
    width = lk if causal else lq + lk - 1
    x = _values(seed, (*lead, lq, width))
    out = rel_shift(x, lk)
    assert out.shape == (*lead, lq, lk)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, _gather_shift(x, lk))

    y = x[..., :lk]  # W >= Lk in both layouts
    un = rel_unshift(y)
    assert un.shape == (*lead, lq, lq + lk - 1)
    np.testing.assert_array_equal(un, reference.rel_unshift(y))
    np.testing.assert_array_equal(rel_shift(un, lk), y)
