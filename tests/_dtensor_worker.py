"""One rank of tests/test_dtensor.py: relattn on torch DTensors over a gloo process group.

Run as ``python tests/_dtensor_worker.py`` with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set, once per rank. Every rank builds the
same float64 inputs, distributes ``q``, ``k`` and ``v`` along the batch
(``Shard(0)``), the heads (``Shard(1)``) or not at all (``Replicate()``), the
relative tables and biases replicated, and runs each attention layer once on
the DTensors (the first call: DTensor's sharding propagation included) and
once on the plain tensors. The last line of its output is JSON: per layer and
placement, the seconds of the first call, the collectives it issued
(``CommDebugMode``), the output's type and placements, and the largest
difference from the plain-tensor result.

Imports torch inside :func:`main` only: pytest's ``--doctest-modules`` imports
this file where torch may be missing.
"""

from __future__ import annotations

import json
import os
import time


def layers(relattn):
    """Name -> ``fn(q, k, v, table)``: ``table`` maps a parameter's name to the array to use."""
    return {
        "transformer_xl": lambda q, k, v, p: relattn.relative_attention(
            q, k, v, p("causal_table"), content_bias=p("u"), position_bias=p("v_bias")
        ),
        "full_layout": lambda q, k, v, p: relattn.relative_attention(
            q, k, v, p("full_table"), content_bias=p("u"), position_bias=p("v_bias")
        ),
        "t5_bias": lambda q, k, v, p: relattn.scaled_dot_product_attention(
            q, k, v, relative_bias=p("full_bias")
        ),
        "alibi_causal": lambda q, k, v, p: relattn.scaled_dot_product_attention(
            q, k, v, relative_bias=p("causal_bias")
        ),
        "causal_flag": lambda q, k, v, p: relattn.scaled_dot_product_attention(
            q, k, v, causal=True
        ),
    }


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    import relattn

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        batch, heads, length, d = 2 * world, 2 * world, 48, 16
        generator = torch.Generator().manual_seed(0)

        def normal(*shape):
            return torch.randn(*shape, generator=generator, dtype=torch.float64)

        q, k, v = (normal(batch, heads, length, d) for _ in range(3))
        params = {
            "causal_table": normal(heads, length, d) / d**0.5,
            "full_table": normal(heads, 2 * length - 1, d) / d**0.5,
            "u": normal(heads, 1, d),
            "v_bias": normal(heads, 1, d),
            "full_bias": normal(heads, 2 * length - 1),
            "causal_bias": -torch.arange(length - 1, -1, -1, dtype=torch.float64) * 0.25,
        }
        # Per-head parameters (the leading axis of all but ALiBi's shared one) are
        # replicated, or sharded along their heads where q, k and v are.
        replicated = {name: distribute_tensor(a, mesh, [Replicate()]) for name, a in params.items()}
        per_head = {
            name: distribute_tensor(a, mesh, [Shard(0) if a.ndim > 1 else Replicate()])
            for name, a in params.items()
        }
        report = {}
        for name, fn in layers(relattn).items():
            expected = fn(q, k, v, params.__getitem__)
            rows = report[name] = {}
            for placement in (Shard(0), Shard(1), Replicate()):
                dq, dk, dv = (distribute_tensor(x, mesh, [placement]) for x in (q, k, v))
                start = time.perf_counter()
                with CommDebugMode() as comm:
                    out = fn(dq, dk, dv, (per_head if placement == Shard(1) else replicated).get)
                seconds = time.perf_counter() - start
                is_dtensor = isinstance(out, DTensor)
                whole = out.full_tensor() if is_dtensor else out
                rows[str(placement)] = {
                    "seconds": seconds,
                    "collectives": comm.get_total_counts(),
                    "dtensor": is_dtensor,
                    "placements": [str(p) for p in out.placements] if is_dtensor else None,
                    "error": float((whole - expected).abs().max()),
                    "shape": list(whole.shape),
                }
        print(json.dumps({"rank": rank, "world": world, "report": report}), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
