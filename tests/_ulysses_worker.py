"""Multi-device checks of ``relattn.ulysses.ulysses_attention`` for ``tests/test_ulysses.py``.

Run in a fresh interpreter, as JAX fixes its device count when it is first imported:

- ``python tests/_ulysses_worker.py jax OUT.json``: 8 forced host devices
  (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set below before JAX is
  imported), float64; Ulysses in ``jax.shard_map`` on meshes of 2, 4 and 8 devices.
- ``python tests/_ulysses_worker.py torch WORLD OUT.json``: ``WORLD`` processes
  (``torch.multiprocessing.spawn``) on a gloo process group (``init_method=file://``),
  float64.

Each writes one JSON object: per scheme and device count, the largest absolute
difference from the single-device float64 call (``relative_attention``,
``scaled_dot_product_attention`` or ``disentangled_attention`` of the whole sequence) of
the output and of the gradient of every floating input (the loss ``Σ out · c`` for a fixed
random ``c``); on JAX also the HLO collective counts; the errors of bad calls (type and
message); seconds per section. Each case is caught on its own, so that one failure is
reported by name and does not hide the others.

Imports JAX and torch inside the functions that use them: pytest's ``--doctest-modules``
imports this file where they may be missing, and the torch ranks need no JAX.
"""

from __future__ import annotations

import os
import sys

DEVICES = 8
if __name__ == "__main__" and sys.argv[1:2] == ["jax"]:
    # Before JAX is imported.
    from _workers import use_host_devices

    use_host_devices(DEVICES)

import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from _workers import collectives, error_of, max_diff  # noqa: E402

import relattn  # noqa: E402

B, H, D, DV = 2, 8, 4, 3  # batch, heads (divisible by 2, 4, 8), d, d_v (d_v != d)
L = 16  # divisible by 2, 4 and 8
MEMORY = 8  # Transformer-XL memory: Lk = L + MEMORY = 24 keys, shards of Lk / n
JAX_DEVICE_COUNTS = (2, 4, 8)
#: Arrays sharded along the sequence: q, k, v on axis -2, positions and document ids on -1.
SEQUENCE_AXIS = {
    "q": -2, "k": -2, "v": -2, "positions": -1, "segment_ids": -1, "query_positions": -1,
    "key_positions": -1,
}  # fmt: skip


# -------------------------------------------------------------------------------------------
# The schemes: NumPy inputs, one call on one device and the same call under Ulysses
# -------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One scheme: its inputs (NumPy; floating ones are differentiated, booleans and
    integers are constants), its static options, the single-device function it is
    compared with, and ``mods(asarray)``, the ``score_mod``/``mask_mod`` built over arrays
    of the library under test."""

    arrays: dict[str, np.ndarray]
    options: dict[str, Any] = field(default_factory=dict)
    reference: str = "relative"  # "relative", "sdpa" or "deberta"
    mods: Callable[[Callable[[Any], Any]], dict[str, Any]] | None = None

    @property
    def params(self) -> list[str]:
        return sorted(n for n, a in self.arrays.items() if a.dtype.kind == "f")

    @property
    def constants(self) -> list[str]:
        return sorted(n for n, a in self.arrays.items() if a.dtype.kind != "f")


def _pair(a: dict[str, Any]) -> dict[str, Any]:
    """``a`` with ``query_positions`` and ``key_positions`` as one ``positions`` pair."""
    a = dict(a)
    if "query_positions" in a:
        a["positions"] = (a.pop("query_positions"), a.pop("key_positions"))
    return a


def single(case: Case, a: dict[str, Any], asarray: Callable[[Any], Any]) -> Any:
    """The whole sequence's attention on one device."""
    a = _pair(a)
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    options = {**case.options, **(case.mods(asarray) if case.mods else {})}
    if case.reference == "sdpa":
        return relattn.scaled_dot_product_attention(q, k, v, **a, **options)
    if case.reference == "deberta":
        table, query_table = a.pop("position_table"), a.pop("query_position_table")
        return relattn.disentangled_attention(q, k, v, table, query_table, **a, **options)
    return relattn.relative_attention(q, k, v, a.pop("position_table", None), **a, **options)


