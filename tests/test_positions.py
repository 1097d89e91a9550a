"""Relative distances, the relative layout and clipped tables (SPEC §1, §2.4, §2.5).

``δ(i, j) = j - (i + Lk - Lq)``; column ``m`` of the relative layout holds
``δ = m - (Lk - 1)``; ``relative_table`` gathers row ``clip(δ, -K, K) + K`` of a
``(2K+1, d)`` table (``"clip"``), or gives distances beyond ``±K`` a zero row
(``"zero"``).
"""

from __future__ import annotations

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from hypothesis import given, settings
from hypothesis import strategies as st

from relattn import (
    rel_shift,
    rel_unshift,
    relative_distances,
    relative_positions,
    relative_scores,
    relative_table,
)

# Lazy on Dask, traced under jax.jit on JAX, for every backend test.
for _function in (
    rel_shift,
    rel_unshift,
    relative_distances,
    relative_positions,
    relative_scores,
    relative_table,
):
    lazy_xp_function(_function)

LENGTHS = [(1, 1), (1, 4), (4, 1), (3, 3), (2, 5), (5, 2), (6, 6)]
RADII = [0, 1, 3]
#: Backends where each new shape costs a compile (JAX) or a graph (Dask): loop over fewer cases.
SLOW_BACKENDS = ("jax", "jax_gpu", "dask")


SLOW_LENGTHS = [(1, 1), (4, 1), (2, 5), (5, 2)]
SLOW_RADII = [0, 3, 10]


def _cases(backend, cases, slow_cases):
    """``cases``, or the shorter ``slow_cases`` on a slow backend."""
    return slow_cases if backend.name in SLOW_BACKENDS else cases


def _default_integer(backend):
    info = backend.xp.__array_namespace_info__()
    return info.default_dtypes(device=backend.device)["integral"]


def _check_backend_array(backend, out):
    assert backend.is_array(out), f"{backend.name} returned a {type(out)}"


# -- naive references ---------------------------------------------------------


def _all_pair_distances(lq: int, lk: int) -> set[int]:
    return {reference.delta(i, j, lq, lk) for i in range(lq) for j in range(lk)}


def _naive_relative_table(table, lq, lk, causal, out_of_range):
    """Row by row: row m is the entry of δ = m - (Lk - 1), clipped at ±K or zero beyond it."""
    table = np.asarray(table)
    radius = (table.shape[-2] - 1) // 2
    width = lk if causal else lq + lk - 1
    out = np.zeros((*table.shape[:-2], width, table.shape[-1]), dtype=table.dtype)
    for m in range(width):
        d = m - (lk - 1)
        if out_of_range == "clip":
            out[..., m, :] = table[..., min(max(d, -radius), radius) + radius, :]
        elif abs(d) <= radius:
            out[..., m, :] = table[..., d + radius, :]
    return out


def _naive_pair_rep(w, d, out_of_range):
    """Shaw et al.'s a_ij = w[clip(δ, -K, K) + K] (or zero beyond ±K)."""
    radius = (w.shape[-2] - 1) // 2
    if out_of_range == "zero" and abs(d) > radius:
        return np.zeros(w.shape[-1])
    return w[..., min(max(d, -radius), radius) + radius, :]


def _naive_shaw_key_scores(q, w, lk, causal, out_of_range):
    """e_ij = q_i · a_ij, one pair at a time; 0 for δ > 0 in the causal layout."""
    lq = q.shape[-2]
    out = np.zeros((*q.shape[:-2], lq, lk))
    for idx in np.ndindex(q.shape[:-2]):
        for i in range(lq):
            for j in range(lk):
                d = reference.delta(i, j, lq, lk)
                if causal and d > 0:
                    continue
                out[idx][i, j] = q[idx][i] @ _naive_pair_rep(w, d, out_of_range)
    return out


