"""Across devices (SPEC §2.14, §5): ring attention, the caller's sharding, NumPy operands.

JAX fixes its device count when it is first imported, and this test session has
imported it long before (``conftest.py``): the multi-device checks run in a fresh
interpreter, ``tests/_devices_worker.py``, on 8 forced host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``) in float64. Its two
groups run at the same time, one process each, started by the first test that
needs either; each writes a JSON report of figures (max abs differences, HLO
collective counts, error messages) that the tests below assert on.

- ``ring``: :func:`relattn.ring_attention` in ``jax.shard_map`` on 2 and 8
  devices (and on a ring of 4 in a (2, 4) mesh with the batch sharded)
  equals the single-device attention (``relative_attention``,
  ``scaled_dot_product_attention``, ``shaw_attention``,
  ``disentangled_attention``) to 1e-10, forward and gradients; its HLO moves k
  and v round the ring (``n - 1`` collective-permute pairs) and gathers nothing;
  bad axis names and per-shard tables raise clear errors.

  Lengths that the device count does not divide are padded, as a caller would
  (the ``ragged[...]`` cases, ``Ragged`` in the worker): ``Lq = Lk = L`` padded
  alike to the next multiple of ``n`` (q, k, v with zero rows at the end), the
  relative-layout tables and biases with as many columns before (and, in the
  full layout, after) so that each column keeps its distance, the padded keys
  masked (``False`` in the key-padding mask), and the padded queries' rows
  dropped from the output.
- ``zigzag``: the load-balanced ring (``sharding="zigzag"``: device ``r`` holds chunks
  ``r`` and ``2n - 1 - r`` of the sequence, laid out by ``zigzag_shard``) on 2 and 8
  devices, every scheme of the ring cases and packed documents (positions restarting in
  each, segment ids, sharded like q), equal to one device to 1e-10, forward and
  gradients; its HLO moves the same ``n - 1`` shards as the contiguous ring.
- ``sharded``: batch or head sharding (``NamedSharding``) through ``jax.jit`` of
  every attention function, dense and blockwise, adds no collective and keeps
  the output sharded like the input; ``shard_map`` and ``vmap`` around relattn.

NumPy operands beside JAX ones need no second device: they are checked here, in
this process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _devices_worker import ZIGZAG
from _workers import Worker, report

import relattn

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

WORKER = Path(__file__).with_name("_devices_worker.py")
GROUPS = ("ring", "zigzag", "sharded")
#: Seconds a worker may take (they take about two minutes together on a loaded 2-core CPU).
TIMEOUT = 900
#: SPEC §5: sequence-parallel attention equals the single-device result to 1e-10 (x64).
TOLERANCE = 1e-10
#: Rings of 2 and 8 devices; a ring of 4 runs on the (2, 4) mesh (``test_ring_on_a_2d_mesh``).
DEVICE_COUNTS = (2, 8)
#: The tests that read a worker's report wait for it: about two minutes.
worker = pytest.mark.subprocess

#: The ring cases of the worker (``ring_cases``), each the same attention on one device.
RING_CASES = (
    "sdpa[key_padding]",
    "sdpa[causal]",
    "alibi",
    "transformer_xl[causal]",
    "xlnet[full,t5,value_table,masked_rows]",
    "transformer_xl[memory]",
    "memory[full,value_table,relative_bias]",
    "deberta",
    "shaw",
    "shaw[causal]",
    "vmap_inside_shard_map",
    "numpy_operands",
    "ragged[full]",
    "ragged[causal]",
    "ragged[deberta,causal]",
)
_TXL = {"q", "k", "v", "position_table", "content_bias", "position_bias"}
#: case -> (device counts, inputs): the gradients checked (``GRADIENTS`` in the worker).
RING_GRADIENTS = {
    "transformer_xl[causal]": (DEVICE_COUNTS, _TXL),
    "xlnet[full,t5,value_table,masked_rows]": (
        DEVICE_COUNTS,
        _TXL | {"relative_bias", "value_table"},
    ),
    "ragged[deberta,causal]": (
        DEVICE_COUNTS,
        {"q", "k", "v", "position_table", "query_position_table"},
    ),
    "transformer_xl[memory]": ((8,), _TXL),
    "deberta": ((8,), {"q", "k", "v", "position_table", "query_position_table"}),
    "shaw[causal]": ((8,), {"q", "k", "v", "key_table", "value_table"}),
}

#: The zig-zag cases: the device counts each runs at, and those at which its gradients are
#: checked.
ZIGZAG_CASES = ZIGZAG
ZIGZAG_RUNS = [(n, case) for case, (counts, _) in ZIGZAG_CASES.items() for n in counts]

ATTENTION = (
    "scaled_dot_product_attention",
    "relative_attention_causal",
    "relative_attention_full",
    "shaw_attention",
    "disentangled_attention",
)
BLOCKWISE = tuple(f"{name}[block_size=4]" for name in ATTENTION)
#: block_size=None over relattn's memory budget (a small RELATTN_MAX_SCORE_BYTES): blockwise.
AUTOMATIC_BLOCKWISE = "relative_attention_causal[block_size=None, over the memory budget]"


# -------------------------------------------------------------------------------------------
# The workers
# -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Worker]]:
    """Both worker groups, started together; killed at teardown if still running."""
    if not hasattr(jax, "shard_map"):
        pytest.skip(f"jax {jax.__version__} has no jax.shard_map")
    folder = tmp_path_factory.mktemp("devices")
    env = {"JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    started = {group: Worker(WORKER, [group], folder, group, env) for group in GROUPS}
    yield started
    for worker in started.values():
        worker.stop()


def _report(workers: dict[str, Worker], group: str) -> dict[str, Any]:
    return report(workers, group, TIMEOUT)


@pytest.fixture(scope="module")
def ring(workers: dict[str, Worker]) -> dict[str, Any]:
    return _report(workers, "ring")


@pytest.fixture(scope="module")
def zigzag(workers: dict[str, Worker]) -> dict[str, Any]:
    return _report(workers, "zigzag")


@pytest.fixture(scope="module")
def sharded(workers: dict[str, Worker]) -> dict[str, Any]:
    return _report(workers, "sharded")


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` of one case, failing with the worker's traceback where it raised."""
    assert "error" not in result, result["error"]
    return result


