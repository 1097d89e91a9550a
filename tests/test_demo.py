"""The main job: ``python -m relattn demo`` and ``python -m relattn info``."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest

from relattn import testing
from relattn.__main__ import main
from relattn.backends import MODULES
from relattn.demo import (
    SCHEMES,
    TOLERANCES,
    Config,
    byte_tokens,
    config_problem,
    demo,
    demo_target,
    exceeds,
    find_backends,
    zen_of_python,
)


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


@pytest.mark.parametrize("name", list(MODULES))
def test_demo_every_installed_backend_small(name, tmp_path, capsys):
    """Every scheme and its checks on each backend (one test each: the suite's workers
    share them out)."""
    from relattn.demo.runner import find_backends

    _, skipped = find_backends([name])
    if name in skipped:
        pytest.skip(f"{name}: {skipped[name]}")
    text = tmp_path / "text.txt"
    # 32 bytes: 2 segments of 16, the second with the first as its memory.
    text.write_text("relative attention, written once", encoding="utf-8")
    small = ["--segment", "16", "--memory", "16", "--d-model", "16"]
    code = main(["demo", "--backend", name, "--text", str(text), *small])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(rf"^xl +{name} ", out, flags=re.M), out


def test_demo_all_backends_finds_and_runs_the_installed_ones(tmp_path, capsys):
    """``--backend all``: every installed backend runs, the others are named as skipped."""
    text = tmp_path / "text.txt"
    text.write_text("relative attention, written once. " * 2, encoding="utf-8")
    small = ["--segment", "8", "--memory", "8", "--d-model", "8", "--check", "none"]
    code = main(["demo", "--backend", "all", "--scheme", "alibi", "--text", str(text), *small])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("numpy", "array_api_strict"):
        assert re.search(rf"^alibi +{name} ", out, flags=re.M), name


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


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_config_problem_is_what_each_encoder_needs(scheme):
    """The command line refuses exactly the d_model / heads an encoder cannot run."""
    for d_model, heads in itertools.product((1, 2, 3, 4, 6, 8), (1, 2, 3, 4)):
        config = Config(segment=4, memory=4, d_model=d_model, heads=heads, layers=1, radius=2)
        problem = config_problem(config, [scheme])
        try:
            demo(["numpy"], "relattn!", "text", config, schemes=[scheme], out=lambda *a: None)
        except ValueError as e:
            assert problem is not None, (d_model, heads, e)
        else:
            assert problem is None, (d_model, heads, problem)


def test_config_problem_names_the_flags_given():
    problem = config_problem(Config(d_model=6, heads=2), list(SCHEMES))
    assert problem is not None
    assert problem.startswith("--d-model 6 / --heads 2 gives a head size of 3; it must be even")
    assert problem.endswith("needed by --scheme tener, rope)")
    assert config_problem(Config(d_model=6, heads=2), ["absolute", "shaw", "disan"]) is None
    assert config_problem(Config(d_model=6, heads=2), ["t5", "alibi", "deberta"]) is None
    assert "RoPE" in config_problem(Config(d_model=6, heads=2), ["rope"])
    assert "--heads 3" in config_problem(Config(d_model=64, heads=3), ["shaw"])
    for scheme in ("t5", "alibi", "rope", "deberta"):
        problem = config_problem(Config(d_model=64, heads=3), [scheme])
        assert problem == (
            "--d-model 64 is not a multiple of --heads 3 "
            f"(equal heads, needed by --scheme {scheme})"
        )
    assert config_problem(Config(d_model=64, heads=3), ["disan"]) is None


@pytest.mark.parametrize(
    ("schemes", "memory"),
    [
        (["t5"], ""),
        (["t5", "xl"], ", memory 3 (xl)"),
        (["absolute", "disan"], ""),
        (None, ", memory 3 (xl, alibi, rope)"),
    ],
)
def test_header_names_the_memory_of_the_schemes_that_keep_one(schemes, memory):
    lines = []
    config = Config(segment=4, memory=3, d_model=8, layers=1)
    demo(["numpy"], "relattn", "text", config, schemes=schemes, out=lines.append)
    assert lines[0] == f"relattn demo: 1-layer encoders, d_model 8, 4 heads, segment 4{memory}"


SMALL = Config(segment=8, memory=8, d_model=8, layers=1)
TEXT = "Now is better than never. Although never is often better than *right* now."


def _report(**options):
    lines = []
    ok = demo(["numpy"], TEXT, "text", SMALL, schemes=["xl", "t5"], out=lines.append, **options)
    rows = {line.split()[0]: line for line in lines if line.startswith(("xl ", "t5 "))}
    return ok, lines, rows


def test_checks_run_over_every_segment_by_default():
    ok, lines, rows = _report()
    assert ok
    assert lines[2] == (
        "checks: all 10 segments against a NumPy float64 run and the naive twin; "
        "float32: rtol 1e-04, atol 1e-05"
    )
    for row in rows.values():
        assert re.fullmatch(r"\S+ +numpy +cpu +float32 +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.]+  ok", row)
    assert lines[-1] == "all checks passed"


def _count_runs(monkeypatch) -> list[int]:
    """The number of tokens of each :func:`relattn.demo.run` call the demo makes, in order."""
    import relattn.demo.runner as runner

    lengths = []
    real_run = runner.run

    def run(encoder, tokens, *args, **options):
        lengths.append(len(tokens))
        return real_run(encoder, tokens, *args, **options)

    monkeypatch.setattr(runner, "run", run)
    return lengths


def test_check_none_skips_both_checks_and_says_so(monkeypatch):
    lengths = _count_runs(monkeypatch)
    ok, lines, rows = _report(check="none")
    assert ok
    assert lines[2] == "checks: skipped (--check none): the table gives the times only"
    for row in rows.values():
        assert re.fullmatch(r"\S+ +numpy +cpu +float32 +skipped +skipped +[0-9.]+  skipped", row)
    assert lines[-1] == "checks skipped (--check none)"
    assert lengths == [8, len(TEXT)] * 2  # per scheme: warm-up, timed run; no reference, no twin


@pytest.mark.parametrize(
    ("check", "skipped_column"),
    [("reference", "naive twins skipped"), ("naive", "NumPy float64 runs skipped")],
)
def test_check_one_of_the_two(check, skipped_column):
    ok, lines, rows = _report(check=check)
    assert ok
    assert skipped_column in lines[2] and f"--check {check}" in lines[2]
    for row in rows.values():
        fields = row.split()
        assert fields[4:6].count("skipped") == 1 and fields[-1] == "ok"
        assert (fields[5] if check == "reference" else fields[4]) == "skipped"
    assert lines[-1] == "all checks passed"


def test_check_segments_limits_the_checks_not_the_timing(monkeypatch):
    lengths = _count_runs(monkeypatch)
    ok, lines, _ = _report(check_segments=3)
    assert ok
    assert lines[2].startswith("checks: the first 3 of 10 segments against a NumPy float64 run")
    # per scheme: reference (3 segments), warm-up (1), timed (the whole text), naive twin (3)
    assert lengths == [24, 8, len(TEXT), 24] * 2
    _, lines, _ = _report(check_segments=50)
    assert lines[2].startswith("checks: all 10 segments")


def test_check_segments_still_fails_loudly(monkeypatch):
    import relattn.demo

    monkeypatch.setitem(relattn.demo.TOLERANCES, "float32", (0.0, 0.0))
    ok, lines, rows = _report(check_segments=1)
    assert not ok
    assert "FAIL" in rows["xl"] and lines[-1] == "SOME CHECKS FAILED"


@pytest.mark.parametrize(("option", "value"), [("check", "some"), ("check_segments", 0)])
def test_demo_rejects_bad_check_options(option, value):
    with pytest.raises(ValueError, match=rf"^{option} must be"):
        demo(["numpy"], TEXT, "text", SMALL, out=lambda *a: None, **{option: value})


def test_progress_bars_go_to_stderr_and_name_each_run(capsys):
    assert demo(["numpy"], TEXT, "text", SMALL, schemes=["xl"], progress=True)
    captured = capsys.readouterr()
    for run in (
        "numpy: float64 reference",
        "numpy: warm-up",
        "numpy: relattn",
        "numpy: naive twin",
    ):
        assert f"xl on {run}: " in captured.err, run
        assert run not in captured.out
    assert "/10 [" in captured.err and "segment/s" in captured.err  # 10 segments per run
    assert "all checks passed" in captured.out and "all checks passed" not in captured.err


def test_no_progress_bars_unless_asked(capsys):
    assert demo(["numpy"], TEXT, "text", SMALL, schemes=["t5"])
    assert capsys.readouterr().err == ""


def test_cli_draws_bars_only_on_a_terminal(monkeypatch, capsys):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    small = ["--scheme", "t5", "--segment", "8", "--d-model", "8", "--layers", "1"]
    assert main(["demo", *small]) == 0  # capsys: not a terminal
    assert capsys.readouterr().err == ""
    for flags, drawn in (([], True), (["--no-progress"], False)):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main(["demo", *small, *flags]) == 0
        assert ("t5 on numpy: relattn" in terminal.getvalue()) is drawn, flags
        assert "t5 on numpy" not in capsys.readouterr().out


def test_twins_transcribe_the_papers_code():
    """The naive twins' own bucket and slope code gives the library docstrings' values."""
    import numpy as np

    from relattn.demo.models import deberta_bucket, pair_distances, press_slopes, t5_bucket

    d = np.array([-200, -20, -3, 0, 3, 20, 200])
    assert t5_bucket(d, 8, 20).tolist() == [3, 3, 2, 0, 6, 7, 7]
    d = np.array([-300, -5, 0, 3, 10, 300])
    assert deberta_bucket(d, 8, 64).tolist() == [-9, -5, 0, 3, 5, 9]
    assert [256 * m for m in press_slopes(3)] == [16, 1, 64]
    assert [256 * m for m in press_slopes(4)] == [64, 16, 4, 1]
    assert pair_distances(2, 3).tolist() == [[-1, 0, 1], [-2, -1, 0]]


def _flip_sign(function):
    return lambda distances, **options: function(-distances, **options)


def _reversed_slopes(heads, **options):
    import relattn

    return relattn.alibi_slopes(heads, **options)[::-1]


def _positions_from_zero(x, positions, **options):
    """RoPE without the memory's and the segment's offset: every row from 0."""
    import relattn

    return relattn.rotary_position_embedding(x, **options)


def _swapped_tables(q, k, v, position_table, query_position_table, **options):
    import relattn

    return relattn.disentangled_attention(q, k, v, query_position_table, position_table, **options)


@pytest.mark.parametrize(
    ("scheme", "name", "broken"),
    [
        ("t5", "relative_position_bucket", "sign"),
        ("alibi", "alibi_slopes", _reversed_slopes),
        ("rope", "rotary_position_embedding", _positions_from_zero),
        ("deberta", "log_bucket_position", "sign"),
        ("deberta", "disentangled_attention", _swapped_tables),
    ],
)
def test_naive_twin_does_not_call_the_function_it_checks(scheme, name, broken, monkeypatch):
    """Break the relattn function a scheme demonstrates: its naive twin must disagree."""
    import relattn.demo.models as models

    function = getattr(models, name)
    monkeypatch.setattr(models, name, _flip_sign(function) if broken == "sign" else broken)
    config = Config(segment=40, memory=24)  # DeBERTa's clip (|δ| > 31) and the memory
    text = "Flat is better than nested. Sparse is better than dense."
    assert not demo(["numpy"], text, "text", config, "float64", [scheme], out=lambda *a: None)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rope_runs_at_text_positions_and_alternates_layouts(dtype):
    """RoPE's output depends on the positions only through distances (up to rounding)."""
    import numpy as np

    from relattn.backends import namespace_of_module
    from relattn.demo.models import RotaryEncoder

    xp = namespace_of_module(None)
    config = Config(segment=8, memory=8, layers=2)
    encoder = RotaryEncoder(config, xp, getattr(xp, dtype))
    assert [p["layout"] for p in encoder.layers] == ["concatenated", "interleaved"]
    h = encoder.embed(byte_tokens("position"))
    at_0, _ = encoder.step(h, [None, None], start=0)
    at_500, _ = encoder.step(h, [None, None], start=500)
    assert not np.array_equal(at_0, at_500)  # the start reaches the rotation ...
    rtol, atol = TOLERANCES[dtype]
    assert np.allclose(at_0, at_500, rtol=rtol, atol=atol)  # ... and cancels in q·k


def test_find_backends_reports_why_it_skips():
    found, skipped = find_backends(list(MODULES))
    assert "numpy" in found and "numpy" not in skipped
    assert set(found) | set(skipped) == set(MODULES)
    assert not set(found) & set(skipped)
    for reason in skipped.values():
        assert reason.startswith(("not installed (", "cannot be imported (", "no usable device ("))
        assert "\n" not in reason


def test_demo_target_falls_back_to_cpu_and_says_why_not(monkeypatch):
    import relattn.demo.runner as runner

    assert demo_target("numpy").name == "numpy"
    torch_target = demo_target("torch")
    assert torch_target.name in ("torch_cuda", "torch") and torch_target.unavailable is None
    monkeypatch.setitem(runner.TARGETS, "cupy", ("cupy",))
    if testing.target("cupy").unavailable is not None:
        with pytest.raises((ImportError, LookupError)):
            demo_target("cupy")


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
