"""relattn on torch DTensors: batch and head parallelism is the caller's sharding (SPEC §2.14).

Each world size runs ``tests/_dtensor_worker.py`` once per rank, in processes
of their own joined by a gloo process group on 127.0.0.1 (a free port). The
inputs are DTensors sharded along the batch (``Shard(0)``), the heads
(``Shard(1)``, with the per-head parameters sharded along theirs) or
replicated; the layers are Transformer-XL's causal layout, the full layout,
and scaled dot-product attention with a T5-style bias, an ALiBi bias in the
causal layout and ``causal=True``. Each must give a DTensor with the inputs'
placement, equal to the plain-tensor result, on its first call within seconds
(DTensor's sharding propagation through the CPU fused kernel's decomposition
took minutes: DTensors take the generic path) and without any collective.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relattn.testing import gloo_world

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.subprocess

WORKER = Path(__file__).with_name("_dtensor_worker.py")
LAYERS = ("transformer_xl", "full_layout", "t5_bias", "alibi_causal", "causal_flag")
PLACEMENTS = ("S(0)", "S(1)", "R")
#: The first call on DTensors, sharding propagation included (about 1 s here).
FIRST_CALL_SECONDS = 60.0


def run_world(world: int) -> list[dict]:
    """The worker's JSON report of every rank of a ``world``-process group."""
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available")
    outputs = gloo_world([str(WORKER)], world)
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_dtensor_layers_equal_plain_tensors(world):
    reports = run_world(world)
    assert [r["rank"] for r in reports] == list(range(world))
    for report in reports:
        assert report["world"] == world
        assert set(report["report"]) == set(LAYERS)
        for layer, rows in report["report"].items():
            assert set(rows) == set(PLACEMENTS), layer
            for placement, row in rows.items():
                where = f"rank {report['rank']}, {layer}, {placement}"
                assert row["dtensor"], where
                assert row["placements"] == [placement], where
                assert row["error"] < 1e-10, where
                assert row["collectives"] == 0, where
                assert row["seconds"] < FIRST_CALL_SECONDS, where


BUDGET_SCRIPT = """
import os
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import relattn

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (1,))
q, k, v = (torch.randn(2, 2, 6, 4, dtype=torch.float64) for _ in range(3))
table = torch.randn(2, 6, 4, dtype=torch.float64)
dq, dk, dv = (distribute_tensor(x, mesh, [Shard(0)]) for x in (q, k, v))
dt = distribute_tensor(table, mesh, [Replicate()])
out = relattn.relative_attention(dq, dk, dv, dt)  # a budget of 1 byte: still dense
assert isinstance(out, DTensor)
error = (out.full_tensor() - relattn.relative_attention(q, k, v, table)).abs().max().item()
assert error < 1e-12, error
try:
    relattn.relative_attention(dq, dk, dv, dt, block_size=2)
except TypeError as e:
    assert str(e).startswith("block_size: the blockwise path does not run on DTensor"), e
else:
    raise AssertionError("block_size=2 on DTensors did not raise")
dist.destroy_process_group()
print("ok")
"""


def test_dtensor_stays_dense_beyond_the_budget():
    """The blockwise path does not take DTensors: the automatic choice stays dense whatever
    the budget, and an explicit ``block_size`` is a ``TypeError`` naming it."""
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available")
    (out,) = gloo_world(["-c", BUDGET_SCRIPT], 1, env={"RELATTN_MAX_SCORE_BYTES": "1"})
    assert out.strip().endswith("ok")
