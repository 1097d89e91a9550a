"""The GPU check, one command: the suite's GPU targets and the GPU rows of compare.py.

Run from a checkout on a machine with a GPU::

    python asv_bench/gpu_check.py            # about 2–5 minutes on one H100/H200

It installs nothing. It runs:

1. the tests of the GPU targets (``cupy``, ``torch_cuda``, ``jax_gpu``) in worker
   processes, one per 2 CPU cores (``-m "not subprocess"``);
2. ``compare.py --quick --only gpu --only plans`` on every GPU target found
   (:func:`bench_command`): relattn against each library's fastest code, time and
   peak memory, at L = 1024, 4096 and 16 384 in bf16 and float32 (causal against
   flash SDPA; ALiBi, a T5 bias and packed documents against FlexAttention, forward
   and forward+backward; Transformer-XL against the authors' ``rel_shift`` code and
   the same in CuPy; JAX against ``jax.nn.dot_product_attention``'s cuDNN and XLA;
   SAM's decomposed relative positions at a 64×64 grid and Swin's shifted windows
   against the same written natively), and each scheme's plan against the forced
   block fold at L = 1024.

Then it prints passed, failed and skipped per target, and the benchmark table.
It exits non-zero if a test fails, or if no GPU library finds a device.
``--length`` and ``--dtype`` narrow the benchmark's sizes (``--length 4096 --dtype
bfloat16`` for a first look).

Each phase has a time limit (``--test-seconds``, ``--bench-seconds``; together
they fit a 6-minute device call). At its limit a phase is interrupted as Ctrl-C
would: pytest then still prints its summary (every failure by name, and the 25
slowest tests, to size the next run), and the benchmark has printed each row as
it was measured. On an H200 the whole GPU suite (about 5 100 tests with 8
workers) needs more than 9 minutes: the limit cuts it, and what ran is reported.

A GPU machine often has torch, jax, cupy, numpy, pytest, pytest-xdist and
hypothesis, but not ``array-api-compat``, ``array-api-extra`` or
``array-api-strict``. Bring those as wheels; they are pure Python
(``py3-none-any``):

    pip download --no-deps -d wheels array-api-compat array-api-extra array-api-strict tqdm
    # copy wheels/ to the GPU machine, then there:
    python -m pip install --no-index --no-deps --target /tmp/site wheels/*.whl
    PYTHONPATH=/tmp/site:$PWD python asv_bench/gpu_check.py

``--dry-run`` prints the commands and the devices found, and runs nothing.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("cupy", "torch_cuda", "jax_gpu")
NEEDED = ("array_api_compat", "array_api_extra", "array_api_strict", "pytest", "xdist")


def devices() -> dict[str, str]:
    """The GPU targets whose library finds a device, each with a one-line description."""
    found = {}
    if importlib.util.find_spec("torch"):
        import torch

        if torch.cuda.is_available():
            found["torch_cuda"] = f"torch {torch.__version__}: {torch.cuda.get_device_name(0)}"
    if importlib.util.find_spec("jax"):
        import jax

        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        if gpus:
            found["jax_gpu"] = f"jax {jax.__version__}: {gpus[0].device_kind}"
    if importlib.util.find_spec("cupy"):
        import cupy

        try:
            if cupy.cuda.runtime.getDeviceCount() > 0:
                found["cupy"] = f"cupy {cupy.__version__}"
        except cupy.cuda.runtime.CUDARuntimeError:
            pass
    return found


def missing() -> list[str]:
    """The Python packages the check needs that this interpreter cannot import."""
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def suite_command(targets: list[str], report: Path) -> list[str]:
    """pytest on the GPU targets' tests, writing a JUnit report."""
    workers = max(1, (os.cpu_count() or 2) // 2)
    return [
        sys.executable, "-m", "pytest", str(ROOT / "tests"), "-q", "-p", "no:cacheprovider",
        "-n", str(workers), "--dist", "load", "-p", "no:benchmark", "-m", "not subprocess",
        "-k", " or ".join(targets), f"--junitxml={report}", "-rfE", "--durations=25",
    ]  # fmt: skip


def bench_command(
    targets: list[str], lengths: list[int] | None = None, dtypes: list[str] | None = None
) -> list[str]:
    """``compare.py``'s GPU rows and plans on ``targets`` (the GPU targets found)."""
    command = [sys.executable, str(ROOT / "asv_bench" / "compare.py"), "--quick",
               "--only", "gpu", "--only", "plans"]  # fmt: skip
    for name in targets:
        command += ["--backend", name]
    for length in lengths or ():
        command += ["--gpu-length", str(length)]
    for dtype in dtypes or ():
        command += ["--gpu-dtype", dtype]
    return command


def run_for(command: list[str], seconds: float, env: dict[str, str]) -> int:
    """Run ``command``; at ``seconds`` interrupt it as Ctrl-C would (its own process
    group, so pytest's workers stop too), so that it prints what it has; kill it if it
    has not stopped 30 s later. The exit code, or 124 where it was interrupted."""
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        print(f"\n[gpu_check] {seconds:.0f} s passed: interrupting", flush=True)
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return 124


def per_target(report: Path, targets: list[str]) -> dict[str, collections.Counter]:
    """Passed, failed and skipped counts per target, from a JUnit report."""
    counts = {name: collections.Counter() for name in targets}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        target = next((t for t in targets if t in name), None)
        if target is None:
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            counts[target]["failed"] += 1
        elif case.find("skipped") is not None:
            counts[target]["skipped"] += 1
        else:
            counts[target]["passed"] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print what would run")
    parser.add_argument(
        "--length",
        type=int,
        action="append",
        help="the benchmark's lengths (repeatable; default 1024, 4096, 16384)",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        choices=("bfloat16", "float16", "float32"),
        help="the benchmark's dtypes (repeatable; default bfloat16, float32)",
    )
    parser.add_argument(
        "--test-seconds", type=float, default=210.0, help="the tests' time limit (default 210)"
    )
    parser.add_argument(
        "--bench-seconds",
        type=float,
        default=120.0,
        help="the benchmark's time limit (default 120)",
    )
    args = parser.parse_args(argv)
    found = devices()
    for name in TARGETS:
        print(f"{name:11s} {found.get(name, 'no device')}")
    lacking = missing()
    if lacking:
        print(f"missing Python packages: {', '.join(lacking)} (see this file's docstring)")
        return 2
    if not found:
        print("no GPU found: nothing to check")
        return 1
    targets = [name for name in TARGETS if name in found]
    env = {**os.environ, "RELATTN_BACKENDS": ",".join(targets)}
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside torch and CuPy
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "gpu.xml"
        tests = suite_command(targets, report)
        bench = bench_command(targets, args.length, args.dtype)
        if args.dry_run:
            print(" ".join(tests))
            print(" ".join(bench))
            return 0
        print(f"running the GPU targets' tests: {' '.join(targets)}", flush=True)
        code = run_for(tests, args.test_seconds, env)
        counts = per_target(report, targets) if report.exists() else {}
    print("\n| target | passed | failed | skipped |\n|---|---|---|---|")
    for name, c in counts.items():
        print(f"| {name} | {c['passed']} | {c['failed']} | {c['skipped']} |")
    print("\nGPU benchmark rows:", flush=True)
    run_for(bench, args.bench_seconds, env)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