def _no_collective(found: dict[str, int]) -> None:
    moved = {name: count for name, count in found.items() if count}
    assert not moved, f"the compiled HLO moves data between devices: {moved}"


# -------------------------------------------------------------------------------------------
# Sequence parallelism: ring attention
# -------------------------------------------------------------------------------------------


@worker
def test_worker_has_eight_float64_devices(ring, sharded):
    assert ring["devices"] == sharded["devices"] == 8
    assert ring["x64"]


@worker
@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_every_ring_case_ran(ring, n):
    assert sorted(ring["cases"][str(n)]) == sorted(RING_CASES)


@worker
@pytest.mark.parametrize("case", RING_CASES)
@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_ring_equals_one_device(ring, n, case):
    result = _ok(ring["cases"][str(n)][case])
    assert result["forward"] <= TOLERANCE * max(1.0, result["scale"]), result


@worker
@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_ring_fully_masked_row_is_zero(ring, n):
    # Row 3 of the mask has no key: zero on its device, never NaN (SPEC §1).
    assert _ok(ring["cases"][str(n)]["xlnet[full,t5,value_table,masked_rows]"])["masked_row"] == 0


@worker
@pytest.mark.parametrize(
    ("n", "case"),
    [(n, case) for case, (counts, _) in RING_GRADIENTS.items() for n in counts],
)
def test_ring_gradients_equal_one_device(ring, n, case):
    result = _ok(ring["cases"][str(n)][case])
    assert set(result["grads"]) == RING_GRADIENTS[case][1]
    limit = TOLERANCE * max(1.0, result["grad_scale"])
    worst = {name: diff for name, diff in result["grads"].items() if not diff <= limit}
    assert not worst, f"gradients differ from the single device's beyond {limit}: {worst}"


