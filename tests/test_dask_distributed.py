"""Dask: clean chunks along the sequence, and relattn on a ``dask.distributed`` cluster.

The shift of Transformer-XL's appendix B reshapes ``(..., Lq, W)`` through a
flat axis; on Dask that reshape leaves ragged chunks along the queries
(``63, 64, 1, 63, 64, 1, …``, or one whole chunk), which every later
operation inherited, up to the attention output. ``Backend.rechunk_like``
puts the input's chunks back once. The first part checks the chunks of
:func:`relattn.rel_shift`, :func:`relattn.rel_unshift` and the attention
functions' outputs on Dask arrays chunked along the sequence (regular: all
equal but the last, and those of the queries), and their values against NumPy.

The second part runs ``examples/dask_distributed.py`` (Transformer-XL's
causal layout, the full layout, T5 and ALiBi biases, blockwise) on a
:class:`dask.distributed.LocalCluster` of two worker processes with one thread
each, against NumPy; it is skipped where ``distributed`` is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import time
import types
from pathlib import Path

import numpy as np
import pytest

import relattn
from relattn.backends import backend_for, namespace_of_module

da = pytest.importorskip("dask.array")

EXAMPLES = Path(__file__).parents[1] / "examples"
TOLERANCE = {"rtol": 1e-10, "atol": 1e-12}  # SPEC §5, float64


def regular(chunks) -> bool:
    """Dask's regular chunks along one axis: all equal, but the last, which is no larger."""
    return all(c == chunks[0] for c in chunks[:-1]) and 0 < chunks[-1] <= chunks[0]


def chunked(a: np.ndarray, chunks) -> da.Array:
    return da.from_array(a, chunks=chunks)


# -- rel_shift and rel_unshift ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("lq", "lk", "causal", "chunks"),
    [
        (64, 64, False, (1, 2, 16, -1)),  # the full layout, rows in chunks, whole columns
        (64, 64, False, (1, 2, 16, 16)),  # rows and columns in chunks
        (64, 64, True, (1, 2, 16, 16)),  # the causal layout (padded with zeros)
        (60, 60, False, (2, 1, 25, 40)),  # chunks that do not divide the lengths
        (32, 80, True, (1, 2, 8, 16)),  # memory: Lk > Lq
        (48, 16, False, (1, 2, 16, -1)),  # cross-attention, Lq > Lk
        (1, 40, True, (1, 2, 1, 8)),  # one query: padding only
    ],
)
def test_rel_shift_keeps_the_chunks(lq, lk, causal, chunks):
    rng = np.random.default_rng(lq + lk)
    width = lk if causal else lq + lk - 1
    x = rng.standard_normal((2, 2, lq, width))
    lazy = chunked(x, chunks)
    out = relattn.rel_shift(lazy, lk)
    # Every axis but the last as the input's (the query axis included), the last regular.
    assert out.chunks[:-1] == lazy.chunks[:-1]
    assert regular(out.chunks[-1]), out.chunks
    assert max(out.chunks[-1]) == min(lk, max(lazy.chunks[-1]))
    np.testing.assert_array_equal(out.compute(), relattn.rel_shift(x, lk))


@pytest.mark.parametrize(
    ("lq", "lk", "chunks"),
    [(64, 64, (1, 2, 16, 16)), (64, 64, (1, 2, 16, -1)), (30, 70, (2, 1, 12, 25))],
)
def test_rel_unshift_keeps_the_chunks(lq, lk, chunks):
    x = np.random.default_rng(lq).standard_normal((2, 2, lq, lk))
    lazy = chunked(x, chunks)
    out = relattn.rel_unshift(lazy)
    assert out.chunks[:-1] == lazy.chunks[:-1]
    assert regular(out.chunks[-1]), out.chunks
    np.testing.assert_array_equal(out.compute(), relattn.rel_unshift(x))
    # Back again: the chunks of the start.
    again = relattn.rel_shift(out, lk)
    assert again.chunks == lazy.chunks
    np.testing.assert_array_equal(again.compute(), x)


def test_the_hook_is_the_identity_elsewhere():
    numpy_backend = backend_for(namespace_of_module(np))
    x = np.arange(6.0).reshape(2, 3)
    assert numpy_backend.rechunk_like(x, x[:, :2]) is x
    dask_backend = backend_for(namespace_of_module(da))
    lazy = chunked(x, (1, 3))
    assert dask_backend.rechunk_like(lazy, lazy) is lazy  # already as wanted: no new layer


# -- attention outputs -----------------------------------------------------------------------

B, H, L, D, CHUNK = 2, 2, 96, 8, 32


