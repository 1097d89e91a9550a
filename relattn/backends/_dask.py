"""Dask: lazy graphs, computed on the way to the host or persisted as caches."""

from __future__ import annotations

from typing import Any

from ._base import Backend, _never, host_only


def _from_host(a: Any, device: Any = None, chunks: Any = None) -> Any:
    import dask.array as da
    import numpy as np

    a = np.array(a, copy=True)
    return da.from_array(a, chunks=a.shape if chunks is None else chunks)


def _to_host(x: Any) -> Any:
    import numpy as np

    return np.asarray(x.compute())


def _compute(x: Any) -> Any:
    return x.compute()


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


BACKEND = Backend(
    name="dask",
    library="dask",
    module="dask.array",
    has_values=_never,
    from_host=_from_host,
    to_host=_to_host,
    ready=_compute,
    materialize=_persist,
    rechunk_like=_rechunk_like,
    device=host_only("dask"),
)
