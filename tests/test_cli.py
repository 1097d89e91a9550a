"""The command line rejects bad flag values in one line, argparse-style, before any work.

Most cases run ``python -m relattn`` in a subprocess, as a user does; the table
of bad flag values runs ``relattn.__main__.main`` in this process (the same
parser and messages, without an interpreter start per case). A bad value must
end in a usage line, one ``error:`` line naming the flag and the value, exit
status 2 and no traceback. A missing array library is simulated by
a directory on ``PYTHONPATH`` whose ``torch.py`` (or ``jax.py`` …) raises
``ModuleNotFoundError`` on import, as an absent library does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relattn.backends import MODULES
from relattn.demo import SCHEMES

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m relattn demo"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relattn", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def cli_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """:func:`cli` run by ``relattn.__main__.main`` in this process: an exception other
    than ``SystemExit`` (a traceback, from a subprocess) fails the test as it propagates."""
    from relattn.__main__ import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "relattn", *args], code, out, err)


def blocking(directory: Path, *libraries: str) -> dict[str, str]:
    """An environment in which importing each of ``libraries`` fails as if not installed."""
    directory.mkdir(exist_ok=True)
    for library in libraries:
        message = f"No module named {library!r} (blocked by the test)"
        (directory / f"{library}.py").write_text(
            f"raise ModuleNotFoundError({message!r}, name={library!r})\n", encoding="utf-8"
        )
    path = os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def one_line_error(done: subprocess.CompletedProcess, prog: str = PROG) -> str:
    """The message of a usage error, after checking its form; fails on anything else."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""
    lines = done.stderr.rstrip("\n").split("\n")
    usage, error = lines[:-1], lines[-1]
    assert usage and usage[0].startswith(f"usage: {prog} "), done.stderr
    assert all(line.startswith(" ") for line in usage[1:]), done.stderr  # usage, wrapped
    assert error.startswith(f"{prog}: error: "), done.stderr
    assert sum("error:" in line for line in lines) == 1, done.stderr
    return error.removeprefix(f"{prog}: error: ")


BAD_VALUES = [
    # (flags, fragments the message must contain)
    (["--segment", "0"], ["--segment", "got 0", "positive"]),
    (["--segment", "-3"], ["--segment", "got -3"]),
    (["--segment", "ten"], ["--segment", "'ten'", "integer"]),
    (["--d-model", "-8"], ["--d-model", "got -8"]),
    (["--d-model", "0"], ["--d-model", "got 0"]),
    (["--heads", "-2"], ["--heads", "got -2"]),
    (["--heads", "0"], ["--heads", "got 0"]),
    (["--radius", "-1"], ["--radius", "got -1", "non-negative"]),
    (["--seed", "-1"], ["--seed", "got -1"]),
    (["--memory", "-1"], ["--memory", "got -1"]),
    (["--layers", "0"], ["--layers", "got 0"]),
    (["--layers", "-1"], ["--layers", "got -1"]),
    (["--clamp-len", "-1"], ["--clamp-len", "got -1"]),
    (["--heads", "3", "--d-model", "64"], ["--d-model 64", "--heads 3", "multiple"]),
    (["--d-model", "2", "--heads", "4"], ["--d-model 2", "--heads 4", "multiple"]),
    (
        ["--d-model", "6", "--heads", "2"],
        ["--d-model 6 / --heads 2", "head size of 3", "even", "tener, rope"],
    ),
    (
        ["--d-model", "6", "--heads", "2", "--scheme", "rope"],
        ["--d-model 6 / --heads 2", "head size of 3", "even", "RoPE", "--scheme rope"],
    ),
    (
        ["--d-model", "64", "--heads", "3", "--scheme", "deberta"],
        ["--d-model 64", "--heads 3", "multiple", "--scheme deberta"],
    ),
    (
        ["--d-model", "6", "--heads", "2", "--scheme", "tener"],
        ["--d-model 6 / --heads 2", "head size of 3", "even"],
    ),
    (["--d-model", "7", "--heads", "7"], ["--d-model 7", "even", "absolute, xl"]),
    (["--d-model", "9", "--heads", "3", "--scheme", "xl"], ["--d-model 9", "even", "xl"]),
    (["--backend", "tensorflow"], ["--backend", "'tensorflow'"]),
    (["--scheme", "xpos"], ["--scheme", "'xpos'"]),
    (["--dtype", "float16"], ["--dtype", "'float16'"]),
    (["--check", "some"], ["--check", "'some'", "'reference'", "'none'"]),
    (["--check-segments", "0"], ["--check-segments", "got 0", "positive"]),
    (["--check-segments", "all"], ["--check-segments", "'all'", "integer"]),
    (["--check", "none", "--check-segments", "2"], ["--check-segments 2", "--check none"]),
]


