"""``asv_bench/gpu_check.py``, the one-command GPU check, on a machine without a GPU: its
device probe, its pytest and benchmark commands and its per-target report; and the GPU
rows of ``asv_bench/compare.py`` it runs, tried on CPU targets (each case gives its rows,
or a row saying why it failed)."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path

import pytest

ASV = Path(__file__).parents[1] / "asv_bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ASV / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")


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


def test_the_suite_command_leaves_out_pytest_benchmark():
    """GPU images carry pytest-benchmark, whose warning under xdist is an error here."""
    command = gpu_check.suite_command(["torch_cuda"], Path("r.xml"))
    assert ("-p", "no:benchmark") in list(itertools.pairwise(command))


def test_a_phase_past_its_limit_is_interrupted_and_prints_what_it_has(tmp_path):
    """At its limit a phase gets Ctrl-C, so pytest prints its summary; code 124."""
    script = tmp_path / "slow.py"
    script.write_text(
        "import sys, time\n"
        "try:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    open(sys.argv[1], 'w').write('summary')\n",
        encoding="utf-8",
    )
    out = tmp_path / "out.txt"
    code = gpu_check.run_for([sys.executable, str(script), str(out)], 2.0, dict(os.environ))
    assert code == 124
    assert out.read_text(encoding="utf-8") == "summary"
    assert gpu_check.run_for([sys.executable, "-c", "pass"], 30.0, dict(os.environ)) == 0


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


def test_the_bench_command_runs_the_gpu_rows_and_plans_on_the_targets_found():
    command = gpu_check.bench_command(["torch_cuda", "cupy"], [4096], ["bfloat16"])
    assert command[1].endswith("compare.py") and "--quick" in command
    pairs = list(itertools.pairwise(command))
    assert ("--only", "gpu") in pairs and ("--only", "plans") in pairs
    assert ("--backend", "torch_cuda") in pairs and ("--backend", "cupy") in pairs
    assert ("--gpu-length", "4096") in pairs and ("--gpu-dtype", "bfloat16") in pairs
    assert "--gpu-length" not in gpu_check.bench_command(["jax_gpu"])


@pytest.fixture(scope="module")
def compare():
    pytest.importorskip("relattn.testing")
    if str(ASV) not in sys.path:
        sys.path.insert(0, str(ASV))
    return _load("compare")


def test_gpu_rows_on_cpu_stand_ins(compare):
    """JAX's and CuPy's cases (NumPy standing in for CuPy) give a time row, and a memory
    row where the library counts bytes; cuDNN, absent on a CPU, gives a row saying so."""
    pytest.importorskip("jax")
    rows = compare.gpu(["jax", "numpy"], 1, lengths=(32,), dtypes=("float32",))
    what = [(r.backend, r.what) for r in rows]
    assert ("numpy", "gpu: Transformer-XL causal fwd, L=32 float32: relattn / the same "
            "written in CuPy") in what  # fmt: skip
    xla = [r for r in rows if r.backend == "jax" and "(xla)" in r.what]
    assert len(xla) == 2 and "peak memory" in xla[1].what and xla[0].value > 0
    cudnn = [r for r in rows if "(cudnn)" in r.what]
    assert len(cudnn) == 2 and all("failed" in r.theirs for r in cudnn)
    assert all(r.ok is None for r in rows)  # the targets apply to bf16 at L >= 4096


@pytest.mark.slow
@pytest.mark.subprocess  # FlexAttention compiles (Inductor's C++ build)
def test_torch_gpu_rows_on_the_cpu(compare):
    """Every PyTorch case runs on a CPU: FlexAttention's forward (compiled) equals relattn;
    its backward, which a CPU lacks, gives a row saying so."""
    pytest.importorskip("torch")
    rows = compare.gpu(["torch"], 1, lengths=(64,), dtypes=("float32",))
    assert len(rows) == 13, [r.what for r in rows]
    for row in rows:
        if "FlexAttention" in row.what and "fwd+bwd" in row.what:
            assert "failed" in row.theirs, row
        else:
            assert row.value > 0 and "failed" not in row.theirs + row.ours, row
