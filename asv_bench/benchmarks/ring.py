"""relattn.ring_attention on 8 host devices against one device's blockwise attention (issue 12).

JAX fixes its device count when it is first imported, and asv's forkserver has
imported it (``common``) with one CPU device: the measurement runs in a fresh
interpreter, ``asv_bench/ring_devices.py``, which sets
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before importing JAX,
runs every length once and prints JSON. ``RingAttention.setup_cache`` runs it
(once per ``asv run``, for all lengths); the ``track_*`` benchmarks return its
numbers. Causal Transformer-XL, ``B = 1``, ``H = 8``, ``d = 64``, float32, total
length ``L`` = 1024, 4096, 16 384 (1024 with ``RELATTN_BENCH_QUICK``), ``L/8``
rows per device; the single-device call is ``relative_attention`` with
``block_size = L/8``. See ``ring_devices.py`` for how memory is measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from . import common

LENGTHS = (1024,) if common.QUICK else (1024, 4096, 16384)
WORKER = Path(__file__).resolve().parents[1] / "ring_devices.py"


class RingAttention:
    """Time and per-device memory of the ring on 8 forced host devices, one process for all L.

    ``track_ring_over_single``: the ring's median time over one device's
    blockwise call, same total length (on one machine's cores: the ring's
    overhead, not a speed-up); ``track_zigzag_over_single``, the same for the zig-zag
    ring (``sharding="zigzag"``); ``track_ring_seconds``; ``track_bytes_per_device``:
    bytes of the program each ring device runs, and ``track_single_device_bytes``
    the single-device program's (XLA's ``memory_analysis()``: temp + argument +
    output; its ``memory_stats()`` where the devices keep them, which XLA's
    CPU client does not).
    """

    params = [LENGTHS]
    param_names = ["length"]
    timeout = 900

    def setup_cache(self):
        if importlib.util.find_spec("jax") is None:
            return {"skip": "jax is not installed"}
        import relattn

        if not hasattr(relattn, "ring_attention"):
            return {"skip": f"relattn {relattn.__version__} has no ring_attention"}
        flag = "--xla_force_host_platform_device_count=8"
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
        command = [sys.executable, str(WORKER), "--lengths", *map(str, LENGTHS)]
        command += ["--repeats", str(common.repeats())]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1700)
        if done.returncode:
            raise RuntimeError(f"{WORKER.name} failed:\n{done.stderr[-3000:]}")
        sys.stderr.write(done.stderr)  # one line per length, for --show-stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    setup_cache.timeout = 1800

    def setup(self, results, length):
        if "skip" in results:
            raise NotImplementedError(results["skip"])
        self.row = results["lengths"][str(length)]

    def track_ring_over_single(self, results, length):
        return self.row["ring_over_single"]

    track_ring_over_single.unit = "ring/single"

    def track_zigzag_over_single(self, results, length):
        if "zigzag_over_single" not in self.row:
            raise NotImplementedError("this relattn has no zig-zag ring")
        return self.row["zigzag_over_single"]

    track_zigzag_over_single.unit = "zigzag/single"

    def track_ring_seconds(self, results, length):
        return self.row["ring_seconds"]

    track_ring_seconds.unit = "seconds"

    def track_bytes_per_device(self, results, length):
        return self.row["ring_bytes_per_device"]

    track_bytes_per_device.unit = "bytes"

    def track_single_device_bytes(self, results, length):
        return self.row["single_device_bytes"]

    track_single_device_bytes.unit = "bytes"
