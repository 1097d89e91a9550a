"""Ring attention on 8 forced host devices against one device's blockwise attention.

Run by ``benchmarks/ring.py`` (``RingAttention.setup_cache``) in a fresh
interpreter: JAX fixes its device count when it is first imported, and asv's
forkserver imported JAX long before, with one CPU device. This script sets
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (and
``JAX_PLATFORMS=cpu``) before importing JAX, then for each total length ``L``:

- ``ring``: ``relattn.ring_attention`` in ``jax.shard_map`` over a mesh of the 8
  devices, ``q``, ``k``, ``v`` sharded along the sequence (``L/8`` rows per
  device), the whole causal-layout table and ``u``, ``v`` replicated;
- ``zigzag``: the same ring with ``sharding="zigzag"`` (``q``, ``k``, ``v`` laid out by
  ``zigzag_shard``: device ``r`` holds chunks ``r`` and ``15 - r`` of 16), whose causal
  work is the same on every device (9 of 32 chunk pairs each);
- ``single``: ``relattn.relative_attention`` on device 0 with
  ``block_size = L/8`` (the contiguous ring's block pairs, on one device);

both causal Transformer-XL, ``B = 1``, ``H = 8``, ``d = 64``, float32
(``long_sequences.inputs``), compiled ahead (``jit(...).lower(...).compile()``),
checked equal, then timed alternately (medians). Memory per device: XLA's
``memory_stats()`` where the device keeps them (``peak_bytes_in_use``; XLA's CPU
client keeps none), else the compiled program's ``memory_analysis()``: temp +
argument + output bytes (minus aliased) of the program one device runs, which is
the per-device program under ``shard_map``. ``memory_source`` says which.
On one machine's CPU cores the 8 devices share the cores: the ratio measures the
ring's overhead (collectives, per-step work, scheduling), not a speed-up.

Prints one JSON object (``{"lengths": {L: {...}}, ...}``) on its last line::

    python asv_bench/ring_devices.py --lengths 1024 4096 --repeats 3
"""

from __future__ import annotations

import os
import sys

DEVICES = 8
_FLAG = f"--xla_force_host_platform_device_count={DEVICES}"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ["JAX_PLATFORMS"] = "cpu"  # the forced devices are host devices

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import relattn  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from long_sequences import inputs  # noqa: E402

NAMES = ("q", "k", "v", "table", "u", "w")


def program_bytes(compiled: Any) -> dict[str, int] | None:
    """``memory_analysis()`` of a compiled program: bytes of one device's program."""
    analysis = compiled.memory_analysis()
    if isinstance(analysis, (list, tuple)):  # one per device program in some versions
        analysis = analysis[0] if analysis else None
    if analysis is None:
        return None
    fields = ("temp", "argument", "output", "alias", "generated_code")
    out = {f: int(getattr(analysis, f"{f}_size_in_bytes", 0) or 0) for f in fields}
    out["total"] = out["temp"] + out["argument"] + out["output"] - out["alias"]
    return out


def peak_stats(device: Any) -> int | None:
    """XLA's ``peak_bytes_in_use`` on ``device``, where it keeps statistics."""
    stats = device.memory_stats()
    return None if not stats else int(stats.get("peak_bytes_in_use", 0))


