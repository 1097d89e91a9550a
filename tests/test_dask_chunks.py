"""Dask: the block fold over chunk pairs (``Backend.chunk_pairs``), one task per pair.

On Dask arrays the blockwise path runs each (query chunk, key chunk) pair as one task,
which folds the pair's NumPy blocks at the requested block size with the pair's global
offsets (so that every relative term stays exact), and merges the states of a query
chunk's key chunks into its output chunk. The graph then grows with the chunk pairs,
whatever the block size (the eager loops on Dask arrays made about 20 Dask operations per
block pair: 4249 tasks for ``L = 40`` in chunks of 10 with blocks of 2, 22 now).

Checked here against relattn's dense NumPy float64 result (within 1e-12): causal
Transformer-XL, the full layout with T5's bias and a value table, a memory (``Lk > Lq``,
keys chunked unlike queries), DeBERTa, a mask with a fully masked row and NaN in the keys
no query sees, packed documents (positions and segment ids chunked like the queries),
uneven chunks, blocks smaller and larger than the chunks, leading dims in chunks, a merge
tree of several levels; on the threaded and the synchronous scheduler. Then the graph:
the same number of tasks for every block size, growing with the chunk pairs, causal
pairs above the diagonal without a task, and the output in the queries' chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import relattn

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

TOLERANCE = {"rtol": 1e-12, "atol": 1e-12}
B, H, D = 2, 3, 8


def _forbid_compute(dsk, keys, **kwargs):
    raise AssertionError("relattn computed a Dask graph: the result must stay lazy")


@dataclass
class Case:
    """One call: its NumPy arrays by name, the Dask chunks of each, and the call."""

    arrays: dict[str, np.ndarray]
    chunks: dict[str, Any]
    call: Any
    causal_offset: int | None = None  # Lk - Lq of a contiguous causal problem

    def dask_arrays(self) -> dict[str, Any]:
        return {n: da.from_array(a, chunks=self.chunks.get(n, -1)) for n, a in self.arrays.items()}


def _normal(rng, *shape):
    return rng.standard_normal(shape)


def transformer_xl(rng, lq=40, lk=40, q_chunk=10, k_chunk=10):
    """Causal Transformer-XL: a per-head table in the causal layout, u and v."""
    a = {
        "q": _normal(rng, B, H, lq, D), "k": _normal(rng, B, H, lk, D),
        "v": _normal(rng, B, H, lk, D), "table": _normal(rng, H, lk, D) / math.sqrt(D),
        "u": _normal(rng, H, 1, D), "pv": _normal(rng, H, 1, D),
    }  # fmt: skip
    chunks = {"q": (1, H, q_chunk, D), "k": (1, H, k_chunk, D), "v": (1, H, k_chunk, D),
              "table": (H, 10, D)}  # fmt: skip

    def call(x, **kw):
        return relattn.relative_attention(
            x["q"], x["k"], x["v"], x["table"], content_bias=x["u"], position_bias=x["pv"],
            causal=True, **kw,
        )  # fmt: skip

    return Case(a, chunks, call, causal_offset=lk - lq)


def t5_values(rng, chunks=(7, 13, 20)):
    """The full layout (not causal) with T5's per-distance bias and a shared value table."""
    length = sum(chunks)
    width = 2 * length - 1
    a = {
        "q": _normal(rng, B, H, length, D), "k": _normal(rng, B, H, length, D),
        "v": _normal(rng, B, H, length, D), "table": _normal(rng, H, width, D) / math.sqrt(D),
        "bias": _normal(rng, H, width), "values": _normal(rng, width, D),
    }  # fmt: skip
    sequence = {n: (1, H, chunks, D) for n in "qkv"}

    def call(x, **kw):
        return relattn.relative_attention(
            x["q"], x["k"], x["v"], x["table"], relative_bias=x["bias"],
            value_table=x["values"], **kw,
        )  # fmt: skip

    return Case(a, sequence, call)


def memory(rng):
    """A Transformer-XL memory: Lk = 56 > Lq = 24, keys in chunks unlike the queries'."""
    case = transformer_xl(rng, lq=24, lk=56, q_chunk=8)
    case.chunks.update({"k": (1, H, (20, 20, 16), D), "v": (1, H, (20, 20, 16), D)})
    return case


def deberta(rng):
    """DeBERTa's disentangled attention (c2p and p2c tables, full layout)."""
    length = 36
    a = {n: _normal(rng, B, H, length, D) for n in "qkv"}
    a["c2p"] = _normal(rng, 2 * length - 1, D) / math.sqrt(D)
    a["p2c"] = _normal(rng, 2 * length - 1, D) / math.sqrt(D)
    chunks = {n: (1, 1, 12, D) for n in "qkv"}

    def call(x, **kw):
        return relattn.disentangled_attention(x["q"], x["k"], x["v"], x["c2p"], x["p2c"], **kw)

    return Case(a, chunks, call)


