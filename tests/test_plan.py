"""Plans (SPEC §2.14b): the path each call signature takes, why, and that every path
computes the same attention as the block fold.

- the plan table: the path per scheme, backend and size (the docs' "Which path runs");
- every path a call can be forced onto (``relattn.config.override(path=…)``) equals the
  fold run with small blocks, and a path that cannot compute the call says why;
- plans are kept per signature and settings; the budget is read once and set in code;
- on a GPU the budget and block sizes come from the device (a stand-in device here).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import relattn
import relattn.plan
from relattn.backends import backend_for

B, H, D = 2, 3, 8


def _inputs(rng, lq, lk):
    q = rng.normal(size=(B, H, lq, D))
    k = rng.normal(size=(B, H, lk, D))
    v = rng.normal(size=(B, H, lk, D))
    return q, k, v


def _calls(backend, rng, lq=6, lk=9):
    """name -> (function, args, kwargs) for every scheme the plan distinguishes."""
    q, k, v = (backend.asarray(a) for a in _inputs(rng, lq, lk))
    w_full, w_causal = lq + lk - 1, lk
    table = backend.asarray(rng.normal(size=(w_causal, D)))
    full_table = backend.asarray(rng.normal(size=(w_full, D)))
    u = backend.asarray(rng.normal(size=(D,)))
    distances = relattn.relative_distances(lq, lk, causal=True)
    alibi = backend.asarray(np.asarray(relattn.alibi_slopes(H))[:, None] * distances)
    t5 = backend.asarray(rng.normal(size=(H, w_full)))
    emb = backend.asarray(rng.normal(size=(9, D)))
    mask = np.ones((B, 1, 1, lk), dtype=bool)
    mask[0, ..., -3:] = False
    mask = backend.asarray(mask)
    seg = np.zeros((B, lk), dtype=np.int64)
    seg[:, 4:] = 1
    segments = (backend.asarray(seg[:, None, -lq:]), backend.asarray(seg[:, None, :]))
    sdpa = relattn.scaled_dot_product_attention
    return {
        "plain": (sdpa, (q, k, v), {}),
        "causal": (sdpa, (q, k, v), {"causal": True}),
        "key padding": (sdpa, (q, k, v), {"mask": mask}),
        "alibi": (sdpa, (q, k, v), {"relative_bias": alibi}),
        "t5": (sdpa, (q, k, v), {"relative_bias": t5}),
        "segments": (sdpa, (q, k, v), {"segment_ids": segments, "causal": True}),
        "transformer-xl": (
            relattn.relative_attention, (q, k, v, table),
            {"content_bias": u, "position_bias": u},
        ),
        "xlnet": (relattn.relative_attention, (q, k, v, full_table), {}),
        "shaw": (relattn.shaw_attention, (q, k, v, emb, emb), {}),
        "deberta": (relattn.disentangled_attention, (q, k, v, full_table, full_table), {}),
    }  # fmt: skip


#: The path of each call on the CPU at small sizes (within the dense budget).
_NUMPY = ["plain", "causal", "key padding", "alibi", "t5", "transformer-xl", "xlnet", "shaw"]
_TORCH = {
    "plain": "fused", "causal": "fused", "key padding": "fused", "alibi": "fused",
    "t5": "fused", "segments": "fold", "transformer-xl": "fused", "xlnet": "fused",
    "shaw": "dense", "deberta": "fused",
}  # fmt: skip
EXPECTED = {
    "numpy": dict.fromkeys([*_NUMPY, "deberta"], "dense") | {"segments": "fold"},
    "torch": _TORCH,
}


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_plan_table_on_the_cpu(library, rng):
    """The documented table: which path each scheme takes on the CPU, within the budget,
    and over it (every one the fold, with the CPU's block sizes)."""
    from relattn.testing import target

    backend = target(library)
    if backend.unavailable:
        pytest.skip(backend.unavailable)
    for name, (fn, args, kwargs) in _calls(backend, rng).items():
        plan = relattn.explain(fn, *args, **kwargs)
        assert plan.path == EXPECTED[library][name], (name, str(plan))
        assert plan.device == "cpu" and plan.library == library
        with relattn.config.override(max_score_bytes=1):
            over = relattn.explain(fn, *args, **kwargs)
        if over.path == "fused":  # a flash kernel: nothing of (Lq, Lk) to hold
            assert name in ("plain", "causal"), name
            assert over.causal_kernel == (name == "causal")
            continue
        assert over.path == "fold" and over.block_size == relattn.plan.BLOCK_SIZES["cpu"], name
        assert any("exceeds the dense budget" in why for _, why in over.refused), name


def test_every_path_equals_the_fold(backend, rng):
    """Each path a call can be forced onto gives the fold's result (blocks of 2 × 3);
    a path that cannot compute it raises ``ValueError`` with the reason."""
    for name, (fn, args, kwargs) in _calls(backend, rng).items():
        expected = backend.to_host(fn(*args, **kwargs, block_size=(2, 3)))
        taken = []
        for path in relattn._config.PATHS:
            with relattn.config.override(path=path):
                try:
                    plan = relattn.explain(fn, *args, **kwargs)
                except ValueError as e:
                    assert f"path={path!r} cannot compute this call" in str(e), (name, path)
                    continue
                assert plan.path == path
                got = fn(*args, **kwargs)
            backend.assert_close(got, expected, "float64")
            taken.append(path)
        assert "fold" in taken, name
        if "segments" not in name:
            assert "dense" in taken, name


def test_forced_path_names_the_reason(torch_backend, rng):
    calls = _calls(torch_backend, rng)
    fn, args, kwargs = calls["shaw"]
    with relattn.config.override(path="fused"), pytest.raises(ValueError, match="value table"):
        fn(*args, **kwargs)
    fn, args, kwargs = calls["transformer-xl"]
    with relattn.config.override(path="flex", compile=True), pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    assert "flex" in str(e.value)


def test_plans_are_kept_per_signature_and_settings(rng):
    q, k, v = _inputs(rng, 4, 4)
    sdpa = relattn.scaled_dot_product_attention
    first = relattn.explain(sdpa, q, k, v, causal=True)
    assert relattn.explain(sdpa, q + 1, k, v, causal=True) is first
    assert relattn.explain(sdpa, q[..., :3, :], k, v, causal=True) is not first
    with relattn.config.override(max_score_bytes=1):
        other = relattn.explain(sdpa, q, k, v, causal=True)
    assert other is not first and other.path == "fold"
    assert relattn.explain(sdpa, q, k, v, causal=True) is first


def test_explain_describes_the_plan(rng):
    q, k, v = _inputs(rng, 5, 5)
    table = rng.normal(size=(9, D))
    plan = relattn.explain(relattn.relative_attention, q, k, v, table)
    text = str(plan)
    assert text.startswith("path: dense") and "passed over:" in text
    assert "numpy has no attention kernel" in text
    empty = relattn.explain(relattn.scaled_dot_product_attention, q[..., :0, :], k, v)
    assert empty.path == "empty"
    with pytest.raises(ValueError, match="ran no attention"):
        relattn.explain(np.add, 1, 2)
    with pytest.raises(ValueError, match="position_table"):  # the call's own checks
        relattn.explain(relattn.relative_attention, q, k, v, table[:3])


def test_config_settings_are_checked_and_restored():
    budget = relattn.config.max_score_bytes
    with pytest.raises(ValueError, match="max_score_bytes must be a positive integer"):
        relattn.config.update("max_score_bytes", 0)
    with pytest.raises(TypeError, match="max_score_bytes must be a positive integer"):
        relattn.config.update("max_score_bytes", 1.5)
    with pytest.raises(ValueError, match="path must be None or one of"):
        relattn.config.update("path", "flash")
    with pytest.raises(TypeError, match="compile must be True, False or None"):
        relattn.config.update("compile", "yes")
    with pytest.raises(ValueError, match="has no setting 'budget'"):
        relattn.config.update("budget", 1)
    with pytest.raises(AttributeError, match="has no setting"):
        _ = relattn.config.budget
    with pytest.raises(RuntimeError), relattn.config.override(max_score_bytes=7, path="fold"):
        assert relattn.config.max_score_bytes == 7 and relattn.config.path == "fold"
        raise RuntimeError
    assert relattn.config.max_score_bytes == budget and relattn.config.path is None
    relattn.config.update("max_score_bytes", 1 << 20)
    try:
        assert relattn.config.settings.max_score_bytes == 1 << 20
    finally:
        relattn.config.update("max_score_bytes", budget)


class _Device:
    """A stand-in for a CUDA device (``type`` as torch's devices say it)."""

    type = "cuda"

    def __hash__(self) -> int:
        return 1


def test_gpu_budget_and_blocks_come_from_the_device(monkeypatch):
    """On a GPU the dense budget is a quarter of the free memory, never the CPU's 64 MiB,
    and the fold's blocks are the GPU's (1024, 2048)."""
    import array_api_compat.numpy as xp

    backend = dataclasses.replace(backend_for(xp), free_memory=lambda device: 80 << 30)
    assert relattn.plan.device_kind(_Device(), backend) == "gpu"
    assert relattn.plan.device_budget("gpu", _Device(), backend) == 20 << 30
    assert relattn.plan.device_budget("cpu", "cpu", backend) == relattn.plan.CPU_BUDGET
    assert relattn.plan.block_sizes("gpu") == (1024, 2048)
    q = np.zeros((1, 16, 4096, 64), dtype=np.float32)
    p = relattn.problem.check(q, q, q, causal=True)
    settings = relattn._config.Settings()
    on_gpu = relattn.plan.choose(p, backend, _Device(), True, False, settings)
    on_cpu = relattn.plan.choose(p, backend, "cpu", True, False, settings)
    assert (on_gpu.path, on_gpu.budget) == ("dense", 20 << 30)
    assert (on_cpu.path, on_cpu.block_size) == ("fold", (256, 512))
    small = dataclasses.replace(backend, free_memory=lambda device: 1 << 30)
    tight = relattn.plan.choose(p, small, _Device(), True, False, settings)
    assert (tight.path, tight.block_size) == ("fold", (1024, 2048))


@pytest.mark.parametrize(("lq", "lk"), [(1, 9), (4, 9), (9, 9)])
def test_sdpa_causal_is_aligned_to_the_last_key(torch_backend, lq, lk, rng):
    """Causal with Lk >= Lq on SDPA: ``is_causal`` or ``causal_lower_right``, no mask array,
    equal to the fold (query i sees keys up to i + Lk - Lq)."""
    q, k, v = (torch_backend.asarray(a) for a in _inputs(rng, lq, lk))
    sdpa = relattn.scaled_dot_product_attention
    plan = relattn.explain(sdpa, q, k, v, causal=True)
    assert (plan.path, plan.causal_kernel) == ("fused", True)
    expected = torch_backend.to_host(sdpa(q, k, v, causal=True, block_size=2))
    torch_backend.assert_close(sdpa(q, k, v, causal=True), expected, "float64")


@pytest.mark.slow
@pytest.mark.subprocess  # Inductor's C++ build, as tests/test_compile.py
def test_flex_is_taken_when_a_loop_repeats_the_signature(torch_backend, monkeypatch, rng):
    """On a CPU, FlexAttention (compiled) is taken from a signature's ``CPU_COMPILE_AFTER``-th
    call on where its scores are large, at once with ``compile=True``, never with ``False``;
    its results equal the fold's, for ALiBi, T5 and packed segments."""
    monkeypatch.setattr(relattn.plan, "CPU_COMPILE_ELEMENTS", 1)
    monkeypatch.setattr(relattn.plan, "CPU_COMPILE_AFTER", 3)
    calls = _calls(torch_backend, rng, lq=5, lk=11)
    fn, args, kwargs = calls["alibi"]
    args = tuple(a.float() for a in args)
    kwargs = {"relative_bias": kwargs["relative_bias"].float()}
    expected = torch_backend.to_host(fn(*args, **kwargs, block_size=(2, 3)))
    paths = []
    for _ in range(4):
        paths.append(relattn.explain(fn, *args, **kwargs).path)
        torch_backend.assert_close(fn(*args, **kwargs), expected, "float32")
    assert paths == ["fused", "fused", "flex", "flex"], paths
    with relattn.config.override(compile=False):
        assert relattn.explain(fn, *args, **kwargs).path == "fused"
    with relattn.config.override(compile=True):
        for name in ("t5", "segments", "key padding"):
            fn, args, kwargs = calls[name]
            args = tuple(a.float() for a in args)
            kwargs = {
                key: (value.float() if getattr(value, "is_floating_point", bool)() else value)
                for key, value in kwargs.items()
            }
            expected = torch_backend.to_host(fn(*args, **kwargs, block_size=(2, 3)))
            plan = relattn.explain(fn, *args, **kwargs)
            assert plan.path == "flex", (name, str(plan))
            torch_backend.assert_close(fn(*args, **kwargs), expected, "float32")


@pytest.mark.slow
@pytest.mark.subprocess  # Inductor's C++ build, as tests/test_compile.py
@pytest.mark.parametrize("name", ["transformer-xl"])
def test_compiled_fold_equals_the_eager_fold(torch_backend, name, rng):
    """``compile=True``: the fold's block step compiled (one graph per step, no break),
    equal to the eager fold with gradients, within the recompile limit, for a table term
    in the causal layout (compiled steps of Shaw's value term and of segments with
    positions passed the same test; they are left out for the suite's time: 50 s each)."""
    import torch
    import torch._dynamo.utils

    fn, args, kwargs = _calls(torch_backend, rng, lq=9, lk=13)[name]
    args = tuple(a.float().requires_grad_() for a in args)
    kwargs = {k: (v.float() if v.is_floating_point() else v) if hasattr(v, "dtype") else v
              for k, v in kwargs.items()}  # fmt: skip
    eager = fn(*args, **kwargs, block_size=(4, 5))
    eager_grads = torch.autograd.grad(eager.sum(), args)
    counters = torch._dynamo.utils.counters["stats"]
    before = counters["unique_graphs"]
    with relattn.config.override(compile=True):
        plan = relattn.explain(fn, *args, **kwargs, block_size=(4, 5))
        assert plan.compile_step is not None and "compiled" in plan.detail
        out = fn(*args, **kwargs, block_size=(4, 5))
        grads = torch.autograd.grad(out.sum(), args)
        fn(*args, **kwargs, block_size=(4, 5))  # again: no new graph
    graphs = counters["unique_graphs"] - before
    assert 1 <= graphs <= 8, graphs
    torch_backend.assert_close(out, torch_backend.to_host(eager), "float32")
    for got, want in zip(grads, eager_grads, strict=True):
        torch_backend.assert_close(got, torch_backend.to_host(want), "float32")
