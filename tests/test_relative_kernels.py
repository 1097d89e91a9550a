"""relattn's relative-position kernels through the public functions: the plan takes the
Triton kernel (PyTorch) or the Pallas kernel (JAX) on a GPU for the terms no library kernel
has, and the result equals the block fold. On a CPU the kernels run in their interpreters
where ``relattn.config.path`` forces them (tiny sizes: interpreted kernels are slow); the
kernels' own tests are ``test_triton_kernel.py`` and ``test_pallas_kernel.py``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import relattn
from relattn.backends import backend_for
from relattn.testing import Target

pytestmark = [pytest.mark.slow]


def _kernel(target: Target) -> str:
    """The kernel's path name on ``target``, skipping where its library is missing."""
    if target.is_torch:
        pytest.importorskip("triton")
        return "triton"
    pytest.importorskip("jax.experimental.pallas")
    return "pallas"


#: Transformer-XL (causal layout), the full layout with Lq < Lk, DeBERTa's two tables, and
#: a per-distance bias with a table: ``(lq, lk, causal, full layout, query table, bias)``.
CASES = {
    "transformer_xl": (11, 11, True, False, False, False),
    "memory": (5, 13, True, False, False, True),
    "full_layout": (6, 10, False, True, False, False),
    "deberta": (9, 9, False, True, True, True),
}


def _inputs(rng: np.random.Generator, case: str, d: int = 8) -> dict:
    lq, lk, _, full, query_table, bias = CASES[case]
    width = lq + lk - 1 if full else lk
    a = {
        "q": rng.standard_normal((1, 2, lq, d)),
        "k": rng.standard_normal((1, 2, lk, d)),
        "v": rng.standard_normal((1, 2, lk, 6)),
        "position_table": rng.standard_normal((2, width, d)) / 2,
        "content_bias": rng.standard_normal((2, 1, d)) / 4,
        "position_bias": rng.standard_normal((2, 1, d)) / 4,
    }
    if query_table:
        a["query_position_table"] = rng.standard_normal((width, d)) / 2
    if bias:
        a["relative_bias"] = rng.standard_normal((2, width))
    return a


def _call(arrays: dict, case: str, **options) -> object:
    causal = CASES[case][2]
    return relattn.relative_attention(**arrays, causal=causal, **options)


@pytest.mark.parametrize("case", list(CASES))
def test_the_forced_kernel_equals_the_fold(jit_backend, case, rng):
    name = _kernel(jit_backend)
    arrays = {n: jit_backend.asarray(a, "float32") for n, a in _inputs(rng, case).items()}
    expected = jit_backend.to_host(_call(arrays, case, block_size=(4, 4)))
    with relattn.config.override(path=name):
        plan = relattn.explain(relattn.relative_attention, **arrays, causal=CASES[case][2])
        out = _call(arrays, case)
    assert plan.path == name
    np.testing.assert_allclose(jit_backend.to_host(out), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("case", ["transformer_xl", "deberta"])
def test_segments_and_a_key_mask_on_the_forced_kernel(jit_backend, case, rng):
    """Packed documents and key padding reach the kernel (no fold in between): equal to the
    fold, and a masked key's NaN reaches no output."""
    name = _kernel(jit_backend)
    host = _inputs(rng, case)
    lq, lk = CASES[case][:2]
    host["k"][..., lk - 1, :] = np.nan  # an unfilled slot, masked
    host["v"][..., lk - 1, :] = np.nan
    arrays = {n: jit_backend.asarray(a, "float32") for n, a in host.items()}
    documents = np.arange(lk) * 2 // lk
    extra = {
        "segment_ids": (jit_backend.asarray(documents[lk - lq :][None, None]),
                        jit_backend.asarray(documents[None, None])),
        "mask": jit_backend.asarray(np.arange(lk) < lk - 1),
    }  # fmt: skip
    expected = jit_backend.to_host(_call(arrays, case, block_size=(4, 4), **extra))
    with relattn.config.override(path=name):
        plan = relattn.explain(relattn.relative_attention, **arrays, causal=CASES[case][2],
                               **extra)  # fmt: skip
        out = jit_backend.to_host(_call(arrays, case, **extra))
    assert plan.path == name
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)


#: Positions as data: a cache (queries at 30 on, keys from 30 - (Lk - Lq)), packed documents
#: restarting at 0 (with their segment ids), and scattered positions (distances past the
#: table's edges, clipped).
POSITIONS = ["cache", "packed", "scattered"]


