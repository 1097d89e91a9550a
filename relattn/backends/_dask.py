"""Dask: lazy graphs (no values to read), persisted caches, chunks kept through the shift,
and the block fold's driver over chunk pairs (one task per pair of chunks)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from ._base import Backend


def _never(x: Any) -> bool:
    return False


def _persist(x: Any) -> Any:
    return x.persist()


def _rechunk_like(x: Any, like: Any) -> Any:
    """``x`` chunked as ``like`` but along the last axis, there in ``like``'s largest chunks.

    A reshape through a flat axis (the shift) moves chunk boundaries by one
    element per row: without this, the result's chunks along the query axis
    are ragged (``63, 64, 1, …``) or one whole chunk, and so is everything
    computed from it.
    """
    from dask.array.core import normalize_chunks

    wanted = (*like.chunks[:-1], max(like.chunks[-1], default=1))
    chunks = normalize_chunks(wanted, x.shape, dtype=x.dtype)
    return x if chunks == x.chunks else x.rechunk(chunks)


def _take_along_axis(x: Any, indices: Any, axis: int) -> Any:
    """The standard's ``take_along_axis`` for Dask arrays of equal shape but along ``axis``:
    ``axis`` in one chunk, the other axes chunked alike, each chunk pair gathered by its
    own library."""
    import array_api_compat
    import dask.array as da

    axis %= x.ndim
    x = x.rechunk({axis: -1})
    chunks = tuple((indices.shape[axis],) if a == axis else c for a, c in enumerate(x.chunks))
    indices = indices.rechunk(chunks)

    def take(block: Any, index: Any) -> Any:
        return array_api_compat.array_namespace(block).take_along_axis(block, index, axis=axis)

    return da.map_blocks(take, x, indices, dtype=x.dtype, chunks=chunks)


# -------------------------------------------------------------------------------------------
# Chunk pairs: a task per (query chunk, key chunk), merged per query chunk
# -------------------------------------------------------------------------------------------
#: Fan-in of a query chunk's merge tree where Dask's ``split_every`` is not one number.
SPLIT_EVERY = 8


def _chunk_pairs(
    pair: Callable[..., Any],
    merge: Callable[[list[Any]], Any],
    finish: Callable[[Any], Any],
    arrays: Sequence[Any],
    axes: Sequence[str],
    lead: tuple[int, ...],
    keep: Callable[[tuple[int, int], tuple[int, int]], bool],
    width: int,
    dtype: Any,
) -> Any:
    """``Backend.chunk_pairs`` on Dask arrays: one task per kept (query chunk, key chunk) pair
    and leading chunk, a tree of merges (fan-in ``split_every``) per query chunk whose root
    finishes the output chunk: a graph of ``O(chunk pairs)`` tasks, whatever the tasks
    compute inside."""
    import dask.array as da
    from dask.array.utils import meta_from_array
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    given: list[tuple[Any, str] | None] = []
    for x, role in zip(arrays, axes, strict=True):
        if x is None:
            given.append(None)
            continue
        x = x if isinstance(x, da.Array) else da.asarray(x)
        given.append((x, role[len(role) - min(x.ndim, len(role)) :]))
    present = [g for g in given if g is not None]
    lead_chunks = tuple(_lead_chunks(present, lead, d) for d in range(len(lead)))
    seq = {kind: _sequence_chunks(present, kind) for kind in "qk"}

    def kinds(x: Any, role: str) -> list[str | int]:
        """Per axis of ``x``: its leading dim of the output (an int), or its role."""
        before = x.ndim - len(role)
        return [len(lead) - before + axis for axis in range(before)] + list(role)

    aligned: list[tuple[Any, list[str | int]] | None] = []
    for g in given:
        if g is None:
            aligned.append(None)
            continue
        x, role = g
        axis_kinds = kinds(x, role)
        target = tuple(
            (size,) if kind == "-" or size == 1
            else lead_chunks[kind] if isinstance(kind, int) else seq[kind]
            for kind, size in zip(axis_kinds, x.shape, strict=True)
        )  # fmt: skip
        aligned.append((x if x.chunks == target else x.rechunk(target), axis_kinds))

    def block_key(x: Any, axis_kinds: list[str | int], lead_index: tuple[int, ...],
                  a: int, b: int) -> tuple[Any, ...]:  # fmt: skip
        index = (
            0 if kind == "-" or size == 1
            else lead_index[kind] if isinstance(kind, int) else a if kind == "q" else b
            for kind, size in zip(axis_kinds, x.shape, strict=True)
        )  # fmt: skip
        return (x.name, *index)

    dependencies = [g[0] for g in aligned if g is not None]
    token = tokenize(pair, merge, finish, *dependencies, *axes, lead, width, str(dtype))
    pairs_name, out_name = f"relattn-chunk-pairs-{token}", f"relattn-attention-{token}"
    split = _split_every()
    rows_of, cols_of = _bounds(seq["q"]), _bounds(seq["k"])
    lead_bounds = [_bounds(chunks) for chunks in lead_chunks]
    pairs: dict[Any, Any] = {}
    out: dict[Any, Any] = {}
    for lead_index in itertools.product(*(range(len(c)) for c in lead_chunks)):
        spans = [lead_bounds[d][n] for d, n in enumerate(lead_index)]
        lead_start = tuple(start for start, _ in spans)
        lead_shape = tuple(stop - start for start, stop in spans)
        for a, rows in enumerate(rows_of):
            # A query chunk with no kept pair still folds its first key chunk (no key).
            kept = [b for b, cols in enumerate(cols_of) if keep(rows, cols)] or [0]
            level = []
            for b in kept:
                key = (pairs_name, *lead_index, a, b)
                task = functools.partial(pair, lead_start, lead_shape, rows, cols_of[b])
                inputs = [None if g is None else block_key(g[0], g[1], lead_index, a, b)
                          for g in aligned]  # fmt: skip
                pairs[key] = (task, *inputs)
                level.append(key)
            depth = 0
            while len(level) > split:
                merged = []
                for n, start in enumerate(range(0, len(level), split)):
                    key = (f"{pairs_name}-merge", *lead_index, a, depth, n)
                    pairs[key] = (merge, level[start : start + split])
                    merged.append(key)
                level, depth = merged, depth + 1
            root = functools.partial(_merge_finish, merge, finish)
            key = (out_name, *lead_index, a, 0)
            out[key] = (root, level)
    graph = HighLevelGraph.from_collections(pairs_name, pairs, dependencies=dependencies)
    layers = {**graph.layers, out_name: MaterializedLayer(out)}
    graph = HighLevelGraph(layers, {**graph.dependencies, out_name: {pairs_name}})
    meta = meta_from_array(dependencies[0], ndim=len(lead) + 2, dtype=dtype)
    return da.Array(graph, out_name, (*lead_chunks, seq["q"], (width,)), meta=meta)


def _merge_finish(
    merge: Callable[[list[Any]], Any], finish: Callable[[Any], Any], states: list[Any]
) -> Any:
    return finish(merge(states))


def _split_every() -> int:
    """The fan-in of the merge tree: Dask's ``split_every`` setting where it is one number."""
    import dask

    split = dask.config.get("split_every", None)
    return split if isinstance(split, int) and split >= 2 else SPLIT_EVERY


