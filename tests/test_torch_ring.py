"""``ring_attention`` on torch tensors over ``torch.distributed`` (SPEC §2.19, §5).

Each world size (2 and 4) runs ``tests/_ring_worker.py`` once per rank, in processes of
their own joined by a gloo group on 127.0.0.1 (:func:`relattn.testing.gloo_world`). Every
scheme (plain causal, a key-padding mask, ALiBi, Transformer-XL's causal layout with ``u``
and ``v``, XLNet's full layout with a T5 bias and a value table, a memory ``Lk > Lq``,
DeBERTa's two tables, packed documents with positions and segment ids), sharded
contiguously and zig-zag, must equal the whole-sequence call in float64 to 1e-10, forward
and every gradient (the sharded inputs' gathered, the replicated inputs' partial
gradients summed over the group). The worker also counts each rank's block steps (its
work) and point-to-point sends: with a causal mask, the zig-zag ranks fold the same
number of blocks, ``2n + 1``; contiguous rank ``r`` folds ``r + 1``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relattn.testing import gloo_world

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.subprocess

WORKER = Path(__file__).with_name("_ring_worker.py")
WORLDS = (2, 4)
#: SPEC §5: sequence parallelism equals one device to 1e-10 in float64.
TOLERANCE = 1e-10
SCHEMES = (
    "sdpa[causal]",
    "sdpa[key_padding]",
    "alibi",
    "transformer_xl[causal]",
    "xlnet[full,t5,value_table]",
    "transformer_xl[memory]",
    "deberta[c2p,p2c]",
    "packed[positions,segments,t5]",
)
#: The schemes whose only masking is causal with Lq = Lk: their block counts are the
#: ring's schedule, not the data's.
CAUSAL = ("sdpa[causal]", "alibi", "transformer_xl[causal]", "xlnet[full,t5,value_table]",
          "deberta[c2p,p2c]")  # fmt: skip


@pytest.fixture(scope="module", params=WORLDS, ids=lambda n: f"world{n}")
def report(request):
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available")
    world = request.param
    outputs = gloo_world([str(WORKER)], world, timeout=480)
    return world, json.loads(outputs[0].strip().splitlines()[-1])


@pytest.mark.parametrize("sharding", ["contiguous", "zigzag"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_ring_equals_one_process(report, scheme, sharding):
    world, found = report
    result = found[f"{scheme}[{sharding}]"]
    assert "error" not in result, result.get("error")
    assert result["forward"] < TOLERANCE
    assert {"q", "k", "v"} <= set(result["grads"])
    for name, difference in result["grads"].items():
        assert difference < TOLERANCE, name
    # Each rank sends k and v (and the keys' positions and segment ids) n - 1 times, and
    # in the backward their gradients back n - 1 times.
    moving = 4 if "positions" in scheme else 2
    assert result["sends"]["forward"] == [moving * (world - 1)] * world
    assert result["sends"]["backward"] == [2 * (world - 1)] * world


@pytest.mark.parametrize("scheme", CAUSAL)
def test_zigzag_balances_the_causal_work(report, scheme):
    """Contiguous rank ``r`` folds ``r + 1`` shard pairs; zig-zag, every rank ``2n + 1``
    chunk pairs of the ``4n`` (SPEC §5: the most loaded at most 1.1× the least)."""
    world, found = report
    assert found[f"{scheme}[contiguous]"]["block_steps"] == list(range(1, world + 1))
    zigzag = found[f"{scheme}[zigzag]"]["block_steps"]
    assert zigzag == [2 * world + 1] * world
    assert max(zigzag) <= 1.1 * min(zigzag)


def test_rings_on_subgroups(report):
    """Two rings at once, on the even and on the odd ranks of a world of 4: each equals
    the whole-sequence call on its own group."""
    world, found = report
    if world < 4:
        pytest.skip("subgroups of 2 need a world of 4")
    for rank, result in enumerate(found["subgroup"]):
        assert result["forward"] < TOLERANCE, rank
        assert max(result["grads"].values()) < TOLERANCE, rank
        assert result["block_steps"] == [5, 5], rank  # zig-zag on a ring of 2


def test_bad_arguments_on_torch(report):
    _, found = report
    errors = found["errors"]
    assert errors["axis_name"].startswith("ValueError: axis_name names a JAX mesh axis")
    assert errors["group_type"].startswith(
        "TypeError: group must be a torch.distributed.ProcessGroup or None"
    )
    assert errors["sharding"] == (
        "ValueError: sharding must be one of ('contiguous', 'zigzag'), got 'striped'"
    )
    assert "need an even length along axis -2, got 3 and 3" in errors["zigzag_odd"]