def ulysses(case: Case, a: dict[str, Any], asarray: Callable[[Any], Any], **where: Any) -> Any:
    """``ulysses_attention`` on this device's shards (``where``: ``axis_name`` or ``group``)."""
    from relattn.ulysses import ulysses_attention

    a = _pair(a)
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    options = {**case.options, **(case.mods(asarray) if case.mods else {})}
    return ulysses_attention(q, k, v, a.pop("position_table", None), **a, **options, **where)


def cases(rng: np.random.Generator) -> dict[str, Case]:
    """The schemes of SPEC §2.19 (the same inputs on every backend and rank)."""
    f = lambda *shape: rng.normal(size=shape)  # noqa: E731
    qkv = {"q": f(B, H, L, D), "k": f(B, H, L, D), "v": f(B, H, L, DV)}
    full = 2 * L - 1
    u, pv = f(H, 1, D), f(H, 1, D)  # Transformer-XL's u and v, per head
    slopes = relattn.alibi_slopes(H)
    found: dict[str, Case] = {}

    found["sdpa[causal]"] = Case(dict(qkv), {"causal": True}, "sdpa")
    # Transformer-XL: a per-head table in the causal layout (implies causal), u and v.
    found["transformer_xl"] = Case(
        {**qkv, "position_table": f(H, L, D), "content_bias": u, "position_bias": pv}
    )
    # XLNet full layout: one table for every head, T5's bucketed bias (H, W), a per-head
    # value table (Shaw's value term).
    buckets = relattn.relative_position_bucket(
        relattn.relative_distances(L, L), num_buckets=8, max_distance=16
    )
    found["xlnet[full,t5,value_table]"] = Case(
        {
            **qkv,
            "position_table": f(full, D),
            "content_bias": u,
            "position_bias": pv,
            "relative_bias": f(8, H)[buckets].T.copy(),
            "value_table": f(H, full, DV),
        }
    )
    # Memory: Lk = L + M keys (k, v shards of Lk / n), query i at key i + M; Transformer-XL's
    # per-head causal table and a full-layout T5 bias.
    lk = L + MEMORY
    found["memory[transformer_xl]"] = Case(
        {
            "q": f(B, H, L, D),
            "k": f(B, H, lk, D),
            "v": f(B, H, lk, DV),
            "position_table": f(H, lk, D),
            "content_bias": u,
            "position_bias": pv,
            "relative_bias": f(H, L + lk - 1),
        }
    )
    # The same memory by positions as data: a (query, key) pair of position arrays, each
    # sharded and gathered on its own; a full-layout T5 bias read at δ, causal by the flag.
    found["memory[positions_pair]"] = Case(
        {
            "q": found["memory[transformer_xl]"].arrays["q"],
            "k": found["memory[transformer_xl]"].arrays["k"],
            "v": found["memory[transformer_xl]"].arrays["v"],
            "relative_bias": f(H, L + lk - 1),
            "query_positions": np.arange(L) + MEMORY,
            "key_positions": np.arange(lk),
        },
        {"causal": True},
        "sdpa",
    )
    # DeBERTa: c2p (per head) and p2c tables gathered at φ = clip(bucket(-δ) + k, 0, 2k - 1).
    k_buckets = 4
    phi = relattn.log_bucket_position(
        -relattn.relative_distances(L, L), bucket_size=k_buckets, max_position=16
    )
    phi = np.clip(phi + k_buckets, 0, 2 * k_buckets - 1)
    found["deberta"] = Case(
        {
            **qkv,
            "position_table": f(H, 2 * k_buckets, D)[:, phi],
            "query_position_table": f(2 * k_buckets, D)[phi],
        },
        {"scale": 1.0 / np.sqrt(3 * D)},
        "deberta",
    )
    # ALiBi over the causal layout (implies causal), with one key/value head for every
    # query head (multi-query attention, as Falcon and MPT pair it).
    alibi = slopes[:, None] * relattn.relative_distances(L, L, causal=True)
    found["alibi[mqa]"] = Case(
        {"q": qkv["q"], "k": f(B, 1, L, D), "v": f(B, 1, L, DV), "relative_bias": alibi},
        reference="sdpa",
    )
    # A key-padding mask (B, 1, 1, Lk), used whole, and a per-head bias (H, Lq, Lk).
    padding = relattn.padding_mask(np.array([L, 11]), L)[:, None, None, :]
    found["key_padding[bias]"] = Case(
        {**qkv, "mask": padding, "bias": f(H, L, L)}, reference="sdpa"
    )
    # Packed documents: positions restart at each document, no attention across them;
    # Transformer-XL's per-head causal table, a full-layout ALiBi bias, blockwise.
    lengths = ([5, 7, 4], [8, 8])
    ids = np.stack([np.repeat(np.arange(len(n)), n) for n in lengths])[:, None, :]
    starts = np.stack([np.concatenate([np.arange(m) for m in n]) for n in lengths])[:, None, :]
    found["packed[positions,segment_ids]"] = Case(
        {
            **qkv,
            "position_table": f(H, L, D),
            "content_bias": u,
            "position_bias": pv,
            "relative_bias": slopes[:, None] * -np.abs(relattn.relative_distances(L, L)),
            "positions": starts,
            "segment_ids": ids,
        },
        {"causal": True, "block_size": 4},
    )

    # score_mod and mask_mod that read the head index: each device must see global heads.
    def mods(asarray: Callable[[Any], Any]) -> dict[str, Any]:
        per_head, window = asarray(slopes), asarray(np.arange(H) + 2)
        return {
            "score_mod": lambda s, b, h, qp, kp: s + per_head[h] * (kp - qp),
            "mask_mod": lambda b, h, qp, kp: (kp <= qp) & (qp - kp <= window[h]),
        }

    found["mods[score_mod,mask_mod]"] = Case(dict(qkv), reference="sdpa", mods=mods)
    return found