def _bounds(chunks: tuple[int, ...]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each chunk."""
    stops = itertools.accumulate(chunks)
    return [(stop - size, stop) for size, stop in zip(chunks, stops, strict=True)]


def _lead_chunks(present: list[tuple[Any, str]], lead: tuple[int, ...], d: int) -> tuple[int, ...]:
    """The output's chunks along leading dim ``d``: those of the first array spanning it."""
    for x, role in present:
        axis = d - (len(lead) - (x.ndim - len(role)))
        if 0 <= axis < x.ndim - len(role) and x.shape[axis] == lead[d] != 1:
            return tuple(x.chunks[axis])
    return (lead[d],)


def _sequence_chunks(present: list[tuple[Any, str]], kind: str) -> tuple[int, ...]:
    """The chunks of the query (``"q"``) or key (``"k"``) axis: those of the first array
    whose axis of that role is the longest (not broadcast)."""
    found = [
        (x.shape[x.ndim - len(role) + i], tuple(x.chunks[x.ndim - len(role) + i]))
        for x, role in present
        for i, r in enumerate(role)
        if r == kind
    ]
    length = max(size for size, _ in found)
    return next(chunks for size, chunks in found if size == length)


BACKEND = Backend(
    take_along_axis=_take_along_axis,
    name="dask",
    has_values=_never,
    materialize=_persist,
    rechunk_like=_rechunk_like,
    chunk_pairs=_chunk_pairs,
)