def _positions(target: Target, kind: str, lq: int, lk: int) -> dict:
    if kind == "cache":
        keys = np.arange(lk) + 30 - (lk - lq)
        return {"positions": (target.asarray(keys[lk - lq :]), target.asarray(keys))}
    if kind == "packed":
        documents = np.arange(lk) * 2 // lk
        starts = np.searchsorted(documents, documents)
        keys, segments = np.arange(lk) - starts, documents
        return {
            "positions": (target.asarray(keys[lk - lq :]), target.asarray(keys)),
            "segment_ids": (target.asarray(segments[lk - lq :]), target.asarray(segments)),
        }
    rng = np.random.default_rng(11)
    queries = rng.integers(-lk, lk, (1, 1, lq))
    return {"positions": (target.asarray(queries), target.asarray(rng.integers(-lk, lk, lk)))}


@pytest.mark.parametrize("kind", POSITIONS)
@pytest.mark.parametrize("case", ["memory", "deberta"])
def test_positions_as_data_on_the_forced_kernel(jit_backend, case, kind, rng):
    """Positions as data reach the kernel (each tile pair's table windows): output and
    every gradient equal the fold's."""
    name = _kernel(jit_backend)
    arrays = {n: jit_backend.asarray(a, "float32") for n, a in _inputs(rng, case).items()}
    extra = _positions(jit_backend, kind, *CASES[case][:2])
    cotangent = np.random.default_rng(6).standard_normal((1, 2, CASES[case][0], 6))
    expected, expected_grads = _with_gradients(
        jit_backend, lambda a: _call(a, case, block_size=(4, 4), **extra), arrays, cotangent
    )
    with relattn.config.override(path=name):
        plan = relattn.explain(relattn.relative_attention, **arrays, causal=CASES[case][2],
                               **extra)  # fmt: skip
        out, grads = _with_gradients(jit_backend, lambda a: _call(a, case, **extra), arrays,
                                     cotangent)  # fmt: skip
    assert plan.path == name
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
    for n in arrays:
        np.testing.assert_allclose(grads[n], expected_grads[n], rtol=5e-5, atol=5e-5, err_msg=n)


def _with_gradients(target: Target, fn: Any, arrays: dict, cotangent: np.ndarray) -> tuple:
    """``fn(arrays)`` on the host and the gradient of ``Σ fn(arrays) · cotangent`` with
    respect to each array, by name (torch autograd or ``jax.grad``)."""
    if target.is_torch:
        import torch

        leaves = {n: a.detach().clone().requires_grad_(True) for n, a in arrays.items()}
        out = fn(leaves)
        out.backward(torch.as_tensor(cotangent, dtype=out.dtype, device=out.device))
        return target.to_host(out), {n: target.to_host(leaf.grad) for n, leaf in leaves.items()}
    import jax

    def loss(values: dict) -> tuple:
        out = fn(values)
        return (out * cotangent).sum(), out

    grads, out = jax.grad(loss, has_aux=True)(arrays)
    return target.to_host(out), {n: target.to_host(g) for n, g in grads.items()}


@pytest.mark.parametrize("case", ["transformer_xl", "deberta"])
def test_the_forced_kernels_gradients_equal_the_folds(jit_backend, case, rng):
    name = _kernel(jit_backend)
    arrays = {n: jit_backend.asarray(a, "float32") for n, a in _inputs(rng, case).items()}
    cotangent = np.random.default_rng(5).standard_normal((1, 2, CASES[case][0], 6))
    _, expected = _with_gradients(
        jit_backend, lambda a: _call(a, case, block_size=(4, 4)), arrays, cotangent
    )
    with relattn.config.override(path=name):
        _, got = _with_gradients(jit_backend, lambda a: _call(a, case), arrays, cotangent)
    for n in arrays:
        np.testing.assert_allclose(got[n], expected[n], rtol=5e-5, atol=5e-5, err_msg=n)


def _sam(target: Target, rng: np.random.Generator) -> tuple:
    """SAM's arguments at a 4 × 5 query grid over a 3 × 5 key grid (MViTv2's pooled keys)."""
    host = {
        "q": rng.standard_normal((1, 2, 20, 8)), "k": rng.standard_normal((1, 2, 15, 8)),
        "v": rng.standard_normal((1, 2, 15, 6)), "table_h": rng.standard_normal((7, 8)) / 3,
        "table_w": rng.standard_normal((9, 8)) / 3,
    }  # fmt: skip
    arrays = {n: target.asarray(a, "float32") for n, a in host.items()}
    return arrays, {"query_grid": (4, 5), "key_grid": (3, 5)}


def test_the_decomposed_terms_on_the_forced_kernel(jit_backend, rng):
    """SAM's per-axis terms are the core's grid terms, which the kernels form in their
    tiles: output and every gradient equal the fold's."""
    from relattn.decomposed import decomposed_relative_attention as sam

    name = _kernel(jit_backend)
    arrays, grids = _sam(jit_backend, rng)
    names = list(arrays)
    cotangent = rng.standard_normal((1, 2, 20, 6))

    def run(**options: object) -> tuple:
        def call(values: dict) -> object:
            return sam(*(values[n] for n in names), **grids, **options)  # pytrees sort keys

        return _with_gradients(jit_backend, call, arrays, cotangent)

    expected, expected_grads = run(block_size=(8, 4))
    with relattn.config.override(path=name):
        plan = relattn.explain(sam, *arrays.values(), **grids)
        out, grads = run()
    assert plan.path == name
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
    for n in names:
        np.testing.assert_allclose(grads[n], expected_grads[n], rtol=5e-5, atol=5e-5, err_msg=n)


