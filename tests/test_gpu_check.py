"""``asv_bench/gpu_check.py``, the one-command GPU check, on a machine without a GPU: its
device probe, its pytest command and its per-target report."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).parents[1] / "asv_bench" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", PATH)
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check
spec.loader.exec_module(gpu_check)


def test_without_a_gpu_it_says_so_and_exits_1(capsys):
    if gpu_check.devices():
        pytest.skip("a GPU is here: the check would run in earnest")
    assert gpu_check.main(["--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "no GPU found" in out
    for name in gpu_check.TARGETS:
        assert f"{name}" in out


def test_the_suite_command_selects_the_gpu_targets(tmp_path):
    command = gpu_check.suite_command(["torch_cuda", "jax_gpu"], tmp_path / "r.xml")
    assert command[command.index("-k") + 1] == "torch_cuda or jax_gpu"
    marker = len(command) - 1 - command[::-1].index("-m")  # after "python -m pytest"
    assert command[marker + 1] == "not subprocess"
    assert f"--junitxml={tmp_path / 'r.xml'}" in command


def test_report_counts_per_target(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(
        """<testsuites><testsuite>
        <testcase name="test_a[torch_cuda-float32]"/>
        <testcase name="test_b[torch_cuda]"><failure message="x"/></testcase>
        <testcase name="test_c[jax_gpu]"><skipped message="y"/></testcase>
        <testcase name="test_d[jax_gpu]"/>
        <testcase name="test_e[numpy]"/>
        </testsuite></testsuites>""",
        encoding="utf-8",
    )
    counts = gpu_check.per_target(report, ["torch_cuda", "jax_gpu"])
    assert counts["torch_cuda"] == {"passed": 1, "failed": 1}
    assert counts["jax_gpu"] == {"passed": 1, "skipped": 1}
