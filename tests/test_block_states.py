"""The online softmax in public: attention_block, merge_block_states, finish_block_state.

Against a NumPy float64 reference with a loop over every ``(row, key)`` (softmax
attention of Vaswani et al. 2017, eq. (1), with an additive bias and a boolean mask),
on every backend:

- two key blocks whose peaks differ widely (the second block's scores shifted by
  ``-30``, ``+2`` or ``+30``), so that the merge's two rescaling factors,
  ``exp(peak_a - peak)`` and ``exp(peak_b - peak)`` (Milakov & Gimelshein 2018),
  differ, and swapping them changes every row that sees a key;
- rows whose keys are all masked in one block only (the other block alone gives the
  row) and in both blocks (the row is exactly 0, never NaN);
- the merge in either order, against the state chained through ``attention_block``'s
  ``state=``, and the merged statistics themselves: ``total · exp(peak)`` is the row's
  unnormalised sum ``Σ_j exp(s_ij)`` whatever peak a state keeps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from relattn import BlockState, attention_block, finish_block_state, merge_block_states
from relattn.testing import tolerance

LEAD, LQ, LK, D, DV = (2, 3), 4, 7, 5, 3
#: The two key blocks, ``[0, 3)`` and ``[3, 7)``.
BLOCKS = ((0, 3), (3, 7))
SCALE = 1 / math.sqrt(D)


def _inputs(rng, shift):
    """q, k, v (leading dims (2, 3)), a (Lq, Lk) bias whose second block is shifted by
    ``shift``, and a (2, 1, Lq, Lk) mask: in batch 0 row 1 sees no key of the first block
    and row 2 none of the second; in batch 1 row 3 sees no key at all."""
    q = rng.normal(size=(*LEAD, LQ, D))
    k = rng.normal(size=(*LEAD, LK, D))
    v = rng.normal(size=(*LEAD, LK, DV))
    bias = rng.normal(size=(LQ, LK))
    bias[:, BLOCKS[1][0] :] += shift
    mask = rng.random((LEAD[0], 1, LQ, LK)) < 0.7
    for lo, _ in BLOCKS:
        mask[..., lo] = True  # every other row sees a key of each block
    (a0, a1), (b0, b1) = BLOCKS
    mask[0, 0, 1, a0:a1] = False
    mask[0, 0, 2, b0:b1] = False
    mask[1, 0, 3, :] = False
    return q, k, v, bias, mask


def _reference(q, k, v, bias, mask):
    """``softmax(q kᵀ / √d + bias, mask) v`` and each row's ``Σ_j exp(s_ij)``, one row and
    one key at a time in float64; a row with no allowed key is 0 with a sum of 0."""
    out = np.zeros((*LEAD, LQ, DV))
    sums = np.zeros((*LEAD, LQ, 1))
    for b in np.ndindex(*LEAD):
        for i in range(LQ):
            keys = [j for j in range(LK) if mask[b[0], 0, i, j]]
            if not keys:
                continue
            s = {j: SCALE * float(np.dot(q[b][i], k[b][j])) + bias[i, j] for j in keys}
            peak = max(s.values())
            weights = {j: math.exp(s[j] - peak) for j in keys}
            total = sum(weights.values())
            out[b][i] = sum(weights[j] / total * v[b][j] for j in keys)
            sums[b][i, 0] = total * math.exp(peak)
    return out, sums


def _block_states(backend, dtype, arrays, chained=False):
    """The states of the two key blocks (``attention_block`` each), or, ``chained``, the
    second block folded into the first one's state (``state=``)."""
    q, k, v, bias, mask = arrays
    xq = backend.asarray(q, dtype)
    states = []
    for lo, hi in BLOCKS:
        state = states[0] if chained and states else None
        states.append(
            attention_block(
                xq,
                backend.asarray(k[..., lo:hi, :], dtype),
                backend.asarray(v[..., lo:hi, :], dtype),
                query_start=0,
                key_start=lo,
                query_length=LQ,
                key_length=LK,
                bias=backend.asarray(bias[:, lo:hi], dtype),
                mask=backend.asarray(mask[..., lo:hi]),
                state=state,
            )
        )
    return states


def _check(backend, dtype, state, expected, sums):
    assert isinstance(state, BlockState)
    out = finish_block_state(state)
    got = backend.to_host(out)
    assert not np.isnan(got).any() and np.isfinite(got).all()
    np.testing.assert_array_equal(got[1, :, 3], 0)  # no key in either block: exactly 0
    np.testing.assert_allclose(got, expected, **tolerance(dtype))
    # The statistics: total · exp(peak) is the row's unnormalised sum, 0 where no key is.
    peak = backend.to_host(state.peak).astype(np.float64)
    total = backend.to_host(state.total).astype(np.float64)
    assert not np.isnan(peak).any() and not np.isnan(total).any()
    np.testing.assert_array_equal(total[1, :, 3], 0)
    with np.errstate(over="ignore"):
        unnormalised = np.where(total > 0, total * np.exp(peak), 0.0)
    np.testing.assert_allclose(unnormalised, sums, rtol=tolerance(dtype)["rtol"], atol=0)


@pytest.mark.parametrize("shift", [-30.0, 2.0, 30.0])
def test_merged_blocks_equal_softmax_attention(backend, dtype, rng, shift):
    """Two key blocks with peaks ``shift`` apart, merged in either order, finish as
    softmax attention over all the keys; rows masked in one block take the other's."""
    arrays = _inputs(rng, shift)
    expected, sums = _reference(*arrays)
    assert np.isfinite(expected).all() and (expected[1, :, 3] == 0).all()
    first, second = _block_states(backend, dtype, arrays)
    for merged in (merge_block_states(first, second), merge_block_states(second, first)):
        _check(backend, dtype, merged, expected, sums)
    (_, chained) = _block_states(backend, dtype, arrays, chained=True)
    _check(backend, dtype, chained, expected, sums)


def test_one_block_alone_is_its_own_softmax(backend, dtype, rng):
    """A block merged with a state whose rows are all masked (peak -inf, total 0) is the
    block itself: the masked state's factor is 0, never NaN, and the other's is 1."""
    q, k, v, bias, mask = _inputs(rng, 30.0)
    lo, hi = BLOCKS[1]
    only_second = np.zeros_like(mask)
    only_second[..., lo:hi] = mask[..., lo:hi]
    expected, sums = _reference(q, k, v, bias, only_second)
    nothing = mask.copy()
    nothing[..., : BLOCKS[0][1]] = False
    first, second = _block_states(backend, dtype, (q, k, v, bias, nothing))
    for merged in (merge_block_states(first, second), merge_block_states(second, first)):
        _check(backend, dtype, merged, expected, sums)