@pytest.mark.parametrize(("flags", "fragments"), BAD_VALUES, ids=" ".join)
def test_bad_value_is_one_line_usage_error(flags, fragments, capsys):
    message = one_line_error(cli_in_process(capsys, "demo", *flags))
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize(
    ("flags", "scheme"),
    [
        (["--d-model", "6", "--heads", "2"], "absolute"),  # head size 3: only TENER needs it even
        (["--d-model", "7", "--heads", "7"], "shaw"),
        (["--d-model", "64", "--heads", "3"], "disan"),  # DiSAN has no heads
        (["--memory", "0", "--clamp-len", "0", "--radius", "0"], "xl"),
        (["--memory", "0"], "alibi"),
        (["--memory", "0", "--d-model", "4", "--heads", "2"], "rope"),  # head size 2: one pair
        (["--d-model", "6", "--heads", "2"], "t5"),  # an odd head size is fine without pairs
        (["--d-model", "6", "--heads", "2"], "deberta"),
        (["--d-model", "6", "--heads", "3", "--segment", "3"], "alibi"),  # 3 heads: not 2^n
    ],
)
def test_edge_values_a_scheme_can_run_are_accepted(flags, scheme, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("relative attention", encoding="utf-8")
    done = cli("demo", "--scheme", scheme, "--segment", "8", "--text", str(text), *flags)
    assert done.returncode == 0, done.stderr
    assert "all checks passed" in done.stdout
    assert done.stderr == ""  # not a terminal: no progress bars


def test_missing_text_file(tmp_path):
    path = tmp_path / "nowhere.txt"
    message = one_line_error(cli("demo", "--text", str(path)))
    assert f"--text {path}" in message and "no such file" in message


def test_text_is_a_directory(tmp_path):
    message = one_line_error(cli("demo", "--text", str(tmp_path)))
    assert f"--text {tmp_path}" in message and "directory" in message


def test_text_is_not_utf8(tmp_path):
    path = tmp_path / "image.bin"
    path.write_bytes(b"GIF89a\x01\x00\xff\xfe\x00\x80")
    message = one_line_error(cli("demo", "--text", str(path)))
    assert f"--text {path}" in message and "not UTF-8" in message and "0xff" in message


def test_text_is_empty(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    message = one_line_error(cli("demo", "--text", str(path)))
    assert f"--text {path}" in message and "empty" in message


def test_text_not_readable(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("hidden", encoding="utf-8")
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("this user reads files whatever their permissions (root)")
        message = one_line_error(cli("demo", "--text", str(path)))
    finally:
        path.chmod(0o600)
    assert f"--text {path}" in message and "cannot read" in message


def test_text_read_error_is_one_line_in_process(monkeypatch, capsys):
    """Whatever ``OSError`` reading the text raises becomes a usage error (root reads all)."""
    import relattn.__main__ as cli_main

    def refuse(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(cli_main, "read_text", refuse)
    with pytest.raises(SystemExit) as exit_:
        cli_main.main(["demo", "--text", "locked.txt"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1] == (
        f"{PROG}: error: --text locked.txt: cannot read it (Permission denied)"
    )


@pytest.mark.parametrize("library", ["torch", "jax", "dask"])
def test_backend_not_installed(library, tmp_path):
    env = blocking(tmp_path / "blocked", library)
    message = one_line_error(cli("demo", "--backend", library, env=env))
    assert message == (
        f"--backend {library}: not installed (No module named '{library}' (blocked by the test))"
    )


def test_cupy_without_library_or_gpu():
    """Here CuPy is missing or has no GPU (else the test skips): either way, one line."""
    from relattn.demo import find_backends

    if not find_backends(["cupy"])[1]:
        pytest.skip("CuPy runs here, on a GPU")
    message = one_line_error(cli("demo", "--backend", "cupy"))
    assert message.startswith("--backend cupy: ")
    assert "not installed" in message or "no usable device" in message


def test_backend_all_lists_skipped_backends_and_runs_the_rest(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("relative attention, written once", encoding="utf-8")
    blocked = ("torch", "jax", "cupy", "dask")
    env = blocking(tmp_path / "blocked", *blocked)
    done = cli(
        "demo",
        "--backend",
        "all",
        "--scheme",
        "absolute",
        "--segment",
        "8",
        "--layers",
        "1",
        "--d-model",
        "8",
        "--text",
        str(text),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in blocked:
        line = f"skipped {name}: not installed (No module named '{name}' (blocked by the test))"
        assert line in lines, done.stdout
    ran = {line.split()[1] for line in lines if line.startswith("absolute ")}
    assert ran == {"numpy", "array_api_strict"}, done.stdout
    assert "all checks passed" in done.stdout


def test_version():
    import relattn

    done = cli("--version")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"relattn {relattn.__version__}\n",
        "",
    )
    assert relattn.__version__ == "0.2.0"


def test_no_command_is_a_usage_error_listing_the_commands():
    message = one_line_error(cli(), prog="python -m relattn")
    assert message == (
        "a command is required: demo (the position schemes over real text, checked) "
        "or info (the array libraries found)"
    )


@pytest.mark.parametrize(
    ("argv0", "prog"),
    [
        ("/venv/bin/relattn", "relattn"),
        ("relattn", "relattn"),
        ("C:/venv/Scripts/relattn.exe", "relattn"),
        ("/src/relattn/__main__.py", "python -m relattn"),
        ("/venv/bin/pytest", "python -m relattn"),
        ("", "python -m relattn"),
    ],
)
def test_program_name(argv0, prog):
    from relattn.__main__ import program_name

    assert program_name(argv0) == prog


def test_console_script_names_itself_relattn(tmp_path):
    """The ``relattn`` script pip installs says ``usage: relattn …``, not ``python -m relattn``."""
    script = Path(sys.executable).with_name("relattn")
    if not script.exists():
        pytest.skip(f"no console script at {script} (pip install -e . writes it)")

    def run(*args):
        return subprocess.run(
            [str(script), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
        )

    done = run("--version")
    assert done.returncode == 0 and done.stdout.startswith("relattn "), done.stderr
    assert one_line_error(run(), prog="relattn").startswith("a command is required: demo")
    assert "got 0" in one_line_error(run("demo", "--segment", "0"), prog="relattn demo")


def test_top_level_help_describes_the_demo():
    done = cli("--help")
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())  # help text is wrapped
    assert "twelve position schemes" in out
    assert f"({', '.join(SCHEMES)})" in out
    assert "NumPy float64" in out and "naive twin" in out
    assert "Transformer-XL encoder" not in out


def test_demo_help_lists_schemes_backends_and_flags():
    done = cli("demo", "--help")
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert list(SCHEMES) == [
        *("absolute", "shaw", "xl", "tener", "complex", "disan"),
        *("t5", "alibi", "rope", "deberta", "swin", "sam"),
    ]
    unwrapped = "".join(done.stdout.split())  # argparse may also wrap after a hyphen
    for scheme, model in SCHEMES.items():
        assert "".join(f"{scheme} ({model.description})".split()) in unwrapped
    assert "--memory N xl, alibi, rope: tokens kept from past segments" in out
    for backend in MODULES:
        assert backend in out
    assert "NumPy float64" in out and "naive twin" in out
    for flag in ("--segment", "--memory", "--d-model", "--heads", "--layers", "--clamp-len"):
        assert flag in out
    assert "--check {all,reference,naive,none}" in out and "--check-segments N" in out
    assert "none: no check, the times only" in out
    assert "--no-progress no progress bars" in out and "standard error" in out