def _ring(n: int, step: int = 1) -> frozenset[tuple[int, int]]:
    """The (source, target) pairs of a ring of ``n`` devices, one ``step`` along."""
    return frozenset((j, (j + step) % n) for j in range(n))


def _pairs(hlo: str) -> frozenset[tuple[int, int]]:
    """HLO's ``source_target_pairs={{0,1},{1,2},...}`` as a set of pairs."""
    return frozenset((int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", hlo))


@worker
@pytest.mark.parametrize("case", RING_CASES)
@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_ring_hlo_passes_blocks_round_the_ring(ring, n, case):
    result = _ok(ring["cases"][str(n)][case])
    found, gradients = result["collectives"], result["with_gradients"]
    # No all-gather, no all-to-all: ragged cases are padded on the host, as a caller would.
    assert found["all-gather"] == found["all-to-all"] == found["reduce-scatter"] == 0, found
    # n - 1 steps pass (k, v) on: n - 1 collective-permute pairs, along the ring; the
    # gradient passes their cotangents back the other way. DeBERTa's p2c term reads the
    # scaled keys, which each device scales itself: nothing more goes round the ring.
    passes = 2 if gradients else 1
    assert found["collective-permute"] == 2 * (n - 1) * passes, found
    rings = {_ring(n)} | ({_ring(n, -1)} if gradients else set())
    assert {_pairs(text) for text in result["permutes"]} == rings
    if not gradients:
        assert found["all-reduce"] == 0, found  # the cotangents of replicated tables only


@worker
@pytest.mark.parametrize(
    "case",
    [
        "xlnet[full,t5,value_table,masked_rows]",
        "transformer_xl[causal]",
    ],
)
def test_ring_on_a_2d_mesh(ring, case):
    # Batch over "batch" (2), the sequence over a ring of 4 on "seq": forward and gradients.
    result = _ok(ring["mesh_2d"][case])
    assert result["forward"] <= TOLERANCE
    assert max(result["grads"].values()) <= TOLERANCE * max(1.0, result["grad_scale"])
    assert result["collectives"]["all-gather"] == 0


@worker
@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_every_zigzag_case_ran(zigzag, n):
    expected = sorted(case for m, case in ZIGZAG_RUNS if m == n)
    assert sorted(zigzag["cases"][str(n)]) == expected


@worker
@pytest.mark.parametrize(("n", "case"), ZIGZAG_RUNS)
def test_zigzag_ring_equals_one_device(zigzag, n, case):
    """Forward (and, where the case says, every gradient) equal to one device, and the
    HLO passes the shards round the ring as the contiguous ring does: ``n - 1`` steps of
    k and v (and the keys' positions and segment ids), their cotangents back."""
    result = _ok(zigzag["cases"][str(n)][case])
    assert result["forward"] <= TOLERANCE * max(1.0, result["scale"]), result
    gradients = n in ZIGZAG_CASES[case][1]
    assert result["with_gradients"] == gradients
    if gradients:
        limit = TOLERANCE * max(1.0, result["grad_scale"])
        worst = {name: diff for name, diff in result["grads"].items() if not diff <= limit}
        assert not worst, f"gradients differ from the single device's beyond {limit}: {worst}"
    found = result["collectives"]
    assert found["all-gather"] == found["all-to-all"] == 0, found
    moving = 4 if "positions" in case else 2
    assert found["collective-permute"] == (n - 1) * (moving + 2 * gradients), found
    if case == "xlnet[full,t5,value_table,masked_rows]":
        assert result["masked_row"] == 0


#: case -> (error type, message pattern), traced on a ring of 4 over L = 16.
RING_ERRORS = {
    "unknown_axis_name": ("ValueError", r"^axis_name must name a mesh axis .*'sequence'"),
    "outside_shard_map": ("ValueError", r"^axis_name must name a mesh axis .*'seq'"),
    "position_table_of_a_shard": (
        "ValueError",
        r"^position_table must have W = Lk = 16 rows .* or W = Lq \+ Lk - 1 = 31 .* got W = 7",
    ),
    "query_position_table_too_wide": ("ValueError", r"^query_position_table must have .*W = 32"),
    "value_table_of_a_shard": ("ValueError", r"^value_table must have .*got W = 4"),
    "relative_bias_of_a_shard": ("ValueError", r"^relative_bias must have .*got W = 4"),
    "mask_of_a_shard": ("ValueError", r"^mask must be broadcastable .*\(2, 2, 16, 16\)"),
    # k, v replicated: each device holds all L keys, so the ring sees n·L = 64 of them.
    "keys_not_sharded": ("ValueError", r"^position_table must have W = Lk = 64 rows"),
}


@worker
@pytest.mark.parametrize("case", RING_ERRORS)
def test_ring_errors(ring, case):
    kind, pattern = RING_ERRORS[case]
    found = ring["errors"][case]
    assert found is not None, f"{case} raised nothing"
    name, _, message = found.partition(": ")
    assert name == kind, found
    assert re.search(pattern, message), found


# -------------------------------------------------------------------------------------------
# Batch and head parallelism: the caller's sharding
# -------------------------------------------------------------------------------------------
@worker
@pytest.mark.parametrize("function", ATTENTION + BLOCKWISE)
@pytest.mark.parametrize("axis", ["batch", "heads"])
def test_sharded_jit_adds_no_collective(sharded, axis, function):
    result = _ok(sharded["jit"][axis][function])
    assert result["diff"] <= TOLERANCE
    _no_collective(result["collectives"])
    # The output stays sharded like q along the sharded axis: one entry per device.
    assert result["sharded_like_input"], result["spec"]
    expected = [1, 2, 16, 3] if axis == "batch" else [2, 1, 16, 3]
    assert result["shard_shape"] == expected


@worker
@pytest.mark.parametrize(
    "function",
    [*ATTENTION, *BLOCKWISE, AUTOMATIC_BLOCKWISE],
)
def test_shard_map_over_the_batch(sharded, function):
    result = _ok(sharded["shard_map"][function])
    assert result["diff"] <= TOLERANCE
    _no_collective(result["collectives"])


@worker
@pytest.mark.parametrize(
    "function",
    ATTENTION
    + BLOCKWISE
    + tuple(f"relative_attention_per_example_table[block_size={b}]" for b in (None, 4)),
)
def test_vmap_over_the_batch(sharded, function):
    assert _ok(sharded["vmap"][function])["diff"] <= TOLERANCE


# -------------------------------------------------------------------------------------------
# NumPy operands beside JAX ones (one device, this process)
# -------------------------------------------------------------------------------------------
def _close(result: Any, expected: Any) -> None:
    assert type(result) is type(expected)
    tolerance = TOLERANCE if result.dtype == jnp.float64 else 1e-5
    np.testing.assert_allclose(np.asarray(result), np.asarray(expected), atol=tolerance, rtol=0)


def _operands(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "q": rng.normal(size=(2, 3, 5, 4)),
        "k": rng.normal(size=(2, 3, 7, 4)),
        "v": rng.normal(size=(2, 3, 7, 2)),
        "full": rng.normal(size=(11, 4)),
        "causal": rng.normal(size=(7, 4)),
        "u": rng.normal(size=(3, 1, 4)),
        "pv": rng.normal(size=(3, 1, 4)),
        "key_table": rng.normal(size=(5, 4)),
        "value_table": rng.normal(size=(5, 2)),
        "query_table": rng.normal(size=(11, 4)),
    }


#: name -> f(q, k, v, tables, block_size): an attention function of tables and biases.
NUMPY_CLOSURES: dict[str, Callable[..., Any]] = {
    "relative_attention[causal]": lambda q, k, v, t, bs: relattn.relative_attention(
        q, k, v, t["causal"], content_bias=t["u"], position_bias=t["pv"], block_size=bs
    ),
    "relative_attention[full]": lambda q, k, v, t, bs: relattn.relative_attention(
        q, k, v, t["full"], content_bias=t["u"], position_bias=t["pv"], block_size=bs
    ),
    "shaw_attention": lambda q, k, v, t, bs: relattn.shaw_attention(
        q, k, v, t["key_table"], t["value_table"], causal=True, block_size=bs
    ),
    "disentangled_attention": lambda q, k, v, t, bs: relattn.disentangled_attention(
        q, k, v, t["full"], t["query_table"], block_size=bs
    ),
}


@pytest.mark.parametrize(
    ("name", "block_size"),
    [(name, None) for name in NUMPY_CLOSURES] + [("relative_attention[causal]", 3)],
)
def test_jit_closing_over_numpy_tables_and_biases(name, block_size):
    rng = np.random.default_rng(4)
    a = _operands(rng)
    tables = {n: x for n, x in a.items() if n not in ("q", "k", "v")}
    q, k, v = (jnp.asarray(a[n]) for n in ("q", "k", "v"))
    call = NUMPY_CLOSURES[name]
    closing = jax.jit(lambda q, k, v: call(q, k, v, tables, block_size))  # NumPy constants
    all_jax = jax.jit(lambda q, k, v, t: call(q, k, v, t, block_size))
    _close(closing(q, k, v), all_jax(q, k, v, {n: jnp.asarray(x) for n, x in tables.items()}))


def test_numpy_operands_promote_like_jax_arrays():
    # float32 JAX queries with float64 NumPy tables: promoted as JAX promotes them.
    rng = np.random.default_rng(5)
    a = _operands(rng)
    q, k, v = (jnp.asarray(a[n], dtype=jnp.float32) for n in ("q", "k", "v"))
    out = relattn.relative_attention(q, k, v, a["full"], content_bias=a["u"])
    expected = relattn.relative_attention(
        q, k, v, jnp.asarray(a["full"]), content_bias=jnp.asarray(a["u"])
    )
    assert out.dtype == expected.dtype
    _close(out, expected)


def test_torch_beside_jax_raises():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    a = _operands(rng)
    q, k, v = (jnp.asarray(a[n]) for n in ("q", "k", "v"))
    table = torch.asarray(a["full"])
    with pytest.raises(TypeError, match=r"^arrays from different libraries cannot be mixed"):
        relattn.relative_attention(q, k, v, table)
    with pytest.raises(TypeError, match=r"^arrays from different libraries cannot be mixed"):
        jax.jit(lambda q, k, v: relattn.relative_attention(q, k, v, table))(q, k, v)
    with pytest.raises(TypeError, match=r"^arrays from different libraries cannot be mixed"):
        relattn.scaled_dot_product_attention(q, torch.asarray(a["k"]), v)


def test_torch_beside_jax_in_the_ring_raises():
    # A one-device ring (this process has one device): the check comes before any collective.
    torch = pytest.importorskip("torch")
    if not hasattr(jax, "shard_map"):
        pytest.skip(f"jax {jax.__version__} has no jax.shard_map")
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(4, 2)))
    table = torch.asarray(rng.normal(size=(7, 2)))
    mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    ring = jax.shard_map(
        lambda q: relattn.ring_attention(q, q, q, table, axis_name="seq"),
        mesh=mesh,
        in_specs=P("seq"),
        out_specs=P("seq"),
    )
    with pytest.raises(TypeError, match=r"^arrays from different libraries cannot be mixed"):
        ring(x)
