"""One rank of tests/test_torch_ring.py: ``ring_attention`` over a gloo process group.

Run as ``python tests/_ring_worker.py`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set, once per rank. Every rank builds the same float64 inputs, runs each
scheme once on the whole sequence in this process (the reference, with ``torch.autograd``)
and once on the ring, on its shard of ``q``, ``k``, ``v`` (contiguous, and laid out by
``zigzag_shard`` for ``sharding="zigzag"``), the tables and biases replicated. The outputs
and the sharded inputs' gradients are gathered over the group, the replicated inputs'
partial gradients summed (``all_reduce``); rank 0 prints one JSON line: per case the largest
difference of the output and of each gradient from the reference, each rank's count of
block steps folded (its work) and of point-to-point sends, forward and backward. A ring
on a subgroup (the even ranks, and the odd ones, each their own ring) and the bad-argument
errors are checked too.

Imports torch inside :func:`main` only: pytest's ``--doctest-modules`` imports this file
where torch may be missing.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

#: Seconds before a stuck rank dumps its stack and exits (the test's own timeout is longer).
DEADLINE = 400
B, H, L, D, DV = 1, 2, 16, 4, 3  # L: divisible by 2·4, the zig-zag chunks of a world of 4
MEMORY = 8  # Transformer-XL's memory: Lk = L + MEMORY


def cases(relattn: Any, torch: Any) -> dict[str, tuple[dict[str, Any], Callable, Callable]]:
    """name -> (inputs, the whole-sequence call ``f(a)``, the ring's keywords ``g(a)``).

    ``a`` maps each input's name to its tensor; ``q``, ``k``, ``v`` (and ``positions``,
    ``segment_ids``: integers) are the ones the ring shards.
    """
    g = torch.Generator().manual_seed(0)

    def f(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    qkv = {"q": f(B, H, L, D), "k": f(B, H, L, D), "v": f(B, H, L, DV)}
    full, causal = 2 * L - 1, L
    u, w = f(H, 1, D), f(H, 1, D)
    slopes = torch.as_tensor(relattn.alibi_slopes(H), dtype=torch.float64)
    alibi = slopes[:, None] * torch.as_tensor(relattn.relative_distances(L, L, causal=True))
    buckets = relattn.relative_position_bucket(
        relattn.relative_distances(L, L), num_buckets=8, max_distance=16
    )
    t5 = f(8, H)[torch.as_tensor(buckets)].T.contiguous()
    lk = L + MEMORY
    memory = {"q": f(B, H, L, D), "k": f(B, H, lk, D), "v": f(B, H, lk, DV)}
    padding = torch.ones(B, 1, 1, L, dtype=torch.bool)
    padding[..., 11:] = False
    # Packed documents: ids 0, 0, …, 1, …, 2, … and positions restarting in each.
    documents = torch.tensor([0] * 5 + [1] * 7 + [2] * 4)
    restart = torch.cat([torch.arange(5), torch.arange(7), torch.arange(4)])

    def relative(a: dict[str, Any], **options: Any) -> Any:
        names = ("position_table", "content_bias", "position_bias", "value_table",
                 "relative_bias", "query_position_table", "mask")  # fmt: skip
        return {n: a[n] for n in names if n in a} | options

    return {
        "sdpa[causal]": (dict(qkv), lambda a: {"causal": True}, None),
        "sdpa[key_padding]": ({**qkv, "mask": padding}, relative, None),
        "alibi": ({**qkv, "relative_bias": alibi}, relative, None),
        "transformer_xl[causal]": (
            {**qkv, "position_table": f(H, causal, D), "content_bias": u, "position_bias": w},
            relative, None,
        ),
        "xlnet[full,t5,value_table]": (
            {**qkv, "position_table": f(full, D), "content_bias": u, "position_bias": w,
             "relative_bias": t5, "value_table": f(full, DV)},
            lambda a: relative(a, causal=True), None,
        ),
        "transformer_xl[memory]": (
            {**memory, "position_table": f(lk, D), "content_bias": u, "position_bias": w},
            relative, None,
        ),
        "deberta[c2p,p2c]": (
            {**qkv, "position_table": f(full, D), "query_position_table": f(full, D)},
            lambda a: relative(a, causal=True, scale=1 / (3 * D) ** 0.5), None,
        ),
        "packed[positions,segments,t5]": (
            {**qkv, "position_table": f(full, D), "relative_bias": t5},
            lambda a: relative(a, causal=True),
            {"positions": restart, "segment_ids": documents},
        ),
    }  # fmt: skip


def main() -> None:
    import torch
    import torch.distributed as dist

    import relattn
    from relattn import fold

    faulthandler.dump_traceback_later(DEADLINE, exit=True)
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    counts = {"block_steps": 0, "sends": 0}
    block_step, batch_isend_irecv = fold.block_step, dist.batch_isend_irecv

    def counting_step(*args: Any, **kwargs: Any) -> Any:
        counts["block_steps"] += 1
        return block_step(*args, **kwargs)

    def counting_sends(ops: list[Any]) -> Any:
        counts["sends"] += sum(op.op is dist.isend for op in ops)
        return batch_isend_irecv(ops)

    fold.block_step, dist.batch_isend_irecv = counting_step, counting_sends
    report: dict[str, Any] = {}
    try:
        for name, (arrays, options, integers) in cases(relattn, torch).items():
            for sharding in ("contiguous", "zigzag"):
                key = f"{name}[{sharding}]"
                try:
                    report[key] = _compare(
                        relattn, torch, dist, arrays, options, integers or {}, sharding,
                        counts, None,
                    )  # fmt: skip
                except Exception as exc:  # one failure is reported by name
                    report[key] = {"error": f"{exc!r}\n{traceback.format_exc()}"}
        report["subgroup"] = _subgroups(relattn, torch, dist, counts)
        report["errors"] = _errors(relattn, torch, dist)
    finally:
        fold.block_step, dist.batch_isend_irecv = block_step, batch_isend_irecv
    if rank == 0:
        print(json.dumps(report), flush=True)
    dist.destroy_process_group()


def _compare(
    relattn: Any, torch: Any, dist: Any, arrays: dict[str, Any], options: Callable,
    integers: dict[str, Any], sharding: str, counts: dict[str, int], group: Any,
) -> dict[str, Any]:  # fmt: skip
    """One case on the ring of ``group`` against the whole-sequence call: the largest
    differences and this group's per-rank counts."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    zigzag = sharding == "zigzag"

    def layout(x: Any, axis: int) -> Any:
        return relattn.zigzag_shard(x, n, axis=axis) if zigzag else x

    def shard(x: Any, axis: int) -> Any:
        return layout(x, axis).chunk(n, dim=axis)[me].clone()

    whole = {k: x.clone().requires_grad_(x.is_floating_point()) for k, x in arrays.items()}
    q, k, v = whole.pop("q"), whole.pop("k"), whole.pop("v")
    out = relattn.relative_attention(q, k, v, **{"position_table": None, **options(whole)},
                                     **integers)  # fmt: skip
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                            dtype=out.dtype)  # fmt: skip
    floating = {"q": q, "k": k, "v": v, **{k: x for k, x in whole.items() if x.requires_grad}}
    expected = dict(zip(floating, torch.autograd.grad(out, list(floating.values()), cotangent),
                        strict=True))  # fmt: skip

    local = {name: shard(x.detach(), -2).requires_grad_(True) for name, x in
             (("q", q), ("k", k), ("v", v))}  # fmt: skip
    replicated = {name: x.detach().clone().requires_grad_(x.requires_grad)
                  for name, x in whole.items()}  # fmt: skip
    sharded_integers = {name: shard(x, -1) for name, x in integers.items()}
    before = dict(counts)
    ring = relattn.ring_attention(
        local["q"], local["k"], local["v"], group=group, sharding=sharding,
        **options(replicated), **sharded_integers,
    )  # fmt: skip
    forward = {name: counts[name] - before[name] for name in counts}
    inputs = {**local, **{k: x for k, x in replicated.items() if x.requires_grad}}
    before = dict(counts)
    grads = torch.autograd.grad(ring, list(inputs.values()), shard(cotangent, -2))
    backward_sends = counts["sends"] - before["sends"]

    def gathered(x: Any) -> Any:
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        whole = torch.cat(parts, dim=-2)
        return relattn.zigzag_unshard(whole, n, axis=-2) if zigzag else whole

    result: dict[str, Any] = {"forward": float((gathered(ring.detach()) - out).abs().max())}
    result["grads"] = {}
    for name, grad in zip(inputs, grads, strict=True):
        if name in local:
            grad = gathered(grad)
        else:  # a replicated input: each rank's share, summed over the group
            grad = grad.clone()
            dist.all_reduce(grad, group=group)
        result["grads"][name] = float((grad - expected[name]).abs().max())
    per_rank = torch.tensor([forward["block_steps"], forward["sends"], backward_sends])
    parts = [torch.empty_like(per_rank) for _ in range(n)]
    dist.all_gather(parts, per_rank, group=group)
    result["block_steps"] = [int(p[0]) for p in parts]
    result["sends"] = {"forward": [int(p[1]) for p in parts],
                       "backward": [int(p[2]) for p in parts]}  # fmt: skip
    return result


