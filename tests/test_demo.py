"""The main job: ``python -m relattn demo`` and ``python -m relattn info``."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from relattn.__main__ import main
from relattn.demo import SCHEMES, TOLERANCES, Config, byte_tokens, demo, exceeds, zen_of_python


def test_zen_of_python_is_the_default_text():
    text = zen_of_python()
    assert text.startswith("The Zen of Python, by Tim Peters")
    assert len(byte_tokens(text)) == len(text.encode())


def test_demo_numpy_passes_and_prints_table(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "FAIL" not in out
    for scheme in SCHEMES:
        assert re.search(rf"^{scheme} +numpy .* ok$", out, flags=re.M), scheme


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_demo_each_scheme_alone(scheme, capsys):
    code = main(["demo", "--scheme", scheme, "--segment", "16", "--memory", "16", "--d-model", "8"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert len(re.findall(r" ok$", out, flags=re.M)) == 1


def test_demo_every_installed_backend_small(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("relative attention, written once. " * 6, encoding="utf-8")
    small = ["--segment", "16", "--memory", "16", "--d-model", "16"]
    code = main(["demo", "--backend", "all", "--text", str(text), *small])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("numpy", "array_api_strict"):
        assert re.search(rf"^xl +{name} ", out, flags=re.M), name


def test_demo_fails_loudly_when_a_check_fails(monkeypatch, capsys):
    import relattn.demo

    monkeypatch.setitem(relattn.demo.TOLERANCES, "float32", (0.0, 0.0))
    ok = demo(["numpy"], "some text for the demo", "text", Config(segment=8, memory=8))
    assert not ok
    assert "FAIL" in capsys.readouterr().out


def test_exceeds_measures_tolerance_violation():
    import numpy as np

    rtol, atol = TOLERANCES["float32"]
    want = np.ones(3)
    assert exceeds(want + 0.5 * (atol + rtol), want, "float32") < 0
    assert exceeds(want + 2 * (atol + rtol), want, "float32") > 0


def test_info_lists_backends(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "relattn" in out


@pytest.mark.slow
def test_module_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "relattn", "demo"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "all checks passed" in done.stdout