@functools.cache
def problem(length: int = L) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        **{n: rng.standard_normal((B, H, length, D)) for n in "qkv"},
        "causal_table": rng.standard_normal((H, length, D)) / math.sqrt(D),
        "full_table": rng.standard_normal((H, 2 * length - 1, D)) / math.sqrt(D),
        "u": rng.standard_normal((H, 1, D)),
        "v_bias": rng.standard_normal((H, 1, D)),
        "full_bias": rng.standard_normal((H, 2 * length - 1)),
        "causal_bias": rng.standard_normal((H, length)),
    }


def lazy_problem(chunk: int) -> dict[str, da.Array]:
    out = {}
    for name, a in problem().items():
        if a.ndim == 4:
            chunks = (1, H, chunk, D)
        elif a.shape[-2:] == (1, D):
            chunks = a.shape
        elif a.ndim == 3:
            chunks = (H, chunk, D)
        else:
            chunks = (H, chunk)
        out[name] = chunked(a, chunks)
    return out


LAYERS = {
    "transformer_xl": lambda p, **kw: relattn.relative_attention(
        p["q"], p["k"], p["v"], p["causal_table"], content_bias=p["u"],
        position_bias=p["v_bias"], **kw,
    ),
    "full_layout": lambda p, **kw: relattn.relative_attention(
        p["q"], p["k"], p["v"], p["full_table"], content_bias=p["u"],
        position_bias=p["v_bias"], **kw,
    ),
    "shaw_values": lambda p, **kw: relattn.relative_attention(
        p["q"], p["k"], p["v"], p["full_table"], value_table=p["full_table"], **kw
    ),
    "t5_bias": lambda p, **kw: relattn.scaled_dot_product_attention(
        p["q"], p["k"], p["v"], relative_bias=p["full_bias"], **kw
    ),
    "alibi_causal": lambda p, **kw: relattn.scaled_dot_product_attention(
        p["q"], p["k"], p["v"], relative_bias=p["causal_bias"], **kw
    ),
}  # fmt: skip


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize(
    "block_size", [None, CHUNK, (48, 40)], ids=["dense", "blockwise", "blocks_across_chunks"]
)
def test_attention_output_has_the_query_chunks(layer, block_size):
    """The output keeps the queries' chunks, also with blocks that cut across them (the
    fold's output was chunked at the union of both boundaries: 32, 16, 16, 32)."""
    lazy = lazy_problem(CHUNK)
    out = LAYERS[layer](lazy, block_size=block_size)
    assert out.chunks == lazy["q"].chunks  # (1, 1), (H,), (32, 32, 32), (D,)
    expected = LAYERS[layer](problem(), block_size=block_size)
    np.testing.assert_allclose(out.compute(), expected, **TOLERANCE)


def test_the_graph_stays_small():
    """Clean chunks also keep the graph small: the full layout's output had 36
    ragged sequence chunks and about 11,000 tasks at L = 256 with chunks of 64."""
    rng = np.random.default_rng(0)
    q, k, v = (chunked(rng.standard_normal((2, 2, 256, 16)), (1, 1, 64, 16)) for _ in "qkv")
    table = chunked(rng.standard_normal((2, 511, 16)), (1, 64, 16))
    out = relattn.relative_attention(q, k, v, table)
    assert out.chunks[-2] == (64, 64, 64, 64)
    assert len(out.__dask_graph__()) < 5000


# -- a dask.distributed cluster --------------------------------------------------------------


@functools.cache
def example():
    spec = importlib.util.spec_from_file_location(
        "dask_distributed_example", EXAMPLES / "dask_distributed.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster():
    """A LocalCluster of 2 worker processes with a thread each, closed at the end."""
    pytest.importorskip(
        "distributed", reason="dask.distributed is not installed (pip install 'relattn[dask]')"
    )
    start = time.perf_counter()
    cluster, client = example().start_cluster(n_workers=2)
    try:
        yield types.SimpleNamespace(client=client, started_in=time.perf_counter() - start)
    finally:
        client.close()
        cluster.close()


@pytest.mark.subprocess
def test_local_cluster_has_two_single_threaded_worker_processes(cluster):
    client = cluster.client
    workers = client.scheduler_info()["workers"]
    assert len(workers) == 2
    assert all(w["nthreads"] == 1 for w in workers.values())
    pids = set(client.run(os.getpid).values())
    assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.subprocess
def test_local_cluster_matches_numpy(cluster, record_property):
    report = example().run(cluster.client, chunk=32, length=64, heads=2, d_head=8)
    graph = report.pop("graph")
    record_property("cluster_start_seconds", round(cluster.started_in, 2))
    record_property("compute_seconds", round(graph["seconds"], 2))
    record_property("tasks", graph["tasks"])
    assert set(report) == {
        "transformer_xl", "full_layout", "t5", "alibi",
        "transformer_xl_blockwise", "t5_blockwise",
    }  # fmt: skip
    for name, row in report.items():
        assert row["chunks"] == (32, 32), name
        assert row["error"] < 1e-12, name