def cotangent(case: Case, rng: np.random.Generator) -> np.ndarray:
    """The fixed ``c`` of the loss ``Σ out · c``: the output's shape."""
    q, k, v = (case.arrays[n] for n in ("q", "k", "v"))
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return rng.normal(size=(*lead, q.shape[-2], v.shape[-1]))


# -------------------------------------------------------------------------------------------
# JAX: jax.shard_map over meshes of 2, 4 and 8 host devices
# -------------------------------------------------------------------------------------------
def run_jax() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(0)
    schemes = cases(rng)
    cotangents = {name: cotangent(case, rng) for name, case in schemes.items()}
    report: dict[str, Any] = {
        "devices": len(jax.devices()),
        "x64": bool(jax.config.jax_enable_x64),
        "cases": {str(n): {} for n in JAX_DEVICE_COUNTS},
        "hlo": {},
        "errors": {},
        "timings": {},
    }

    def spec(name: str, ndim: int) -> P:
        axis = SEQUENCE_AXIS.get(name)
        if axis is None:
            return P()
        s: list[Any] = [None] * ndim
        s[ndim + axis] = "seq"
        return P(*s)

    def sharded(case: Case, mesh: Any) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
        """The whole output of Ulysses on ``mesh``: q, k, v and the integer ids sharded."""
        params, constants = case.params, case.constants
        in_specs = (
            {n: spec(n, case.arrays[n].ndim) for n in params},
            {n: spec(n, case.arrays[n].ndim) for n in constants},
        )
        out_spec = spec("q", case.arrays["q"].ndim)

        def local(p: dict[str, Any], c: dict[str, Any]) -> Any:
            return ulysses(case, {**p, **c}, jnp.asarray, axis_name="seq")

        return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_spec)

    def loss_of(fn: Callable[..., Any], cot: Any) -> Callable[..., Any]:
        def loss(p: dict[str, Any], c: dict[str, Any]) -> Any:
            out = fn(p, c)
            return jnp.sum(out * cot), out

        return jax.jit(jax.value_and_grad(loss, has_aux=True))

    t = time.perf_counter()
    references: dict[str, Any] = {}
    for name, case in schemes.items():
        try:
            p = {n: jnp.asarray(case.arrays[n]) for n in case.params}
            c = {n: jnp.asarray(case.arrays[n]) for n in case.constants}
            fn = loss_of(lambda p, c, case=case: single(case, {**p, **c}, jnp.asarray),
                         jnp.asarray(cotangents[name]))  # fmt: skip
            (_, out), grads = fn(p, c)
            references[name] = (np.asarray(out), {n: np.asarray(g) for n, g in grads.items()})
        except Exception as e:
            references[name] = error_of(e) + "\n" + traceback.format_exc()
    report["timings"]["single_device"] = time.perf_counter() - t

    for n in JAX_DEVICE_COUNTS:
        t = time.perf_counter()
        mesh = Mesh(np.array(jax.devices()[:n]), ("seq",))
        for name, case in schemes.items():
            result: dict[str, Any] = {}
            try:
                expected = references[name]
                if isinstance(expected, str):
                    raise RuntimeError(f"the single-device call failed: {expected}")
                p = {m: jnp.asarray(case.arrays[m]) for m in case.params}
                c = {m: jnp.asarray(case.arrays[m]) for m in case.constants}
                fn = loss_of(sharded(case, mesh), jnp.asarray(cotangents[name]))
                (_, out), grads = fn(p, c)
                out_ref, grads_ref = expected
                result["forward"] = max_diff(out, out_ref)
                result["scale"] = float(np.max(np.abs(out_ref)))
                result["grads"] = {m: max_diff(grads[m], grads_ref[m]) for m in case.params}
                result["grad_scale"] = max(float(np.max(np.abs(g))) for g in grads_ref.values())
                result["nan"] = bool(np.isnan(np.asarray(out)).any())
            except Exception as e:
                result["error"] = error_of(e) + "\n" + traceback.format_exc()
            report["cases"][str(n)][name] = result
        report["timings"][f"ulysses_{n}"] = time.perf_counter() - t

    # HLO: what moves between the devices, forward alone and with the gradients (n = 8).
    t = time.perf_counter()
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("seq",))
    hlo_cases = ("sdpa[causal]", "transformer_xl", "packed[positions,segment_ids]",
                 "memory[positions_pair]")  # fmt: skip
    for name in hlo_cases:
        case = schemes[name]
        try:
            p = {m: jnp.asarray(case.arrays[m]) for m in case.params}
            c = {m: jnp.asarray(case.arrays[m]) for m in case.constants}
            forward = jax.jit(sharded(case, mesh)).lower(p, c).compile().as_text()
            both = loss_of(sharded(case, mesh), jnp.asarray(cotangents[name]))
            backward = both.lower(p, c).compile().as_text()
            report["hlo"][name] = {
                "forward": collectives(forward),
                "with_gradients": collectives(backward),
            }
        except Exception as e:
            report["hlo"][name] = {"error": error_of(e) + "\n" + traceback.format_exc()}
    report["timings"]["hlo"] = time.perf_counter() - t

    t = time.perf_counter()
    report["errors"] = _jax_errors(jax, jnp, Mesh, P)
    report["timings"]["errors"] = time.perf_counter() - t
    return report