def _subgroups(relattn: Any, torch: Any, dist: Any, counts: dict[str, int]) -> Any:
    """Two rings at once: the even ranks and the odd ones, each a subgroup (world >= 4)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 4:
        return None
    groups = [dist.new_group(list(range(parity, world, 2))) for parity in (0, 1)]
    arrays, options, _ = cases(relattn, torch)["transformer_xl[causal]"]
    mine = groups[rank % 2]
    result = _compare(relattn, torch, dist, arrays, options, {}, "zigzag", counts, mine)
    results = [None] * world
    dist.all_gather_object(results, result)
    return results


def _errors(relattn: Any, torch: Any, dist: Any) -> dict[str, str | None]:
    """The messages of the bad calls (``None``: no error raised)."""
    x = torch.zeros(1, 2, 6, 4)
    odd = torch.zeros(1, 2, 3, 4)
    calls = {
        "axis_name": lambda: relattn.ring_attention(x, x, x, axis_name="seq"),
        "group_type": lambda: relattn.ring_attention(x, x, x, group="world"),
        "sharding": lambda: relattn.ring_attention(x, x, x, sharding="striped"),
        "zigzag_odd": lambda: relattn.ring_attention(odd, odd, odd, sharding="zigzag"),
    }
    found: dict[str, str | None] = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = None
        except Exception as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    return found


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
