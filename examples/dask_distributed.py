"""Relative attention on a Dask cluster: two worker processes, arrays chunked along the sequence.

relattn runs on Dask arrays unchanged (SPEC §2.14: the caller's chunks are the
parallelism): each function builds a lazy graph, and a ``dask.distributed``
cluster computes it. Queries, keys and values are chunked along the batch and
the sequence, the relative tables along their distances; the outputs come back
chunked as the queries are, ``(1, 1), (H,), (chunk, chunk, …), (d,)``, however
the shift of Transformer-XL's appendix B reshapes the scores inside.

Six attention layers run on a :class:`dask.distributed.LocalCluster` of two
worker processes with one thread each, in one graph:

* Transformer-XL (causal layout, content bias ``u`` and position bias ``v``);
* the full layout of XLNet and Conformer (every distance, no implied mask);
* T5's bucketed per-distance bias and ALiBi's linear one
  (:func:`relattn.scaled_dot_product_attention` with ``relative_bias``);
* Transformer-XL and T5 blockwise (``block_size=``: O(L) memory per head).

Each output is checked against the same call on the NumPy arrays.

Run with ``python examples/dask_distributed.py``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import array_api_compat
import numpy as np

import relattn

BATCH, HEADS, LENGTH, D_HEAD, CHUNK = 2, 4, 512, 32, 128
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128


def make_inputs(
    seed: int = 0,
    *,
    batch: int = BATCH,
    heads: int = HEADS,
    length: int = LENGTH,
    d_head: int = D_HEAD,
) -> dict[str, np.ndarray]:
    """Random float64 queries, keys, values and position parameters, as NumPy arrays."""
    rng = np.random.default_rng(seed)
    qkv = {name: rng.standard_normal((batch, heads, length, d_head)) for name in "qkv"}
    return {
        **qkv,
        # Projected sinusoids stand-ins: row m encodes δ = m - (L - 1).
        "causal_table": rng.standard_normal((heads, length, d_head)) / math.sqrt(d_head),
        "full_table": rng.standard_normal((heads, 2 * length - 1, d_head)) / math.sqrt(d_head),
        "u": rng.standard_normal((heads, 1, d_head)) * 0.5,
        "v_bias": rng.standard_normal((heads, 1, d_head)) * 0.5,
        "t5_embedding": rng.standard_normal((heads, T5_BUCKETS)),
    }


def chunked(inputs: dict[str, np.ndarray], chunk: int = CHUNK) -> dict[str, Any]:
    """The inputs as Dask arrays: one batch row and ``chunk`` positions or distances a chunk."""
    import dask.array as da

    def chunks(name: str, a: np.ndarray) -> tuple[int, ...]:
        if a.ndim == 4:  # q, k, v: (B, H, L, d)
            return (1, a.shape[1], chunk, a.shape[3])
        if name.endswith("_table"):  # (H, W, d)
            return (a.shape[0], chunk, a.shape[2])
        return a.shape

    return {name: da.from_array(a, chunks=chunks(name, a)) for name, a in inputs.items()}


def attention_layers(a: dict[str, Any], *, block_size: int = CHUNK) -> dict[str, Any]:
    """The six attention outputs ``(B, H, L, d)`` for the arrays ``a`` of any one library."""
    xp = array_api_compat.array_namespace(a["q"])
    q, k, v = a["q"], a["k"], a["v"]
    length = q.shape[-2]
    txl = {"content_bias": a["u"], "position_bias": a["v_bias"]}
    # T5: one bucket per distance of the full layout, looked up per head: (H, 2L - 1).
    distances = relattn.relative_distances(length, length, xp=xp)
    buckets = relattn.relative_position_bucket(
        distances, num_buckets=T5_BUCKETS, max_distance=T5_MAX_DISTANCE
    )
    t5 = xp.take(a["t5_embedding"], buckets, axis=-1)
    # ALiBi: m_h · δ = -m_h |δ| over the causal layout (δ <= 0), (H, L).
    slopes = relattn.alibi_slopes(q.shape[1], xp=xp, dtype=q.dtype)
    causal = relattn.relative_distances(length, length, causal=True, xp=xp)
    alibi = slopes[:, None] * xp.astype(causal, q.dtype)
    return {
        "transformer_xl": relattn.relative_attention(q, k, v, a["causal_table"], **txl),
        "full_layout": relattn.relative_attention(q, k, v, a["full_table"], **txl),
        "t5": relattn.scaled_dot_product_attention(q, k, v, relative_bias=t5),
        "alibi": relattn.scaled_dot_product_attention(q, k, v, relative_bias=alibi),
        "transformer_xl_blockwise": relattn.relative_attention(
            q, k, v, a["causal_table"], **txl, block_size=block_size
        ),
        "t5_blockwise": relattn.scaled_dot_product_attention(
            q, k, v, relative_bias=t5, block_size=block_size
        ),
    }


def start_cluster(n_workers: int = 2) -> tuple[Any, Any]:
    """A :class:`LocalCluster` of ``n_workers`` processes, one thread each, and its client.

    On the loopback interface, without a dashboard; close the client, then the
    cluster.
    """
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    return cluster, Client(cluster)


def run(client: Any, *, chunk: int = CHUNK, seed: int = 0, **sizes: int) -> dict[str, Any]:
    """Every layer computed on ``client``'s cluster in one graph, checked against NumPy.

    Returns, per layer, ``"chunks"`` (the lazy output's chunks along the
    sequence), ``"error"`` (largest absolute difference from NumPy), and the
    whole graph's ``"seconds"`` and ``"tasks"`` under the key ``"graph"``.
    """
    import dask

    inputs = make_inputs(seed, **sizes)
    lazy = attention_layers(chunked(inputs, chunk), block_size=chunk)
    tasks = len({key for out in lazy.values() for key in out.__dask_graph__()})
    start = time.perf_counter()
    (computed,) = dask.compute(lazy, scheduler=client.get)
    seconds = time.perf_counter() - start
    expected = attention_layers(inputs, block_size=chunk)
    report: dict[str, Any] = {
        name: {
            "chunks": lazy[name].chunks[-2],
            "error": float(np.max(np.abs(np.asarray(computed[name]) - expected[name]))),
        }
        for name in lazy
    }
    report["graph"] = {"seconds": seconds, "tasks": tasks}
    return report


def main() -> None:
    start = time.perf_counter()
    cluster, client = start_cluster()
    try:
        workers = len(client.scheduler_info()["workers"])
        started = time.perf_counter() - start
        print(f"LocalCluster: {workers} worker processes, started in {started:.1f} s")
        report = run(client)
        graph = report.pop("graph")
        print(f"B={BATCH} H={HEADS} L={LENGTH} d={D_HEAD}, chunks of {CHUNK} positions:", end=" ")
        print(f"{graph['tasks']} tasks, computed in {graph['seconds']:.2f} s")
        for name, row in report.items():
            chunks, error = row["chunks"], row["error"]
            print(f"  {name:25s} sequence chunks {chunks}, max |Dask - NumPy| {error:.1e}")
            assert error < 1e-10, name
    finally:
        client.close()
        cluster.close()


if __name__ == "__main__":
    main()
