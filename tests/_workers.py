"""Worker processes of the multi-device tests (``test_devices.py``, ``test_ulysses.py``),
and what the workers share to write their reports.

JAX fixes its device count when it is first imported, and a test session has imported it
long before: the multi-device checks run in worker scripts of their own, which write a JSON
report. :class:`Worker` starts one in the background; :func:`report` waits for it and reads
its report (or fails the test with its log), starting it once more with XLA's default
flags where this XLA lacks the worker's compile-time ones.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: HLO instructions that move data between devices.
COLLECTIVES = (
    "all-gather",
    "all-to-all",
    "collective-permute",
    "all-reduce",
    "reduce-scatter",
    "collective-broadcast",
)


def use_host_devices(count: int) -> None:
    """Set JAX's environment for ``count`` host devices in float64, before JAX is imported.

    A worker calls this under ``if __name__ == "__main__"`` (pytest's --doctest-modules
    imports the worker files into the test session, whose environment they must leave
    alone). XLA's CPU compiles dominate the workers' run time: LLVM's optimisations and the
    fusion emitters are turned off, which halves them and halves them again;
    ``RELATTN_PLAIN_XLA=1`` leaves XLA's defaults (an XLA that does not know these flags
    aborts: :func:`report` then runs the worker again with it).
    """
    flags = f"--xla_force_host_platform_device_count={count}"
    if not os.environ.get("RELATTN_PLAIN_XLA"):
        flags += " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    os.environ["JAX_ENABLE_X64"] = "1"
    os.environ["JAX_PLATFORMS"] = "cpu"  # the forced devices are host devices


def collectives(hlo: str) -> dict[str, int]:
    """How many instructions of each collective the HLO text has (sync or async start)."""
    return {name: len(re.findall(rf"\s{name}(?:-start)?\(", hlo)) for name in COLLECTIVES}


def max_diff(a: Any, b: Any) -> float:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def error_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class Worker:
    """One running worker ``python script *args REPORT``: its process, report and log."""

    script: Path
    args: list[str]
    folder: Path
    name: str
    env: dict[str, str] | None = None
    plain_xla: bool = False

    def __post_init__(self) -> None:
        self.report = self.folder / f"{self.name}.json"
        self.log = self.folder / f"{self.name}.log"
        env = {**os.environ, **(self.env or {})}
        if self.plain_xla:
            env["RELATTN_PLAIN_XLA"] = "1"
        with open(self.log, "w", encoding="utf-8") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(self.script), *self.args, str(self.report)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.script.parent.parent,
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def report(workers: dict[str, Worker], name: str, timeout: float) -> dict[str, Any]:
    """The JSON report of ``workers[name]``, waiting at most ``timeout`` seconds."""
    import pytest

    worker = workers[name]
    try:
        worker.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.stop()
        pytest.fail(f"the {name} worker ran past {timeout} s:\n{worker.log.read_text()[-4000:]}")
    log = worker.log.read_text()
    if worker.process.returncode != 0 and "Unknown flag" in log and not worker.plain_xla:
        # An XLA that lacks the worker's compile-time flags: once more with XLA's defaults.
        workers[name] = Worker(
            worker.script, worker.args, worker.folder, name, worker.env, plain_xla=True
        )
        return report(workers, name, timeout)
    if worker.process.returncode != 0:
        pytest.fail(f"the {name} worker failed:\n{log[-8000:]}")
    return json.loads(worker.report.read_text())
