"""One test suite, every backend: the fixtures over :mod:`relattn.testing`'s targets.

The ``backend`` fixture runs a test once per :class:`relattn.testing.Target`,
an array library on one device: NumPy, NumPy with read-only inputs (catches
hidden in-place writes), array-api-strict, PyTorch (CPU), JAX (CPU), Dask, and
CuPy / PyTorch CUDA / JAX GPU. ``RELATTN_BACKENDS=numpy,torch`` restricts the
run to some targets, by name. Tests of one library's own transforms take
``torch_backend`` (``torch.autograd``, ``torch.compile``), ``jax_backend``
(``jax.grad``) or ``jit_backend`` (either compiler) instead, so that the other
libraries do not even appear. ``checks_backend`` serves the bad-input checks,
which read metadata only (see ``CHECK_TARGETS``).

Tests build their inputs in NumPy float64, convert them with
``backend.asarray(a, dtype)`` and compare results with
``backend.assert_close(result, expected, dtype)`` against a float64 reference,
at the tolerances of SPEC §5 (``relattn.testing.TOLERANCES``). Naive
references, written from the papers' formulas with loops over ``(i, j)``, are
in ``reference.py``. What a function supports on a library (jit, gradients,
the ring …) is declared in :mod:`relattn.capabilities`; tests skip with
:func:`relattn.testing.skip_unless_capable`.

Collection leaves out (deselects, counted in pytest's summary) the items that
cannot run here: those of a GPU target when no GPU is present, and those whose
dtype parameter names a dtype the target's library lacks (NumPy's bfloat16).
It also runs ``jit_backend`` tests in one dtype per compiler, PyTorch's in
float32 and JAX's in float64 (the tighter check): each traces the same program
whatever the dtype, and each compile takes seconds; the eager tests run every
dtype.
A CPU target whose library is not installed is skipped at run time, with the
reason.

Markers (registered in ``pyproject.toml``):

- ``subprocess``: runs worker processes (several devices, a Dask cluster, a
  process group) or Inductor's C++ build; minutes. ``-m "not subprocess"``
  leaves them out; CI runs them.
- ``slow``: takes more than a few seconds.
- ``grid``: a numerical check over a grid of parameters (shapes, radii, modes,
  dtypes). On JAX and Dask (``SLOW_TARGETS``), where each new shape costs a
  compile or a task graph, collection keeps a pairwise cover of the grid: every
  two values of every two parameters appear together once. The other targets run
  the whole grid.
- ``every_dtype``: runs float32 on JAX and Dask too, where the other tests taking
  ``backend`` run float64 only (see ``FLOAT64_TARGETS``).
- ``full_matrix``: the bad-input checks on the targets beyond
  ``CHECK_TARGETS``. Left out unless ``-m`` names the marker:
  ``-m full_matrix`` runs just those, ``-m "full_matrix or not full_matrix"``
  everything.

JAX: float64 is on (``JAX_ENABLE_X64``), and XLA compiles without LLVM's
optimisations (see ``_fast_xla_flags``; ``RELATTN_PLAIN_XLA=1`` keeps XLA's
defaults): compiling dominates the JAX tests' time.

Laziness: a test module that tags relattn's functions with
:func:`array_api_extra.testing.lazy_xp_function` (and lists ``relattn`` in
``lazy_xp_modules`` where it calls them as ``relattn.name``) has them run under
``jax.jit`` on JAX and fail on Dask if they compute the graph, for every test
that takes the ``backend`` fixture.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

# JAX reads this when it is first imported: float64 must be on for the float64 tests.
os.environ.setdefault("JAX_ENABLE_X64", "1")


def _fast_xla_flags() -> str:
    """XLA flags that cut the JAX tests' compile times, which dominate them, by 2 to 3 times.

    LLVM's optimisations off (a flag of every XLA); on jaxlib 0.7 and later, the CPU
    fusion emitters off too (an XLA that does not know a flag aborts). The compiled
    programs compute the same operations: the tests' tolerances hold as they do in
    ``_devices_worker.py``, which sets the same flags. ``RELATTN_PLAIN_XLA=1`` leaves
    XLA's defaults.
    """
    from importlib import metadata

    flags = "--xla_backend_optimization_level=0"
    try:
        major, minor = (int(part) for part in metadata.version("jaxlib").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return flags
    # Known to jaxlib 0.7 to 0.10 (0.11.2, seen on a GPU machine, aborts on it).
    known = (0, 7) <= (major, minor) < (0, 11)
    return flags + (" --xla_cpu_use_fusion_emitters=false" if known else "")


# float32 products in full precision on GPUs too (JAX's default there is TF32, off by about
# 1e-3): the tests hold every backend to SPEC §5's float32 tolerance. "float32" is JAX's
# name for HIGHEST in old and new versions alike (jax 0.4.30 refuses "highest").
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")

if not os.environ.get("RELATTN_PLAIN_XLA"):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_fast_xla_flags()}".strip()

import numpy as np  # noqa: E402 - after the environment above
import pytest  # noqa: E402 - after the environment above
from array_api_extra import testing as xpx_testing  # noqa: E402 - after the environment above
from hypothesis import HealthCheck, settings  # noqa: E402 - after the environment above

from relattn.testing import Target, selected_targets  # noqa: E402 - after the environment above

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# CI (``CI`` set, as ``.ci/run``'s environment has it): the same examples on every run, so
# that a failure reproduces, and the blob that replays a failing example printed. This
# replaces Hypothesis's own "ci" profile, which it loads where ``CI`` is set (and which the
# "default" profile loaded here would otherwise override). Derandomized, Hypothesis keeps
# no example database.
settings.register_profile("ci", settings.get_profile("default"), derandomize=True, print_blob=True)
settings.load_profile("ci" if "CI" in os.environ else "default")

FLOAT_DTYPES = ("float32", "float64")

TARGETS = selected_targets()

#: The targets of ``checks_backend``: one per path the argument checks take. They read
#: metadata (types, dtypes, shapes), with the same code for every library but where a
#: call mixes libraries: NumPy, and JAX, whose calls take NumPy operands (as Dask's
#: do). Dtype checks and mixed libraries, where each library differs, take ``backend``.
CHECK_TARGETS = ("numpy", "jax")


def target_fixture(
    name: str, select: Callable[[Target], bool], *, lazy: bool = False, marks: Any = None
) -> Any:
    """A fixture ``name`` running a test once per target that ``select`` keeps.

    A target that cannot run here skips the test with the reason. With ``lazy``,
    the functions the test module tags with ``lazy_xp_function`` are patched for
    the test (``jax.jit`` on JAX, no graph computation on Dask). ``marks``
    (``target -> marks``) marks some targets' items.
    """
    params = [
        pytest.param(t, id=t.name, marks=() if marks is None else marks(t))
        for t in TARGETS
        if select(t)
    ]

    @pytest.fixture(name=name, params=params)
    def fixture(request: pytest.FixtureRequest) -> Iterator[Target]:
        target: Target = request.param
        if target.unavailable:
            pytest.skip(f"{target.name}: {target.unavailable}")
        with contextlib.ExitStack() as stack:
            if target.name == "dask":
                stack.enter_context(_synchronous_dask())
            if lazy:
                stack.enter_context(xpx_testing.patch_lazy_xp_functions(request, xp=target.xp))
            yield target

    return fixture


def _synchronous_dask() -> Any:
    """Dask's synchronous scheduler for a test: the same task graph computed in this thread,
    without the thread pool's start and hand-offs, which cost more than these graphs' tiny
    chunks (17% of the Dask tests' time). Dask's threads and its distributed scheduler are
    checked in ``test_dask_distributed.py``, whose ``Client`` takes over as the scheduler."""
    import dask

    return dask.config.set(scheduler="synchronous")


def _one_jit_per_function() -> None:
    """``lazy_xp_function``'s ``jax.jit`` kept per function for the session.

    :func:`array_api_extra.testing.patch_lazy_xp_functions` wraps each tagged function in a
    new ``jax.jit`` for every test, so that no compile outlives its test: a call that an
    earlier test compiled (the same function, shapes, dtypes and static arguments) is traced
    and compiled again. One wrapper per function keeps JAX's own cache, as a program that
    jits a function once does; each test still runs its calls under ``jax.jit``. It saves
    about a sixth of the JAX tests' time. The wrapper is array-api-extra's private
    ``jax_autojit``: where a version lacks it, every test compiles afresh, as before.
    """
    from array_api_extra._lib import _helpers

    wrap = getattr(_helpers, "jax_autojit", None)
    if wrap is None or hasattr(wrap, "cache_info"):
        return
    _helpers.jax_autojit = functools.cache(wrap)


_one_jit_per_function()

#: Every target.
backend = target_fixture("backend", lambda t: True, lazy=True)
#: PyTorch on the CPU and on CUDA: autograd, ``torch.compile``.
torch_backend = target_fixture("torch_backend", lambda t: t.is_torch)
#: JAX on the CPU and on a GPU: ``jax.grad``, ``jax.jit``.
jax_backend = target_fixture("jax_backend", lambda t: t.is_jax)
#: The targets with a compiler (``Target.jit``).
jit_backend = target_fixture("jit_backend", lambda t: t.is_torch or t.is_jax)
#: The CPU targets that the examples' recipes hand results back from through DLPack.
RECIPE_TARGETS = ("numpy", "array_api_strict", "torch", "jax")
recipe_backend = target_fixture("recipe_backend", lambda t: t.name in RECIPE_TARGETS)
#: The bad-input checks: ``CHECK_TARGETS``, the other targets under ``full_matrix``.
checks_backend = target_fixture(
    "checks_backend",
    lambda t: True,
    marks=lambda t: () if t.name in CHECK_TARGETS else pytest.mark.full_matrix,
)


@pytest.fixture(params=FLOAT_DTYPES)
def dtype(request: pytest.FixtureRequest) -> str:
    """Name of a floating dtype; ``backend.dtype(name)`` gives the library's."""
    return request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261121)