def median_times(calls: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median seconds of each call, the calls alternating, ``repeats`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(length: int, repeats: int) -> dict[str, Any]:
    devices = jax.devices()[:DEVICES]
    if len(devices) < DEVICES or length % (2 * DEVICES):
        raise SystemExit(f"need {DEVICES} devices and L divisible by {2 * DEVICES}")
    host = inputs(length)
    mesh = Mesh(np.array(devices), ("seq",))
    seq, whole = P(None, None, "seq", None), P()
    specs = (seq, seq, seq, whole, whole, whole)
    on_one = [jax.device_put(host[n], devices[0]) for n in NAMES]
    # The zig-zag ring where this relattn has it (asv also runs older commits).
    shardings = ("contiguous", "zigzag") if hasattr(relattn, "zigzag_shard") else ("contiguous",)

    def laid_out(sharding: str) -> list[Any]:
        def layout(name: str) -> Any:
            if sharding == "zigzag" and name in ("q", "k", "v"):
                return relattn.zigzag_shard(host[name], DEVICES, axis=-2)
            return host[name]

        return [jax.device_put(layout(n), NamedSharding(mesh, spec))
                for n, spec in zip(NAMES, specs, strict=True)]  # fmt: skip

    def ring_program(sharding: str) -> Any:
        def local(q: Any, k: Any, v: Any, table: Any, u: Any, w: Any) -> Any:
            layout = {} if sharding == "contiguous" else {"sharding": sharding}
            return relattn.ring_attention(
                q, k, v, table, axis_name="seq", content_bias=u, position_bias=w, **layout
            )

        return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=seq))

    def single(q: Any, k: Any, v: Any, table: Any, u: Any, w: Any) -> Any:
        return relattn.relative_attention(
            q, k, v, table, content_bias=u, position_bias=w, block_size=length // DEVICES
        )

    calls, compile_seconds = {}, {}
    start = time.perf_counter()
    one = jax.jit(single).lower(*on_one).compile()
    compile_seconds["single"] = time.perf_counter() - start
    expected = np.asarray(one(*on_one))
    calls["single"] = lambda: one(*on_one)
    rings = {}
    max_diff = 0.0
    for sharding in shardings:
        arrays = laid_out(sharding)
        start = time.perf_counter()
        rings[sharding] = program = ring_program(sharding).lower(*arrays).compile()
        compile_seconds[sharding] = time.perf_counter() - start
        out = np.asarray(program(*arrays))
        if sharding == "zigzag":
            out = relattn.zigzag_unshard(out, DEVICES, axis=-2)
        max_diff = max(max_diff, float(np.max(np.abs(out - expected))))
        calls[sharding] = functools.partial(program, *arrays)
    if not max_diff <= 1e-4:
        raise SystemExit(f"L={length}: ring and single-device outputs differ by {max_diff}")
    seconds = median_times(calls, repeats)
    ring = rings["contiguous"]
    stats = [peak_stats(d) for d in devices]
    if all(s is not None for s in stats):
        source = "memory_stats"  # process-wide peaks: the largest program so far shows through
        ring_bytes, single_bytes = max(stats), peak_stats(devices[0])
        ring_analysis = single_analysis = None
    else:
        source = "memory_analysis"
        ring_analysis, single_analysis = program_bytes(ring), program_bytes(one)
        ring_bytes = None if ring_analysis is None else ring_analysis["total"]
        single_bytes = None if single_analysis is None else single_analysis["total"]
    row = {
        "length": length,
        "devices": DEVICES,
        "ring_seconds": seconds["contiguous"],
        "single_seconds": seconds["single"],
        "ring_over_single": seconds["contiguous"] / seconds["single"],
        "ring_bytes_per_device": ring_bytes,
        "single_device_bytes": single_bytes,
        "memory_source": source,
        "ring_memory_analysis": ring_analysis,
        "single_memory_analysis": single_analysis,
        "compile_seconds": compile_seconds,
        "max_abs_diff": max_diff,
    }
    if "zigzag" in seconds:
        row["zigzag_seconds"] = seconds["zigzag"]
        row["zigzag_over_single"] = seconds["zigzag"] / seconds["single"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {}
    for length in args.lengths:
        results[str(length)] = row = measure(length, args.repeats)
        print(
            f"L={length}: ring {row['ring_seconds'] * 1e3:.1f} ms, single "
            f"{row['single_seconds'] * 1e3:.1f} ms, ring/single {row['ring_over_single']:.2f}, "
            f"zigzag/single {row.get('zigzag_over_single', float('nan')):.2f}, "
            f"per device {row['ring_bytes_per_device']} B ({row['memory_source']})",
            file=sys.stderr,
            flush=True,
        )
    versions = {"jax": jax.__version__, "relattn": relattn.__version__}
    print(json.dumps({"lengths": results, "versions": versions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
