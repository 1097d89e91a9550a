"""Dask: lazy graphs (no values to read), persisted caches, chunks kept through the shift."""

from __future__ import annotations

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


BACKEND = Backend(
    take_along_axis=_take_along_axis,
    name="dask",
    has_values=_never,
    materialize=_persist,
    rechunk_like=_rechunk_like,
)