def _jax_errors(jax: Any, jnp: Any, Mesh: Any, P: Any) -> dict[str, str]:
    """Bad calls inside ``shard_map``: the error each raises (``"no error"`` if none)."""
    from relattn.ulysses import ulysses_attention

    mesh = Mesh(np.array(jax.devices()[:4]), ("seq",))
    x6 = jnp.zeros((1, 6, 8, D))  # six heads over four devices
    x8 = jnp.zeros((1, 8, 8, D))
    seq4, seq3 = P(None, None, "seq", None), P(None, "seq", None)
    calls = {
        "heads_not_divisible": (x6, seq4, {"axis_name": "seq"}),
        "no_head_axis": (jnp.zeros((8, D)), P("seq", None), {"axis_name": "seq"}),
        "group_with_jax": (x8, seq4, {"axis_name": "seq", "group": object()}),
        "no_axis_name": (x8, seq4, {}),
        "unknown_axis_name": (x8, seq4, {"axis_name": "heads"}),
        "head_counts_differ": (jnp.zeros((8, 8, D)), seq3, {"axis_name": "seq", "k_heads": 4}),
    }
    found: dict[str, str] = {}
    for name, (x, s, kw) in calls.items():
        kw = dict(kw)
        k_heads = kw.pop("k_heads", None)

        def local(q: Any, kw: dict[str, Any] = kw, k_heads: int | None = k_heads) -> Any:
            k = q if k_heads is None else q[:k_heads]
            return ulysses_attention(q, k, k, **kw)

        try:
            jax.shard_map(local, mesh=mesh, in_specs=(s,), out_specs=s)(x)
            found[name] = "no error"
        except Exception as e:
            found[name] = error_of(e)
    return found


# -------------------------------------------------------------------------------------------
# torch: one process per rank on a gloo group
# -------------------------------------------------------------------------------------------
def _rank(rank: int, world: int, store: str, path: str) -> None:
    """One rank: every case on its shards; rank 0 writes the report."""
    import datetime
    import faulthandler

    import torch
    import torch.distributed as dist

    faulthandler.dump_traceback_later(240, exit=True)  # a hung collective: say where
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        report = _torch_cases(rank, world, torch, dist)
        if rank == 0:
            with open(path, "w", encoding="utf-8") as out:
                json.dump(report, out)
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def _shard(x: Any, name: str, rank: int, world: int) -> Any:
    axis = SEQUENCE_AXIS.get(name)
    return x if axis is None else x.chunk(world, dim=axis)[rank]


