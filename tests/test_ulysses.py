"""Ulysses sequence parallelism (SPEC §2.19, §5): ``relattn.ulysses.ulysses_attention``.

The checks run in worker processes, ``tests/_ulysses_worker.py``, started together by
the first test that needs one: JAX on 8 forced host devices (meshes of 2, 4 and 8), and
torch on gloo process groups of 2 and 4 ranks, all in float64. Each writes a JSON report
of figures that the tests below assert on:

- every scheme (plain causal attention, Transformer-XL, XLNet with a T5 bias and a value
  table, a memory ``Lk > Lq`` by the shift and by a pair of query and key positions,
  DeBERTa, ALiBi with one key/value head, a key-padding mask with a per-head bias, packed
  documents with positions and document ids, a ``score_mod``/``mask_mod`` pair that reads
  the head index) equals the single-device call of the whole sequence to 1e-10, output
  and every input's gradient (on torch the replicated inputs' partial gradients summed
  over the group);
- JAX's compiled program moves q, k, v and the output by four all-to-alls (eight with the
  gradients), gathers only the integer positions and document ids, and passes nothing
  round a ring;
- bad calls raise ``ValueError`` (heads that the device count does not divide, no head
  axis, ``axis_name`` with torch, ``group`` with JAX) or ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _ulysses_worker
import numpy as np
import pytest
from _workers import Worker, report

pytestmark = pytest.mark.subprocess

WORKER = Path(__file__).with_name("_ulysses_worker.py")
#: Seconds a worker may take (about 25 s for JAX, 20 s for torch's 4 ranks on 2 cores).
TIMEOUT = 600
#: SPEC §5: context parallelism equals one device to 1e-10 in float64.
TOLERANCE = 1e-10
JAX_DEVICE_COUNTS = _ulysses_worker.JAX_DEVICE_COUNTS
TORCH_WORLDS = (2, 4)
#: The worker's schemes and, for each, the floating inputs whose gradients it checks.
SCHEMES = {
    name: set(case.params) for name, case in _ulysses_worker.cases(np.random.default_rng(0)).items()
}
#: (library, device count) of every report.
TARGETS = [("jax", n) for n in JAX_DEVICE_COUNTS] + [("torch", w) for w in TORCH_WORLDS]


def _available(backend: str) -> str | None:
    """Why ``backend``'s worker cannot run here (``None``: it can)."""
    if backend == "jax":
        try:
            import jax
        except ImportError:
            return "jax is not installed"
        if not hasattr(jax, "shard_map"):
            return f"jax {jax.__version__} has no jax.shard_map"
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if not (dist.is_available() and dist.is_gloo_available()):
        return "torch.distributed with the gloo backend is not available"
    return None


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Worker]]:
    """Every worker that can run here, started together; killed at teardown if still running."""
    folder = tmp_path_factory.mktemp("ulysses")
    started: dict[str, Worker] = {}
    if _available("jax") is None:
        started["jax"] = Worker(WORKER, ["jax"], folder, "jax")
    if _available("torch") is None:
        for world in TORCH_WORLDS:
            started[f"torch{world}"] = Worker(
                WORKER, ["torch", str(world)], folder, f"torch{world}"
            )
    yield started
    for worker in started.values():
        worker.stop()


class Reports:
    """The workers' reports, each read when a test first needs it (a failed worker fails
    only the tests that read it)."""

    def __init__(self, workers: dict[str, Worker]) -> None:
        self.workers = workers
        self.read: dict[str, dict[str, Any]] = {}

    def __call__(self, name: str) -> dict[str, Any]:
        backend = "jax" if name == "jax" else "torch"
        reason = _available(backend)
        if reason is not None:
            pytest.skip(reason)
        if name not in self.read:
            self.read[name] = report(self.workers, name, TIMEOUT)
        return self.read[name]

    def cases(self, backend: str, n: int) -> dict[str, Any]:
        """The cases of JAX on ``n`` devices or of torch's world of ``n`` ranks."""
        if backend == "jax":
            return self("jax")["cases"][str(n)]
        return self(f"torch{n}")["cases"]