# ----------------------------------------------------------------------------------------
# Collection: leave out what cannot run here
# ----------------------------------------------------------------------------------------

#: Why items were deselected, for the terminal summary: reason -> count.
_DESELECTED: dict[str, int] = {}


def _why_not(item: pytest.Item, config: pytest.Config) -> str | None:
    """Why ``item`` is left out of this run (see the module's docstring), or ``None``."""
    if item.get_closest_marker("full_matrix") and "full_matrix" not in config.option.markexpr:
        return "full_matrix (run with -m full_matrix)"
    params = getattr(getattr(item, "callspec", None), "params", {})
    targets = [p for p in params.values() if isinstance(p, Target)]
    for target in targets:
        if target.gpu and target.unavailable:
            return f"{target.name}: {target.unavailable}"
        for value in params.values():
            if isinstance(value, str) and not target.has_dtype(value):
                return f"{target.library} has no {value}"
    compiled = params.get("jit_backend")
    if compiled is not None and compiled.is_torch and params.get("dtype") == "float64":
        return "torch.compile in float32 only (Dynamo captures the same graph in every dtype)"
    if compiled is not None and compiled.is_jax and params.get("dtype") == "float32":
        return "jax.jit in float64 only (the same trace in every dtype)"
    target = params.get("backend")
    if (
        target is not None
        and target.name in FLOAT64_TARGETS
        and params.get("dtype") == "float32"
        and item.get_closest_marker("every_dtype") is None
    ):
        return "jax, dask: float64 only, but where marked every_dtype (see FLOAT64_TARGETS)"
    return None