def _torch_cases(rank: int, world: int, torch: Any, dist: Any) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    schemes = cases(rng)
    cotangents = {name: cotangent(case, rng) for name, case in schemes.items()}
    report: dict[str, Any] = {"world": world, "cases": {}, "errors": {}, "timings": {}}
    t = time.perf_counter()
    for name, case in schemes.items():
        result: dict[str, Any] = {}
        try:
            # The whole sequence on one device (every rank computes it: it is small).
            whole = {m: torch.tensor(a, requires_grad=a.dtype.kind == "f")
                     for m, a in case.arrays.items()}  # fmt: skip
            cot = torch.tensor(cotangents[name])
            out_ref = single(case, whole, torch.as_tensor)
            (out_ref * cot).sum().backward()
            # This rank's shards: q, k, v and the integer ids along the sequence.
            local = {}
            for m, a in case.arrays.items():
                shard = _shard(torch.tensor(a), m, rank, world).clone()
                local[m] = shard.requires_grad_(a.dtype.kind == "f")
            out = ulysses(case, local, torch.as_tensor, group=None)
            (out * _shard(cot, "q", rank, world)).sum().backward()
            figures = [max_diff(out.detach(), _shard(out_ref.detach(), "q", rank, world))]
            for m in case.params:
                grad = local[m].grad
                if grad is None:
                    grad = torch.zeros_like(local[m])
                if m not in SEQUENCE_AXIS:  # replicated: each rank holds its heads' share
                    grad = grad.clone()
                    dist.all_reduce(grad)
                expected = _shard(whole[m].grad, m, rank, world)
                figures.append(max_diff(grad, expected))
            worst = torch.tensor(figures, dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            result["forward"] = float(worst[0])
            result["grads"] = dict(zip(case.params, map(float, worst[1:]), strict=True))
            result["scale"] = float(out_ref.detach().abs().max())
            result["grad_scale"] = max(float(whole[m].grad.abs().max()) for m in case.params)
            result["nan"] = bool(torch.isnan(out).any())
        except Exception as e:
            result["error"] = error_of(e) + "\n" + traceback.format_exc()
        report["cases"][name] = result
    report["timings"]["cases"] = time.perf_counter() - t
    report["errors"] = _torch_errors(world, torch)
    return report


def _torch_errors(world: int, torch: Any) -> dict[str, str]:
    """Bad calls on torch tensors: the error each raises (``"no error"`` if none)."""
    from relattn.ulysses import ulysses_attention

    x8 = torch.zeros(1, 8, 4, D, dtype=torch.float64)
    bad_heads = torch.zeros(1, 2 * world - 1 if world > 1 else 3, 4, D, dtype=torch.float64)
    calls = {
        "heads_not_divisible": lambda: ulysses_attention(bad_heads, bad_heads, bad_heads),
        "axis_name_with_torch": lambda: ulysses_attention(x8, x8, x8, axis_name="seq"),
        "group_not_a_group": lambda: ulysses_attention(x8, x8, x8, group="world"),
        "no_head_axis": lambda: ulysses_attention(x8[0, 0], x8[0, 0], x8[0, 0]),
    }
    found: dict[str, str] = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = "no error"
        except Exception as e:
            found[name] = error_of(e)
    return found


def run_torch(world: int, path: str) -> None:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        mp.spawn(_rank, args=(world, store, path), nprocs=world, join=True)


def main(argv: list[str]) -> int:
    t = time.perf_counter()
    if argv[1] == "jax":
        path = argv[2]
        report = run_jax()
        report["seconds"] = time.perf_counter() - t
        with open(path, "w", encoding="utf-8") as out:
            json.dump(report, out)
        return 0
    if argv[1] == "torch":
        world, path = int(argv[2]), argv[3]
        run_torch(world, path)
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        report["seconds"] = time.perf_counter() - t
        with open(path, "w", encoding="utf-8") as out:
            json.dump(report, out)
        return 0
    raise SystemExit(f"usage: {argv[0]} jax OUT.json | torch WORLD OUT.json")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