@pytest.fixture(scope="module")
def reports(workers: dict[str, Worker]) -> Reports:
    return Reports(workers)


@pytest.fixture(scope="module")
def jax_report(reports: Reports) -> dict[str, Any]:
    return reports("jax")


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` of one case, failing with the worker's traceback where it raised."""
    assert "error" not in result, result["error"]
    return result


def test_jax_worker_has_eight_float64_devices(jax_report):
    assert jax_report["devices"] == 8
    assert jax_report["x64"]


@pytest.mark.parametrize(("library", "n"), TARGETS)
def test_every_scheme_ran(reports, library, n):
    assert sorted(reports.cases(library, n)) == sorted(SCHEMES)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize(("library", "n"), TARGETS)
def test_ulysses_equals_one_device(reports, library, n, scheme):
    result = _ok(reports.cases(library, n)[scheme])
    assert not result["nan"]
    assert result["forward"] <= TOLERANCE, result
    assert set(result["grads"]) == SCHEMES[scheme]
    worst = {name: diff for name, diff in result["grads"].items() if not diff <= TOLERANCE}
    assert not worst, f"gradients differ from the single device's beyond {TOLERANCE}: {worst}"


#: Case -> the all-gathers of its forward: one per integer array (positions and document
#: ids serving queries and keys; a pair of query and key positions).
GATHERS = {
    "sdpa[causal]": 0,
    "transformer_xl": 0,
    "packed[positions,segment_ids]": 2,
    "memory[positions_pair]": 2,
}


@pytest.mark.parametrize("case", sorted(GATHERS))
def test_hlo_moves_heads_by_all_to_all(jax_report, case):
    found = jax_report["hlo"][case]
    assert "error" not in found, found["error"]
    forward, both = found["forward"], found["with_gradients"]
    # q, k, v to head shards and the output back: four all-to-alls; the gradient runs
    # each in reverse. Integer ids are gathered once and have no gradient. No ring.
    assert forward["all-to-all"] == 4, forward
    assert both["all-to-all"] == 8, both
    assert forward["all-gather"] == both["all-gather"] == GATHERS[case], found
    assert forward["collective-permute"] == both["collective-permute"] == 0, found
    assert forward["reduce-scatter"] == both["reduce-scatter"] == 0, found
    assert forward["all-reduce"] == 0, forward


#: JAX's bad calls: each a ValueError whose message says these.
JAX_ERRORS = {
    "heads_not_divisible": ("q:", "H = 6", "n = 4"),
    "no_head_axis": ("q must have shape (..., H, L/n, d)",),
    "group_with_jax": ("group", "axis_name="),
    "no_axis_name": ("axis_name",),
    "unknown_axis_name": ("axis_name", "'heads'"),
    "head_counts_differ": ("number of heads",),
}


@pytest.mark.parametrize("case", sorted(JAX_ERRORS))
def test_jax_bad_calls(jax_report, case):
    message = jax_report["errors"][case]
    assert message.startswith("ValueError: "), message
    for part in JAX_ERRORS[case]:
        assert part in message, message


@pytest.mark.parametrize("world", TORCH_WORLDS)
def test_torch_bad_calls(reports, world):
    errors = reports(f"torch{world}")["errors"]
    heads = 2 * world - 1
    assert errors["heads_not_divisible"].startswith("ValueError: q:"), errors
    assert f"H = {heads} and n = {world}" in errors["heads_not_divisible"], errors
    assert errors["axis_name_with_torch"].startswith("ValueError: axis_name"), errors
    assert errors["group_not_a_group"].startswith("TypeError: group"), errors
    assert errors["no_head_axis"].startswith("ValueError: q must have shape"), errors


def test_ulysses_outside_a_collective_raises():
    # NumPy arrays have no collective: a TypeError naming the libraries that do.
    from relattn.ulysses import ulysses_attention

    x = np.zeros((2, 4, 3))
    with pytest.raises(TypeError, match="ulysses_attention needs JAX arrays"):
        ulysses_attention(x, x, x)