#: CPU targets whose ``backend`` tests run in float64 (the tighter check) only, but those
#: marked ``every_dtype``: on JAX each test compiles its calls (``lazy_xp_function``) and on
#: Dask it builds a task graph, and that cost, most of their time, is the same in each
#: dtype. float32 runs on them where a dtype goes wrong in a library's own way: the result
#: dtype of every public function (``test_results_in_callers_library_and_device_inputs_kept``:
#: a float64 constant promoting a float32 call), the core's values against the float64
#: references (``test_attention.py``), and half precision with its float32 accumulators.
#: Every test runs float32 on NumPy, array-api-strict and PyTorch, and on the GPU targets.
FLOAT64_TARGETS = ("jax", "dask")


#: Targets where each new shape costs a compile (JAX, its functions under ``jax.jit``) or a
#: task graph (Dask): a test marked ``grid`` runs a covering subset of its grid there.
SLOW_TARGETS = ("jax", "jax_gpu", "dask")


def _covered(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items of ``grid`` tests on ``SLOW_TARGETS`` that add no new pair of parameter values.

    Per test function and target, in collection order, an item is kept when it brings a
    pair of parameter values (``dtype="float64"`` with ``radius=0``, say) that no kept item
    has yet: every value of every parameter, and every two values of two parameters, run
    on each slow target, and the whole grid on the others.
    """
    seen: dict[tuple[str, str], set[tuple[tuple[str, str], ...]]] = {}
    redundant = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or item.get_closest_marker("grid") is None:
            continue
        targets = [p.name for p in callspec.params.values() if isinstance(p, Target)]
        if not any(name in SLOW_TARGETS for name in targets):
            continue
        values = sorted((name, repr(value)) for name, value in callspec.params.items()
                        if not isinstance(value, Target))  # fmt: skip
        pairs = {(a, b) for i, a in enumerate(values) for b in values[i + 1 :]} or {tuple(values)}
        covered = seen.setdefault((item.originalname, targets[0]), set())
        if pairs <= covered:
            redundant.append(item)
        covered |= pairs
    return redundant


#: The test files that take longest, longest first (``--durations=0`` summed per file, on
#: 2 cores): they are collected first, and ``--no-loadscope-reorder`` (pyproject.toml) has
#: pytest-xdist hand them out in that order, so that no long file starts last and runs
#: alone. ``test_devices`` waits on worker processes of its own, which then run beside the
#: rest. A stale list costs balance, never coverage.
LONGEST_FIRST = (
    "test_devices.py", "test_ulysses.py", "test_torch_ring.py", "test_transforms.py",
    "test_positions_as_data.py", "test_blockwise.py",
    "test_demo.py", "test_biases.py", "test_errors.py", "test_disentangled.py", "test_shaw.py",
    "test_positions.py", "test_shift.py", "test_classic.py", "test_attention.py", "test_disan.py",
)  # fmt: skip


def _schedule_rank(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_schedule_rank)  # stable: each file's own order is kept
    kept, left_out = [], []
    for item in items:
        why = _why_not(item, config)
        if why is None:
            kept.append(item)
        else:
            left_out.append(item)
            _DESELECTED[why] = _DESELECTED.get(why, 0) + 1
    redundant = _covered(kept)
    if redundant:
        why = f"grid: pairwise cover on {', '.join(SLOW_TARGETS)}"
        _DESELECTED[why] = len(redundant)
        left_out += redundant
        dropped = set(redundant)
        kept = [item for item in kept if item not in dropped]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for why, count in sorted(_DESELECTED.items()):
        terminalreporter.write_line(f"deselected {count} items: {why}")