def masked(rng):
    """A (Lq, Lk) mask with a fully masked row (zeros) and keys that no query sees holding
    NaN (never in the output)."""
    lq, lk = 30, 40
    a = {"q": _normal(rng, B, H, lq, D), "k": _normal(rng, B, H, lk, D),
         "v": _normal(rng, B, H, lk, D)}  # fmt: skip
    mask = rng.random((lq, lk)) < 0.7
    mask[7] = False  # a query that sees no key
    mask[:, [3, 17, 18]] = False  # keys that no query sees
    for name in "kv":
        a[name][..., [3, 17, 18], :] = np.nan
    a["mask"] = mask
    chunks = {"q": (1, H, 10, D), "k": (1, H, 8, D), "v": (1, H, 8, D), "mask": (10, 8)}

    def call(x, **kw):
        return relattn.scaled_dot_product_attention(x["q"], x["k"], x["v"], mask=x["mask"], **kw)

    return Case(a, chunks, call)


def packed(rng):
    """Packed documents: positions restarting per document and segment ids, chunked like
    the queries, with a causal Transformer-XL table in the full layout."""
    length = 40
    lengths = (13, 9, 18)
    pos = np.concatenate([np.arange(n) for n in lengths])
    seg = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])
    a = {n: _normal(rng, B, H, length, D) for n in "qkv"}
    a["table"] = _normal(rng, H, 2 * length - 1, D) / math.sqrt(D)
    a["pos"] = np.broadcast_to(pos, (B, 1, length)).copy()
    a["seg"] = np.broadcast_to(seg, (B, 1, length)).copy()
    chunks = {**{n: (1, H, 10, D) for n in "qkv"}, "pos": (1, 1, 10), "seg": (1, 1, 10)}

    def call(x, **kw):
        return relattn.relative_attention(
            x["q"], x["k"], x["v"], x["table"], positions=x["pos"], segment_ids=x["seg"],
            causal=True, **kw,
        )  # fmt: skip

    return Case(a, chunks, call)


def alibi_uneven(rng):
    """Causal ALiBi-like bias (the causal layout) on chunks of 100, 100 and 56."""
    length = 256
    a = {n: _normal(rng, 1, 2, length, D) for n in "qkv"}
    a["bias"] = -np.arange(length)[::-1] * np.array([[0.5], [0.25]])
    chunks = {n: (1, 2, (100, 100, 56), D) for n in "qkv"}

    def call(x, **kw):
        return relattn.scaled_dot_product_attention(
            x["q"], x["k"], x["v"], relative_bias=x["bias"], **kw
        )

    return Case(a, chunks, call, causal_offset=0)


def key_padding(rng):
    """A key-padding mask (B, 1, 1, Lk), broadcast (never expanded), and the batch in chunks
    of one row."""
    length = 30
    a = {n: _normal(rng, B, H, length, D) for n in "qkv"}
    mask = np.ones((B, 1, 1, length), dtype=bool)
    mask[1, ..., 21:] = False
    a["mask"] = mask
    chunks = {**{n: (1, 1, 10, D) for n in "qkv"}, "mask": (1, 1, 1, 10)}

    def call(x, **kw):
        return relattn.scaled_dot_product_attention(x["q"], x["k"], x["v"], mask=x["mask"], **kw)

    return Case(a, chunks, call)


def more_queries(rng):
    """Causal with Lq = 30 > Lk = 20: the first ten queries see no key (zero rows), and their
    query chunk has no pair but its first, which folds no key."""
    case = transformer_xl(rng, lq=30, lk=20)
    return case


CASES = {
    "transformer_xl": transformer_xl, "t5_values": t5_values, "memory": memory,
    "deberta": deberta, "masked": masked, "packed": packed, "alibi_uneven": alibi_uneven,
    "key_padding": key_padding, "more_queries": more_queries,
}  # fmt: skip

#: Blocks smaller than the chunks, unlike them, and larger than the whole problem.
BLOCKS = [(2, 3), (5, 8), (64, 512)]


def _reference(case: Case) -> np.ndarray:
    return case.call(case.arrays)


def _relattn_tasks(out) -> int:
    """The tasks of relattn's own layers (the chunk pairs, the merges, the outputs)."""
    graph = out.__dask_graph__()
    return sum(len(layer) for name, layer in graph.layers.items() if name.startswith("relattn-"))