class _Device:
    """A stand-in for a CUDA device (``type`` as torch's devices say it)."""

    type = "cuda"

    def __hash__(self) -> int:
        return 1


@pytest.mark.parametrize("library", ["torch", "jax"])
def test_a_gpu_plan_takes_the_kernel_for_a_position_table(library, rng):
    """On a GPU Transformer-XL's and DeBERTa's tables take relattn's kernel (FlexAttention
    cannot carry them), at given positions too; a per-distance bias alone stays with
    FlexAttention on torch; a value table (Shaw) or an (Lq, Lk) mask go elsewhere, saying
    why."""
    target = relattn.testing.target(library)
    if target.unavailable:
        pytest.skip(target.unavailable)
    name = _kernel(target)
    backend = dataclasses.replace(backend_for(target.xp), free_memory=lambda device: 80 << 30)
    settings = relattn._config.Settings()
    arrays = {n: target.asarray(a, "float32") for n, a in _inputs(rng, "deberta").items()}

    def plan(**changes: object) -> relattn.plan.Plan:
        p = relattn.problem.check(arrays["q"], arrays["k"], arrays["v"], **changes)
        return relattn.plan.choose(p, backend, _Device(), True, False, settings)

    tables = {n: arrays[n] for n in ("position_table", "query_position_table")}
    assert plan(**tables).path == name
    assert plan(position_table=arrays["position_table"], causal=False).path == name
    mask = target.asarray(np.ones((9, 9), dtype=bool))
    masked = plan(**tables, mask=mask)
    assert masked.path != name
    assert "mask is not formed" in dict(masked.refused)[name]
    padding = target.asarray(np.arange(9) < 7)
    assert plan(**tables, mask=padding).path == name
    assert plan(**tables, positions=target.asarray(np.arange(9)[::-1].copy())).path == name
    if library == "torch":
        assert plan(relative_bias=arrays["relative_bias"]).path == "flex"
    sam_arrays, grids = _sam(target, rng)
    from relattn.decomposed import decomposed_relative_attention

    sam = relattn.explain(decomposed_relative_attention, *sam_arrays.values(), **grids)
    assert sam.path != name and "runs only in its interpreter" in dict(sam.refused)[name]
    on_cpu = relattn.plan.choose(
        relattn.problem.check(arrays["q"], arrays["k"], arrays["v"], **tables),
        backend, "cpu", True, False, settings,
    )  # fmt: skip
    assert on_cpu.path != name
    assert "runs only in its interpreter" in dict(on_cpu.refused)[name]


def test_a_forced_kernel_that_cannot_compute_the_call_says_why(jit_backend, rng):
    name = _kernel(jit_backend)
    arrays = {n: jit_backend.asarray(a, "float32") for n, a in _inputs(rng, "deberta").items()}
    values = jit_backend.asarray(rng.standard_normal((17, 6)), "float32")
    with (
        relattn.config.override(path=name),
        pytest.raises(ValueError, match=f"path='{name}' cannot compute this call: a value table"),
    ):
        relattn.relative_attention(**arrays, value_table=values)


def test_the_kernel_record_is_offered_to_the_plan():
    """Each backend offers its kernel: FlexAttention and Triton on torch, Pallas on JAX."""
    from relattn.backends import _jax, _torch

    assert [k.name for k in _torch.BACKEND.kernels] == ["flex", "triton"]
    assert [k.name for k in _jax.BACKEND.kernels] == ["pallas"]
    assert all(k.gpu_only for k in (*_torch.BACKEND.kernels[1:], *_jax.BACKEND.kernels))


def test_the_triton_kernel_under_torch_compile(rng):
    """The kernel is a PyTorch custom operator: torch.compile keeps it in one graph
    (fullgraph), and the compiled call and its gradients equal the eager fold's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    host = _inputs(rng, "memory")
    arrays = {n: torch.tensor(a, dtype=torch.float32) for n, a in host.items()}
    cotangent = np.random.default_rng(7).standard_normal((1, 2, CASES["memory"][0], 6))
    target = relattn.testing.target("torch")
    expected, expected_grads = _with_gradients(
        target, lambda a: _call(a, "memory", block_size=(4, 4)), arrays, cotangent
    )
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: _call(a, "memory"), fullgraph=True)
    with relattn.config.override(path="triton"):
        out, grads = _with_gradients(target, compiled, arrays, cotangent)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
    for n in arrays:
        np.testing.assert_allclose(grads[n], expected_grads[n], rtol=5e-5, atol=5e-5, err_msg=n)