def _naive_shaw_value_sum(alpha, w, out_of_range):
    """z_i = Σ_j α_ij a_ij, one pair at a time."""
    lq, lk = alpha.shape[-2:]
    out = np.zeros((*alpha.shape[:-2], lq, w.shape[-1]))
    for idx in np.ndindex(alpha.shape[:-2]):
        for i in range(lq):
            for j in range(lk):
                d = reference.delta(i, j, lq, lk)
                out[idx][i] += alpha[idx][i, j] * _naive_pair_rep(w, d, out_of_range)
    return out


# -- relative_distances -------------------------------------------------------


@pytest.mark.parametrize(("lq", "lk"), LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_relative_distances(backend, lq, lk, causal):
    out = relative_distances(lq, lk, causal=causal, xp=backend.lib, device=backend.device)
    _check_backend_array(backend, out)
    assert out.dtype == _default_integer(backend)
    width = lk if causal else lq + lk - 1
    assert tuple(out.shape) == (width,)
    got = backend.to_host(out)
    # Column m holds δ = m - (Lk - 1), ascending by one.
    np.testing.assert_array_equal(got, np.arange(width) - (lk - 1))
    # The columns are exactly the distances some (i, j) pair has (only δ <= 0 when causal).
    pairs = _all_pair_distances(lq, lk)
    wanted = sorted(d for d in pairs if d <= 0) if causal else sorted(pairs)
    assert got.tolist() == wanted


def test_relative_distances_examples():
    np.testing.assert_array_equal(relative_distances(2, 3), [-2, -1, 0, 1])
    np.testing.assert_array_equal(relative_distances(2, 3, causal=True), [-2, -1, 0])
    np.testing.assert_array_equal(relative_distances(1, 1), [0])
    np.testing.assert_array_equal(relative_distances(3, 1), [0, 1, 2])
    assert isinstance(relative_distances(2, 3), np.ndarray)  # xp=None means NumPy


# -- relative_positions -------------------------------------------------------


@pytest.mark.parametrize(("lq", "lk"), LENGTHS)
def test_relative_positions(backend, lq, lk):
    out = relative_positions(lq, lk, xp=backend.lib, device=backend.device)
    _check_backend_array(backend, out)
    assert out.dtype == _default_integer(backend)
    assert tuple(out.shape) == (lq, lk)
    expected = np.array([[reference.delta(i, j, lq, lk) for j in range(lk)] for i in range(lq)])
    np.testing.assert_array_equal(backend.to_host(out), expected)


def test_relative_positions_example():
    # Lq = 2, Lk = 3: the queries sit at key positions 1 and 2.
    np.testing.assert_array_equal(relative_positions(2, 3), [[-1, 0, 1], [-2, -1, 0]])
    # Lq > Lk: offset is negative, future keys have δ > 0.
    np.testing.assert_array_equal(relative_positions(3, 2), [[1, 2], [0, 1], [-1, 0]])


@pytest.mark.parametrize(("lq", "lk"), LENGTHS)
def test_positions_are_shifted_distances(backend, lq, lk):
    """rel_shift of a layout whose cells hold their own δ gives δ(i, j) (both layouts)."""
    xp = backend.xp
    for causal in (False, True):
        dist = relative_distances(lq, lk, causal=causal, xp=backend.lib, device=backend.device)
        rows = xp.broadcast_to(dist[None, :], (lq, dist.shape[0]))
        got = backend.to_host(rel_shift(rows, lk))
        want = backend.to_host(relative_positions(lq, lk, xp=backend.lib, device=backend.device))
        if causal:
            want = np.where(want <= 0, want, 0)
        np.testing.assert_array_equal(got, want)


# -- relative_table -------------------------------------------------------------


@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
@pytest.mark.parametrize("causal", [False, True])
def test_relative_table_matches_row_gather(backend, dtype, out_of_range, causal):
    """Several Lq, Lk and K = 0, 1, 3, 10 (10: larger than every distance, nothing clipped)."""
    for lq, lk in _cases(backend, LENGTHS, SLOW_LENGTHS):
        for radius in _cases(backend, [*RADII, 10], SLOW_RADII):
            rng = np.random.default_rng(1000 * lq + 100 * lk + radius)
            table_np = rng.normal(size=(2 * radius + 1, 4))
            out = relative_table(
                backend.asarray(table_np, dtype), lq, lk, causal=causal, out_of_range=out_of_range
            )
            _check_backend_array(backend, out)
            assert out.dtype == backend.dtype(dtype)
            expected = _naive_relative_table(
                np.asarray(table_np, dtype=dtype), lq, lk, causal, out_of_range
            )
            assert tuple(out.shape) == expected.shape
            # A gather: exact.
            np.testing.assert_array_equal(
                backend.to_host(out), expected, err_msg=f"Lq={lq} Lk={lk} K={radius}"
            )


@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
@pytest.mark.parametrize("causal", [False, True])
def test_relative_table_leading_dims(backend, dtype, out_of_range, causal):
    """A per-head table (B, H, 2K+1, d) expands every head the same way."""
    rng = np.random.default_rng(5)
    lq, lk, radius = 3, 5, 2
    table_np = rng.normal(size=(2, 3, 2 * radius + 1, 4))
    out = relative_table(
        backend.asarray(table_np, dtype), lq, lk, causal=causal, out_of_range=out_of_range
    )
    _check_backend_array(backend, out)
    width = lk if causal else lq + lk - 1
    assert tuple(out.shape) == (2, 3, width, 4)
    expected = _naive_relative_table(
        np.asarray(table_np, dtype=dtype), lq, lk, causal, out_of_range
    )
    np.testing.assert_array_equal(backend.to_host(out), expected)


def test_relative_table_clip_vs_zero_differ_only_beyond_radius(backend, dtype):
    lq, lk, radius = 4, 6, 1
    table_np = np.random.default_rng(6).uniform(1, 2, size=(2 * radius + 1, 3))
    table = backend.asarray(table_np, dtype)
    clip = backend.to_host(relative_table(table, lq, lk, out_of_range="clip"))
    zero = backend.to_host(relative_table(table, lq, lk, out_of_range="zero"))
    d = np.arange(lq + lk - 1) - (lk - 1)
    inside = np.abs(d) <= radius
    np.testing.assert_array_equal(clip[inside], zero[inside])
    np.testing.assert_array_equal(zero[~inside], 0)
    # Clipped rows repeat the edge rows w_{-K} and w_{K}.
    np.testing.assert_array_equal(clip[d < -radius], np.broadcast_to(clip[d == -radius], (4, 3)))
    np.testing.assert_array_equal(clip[d > radius], np.broadcast_to(clip[d == radius], (2, 3)))
    assert np.all(clip[~inside] != 0)


def test_relative_table_example():
    table = np.arange(1.0, 4.0).reshape(3, 1)  # rows for δ = -1, 0, 1
    np.testing.assert_array_equal(relative_table(table, 2, 3)[:, 0], [1.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(
        relative_table(table, 2, 3, out_of_range="zero")[:, 0], [0.0, 1.0, 2.0, 3.0]
    )
    np.testing.assert_array_equal(relative_table(table, 2, 3, causal=True)[:, 0], [1.0, 1.0, 2.0])


@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
def test_relative_table_integer_table(backend, out_of_range):
    table_np = np.arange(10, 10 + 5 * 2).reshape(5, 2)  # K = 2
    out = relative_table(backend.asarray(table_np, "int64"), 4, 3, out_of_range=out_of_range)
    _check_backend_array(backend, out)
    assert out.dtype == backend.dtype("int64")
    np.testing.assert_array_equal(
        backend.to_host(out), _naive_relative_table(table_np, 4, 3, False, out_of_range)
    )


def test_relative_table_input_not_mutated(backend, dtype):
    table_np = np.random.default_rng(7).normal(size=(2, 5, 3))
    table = backend.asarray(table_np, dtype)
    before = np.array(backend.to_host(table), copy=True)
    for mode in ("clip", "zero"):
        backend.to_host(relative_table(table, 4, 6, out_of_range=mode))
    np.testing.assert_array_equal(backend.to_host(table), before)


@settings(max_examples=500, derandomize=True, database=None)
@given(
    lq=st.integers(1, 12),
    lk=st.integers(1, 12),
    radius=st.integers(0, 14),
    causal=st.booleans(),
    out_of_range=st.sampled_from(["clip", "zero"]),
    lead=st.lists(st.integers(1, 3), max_size=2).map(tuple),
)
def test_relative_table_random_numpy(lq, lk, radius, causal, out_of_range, lead):
    table = np.random.default_rng(radius).normal(size=(*lead, 2 * radius + 1, 3))
    out = relative_table(table, lq, lk, causal=causal, out_of_range=out_of_range)
    np.testing.assert_array_equal(out, _naive_relative_table(table, lq, lk, causal, out_of_range))


# -- consistency with the shift: Shaw et al. per-pair lookups -------------------------


SHAW_LENGTHS = [(1, 1), (1, 4), (4, 1), (3, 3), (2, 5), (5, 2)]


@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
@pytest.mark.parametrize("causal", [False, True])
def test_shaw_key_scores_via_table_and_shift(backend, dtype, out_of_range, causal):
    """rel_shift(q · relative_table(w)ᵀ) == q_i · w[clip(δ_ij, -K, K) + K], per pair."""
    d = 4
    for lq, lk in _cases(backend, SHAW_LENGTHS, SLOW_LENGTHS):
        for radius in _cases(backend, [*RADII, 10], SLOW_RADII):
            rng = np.random.default_rng(7 * lq + 11 * lk + radius)
            q_np = rng.normal(size=(2, lq, d))
            w_np = rng.normal(size=(2 * radius + 1, d))
            expected = _naive_shaw_key_scores(q_np, w_np, lk, causal, out_of_range)

            q, w = backend.asarray(q_np, dtype), backend.asarray(w_np, dtype)
            table = relative_table(w, lq, lk, causal=causal, out_of_range=out_of_range)
            backend.assert_close(relative_scores(q, table, lk), expected, dtype)
            by_hand = rel_shift(q @ backend.xp.matrix_transpose(table), lk)
            backend.assert_close(by_hand, expected, dtype)


@pytest.mark.parametrize("out_of_range", ["clip", "zero"])
def test_shaw_value_term_via_unshift(backend, dtype, out_of_range):
    """rel_unshift(α) @ relative_table(w) == Σ_j α_ij w[clip(δ_ij, -K, K) + K], per pair."""
    for lq, lk in _cases(backend, SHAW_LENGTHS, SLOW_LENGTHS):
        for radius in RADII:
            rng = np.random.default_rng(13 * lq + 17 * lk + radius)
            alpha_np = rng.uniform(size=(2, lq, lk))
            w_np = rng.normal(size=(2 * radius + 1, 3))
            expected = _naive_shaw_value_sum(alpha_np, w_np, out_of_range)

            table = relative_table(backend.asarray(w_np, dtype), lq, lk, out_of_range=out_of_range)
            out = rel_unshift(backend.asarray(alpha_np, dtype)) @ table
            backend.assert_close(out, expected, dtype)


def test_shaw_per_head_tables(backend, dtype):
    """Per-head tables (H, 2K+1, d) against queries (B, H, Lq, d)."""
    rng = np.random.default_rng(21)
    lq, lk, radius, d = 3, 4, 1, 5
    q_np = rng.normal(size=(2, 3, lq, d))
    w_np = rng.normal(size=(3, 2 * radius + 1, d))
    expected = np.zeros((2, 3, lq, lk))
    for h in range(3):
        expected[:, h] = _naive_shaw_key_scores(q_np[:, h], w_np[h], lk, False, "clip")
    table = relative_table(backend.asarray(w_np, dtype), lq, lk)
    backend.assert_close(relative_scores(backend.asarray(q_np, dtype), table, lk), expected, dtype)