def _kept_pairs(q_chunks, k_chunks, offset) -> int:
    """Chunk pairs with a task: all, or under a contiguous causal mask those with a key that
    some query sees (a query chunk keeps one pair at least)."""
    qs = np.cumsum((0, *q_chunks))
    ks = np.cumsum((0, *k_chunks))
    total = 0
    for a in range(len(q_chunks)):
        kept = sum(offset is None or ks[b] <= qs[a + 1] - 1 + offset for b in range(len(k_chunks)))
        total += max(kept, 1)
    return total


@pytest.mark.parametrize("scheduler", ["threads", "synchronous"])
@pytest.mark.parametrize("block_size", BLOCKS, ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("name", sorted(CASES))
def test_chunk_pairs_equal_numpy(name, block_size, scheduler):
    case = CASES[name](np.random.default_rng(len(name)))
    saved = {n: a.copy() for n, a in case.arrays.items()}
    expected = _reference(case)
    lazy = case.dask_arrays()
    with dask.config.set(scheduler=_forbid_compute):
        out = case.call(lazy, block_size=block_size)
    assert isinstance(out, da.Array)
    # The queries' chunks: leading dims and the query axis as q's, the features whole.
    assert out.chunks[:-1] == lazy["q"].chunks[:-1]
    with dask.config.set(scheduler=scheduler):
        got = out.compute()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, **TOLERANCE)
    assert np.isfinite(got).all()
    for n, a in case.arrays.items():  # inputs never mutated
        np.testing.assert_array_equal(a, saved[n])
    # One task per kept chunk pair and one per output chunk (no merge level at these sizes).
    q, k = lazy["q"], lazy["k"]
    lead_blocks = math.prod(len(c) for c in out.chunks[:-2])
    pairs = _kept_pairs(q.chunks[-2], k.chunks[-2], case.causal_offset)
    assert _relattn_tasks(out) == lead_blocks * (pairs + len(q.chunks[-2]))


def test_empty_rows_are_zero():
    """A fully masked row and the queries of a causal Lq > Lk that see no key are 0."""
    case = masked(np.random.default_rng(1))
    got = case.call(case.dask_arrays(), block_size=(4, 4)).compute()
    assert np.all(got[..., 7, :] == 0)
    case = more_queries(np.random.default_rng(2))
    got = case.call(case.dask_arrays(), block_size=(4, 4)).compute()
    assert np.all(got[..., :10, :] == 0) and np.any(got[..., 10:, :] != 0)


def test_float32_stays_float32():
    case = transformer_xl(np.random.default_rng(3))
    expected = _reference(case)
    single = {n: a.astype(np.float32) for n, a in case.arrays.items()}
    lazy = {n: da.from_array(a, chunks=case.chunks.get(n, -1)) for n, a in single.items()}
    out = case.call(lazy, block_size=(4, 4))
    assert out.dtype == np.float32
    got = out.compute()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_merge_tree_of_several_levels():
    """With a fan-in of 2 the states of a query chunk's 8 key chunks merge in three levels;
    the result is the same."""
    case = t5_values(np.random.default_rng(4), chunks=(5,) * 8)
    expected = _reference(case)
    with dask.config.set(split_every=2):
        out = case.call(case.dask_arrays(), block_size=(3, 3))
    # Per batch row (chunks of one): 64 pairs, 4 + 2 merges per query chunk, 8 outputs.
    assert _relattn_tasks(out) == B * (64 + 8 * (4 + 2) + 8)
    np.testing.assert_allclose(out.compute(), expected, **TOLERANCE)


# -- the graph grows with the chunk pairs, not the block pairs --------------------------------


def _example(chunk: int, block_size, length: int = 40, d: int = 8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 2, length, d))
    q = da.from_array(x, chunks=(1, 2, chunk, d))
    return x, relattn.relative_attention(q, q, q, None, causal=True, block_size=block_size)


def test_graph_size_does_not_depend_on_the_block_size():
    sizes = {}
    for block_size in [(2, 2), (4, 4), (8, 8)]:
        x, out = _example(10, block_size)
        assert out.chunks[-2] == (10, 10, 10, 10)
        sizes[block_size] = len(out.__dask_graph__())
        expected = relattn.relative_attention(x, x, x, None, causal=True)
        np.testing.assert_allclose(out.compute(), expected, **TOLERANCE)
    assert len(set(sizes.values())) == 1, sizes
    # The example of issue 34: 4249 tasks with blocks of 2 before (772 with blocks of 8).
    assert sizes[(2, 2)] < 40


