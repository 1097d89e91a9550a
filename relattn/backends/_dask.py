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


BACKEND = Backend(
    name="dask",
    library="dask",
    module="dask.array",
    has_values=_never,
    from_host=_from_host,
    to_host=_to_host,
    ready=_compute,
    materialize=_persist,
    device=host_only("dask"),
)