def test_graph_grows_with_the_chunk_pairs(record_property):
    """Chunks of 5 instead of 10 at L = 40: 36 causal chunk pairs instead of 10."""
    _, coarse = _example(10, (2, 2))
    _, fine = _example(5, (2, 2))
    assert fine.chunks[-2] == (5,) * 8
    pairs = _kept_pairs((5,) * 8, (5,) * 8, 0), _kept_pairs((10,) * 4, (10,) * 4, 0)
    assert pairs == (36, 10)
    assert _relattn_tasks(fine) == 36 + 8 and _relattn_tasks(coarse) == 10 + 4
    ratio = len(fine.__dask_graph__()) / len(coarse.__dask_graph__())
    record_property("graph_ratio_chunks_5_vs_10", round(ratio, 2))
    assert 2.5 < ratio < 4.5, ratio


def test_causal_pairs_above_the_diagonal_have_no_task():
    """Self-attention in 6 chunks: 21 of the 36 pairs; the full problem has all 36."""
    x = np.random.default_rng(5).normal(size=(1, 2, 600, 16))
    q = da.from_array(x, chunks=(1, 2, 100, 16))
    causal = relattn.relative_attention(q, q, q, None, causal=True, block_size=(256, 512))
    full = relattn.relative_attention(q, q, q, None, block_size=(256, 512))
    assert _relattn_tasks(causal) == 21 + 6 and _relattn_tasks(full) == 36 + 6
    assert causal.chunks[-2] == (100,) * 6
    expected = relattn.relative_attention(x, x, x, None, causal=True)
    np.testing.assert_allclose(causal.compute(), expected, **TOLERANCE)


def test_leading_chunks_are_kept():
    """Batch and head in chunks of one: a task per leading chunk too, and the output in q's
    chunks along every axis."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 2, 24, 4))
    table = rng.normal(size=(2, 47, 4))
    q = da.from_array(x, chunks=(1, 1, 12, 4))
    out = relattn.relative_attention(q, q, q, da.from_array(table), block_size=(5, 7))
    assert out.chunks == q.chunks
    assert _relattn_tasks(out) == 4 * (4 + 2)
    expected = relattn.relative_attention(x, x, x, table)
    np.testing.assert_allclose(out.compute(), expected, **TOLERANCE)


def test_queries_without_leading_dims():
    """q, k, v (L, d) with a per-head table (H, W, d): the output's heads are the table's
    chunks; the query axis is q's."""
    rng = np.random.default_rng(7)
    x, table = rng.normal(size=(40, 8)), rng.normal(size=(3, 79, 8))
    q = da.from_array(x, chunks=(10, 4))
    out = relattn.relative_attention(q, q, q, da.from_array(table, chunks=(1, 79, 8)),
                                     block_size=(3, 4))  # fmt: skip
    assert out.shape == (3, 40, 8) and out.chunks[:-1] == ((1, 1, 1), (10,) * 4)
    np.testing.assert_allclose(out.compute(), relattn.relative_attention(x, x, x, table),
                               **TOLERANCE)  # fmt: skip


def test_feature_chunks_follow_the_queries():
    """q's features in chunks of 4: the output's too, as the dense path's."""
    x = np.random.default_rng(8).normal(size=(1, 2, 30, 8))
    q = da.from_array(x, chunks=(1, 2, 10, 4))
    out = relattn.relative_attention(q, q, q, None, causal=True, block_size=(4, 4))
    assert out.chunks == q.chunks
    expected = relattn.relative_attention(x, x, x, None, causal=True)
    np.testing.assert_allclose(out.compute(), expected, **TOLERANCE)


def test_score_mod_takes_dask_arrays():
    """The caller's score_mod and mask_mod are written for the library's arrays (this one
    closes over a Dask array): they run on the eager loops, as before, and stay exact."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(1, 2, 20, 4))
    slopes = np.array([0.5, 0.25])

    def call(q, slopes, xp):
        def score_mod(score, batch, head, q_pos, kv_pos):
            slope = xp.take(slopes, xp.reshape(head, (-1,)), axis=0)[..., None, None]
            return score - slope * xp.astype(xp.abs(kv_pos - q_pos), score.dtype)

        def mask_mod(batch, head, q_pos, kv_pos):
            return kv_pos <= q_pos

        return relattn.scaled_dot_product_attention(
            q, q, q, score_mod=score_mod, mask_mod=mask_mod, block_size=(4, 4)
        )

    from array_api_compat import numpy as compat_numpy
    from array_api_compat.dask import array as compat_dask

    q = da.from_array(x, chunks=(1, 2, 10, 4))
    out = call(q, da.from_array(slopes), compat_dask)
    np.testing.assert_allclose(out.compute(), call(x, slopes, compat_numpy), **TOLERANCE)
