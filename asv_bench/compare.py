"""relattn against native code, side by side in one process, with a pass/miss table.

The speed and memory targets of SPEC §5 and issue 4, measured the way asv's
``track_*`` benchmarks do (the two sides alternate, several repeats, medians)
but at the sizes the targets name, and printed as one markdown table:

- ``relative_attention``: relattn / native Transformer-XL code (pad-and-reshape
  shift, ``asv_bench/benchmarks/native.py``) on NumPy, PyTorch CPU and JAX
  (``jax.jit``) at Lq = 512, Lk = 1024, causal and full layouts: <= 1.05;
- ``rotary_position_embedding`` of ``q`` and ``k`` (B = 2, H = 8, L = 2048,
  d = 64) / Hugging Face's ``apply_rotary_pos_emb`` with ``rotate_half``
  given its cached ``cos``/``sin``, and T5-bias attention at Lq = Lk = 512
  (``relative_bias=`` from the ``2L - 1`` distances' buckets) / the ``(H, L, L)``
  bias gathered per pair + the fused kernel (NumPy: softmax), on NumPy,
  PyTorch CPU and JAX: <= 1.05;
- ``relative_attention`` / its own matrix products timed alone
  (``(q+u) kᵀ``, ``(q+v) Rᵀ``, ``P v``, summed) at Lq = 1024, Lk = 2048 on
  NumPy and PyTorch CPU: <= 1.5;
- Shaw host peak memory (``asv_bench/shaw_memory.py``, one process per case)
  at L = 2048: shaw / plain attention with a bias <= 1.25 and
  materialised (tensor2tensor) / shaw >= 10;
- dispatch overhead at L = 8: relattn's call minus the native call, in µs, for
  ``relative_attention`` (causal Transformer-XL) and plain
  ``scaled_dot_product_attention`` (reported, no target);
- ``plans``: each scheme's default plan (the path relattn chooses, named in the
  row) against the same call forced onto the block fold, causal plain attention,
  ALiBi, T5, packed documents, Transformer-XL, Shaw and DeBERTa, B = 1, H = 8,
  d = 64, float32, L = 1024 and 4096 (``--quick``: 1024): <= 1.0;
- ``vision``: SAM's attention with decomposed relative positions at a 64×64 grid
  (L = 4096, B = 1, d = 64, 4 heads on a CPU, ``--quick`` 2) and Swin-T's shifted 7×7
  windows of a 56×56 grid (B = 8, H = 3, d = 32) against the same written natively
  (segment-anything's ``add_decomposed_rel_pos``, Swin's ``WindowAttention``), on NumPy,
  PyTorch CPU and JAX (``jax.jit``): time and peak host memory <= 1.0 (NumPy:
  tracemalloc; PyTorch: resident high-water growth; JAX: the compiled programs' bytes);
  the ``gpu`` group runs both on each GPU target (SAM with ViT-B's 12 heads, 64 Swin
  images), bf16 and float32, the targets checked for bf16;
- ``gpu``, on each GPU target found (``torch_cuda``, ``jax_gpu``, ``cupy``),
  B = 2, H = 16, d = 64, L = 1024, 4096, 16 384, bf16 and float32, time and peak
  memory: causal against flash SDPA (<= 1.1), ALiBi, T5 and packed documents
  against FlexAttention forward and forward+backward (<= 1.0), Transformer-XL
  against the authors' ``rel_shift`` code (<= 1.0 in time, <= 0.1 in memory),
  JAX against ``jax.nn.dot_product_attention`` (<= 1.5 cuDNN, <= 1.0 XLA), CuPy
  against the same written in CuPy (<= 1.0), the targets checked for bf16 at
  L >= 4096 (:func:`gpu`); and ``relative_attention`` on torch CUDA against
  ``scaled_dot_product_attention`` given the same scores' position term and
  causal mask as a precomputed bias, L = 4096: throughput >= 0.8 × SDPA's.

Usage (from the repository root)::

    python asv_bench/compare.py                   # everything available on the CPU
    python asv_bench/compare.py --quick           # fewer repeats
    python asv_bench/compare.py --backend numpy --backend torch
    python asv_bench/compare.py --only plans --backend numpy --backend torch --backend jax
    python asv_bench/compare.py --only vision --quick
    python asv_bench/compare.py --only gpu --gpu-length 4096 --gpu-dtype bfloat16
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import operator
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import relattn  # noqa: E402

from benchmarks import common, native  # noqa: E402

if TYPE_CHECKING:
    from relattn.testing import Target

CPU = ("numpy", "torch", "jax")
FUSED = {"torch": "F.scaled_dot_product_attention", "jax": "jax.nn.dot_product_attention"}
#: glibc malloc settings of ``--warm-malloc``: no mmap per array, no trimming.
WARM_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**36)}


@dataclass
class Row:
    what: str
    backend: str
    ours: str
    theirs: str
    value: float
    target: str
    ok: bool | None  # None: reported, no target

    def cells(self) -> list[str]:
        status = "info" if self.ok is None else ("pass" if self.ok else "**MISS**")
        return [self.what, self.backend, self.ours, self.theirs, f"{self.value:.3g}", self.target,
                status]  # fmt: skip


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def side_by_side(
    fn: Callable[[], Any], baseline: Callable[[], Any], backend: Target, repeats: int
) -> tuple[float, float, float]:
    """``(ratio, median fn, median baseline)`` alternating the two, ``repeats`` times each."""
    return common.median_ratio(fn, baseline, backend, repeats)


def relative_calls(backend: Target, lq: int, lk: int, layout: str):
    arrays = common.on(backend, common.relative_inputs(lq, layout, key_len=lk))
    q, k, v, table, u, pos = (arrays[n] for n in common.RELATIVE_NAMES)
    ours_fn = common.relattn_function("relative_attention", backend)
    theirs_fn = native.native("relative_attention", backend)

    def ours():
        return ours_fn(q, k, v, table, content_bias=u, position_bias=pos)

    def theirs():
        return theirs_fn(q, k, v, table, u, pos)

    return ours, theirs, arrays


# -- the measurements --------------------------------------------------


def against_native(names: list[str], repeats: int) -> list[Row]:
    rows = []
    for name in names:
        backend = common.get_backend(name)
        native.check(name)
        for layout in ("causal", "full"):
            ours, theirs, _ = relative_calls(backend, 512, 1024, layout)
            ratio, a, b = side_by_side(ours, theirs, backend, repeats)
            what = f"relative_attention {layout}, Lq=512 Lk=1024: relattn / native"
            label = f"{name}-jit" if name == "jax" else name
            rows.append(Row(what, label, ms(a), ms(b), ratio, "<= 1.05", ratio <= 1.05))
    return rows


def other_functions(names: list[str], repeats: int) -> list[Row]:
    """scaled_dot_product_attention against the fused kernels; Shaw against tensor2tensor."""
    rows = []
    lq, lk = 512, 1024
    for name in names:
        backend = common.get_backend(name)
        label = f"{name}-jit" if name == "jax" else name
        arrays = common.on(backend, common.bias_inputs(lq, key_len=lk))
        q, k, v, bias = (arrays[n] for n in ("q", "k", "v", "bias"))
        ours_fn = common.relattn_function("scaled_dot_product_attention", backend)
        theirs_fn = native.native("scaled_dot_product_attention", backend)
        ours = functools.partial(ours_fn, q, k, v, bias=bias)
        theirs = functools.partial(theirs_fn, q, k, v, bias)
        ratio, a, b = side_by_side(ours, theirs, backend, repeats)
        fused = FUSED.get(name, name)
        what = f"scaled_dot_product_attention + bias, Lq=512 Lk=1024: relattn / {fused}"
        rows.append(Row(what, label, ms(a), ms(b), ratio, "<= 1.05", ratio <= 1.05))
        arrays = common.on(backend, common.shaw_inputs(lq, key_len=lk))
        args = tuple(arrays[n] for n in ("q", "k", "v", "key_table", "value_table"))
        ours_fn = common.relattn_function("shaw_attention", backend)
        theirs_fn = native.native("shaw_attention", backend)
        ours, theirs = functools.partial(ours_fn, *args), functools.partial(theirs_fn, *args)
        ratio, a, b = side_by_side(ours, theirs, backend, repeats)
        what = "shaw_attention, Lq=512 Lk=1024: relattn / tensor2tensor (Lq, Lk, d) tensors"
        rows.append(Row(what, label, ms(a), ms(b), ratio, "<= 1.05", ratio <= 1.05))
    return rows


def position_schemes(names: list[str], repeats: int) -> list[Row]:
    """RoPE against HF's ``rotate_half``; T5's bias against the materialised ``(H, L, L)`` bias."""
    rows = []
    rotary_length, t5_length = 2048, 512
    for name in names:
        backend = common.get_backend(name)
        label = f"{name}-jit" if name == "jax" else name
        arrays = common.on(backend, common.rotary_inputs(rotary_length))
        cos, sin = native.rotary_tables(backend, rotary_length)
        ours_fn = backend.default_jit(common.rotary_qk)
        theirs_fn = native.native("rotary_position_embedding", backend)
        ours = functools.partial(ours_fn, arrays["q"], arrays["k"])
        theirs = functools.partial(theirs_fn, arrays["q"], arrays["k"], cos, sin)
        ratio, a, b = side_by_side(ours, theirs, backend, repeats)
        what = f"rotary_position_embedding, L={rotary_length}: relattn / native rotate_half"
        rows.append(Row(what, label, ms(a), ms(b), ratio, "<= 1.05", ratio <= 1.05))
        arrays = common.on(backend, common.t5_inputs(t5_length))
        qkv = (arrays["q"], arrays["k"], arrays["v"], arrays["table"])
        ours_fn = backend.default_jit(common.t5_attention)
        theirs_fn = native.native("t5_attention", backend)
        ours = functools.partial(ours_fn, *qkv, arrays["buckets"])
        theirs = functools.partial(theirs_fn, *qkv, native.t5_pairs(backend, t5_length))
        ratio, a, b = side_by_side(ours, theirs, backend, repeats)
        what = f"T5-bias attention, Lq=Lk={t5_length}: relattn / materialised bias + SDPA"
        rows.append(Row(what, label, ms(a), ms(b), ratio, "<= 1.05", ratio <= 1.05))
    return rows


def against_products(names: list[str], repeats: int) -> list[Row]:
    """relattn's whole call against the three products it cannot avoid, each timed alone."""
    rows = []
    for name in names:
        if name not in ("numpy", "torch"):
            continue
        backend = common.get_backend(name)
        lq, lk = 1024, 2048
        ours, theirs, arrays = relative_calls(backend, lq, lk, "causal")
        q, k, v, table, u, pos = (arrays[n] for n in common.RELATIVE_NAMES)
        lib = backend.lib
        qu, qv = q + u, q + pos
        k_t, r_t = lib.swapaxes(k, -1, -2), lib.swapaxes(table, -1, -2)
        weights = backend.asarray(
            np.full((common.BATCH, common.HEADS, lq, lk), 1.0 / lk, dtype=np.float32)
        )
        products = {
            "(q+u) kᵀ": functools.partial(operator.matmul, qu, k_t),
            "(q+v) Rᵀ": functools.partial(operator.matmul, qv, r_t),
            "P v": functools.partial(operator.matmul, weights, v),
        }
        calls = {"relattn": ours, "native": theirs, **products}
        for fn in calls.values():
            backend.ready(fn())
        # Round-robin: one call of each per round, medians over the rounds.
        times: dict[str, list[float]] = {key: [] for key in calls}
        for _ in range(repeats):
            for key, fn in calls.items():
                times[key].append(common.timed(fn, backend))
        med = {key: statistics.median(t) for key, t in times.items()}
        total = sum(med[p] for p in products)
        parts = " + ".join(f"{ms(med[p])}" for p in products)
        what = f"relative_attention causal, Lq=1024 Lk=2048: {{}} / Σ products ({parts})"
        ratio = med["relattn"] / total
        rows.append(Row(what.format("relattn"), name, ms(med["relattn"]), ms(total), ratio,
                        "<= 1.5", ratio <= 1.5))  # fmt: skip
        rows.append(Row(what.format("native"), name, ms(med["native"]), ms(total),
                        med["native"] / total, "(floor)", None))  # fmt: skip
    return rows


def shaw_memory(length: int) -> list[Row]:
    """Traced host peaks of the three Shaw cases, each in its own process (NumPy)."""
    peaks = {}
    for case in ("shaw", "plain", "materialised"):
        cmd = [sys.executable, str(HERE / "shaw_memory.py"), "--case", case]
        cmd += ["--length", str(length)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        peaks[case] = json.loads(done.stdout.strip().splitlines()[-1])["traced_mib"]
    size = f"L={length} B=1 H=8 d=64 K=16, traced peak"
    ratio_plain = peaks["shaw"] / peaks["plain"]
    ratio_mat = peaks["materialised"] / peaks["shaw"]
    mib = {case: f"{p:.0f} MiB" for case, p in peaks.items()}
    return [
        Row(f"shaw_attention memory, {size}: shaw / plain+bias", "numpy", mib["shaw"],
            mib["plain"], ratio_plain, "<= 1.25", ratio_plain <= 1.25),
        Row(f"shaw_attention memory, {size}: materialised / shaw", "numpy", mib["shaw"],
            mib["materialised"], ratio_mat, ">= 10", ratio_mat >= 10),
    ]  # fmt: skip


def per_call(ours: Callable[[], Any], theirs: Callable[[], Any], backend: Target,
             loops: int, rounds: int) -> tuple[float, float]:  # fmt: skip
    """Median seconds per call of ``ours`` and ``theirs``: ``rounds`` alternating rounds of
    ``loops`` calls each."""
    for fn in (ours, theirs):
        backend.ready(fn())
    a_runs, b_runs = [], []
    for _ in range(rounds):
        for fn, runs in ((ours, a_runs), (theirs, b_runs)):
            start = time.perf_counter()
            for _ in range(loops):
                out = fn()
            backend.ready(out)
            runs.append((time.perf_counter() - start) / loops)
    return statistics.median(a_runs), statistics.median(b_runs)


def dispatch(names: list[str], quick: bool) -> list[Row]:
    """Per-call cost at Lq = Lk = 8, where the arithmetic is negligible: microseconds.

    ``relative_attention`` (causal Transformer-XL) against the native pad-and-reshape
    code, and ``scaled_dot_product_attention`` (plain) against the same
    ``softmax(q kᵀ·s) v`` in the library's own API: ``F.scaled_dot_product_attention``,
    ``jax.nn.dot_product_attention`` (under ``jax.jit``, as relattn's), NumPy's
    products and softmax (``native.numpy_attention``)."""
    rows = []
    loops, rounds = (200, 5) if quick else (1000, 9)
    for name in names:
        backend = common.get_backend(name)
        label = f"{name}-jit" if name == "jax" else name
        ours, theirs, _ = relative_calls(backend, 8, 8, "causal")
        a, b = per_call(ours, theirs, backend, loops, rounds)
        rows.append(
            Row("relative_attention dispatch, Lq=Lk=8: relattn − native (µs per call)", label,
                f"{a * 1e6:.0f} µs", f"{b * 1e6:.0f} µs", (a - b) * 1e6, "report", None)
        )  # fmt: skip
        arrays = common.on(backend, common.attention_inputs(8, key_len=8))
        qkv = (arrays["q"], arrays["k"], arrays["v"])
        ours = functools.partial(
            common.relattn_function("scaled_dot_product_attention", backend), *qkv
        )
        theirs = functools.partial(native.native("scaled_dot_product_attention", backend), *qkv)
        a, b = per_call(ours, theirs, backend, loops, rounds)
        fused = FUSED.get(name, "NumPy softmax")
        rows.append(
            Row(f"scaled_dot_product_attention dispatch (plain), Lq=Lk=8: relattn − {fused} "
                "(µs per call)", label, f"{a * 1e6:.0f} µs", f"{b * 1e6:.0f} µs",
                (a - b) * 1e6, "report", None)
        )  # fmt: skip
    return rows


#: Lengths of the ``plans`` group (``--quick``: the first only).
PLAN_LENGTHS = (1024, 4096)


def plans(names: list[str], repeats: int, quick: bool) -> list[Row]:
    """Each scheme's default plan against the same call forced onto the block fold.

    The schemes of ``common.PLAN_SCHEMES`` (causal plain attention, ALiBi, T5,
    packed documents, causal Transformer-XL, Shaw, DeBERTa), B = 1, H = 8, d = 64,
    float32, at :data:`PLAN_LENGTHS`: relattn's call as it comes
    (``common.plan_and_fold``: warm, a plan that compiles after some calls of its
    signature compiled) over the call under ``relattn.config.override(path="fold")``,
    alternating. JAX: each side its own ``jax.jit`` function, the forced one traced
    under the override. Each row names the path the plan took
    (:func:`relattn.explain`); where that is the fold itself the two sides are one
    path, and the ratio is reported only. L = 4096 runs half the repeats (at least 3).
    """
    rows = []
    for name in names:
        backend = common.get_backend(name)
        label = f"{name}-jit" if name == "jax" else name
        for length in PLAN_LENGTHS[:1] if quick else PLAN_LENGTHS:
            n = repeats if length < 4096 else max(3, repeats // 2)
            for scheme in common.PLAN_SCHEMES:
                arrays = common.on(backend, common.plan_inputs(scheme, length))
                plan, fold, chosen = common.plan_and_fold(scheme, backend, arrays)
                print(f"plans: {label} {scheme}, L={length}: {chosen.path}", file=sys.stderr,
                      flush=True)  # fmt: skip
                ratio, a, b = side_by_side(plan, fold, backend, n)
                same = chosen.path == "fold"
                path = chosen.path + (f" {chosen.block_size}" if same else "")
                what = f"plans: {scheme}, L={length}: relattn's plan ({path}) / forced fold"
                rows.append(Row(what, label, ms(a), ms(b), ratio, "<= 1.0",
                                None if same else ratio <= 1.0))  # fmt: skip
                del arrays, plan, fold
    return rows


def decode(names: list[str], repeats: int) -> list[Row]:
    """A decode step (``Lq = 1``) at ``Lk`` = 8 192 and 65 536 and a chunk of prefill
    (``Lq = 256`` against 8 192 keys): Transformer-XL terms (causal layout, per-head table,
    ``u``, ``v``), B = 1, H = 8, d = 64, float32, against the faster of the two ways to
    write it by hand (``matmul`` of a transposed ``k``, or ``einsum``)."""
    rows = []
    rng = np.random.default_rng(3)
    for name in names:
        backend = common.get_backend(name)
        ours_fn = common.relattn_function("relative_attention", backend)
        by_matmul = native.native("relative_attention", backend)
        by_einsum = native.native("relative_attention_einsum", backend)
        for lq, lk in ((1, 8192), (1, 65536), (256, 8192)):
            shapes = {"q": (1, 8, lq, 64), "k": (1, 8, lk, 64), "v": (1, 8, lk, 64),
                      "table": (8, lk, 64), "u": (8, 1, 64), "pos": (8, 1, 64)}  # fmt: skip
            a = {n: backend.asarray(rng.normal(size=s).astype(np.float32))
                 for n, s in shapes.items()}  # fmt: skip
            args = (a["q"], a["k"], a["v"], a["table"], a["u"], a["pos"])

            def ours(args=args, fn=ours_fn):
                return fn(*args[:4], content_bias=args[4], position_bias=args[5])

            times = {}
            for label, fn in (("matmul", functools.partial(by_matmul, *args)),
                              ("einsum", functools.partial(by_einsum, *args))):  # fmt: skip
                _, _, times[label] = side_by_side(ours, fn, backend, repeats)
            best = min(times, key=times.get)
            ratio, a_time, b_time = side_by_side(
                ours,
                functools.partial(by_matmul if best == "matmul" else by_einsum, *args),
                backend,
                repeats,
            )
            what = "decode step" if lq == 1 else "chunked prefill"
            label = f"{name}-jit" if name == "jax" else name
            rows.append(
                Row(f"relative_attention {what}, Lq={lq} Lk={lk}: relattn / native ({best})",
                    label, ms(a_time), ms(b_time), ratio, "<= 1.0", ratio <= 1.0)
            )  # fmt: skip
        rows.extend(cached_decode(name, repeats, rng))
    return rows


def cached_decode(name: str, repeats: int, rng: np.random.Generator) -> list[Row]:
    """A decode step against a static cache of ``Lmax`` = 8 192 and 65 536 slots, two rows
    filled to ``Lmax`` and ``Lmax / 2``, unfilled slots zero (as a preallocated cache
    starts): relattn with positions and ``causal=True``, the native code masking them by
    hand. Transformer-XL terms as in :func:`decode`, B = 2. (Slots holding NaN cost
    relattn one more pass, selecting them out.)"""
    rows = []
    backend = common.get_backend(name)
    ours_fn = common.relattn_function("relative_attention", backend, causal=True)
    theirs_fn = native.native("cached_decode", backend)
    for lmax in (8192, 65536):
        shapes = {"q": (2, 8, 1, 64), "k": (2, 8, lmax, 64), "v": (2, 8, lmax, 64),
                  "table": (8, lmax, 64), "u": (8, 1, 64), "pos": (8, 1, 64)}  # fmt: skip
        host = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
        filled = np.array([lmax, lmax // 2])
        unfilled = np.arange(lmax)[None, None, :, None] >= filled[:, None, None, None]
        zeros = {n: np.where(unfilled, 0, host[n]) for n in ("k", "v")}
        a = {n: backend.asarray(x) for n, x in host.items()}
        positions = (backend.asarray((filled - 1).reshape(2, 1, 1)),
                     backend.asarray(np.arange(lmax)[None, None, :]))  # fmt: skip
        z_k, z_v = backend.asarray(zeros["k"]), backend.asarray(zeros["v"])
        lengths = backend.asarray(filled)

        def ours(a=a, positions=positions, k=z_k, v=z_v):
            return ours_fn(a["q"], k, v, a["table"], content_bias=a["u"],
                           position_bias=a["pos"], positions=positions)  # fmt: skip

        def theirs(a=a, k=z_k, v=z_v, lengths=lengths):
            return theirs_fn(a["q"], k, v, a["table"], a["u"], a["pos"], lengths)

        np.testing.assert_allclose(backend.to_host(ours()), backend.to_host(theirs()),
                                   rtol=2e-4, atol=2e-5)  # fmt: skip
        ratio, a_time, b_time = side_by_side(ours, theirs, backend, repeats)
        label = f"{name}-jit" if name == "jax" else name
        rows.append(
            Row(f"relative_attention decode step, static cache of {lmax} slots filled to "
                f"{lmax} and {lmax // 2} (positions): relattn / native",
                label, ms(a_time), ms(b_time), ratio, "<= 1.0", ratio <= 1.0)
        )  # fmt: skip
    return rows


def cuda_vs_sdpa(repeats: int, length: int = 4096, backend_name: str = "torch_cuda") -> list[Row]:
    """torch CUDA relative_attention against SDPA given its position term as a bias, L = 4096."""
    backend = common.get_backend(backend_name)  # NotImplementedError without torch or CUDA
    import torch
    import torch.nn.functional as F

    ours, _, arrays = relative_calls(backend, length, length, "causal")
    q, k, v, table, u, pos = (arrays[n] for n in common.RELATIVE_NAMES)
    scale = 1.0 / math.sqrt(q.shape[-1])
    with torch.no_grad():
        position = relattn.rel_shift((q + pos) @ table.transpose(-1, -2), length) * scale
        blocked = torch.triu(torch.ones(length, length, dtype=torch.bool, device=q.device), 1)
        bias = position.masked_fill(blocked, -math.inf)  # (B, H, L, L), precomputed
        qu = q + u

        def sdpa():
            return F.scaled_dot_product_attention(qu, k, v, attn_mask=bias, scale=scale)

        np.testing.assert_allclose(
            backend.to_host(sdpa()), backend.to_host(ours()), rtol=1e-3, atol=1e-3
        )
        ratio, a, b = side_by_side(ours, sdpa, backend, repeats)
    throughput = 1.0 / ratio  # SDPA's time over relattn's
    return [
        Row(f"relative_attention causal, L={length}: throughput relattn / SDPA with the "
            "position term as a precomputed bias", backend_name, ms(a), ms(b), throughput,
            ">= 0.8", throughput >= 0.8)
    ]  # fmt: skip


# -- GPUs --------------------------------------------------------------

#: The GPU targets of ``relattn.testing`` the ``gpu`` group runs on, where found.
GPU_TARGETS = ("torch_cuda", "jax_gpu", "cupy")
GPU_LENGTHS = (1024, 4096, 16384)
GPU_DTYPES = ("bfloat16", "float32")
#: SPEC §5's GPU sizes: B = 2, H = 16, d = 64.
GPU_BATCH, GPU_HEADS = 2, 16
#: Where SPEC §5's GPU targets apply (bf16 at these lengths); the other rows are reported.
GPU_CHECKED = ("bfloat16", (4096, 16384))
#: Largest difference allowed between relattn's result and the baseline's, by dtype
#: (outputs and gradients of unit-scale data; TF32 and bf16 products).
GPU_TOLERANCE = {"bfloat16": 6e-2, "float16": 1e-2, "float32": 1e-2}


@dataclass
class Pair:
    """relattn's call and the baseline's, without arguments; their device bytes where the
    library counts them (``None``: from the allocator around one call)."""

    ours: Callable[[], Any]
    theirs: Callable[[], Any]
    ours_bytes: Callable[[], int] | None = None
    theirs_bytes: Callable[[], int] | None = None
    #: The two compute the same result (checked); ``False`` for a floor of other math.
    same: bool = True


def gpu_arrays(backend: Target, scheme: str, length: int, dtype: str) -> dict:
    """``common.plan_inputs`` of ``scheme`` at the GPU sizes, floats in ``dtype``."""
    host = common.plan_inputs(scheme, length, batch=GPU_BATCH, heads=GPU_HEADS)
    return {n: backend.asarray(a, dtype if a.dtype.kind == "f" else None) for n, a in host.items()}


def _torch_backward(fn: Callable[..., Any], q: Any, k: Any, v: Any) -> Callable[[], Any]:
    """A call of ``fn(q, k, v)`` and its backward pass: the gradients of ``q``, ``k``, ``v``."""
    import torch

    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    grad = torch.randn(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device,
                       generator=torch.Generator(q.device).manual_seed(0))  # fmt: skip

    def step() -> Any:
        return torch.autograd.grad(fn(q, k, v), (q, k, v), grad)

    return step


def torch_gpu_cases(backend: Target, length: int, dtype: str):
    """``(what, baseline, make, time target, memory target)`` of PyTorch: causal attention
    against SDPA's own causal kernel (flash in bf16), the ``score_mod`` schemes against
    FlexAttention written directly (``native.torch_flex_attention``), each forward and
    forward+backward, and causal Transformer-XL against the authors' ``rel_shift`` code
    (``native.torch_relative_attention``) in time and memory."""
    import torch
    import torch.nn.functional as F

    sdpa = relattn.scaled_dot_product_attention

    def causal() -> tuple:
        a = gpu_arrays(backend, "causal", length, dtype)

        def theirs(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return a, functools.partial(sdpa, causal=True), theirs

    def alibi() -> tuple:
        a = gpu_arrays(backend, "alibi", length, dtype)
        slopes = torch.asarray(np.asarray(relattn.alibi_slopes(GPU_HEADS), dtype=np.float32),
                               device=a["q"].device)  # fmt: skip
        flex = native.torch_flex_attention(a["q"], a["k"], a["v"], slopes=slopes, causal=True)
        return a, functools.partial(sdpa, relative_bias=a["relative_bias"], causal=True), flex

    def t5() -> tuple:
        a = gpu_arrays(backend, "t5", length, dtype)
        values = a["relative_bias"]
        flex = native.torch_flex_attention(a["q"], a["k"], a["v"], values=values, scale=1.0)
        return a, functools.partial(sdpa, relative_bias=values, scale=1.0), flex

    def segments() -> tuple:
        a = gpu_arrays(backend, "segments", length, dtype)
        ids = a["segment_ids"]
        flex = native.torch_flex_attention(a["q"], a["k"], a["v"], segments=ids[:, 0],
                                           causal=True)  # fmt: skip
        return a, functools.partial(sdpa, segment_ids=ids, causal=True), flex

    def pair(make: Callable[[], tuple], backward: bool) -> Pair:
        a, ours, theirs = make()
        q, k, v = a["q"], a["k"], a["v"]
        if backward:
            return Pair(_torch_backward(ours, q, k, v), _torch_backward(theirs, q, k, v))
        return Pair(functools.partial(ours, q, k, v), functools.partial(theirs, q, k, v))

    flex = "FlexAttention (torch.compile, block mask made once)"
    for scheme, baseline, make, target in (
        ("causal", "SDPA is_causal (flash in bf16)", causal, 1.1),
        ("ALiBi", flex, alibi, 1.0),
        ("T5 bias", flex, t5, 1.0),
        ("4 packed documents, causal", flex, segments, 1.0),
    ):
        for backward in (False, True):
            what = f"{scheme} {'fwd+bwd' if backward else 'fwd'}"
            yield what, baseline, functools.partial(pair, make, backward), target, None

    authors = "the authors' rel_shift code"
    for backward in (False, True):
        transformer_xl = functools.partial(
            _transformer_xl_pair, backend, length, dtype, native.torch_relative_attention,
            backward=backward,
        )  # fmt: skip
        what = f"Transformer-XL causal {'fwd+bwd' if backward else 'fwd'}"
        yield what, authors, transformer_xl, 1.0, 0.1
    yield from relative_kernel_cases(backend, length, dtype)


def relative_kernel_cases(backend: Target, length: int, dtype: str):
    """relattn's relative-position kernel (the plan's path for Transformer-XL and DeBERTa
    on a GPU: Triton on PyTorch, Pallas on JAX) against the floors: the block fold it
    replaces (compiled where the plan would compile it), FlexAttention's ALiBi on PyTorch
    or cuDNN's plain causal kernel on JAX (a relative term's cost over the simplest bias's:
    stretch targets 2 and 1.5), and DeBERTa's c2p + p2c against HF's eager gathers written
    natively (``native.*_deberta_attention``), time <= 1, memory <= 0.1."""
    kernel = "Transformer-XL causal fwd, relattn's kernel"
    fold = "the block fold (relattn.config.path='fold')"
    floor, floor_target = (
        ("FlexAttention ALiBi", 2.0) if backend.is_torch
        else ("jax.nn.dot_product_attention (cudnn) causal", 1.5)
    )  # fmt: skip
    for what, baseline, make, targets in (
        (kernel, fold, _kernel_over_fold_pair, (1.0, None)),
        (kernel, floor, _kernel_over_alibi_pair, (floor_target, None)),
        ("DeBERTa c2p+p2c fwd", "HF's eager c2p/p2c gathers written natively", _deberta_pair,
         (1.0, 0.1)),
    ):  # fmt: skip
        yield what, baseline, functools.partial(make, backend, length, dtype), *targets


def _transformer_xl_pair(backend: Target, length: int, dtype: str, theirs: Any, *,
                         backward: bool = False) -> Pair:  # fmt: skip
    """Causal Transformer-XL attention: relattn's call against ``theirs(q, k, v, table, u,
    v)`` (the same terms written natively), on the GPU case's arrays; ``backward``: each
    with its backward pass (PyTorch)."""
    a = gpu_arrays(backend, "transformer-xl", length, dtype)
    table, u, w = a["position_table"], a["content_bias"], a["position_bias"]
    ours = functools.partial(_transformer_xl, table=table, u=u, w=w)
    native_call = functools.partial(_native_transformer_xl, theirs, table=table, u=u, w=w)
    q, k, v = a["q"], a["k"], a["v"]
    if backward:
        return Pair(_torch_backward(ours, q, k, v), _torch_backward(native_call, q, k, v))
    return Pair(functools.partial(ours, q, k, v), functools.partial(native_call, q, k, v))


def _transformer_xl(q: Any, k: Any, v: Any, *, table: Any, u: Any, w: Any) -> Any:
    return relattn.relative_attention(q, k, v, table, content_bias=u, position_bias=w,
                                      causal=True)  # fmt: skip


def _native_transformer_xl(theirs: Any, q: Any, k: Any, v: Any, *, table: Any, u: Any,
                           w: Any) -> Any:  # fmt: skip
    return theirs(q, k, v, table, u, w)


def _forced(fn: Callable[..., Any], path: str, backend: Target) -> Callable[..., Any]:
    """``fn`` run with ``relattn.config.path`` forced to ``path`` (JAX: traced under it, in
    one ``jax.jit``)."""

    def call(*args: Any) -> Any:
        with relattn.config.override(path=path):
            return fn(*args)

    return backend.default_jit(call)


def _kernel_name(backend: Target) -> str:
    return "triton" if backend.is_torch else "pallas"


def _kernel_case(backend: Target, length: int, dtype: str) -> tuple[tuple, Any, Any]:
    """The Transformer-XL case's ``(q, k, v)``, relattn's causal call on them (the table
    and biases bound) and that call on relattn's kernel (forced)."""
    a = gpu_arrays(backend, "transformer-xl", length, dtype)
    call = functools.partial(_transformer_xl, table=a["position_table"],
                             u=a["content_bias"], w=a["position_bias"])  # fmt: skip
    return (a["q"], a["k"], a["v"]), call, _forced(call, _kernel_name(backend), backend)


def _kernel_over_fold_pair(backend: Target, length: int, dtype: str) -> Pair:
    """Causal Transformer-XL on relattn's kernel against the block fold (forced)."""
    qkv, call, ours = _kernel_case(backend, length, dtype)
    theirs = _forced(call, "fold", backend)
    return _pair_of(backend, ours, theirs, qkv, qkv)


def _pair_of(backend: Target, ours: Any, theirs: Any, ours_args: tuple,
             theirs_args: tuple) -> Pair:  # fmt: skip
    """A :class:`Pair` of two calls; on JAX with their compiled programs' bytes."""
    if backend.is_jax:
        return Pair(functools.partial(ours, *ours_args), functools.partial(theirs, *theirs_args),
                    functools.partial(_jax_program_bytes, ours, *ours_args),
                    functools.partial(_jax_program_bytes, theirs, *theirs_args))  # fmt: skip
    return Pair(functools.partial(ours, *ours_args), functools.partial(theirs, *theirs_args))


def _kernel_over_alibi_pair(backend: Target, length: int, dtype: str) -> Pair:
    """Causal Transformer-XL on relattn's kernel against the simplest fast causal call of
    the library: FlexAttention's ALiBi (PyTorch), cuDNN's plain causal kernel (JAX)."""
    qkv, _, ours = _kernel_case(backend, length, dtype)
    if backend.is_torch:
        import torch

        slopes = torch.asarray(np.asarray(relattn.alibi_slopes(GPU_HEADS), dtype=np.float32),
                               device=qkv[0].device)  # fmt: skip
        flex = native.torch_flex_attention(*qkv, slopes=slopes, causal=True)
        return Pair(functools.partial(ours, *qkv), functools.partial(flex, *qkv), same=False)
    import jax

    theirs = jax.jit(functools.partial(native.jax_attention, causal=True,
                                       implementation="cudnn"))  # fmt: skip
    return replace(_pair_of(backend, ours, theirs, qkv, qkv), same=False)


def _deberta_pair(backend: Target, length: int, dtype: str) -> Pair:
    """DeBERTa's content-to-position and position-to-content terms (full layout, one table
    row per distance, ``scale = 1/√(3d)``): relattn against HF's eager gathers written in
    the library (``native.<library>_deberta_attention``)."""
    a = gpu_arrays(backend, "deberta", length, dtype)
    scale = (3 * a["q"].shape[-1]) ** -0.5
    qkv = (a["q"], a["k"], a["v"])
    tables = (a["position_table"], a["query_position_table"])

    def ours(q: Any, k: Any, v: Any, key_table: Any, query_table: Any) -> Any:
        return relattn.relative_attention(q, k, v, key_table, query_position_table=query_table,
                                          scale=scale)  # fmt: skip

    theirs = native.native("deberta_attention", backend, scale=scale)
    return _pair_of(backend, backend.default_jit(ours), theirs, (*qkv, *tables),
                    (*qkv, *tables))  # fmt: skip


def _jax_program_bytes(jitted: Callable[..., Any], *args: Any) -> int:
    """Temporary and output bytes of ``jitted``'s compiled program (XLA's static plan:
    JAX keeps one peak per process, which cannot be reset between the two sides)."""
    analysis = jitted.lower(*args).compile().memory_analysis()
    if analysis is None:
        raise LookupError("this JAX backend gives no memory analysis")
    return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)


def jax_gpu_cases(backend: Target, length: int, dtype: str):
    """Causal attention under ``jax.jit``: relattn against ``jax.nn.dot_product_attention``
    with ``implementation="cudnn"`` (16-bit floats only) and ``"xla"``."""
    import jax

    def pair(implementation: str) -> Pair:
        a = gpu_arrays(backend, "causal", length, dtype)
        qkv = (a["q"], a["k"], a["v"])
        ours = jax.jit(functools.partial(relattn.scaled_dot_product_attention, causal=True))
        theirs = jax.jit(functools.partial(native.jax_attention, causal=True,
                                           implementation=implementation))  # fmt: skip
        return Pair(
            functools.partial(ours, *qkv), functools.partial(theirs, *qkv),
            functools.partial(_jax_program_bytes, ours, *qkv),
            functools.partial(_jax_program_bytes, theirs, *qkv),
        )  # fmt: skip

    for implementation, target in (("cudnn", 1.5), ("xla", 1.0)):
        baseline = f"jax.nn.dot_product_attention ({implementation})"
        yield "causal fwd", baseline, functools.partial(pair, implementation), target, None
    yield from relative_kernel_cases(backend, length, dtype)


def cupy_gpu_cases(backend: Target, length: int, dtype: str):
    """Causal Transformer-XL: relattn against the same written directly in CuPy (the
    NumPy pad-and-reshape code on ``cupy``, ``native.numpy_relative_attention``)."""

    theirs = native.native("relative_attention", backend)
    pair = functools.partial(_transformer_xl_pair, backend, length, dtype, theirs)
    yield "Transformer-XL causal fwd", "the same written in CuPy", pair, 1.0, 0.1


#: library -> its GPU cases (NumPy: CuPy's, for trying the rows on a CPU).
GPU_CASES = {"torch": torch_gpu_cases, "jax": jax_gpu_cases, "cupy": cupy_gpu_cases,
             "numpy": cupy_gpu_cases}  # fmt: skip


def _release(backend: Target) -> None:
    """Give the device's cached blocks back after a case (the next may need them).

    After a kernel's fault (CUDA's errors are sticky: every later call in the process
    raises it again) there is nothing to give back: the error is left to the next
    case, whose row reports it, so that the rows measured so far are still printed."""
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        if backend.library == "torch" and backend.gpu:
            import torch

            torch.cuda.empty_cache()
        elif backend.library == "cupy":
            backend.lib.get_default_memory_pool().free_all_blocks()


def _error(e: BaseException) -> str:
    """The first line of an error, short, without the table's ``|``."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".replace("|", "/")[:140]


def _as_host_tuple(out: Any, backend: Target) -> list[np.ndarray]:
    outs = out if isinstance(out, tuple) else (out,)
    return [np.asarray(backend.to_host(x), dtype=np.float32) for x in outs]


def gpu_case(name: str, what: str, baseline: str, make: Callable[[], Pair], targets: tuple,
             size: str, dtype: str, repeats: int, checked: bool) -> list[Row]:  # fmt: skip
    """The rows of one case: time (relattn / baseline), and peak device memory where the
    library counts it; ``size`` names the case's size in its rows (``"L=4096"``, or ``""``
    where ``what`` does), ``checked`` whether the targets are checked or the ratios only
    reported. A side that fails (out of memory, a kernel that does not take the dtype)
    gives a row saying so instead of a ratio."""
    backend = common.get_backend(name)
    time_target, memory_target = targets
    at = f"{size} {dtype}" if size else dtype
    title = f"gpu: {what}, {at}: relattn / {baseline}"
    target = f"<= {time_target:g}"
    try:
        pair = make()
        ours_out = _as_host_tuple(common.ready(backend, pair.ours()), backend)
    except Exception as e:  # any library's error: the row reports it
        _release(backend)
        return [Row(title, name, f"failed: {_error(e)}", "–", math.nan, target, None)]
    try:
        theirs_out = _as_host_tuple(common.ready(backend, pair.theirs()), backend)
    except Exception as e:
        _release(backend)
        alone = statistics.median(common.timed(pair.ours, backend) for _ in range(repeats))
        return [Row(title, name, ms(alone), f"failed: {_error(e)}", math.nan, target, None)]
    tolerance = GPU_TOLERANCE.get(dtype, 1e-2)
    pairs = zip(ours_out, theirs_out, strict=True) if pair.same else ()
    worst = max((float(np.max(np.abs(a - b), initial=0.0)) for a, b in pairs), default=0.0)
    del ours_out, theirs_out
    if not worst <= tolerance:
        _release(backend)
        return [Row(title, name, f"differs: max |Δ| = {worst:.3g} > {tolerance:g}", "–",
                    math.nan, target, False)]  # fmt: skip
    memory = None
    try:
        if pair.ours_bytes is not None and pair.theirs_bytes is not None:
            memory = (pair.ours_bytes(), pair.theirs_bytes())
        else:
            memory = (common.peak_device_bytes(backend, pair.ours),
                      common.peak_device_bytes(backend, pair.theirs))  # fmt: skip
    except (NotImplementedError, LookupError):
        memory = None  # a CPU, or a library that counts no device memory
    ratio, a, b = side_by_side(pair.ours, pair.theirs, backend, repeats)
    ok = ratio <= time_target if checked else None
    rows = [Row(title, name, ms(a), ms(b), ratio, target, ok)]
    if memory is not None:
        mine, theirs = memory
        share = mine / theirs if theirs else math.nan
        mib = 1 << 20
        rows.append(
            Row(f"gpu: {what}, {at}: peak memory relattn / {baseline}", name,
                f"{mine / mib:.0f} MiB", f"{theirs / mib:.0f} MiB", share,
                f"<= {memory_target:g}" if memory_target else "report",
                share <= memory_target if memory_target and checked else None)
        )  # fmt: skip
    del pair
    _release(backend)
    return rows


def gpu(names: list[str], repeats: int, lengths: tuple[int, ...] = GPU_LENGTHS,
        dtypes: tuple[str, ...] = GPU_DTYPES) -> list[Row]:  # fmt: skip
    """relattn against each library's own fastest code on a GPU (SPEC §5's GPU targets).

    B = 2, H = 16, d = 64, self-attention of each length, each dtype: time (median
    of ``repeats``, alternating) and peak device memory (PyTorch: the caching
    allocator's peak, reset before; CuPy: its pool's growth; JAX: the compiled
    programs' temporary and output bytes). PyTorch (``torch_cuda``): causal against
    SDPA's ``is_causal`` (flash in bf16); ALiBi, a T5 bias and 4 packed documents
    against FlexAttention written directly, forward and forward+backward; causal
    Transformer-XL against the authors' ``rel_shift`` code. JAX (``jax_gpu``):
    causal against ``jax.nn.dot_product_attention``, cuDNN and XLA. CuPy: causal
    Transformer-XL against the same written in CuPy. The targets are checked for
    bf16 at L = 4096 and 16 384; the other rows are reported. ``names`` may name
    CPU targets too, to try the rows where there is no GPU.
    """

    def cases(backend: Target, dtype: str):
        for length in lengths:
            checked = dtype == GPU_CHECKED[0] and length in GPU_CHECKED[1]
            for what, baseline, make, *targets in GPU_CASES[backend.library](
                backend, length, dtype
            ):
                yield what, baseline, make, tuple(targets), f"L={length}", checked

    return gpu_rows(names, dtypes, repeats, cases)


def gpu_rows(names: list[str], dtypes: tuple[str, ...], repeats: int,
             cases: Callable[[Target, str], Any]) -> list[Row]:  # fmt: skip
    """:func:`gpu_case`'s rows of ``cases(backend, dtype)`` (each ``(what, baseline, make,
    targets, size, checked)``) on each target of ``names`` and each dtype it has, every row
    printed as it is measured: a run cut short keeps its rows."""
    rows = []
    for name in names:
        backend = common.get_backend(name)
        for dtype in dtypes:
            if not backend.has_dtype(dtype):
                print(f"gpu: {name} has no {dtype}: its rows are skipped", file=sys.stderr)
                continue
            for what, baseline, make, targets, size, checked in cases(backend, dtype):
                at = f"{size} {dtype}" if size else dtype
                print(f"gpu: {name} {what}, {at} / {baseline}", file=sys.stderr, flush=True)
                measured = gpu_case(
                    name, what, baseline, make, targets, size, dtype, repeats, checked
                )
                for row in measured:
                    print(table([row]).splitlines()[-1], file=sys.stderr, flush=True)
                rows += measured
    return rows


# -- vision: SAM's decomposed relative positions and Swin's windows ----------------------

#: The rows of ``--only vision`` (and the gpu group's vision rows), by case of
#: ``benchmarks/vision.py``, filled by :func:`_vision_what` from the case's arrays.
VISION_WHAT = {
    "sam": "decomposed rel-pos (SAM), {h}×{w} grid (L={length}), B={b} H={heads} d={d}: "
           "relattn / segment-anything written natively",
    "swin": "Swin windows {window}×{window}, {grid}×{grid} grid, shifted, B={b} H={heads} "
            "d={d}: relattn / Swin written natively",
}  # fmt: skip
#: The GPU rows' batch of Swin images (ImageNet training: 64 to 128 per GPU).
VISION_GPU_SWIN_BATCH = 64


def _vision_what(case: str, arrays: dict) -> str:
    """The row of ``case`` (:data:`VISION_WHAT`) with the sizes of ``arrays``."""
    batch, heads, length, d = arrays["q"].shape
    if case == "sam":
        h, w = arrays["rel_pos_h"].shape[0] // 2 + 1, arrays["rel_pos_w"].shape[0] // 2 + 1
        return VISION_WHAT[case].format(h=h, w=w, length=length, b=batch, heads=heads, d=d)
    nw = arrays["window_bias"].shape[0]
    window = math.isqrt(length)
    return VISION_WHAT[case].format(window=window, grid=math.isqrt(nw) * window,
                                    b=batch // nw, heads=heads, d=d)  # fmt: skip


def _proc_status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise LookupError(f"/proc/self/status has no {key}")


def rss_peak_bytes(fn: Callable[[], Any], backend: Target) -> int:
    """Growth of the process's resident high-water mark over one call of ``fn`` (Linux):
    freed heap given back (``malloc_trim``), ``VmHWM`` reset (``/proc/self/clear_refs``),
    then ``VmHWM`` after the call over ``VmRSS`` before. For libraries that tracemalloc
    does not see (PyTorch's CPU buffers); ``LookupError`` where the kernel offers neither."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        before = _proc_status_kib("VmRSS")
    except OSError as e:
        raise LookupError(f"no resident high-water mark to reset here ({e})") from None
    common.ready(backend, fn())
    return max(_proc_status_kib("VmHWM") - before, 0) * 1024


def traced_peak_bytes(fn: Callable[[], Any], backend: Target) -> int:
    """tracemalloc's peak over one call of ``fn`` (NumPy's buffers are traced)."""
    import tracemalloc

    tracemalloc.start()
    try:
        common.ready(backend, fn())
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def vision_memory(backend: Target, sides: tuple) -> tuple[int, int, str]:
    """``(relattn's bytes, the native code's, how)`` of one call each: NumPy's tracemalloc
    peak, PyTorch CPU's resident high-water growth, JAX's compiled programs' temporary and
    output bytes. ``sides`` is :func:`benchmarks.vision.functions`'s result."""
    import gc

    ours_fn, ours_args, theirs_fn, theirs_args = sides
    if backend.is_jax:
        return (_jax_program_bytes(ours_fn, *ours_args),
                _jax_program_bytes(theirs_fn, *theirs_args), "XLA temp + output")  # fmt: skip
    measure, how = ((traced_peak_bytes, "tracemalloc") if backend.library == "numpy"
                    else (rss_peak_bytes, "RSS high-water growth"))  # fmt: skip
    gc.collect()
    mine = measure(functools.partial(ours_fn, *ours_args), backend)
    gc.collect()
    theirs = measure(functools.partial(theirs_fn, *theirs_args), backend)
    return mine, theirs, how


def vision_rows(names: list[str], repeats: int, quick: bool, memory: bool = True) -> list[Row]:
    """SAM's decomposed relative positions at a 64×64 grid and Swin-T's shifted 7×7 windows
    of a 56×56 grid (``benchmarks/vision.py``), relattn against the same written natively
    (``native.numpy_sam_attention``, ``native.numpy_swin_window_attention`` and their
    PyTorch and JAX twins): time (<= 1.0) and, unless ``memory`` is off, host peak memory
    (<= 1.0; :func:`vision_memory`). SAM on a CPU with ``vision.SAM_CPU_HEADS`` heads
    (``quick``: ``vision.SAM_QUICK_HEADS``) and half the repeats (at least 3): seconds
    per call."""
    from benchmarks import vision

    rows = []
    for name in names:
        backend = common.get_backend(name)
        label = f"{name}-jit" if name == "jax" else name
        vision.check(name)
        for case in vision.CASES:
            arrays = vision.inputs(case, backend, quick)
            sides = vision.functions(case, backend, arrays)
            ours = functools.partial(sides[0], *sides[1])
            theirs = functools.partial(sides[2], *sides[3])
            what = _vision_what(case, arrays)
            print(f"vision: {label} {what}", file=sys.stderr, flush=True)
            n = max(3, repeats // 2) if case == "sam" else repeats
            ratio, a, b = side_by_side(ours, theirs, backend, n)
            rows.append(Row(what, label, ms(a), ms(b), ratio, "<= 1.0", ratio <= 1.0))
            if memory:
                try:
                    mine, their, how = vision_memory(backend, sides)
                except LookupError as e:
                    print(f"vision: no memory row for {label}: {e}", file=sys.stderr)
                else:
                    share = mine / their if their else math.nan
                    short = what.split(":")[0]
                    mib = 1 << 20
                    rows.append(Row(f"{short}: peak memory ({how}) relattn / native", label,
                                    f"{mine / mib:.1f} MiB", f"{their / mib:.1f} MiB", share,
                                    "<= 1.0", share <= 1.0))  # fmt: skip
            del arrays, sides, ours, theirs
    return rows


def vision_gpu_cases(backend: Target, dtype: str, sizes: dict | None = None):
    """``(what, baseline, make, time target, memory target)`` of the vision cases
    on a GPU target: SAM ViT-B's attention (B = 1, H = 12, d = 64, 64×64 grid) and Swin-T's
    shifted windows (:data:`VISION_GPU_SWIN_BATCH` images), relattn against the same
    written natively in the target's library (CuPy: the NumPy code on ``cupy``), floats in
    ``dtype``; memory from the allocator (PyTorch, CuPy) or the compiled programs (JAX).
    ``sizes``: keywords of ``vision.sam_inputs`` and ``vision.swin_inputs`` by case (the
    tests' small ones)."""
    from benchmarks import vision

    sizes = sizes or {"sam": {}, "swin": {"batch": VISION_GPU_SWIN_BATCH}}
    makers = {"sam": vision.sam_inputs, "swin": vision.swin_inputs}

    def pair(case: str) -> Pair:
        host = makers[case](**sizes[case])
        arrays = {n: backend.asarray(a, dtype if a.dtype.kind == "f" else None)
                  for n, a in host.items()}  # fmt: skip
        sides = vision.functions(case, backend, arrays)
        ours = functools.partial(sides[0], *sides[1])
        theirs = functools.partial(sides[2], *sides[3])
        if backend.is_jax:
            return Pair(ours, theirs, functools.partial(_jax_program_bytes, sides[0], *sides[1]),
                        functools.partial(_jax_program_bytes, sides[2], *sides[3]))  # fmt: skip
        return Pair(ours, theirs)

    for case in vision.CASES:
        host = makers[case](**sizes[case])
        what = _vision_what(case, host).split(":")[0]
        baseline = VISION_WHAT[case].split(": relattn / ")[1]
        yield what, baseline, functools.partial(pair, case), 1.0, 1.0


def vision_gpu(names: list[str], repeats: int, dtypes: tuple[str, ...] = GPU_DTYPES,
               sizes: dict | None = None) -> list[Row]:  # fmt: skip
    """The vision cases' GPU rows (:func:`vision_gpu_cases`) on each target of ``names``,
    each dtype, as :func:`gpu_case` measures them; the targets (<= 1.0 in time and memory)
    checked for bf16, the other rows reported. ``names`` may name CPU targets, to try the
    rows where there is no GPU."""

    def cases(backend: Target, dtype: str):
        # each case names its sizes: the rows say the dtype alone
        for what, baseline, make, *targets in vision_gpu_cases(backend, dtype, sizes):
            yield what, baseline, make, tuple(targets), "", dtype == GPU_CHECKED[0]

    return gpu_rows(names, dtypes, repeats, cases)


def table(rows: list[Row]) -> str:
    head = ["measurement", "backend", "relattn", "baseline", "value", "target", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def environment() -> str:
    import importlib
    import platform

    libs = {"numpy": np}
    for mod in ("torch", "jax"):
        with contextlib.suppress(ImportError):
            libs[mod] = importlib.import_module(mod)
    versions = ", ".join(f"{mod} {lib.__version__}" for mod, lib in libs.items())
    threads = f"torch threads {libs['torch'].get_num_threads()}" if "torch" in libs else ""
    return f"{platform.processor() or platform.machine()}, {versions}; {threads}"


#: The groups of rows ``--only`` selects.
GROUPS = ("speed", "memory", "dispatch", "decode", "plans", "vision", "gpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 9")
    parser.add_argument(
        "--backend",
        action="append",
        choices=(*CPU, *GPU_TARGETS),
        help="restrict to these backends (repeatable); default: the CPU ones, and for "
        "the gpu group every GPU target found",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the Shaw memory runs")
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        help="also write the table, with the command and environment, to PATH "
        "(the README's and the docs' Performance table: asv_bench/compare-results.md)",
    )
    parser.add_argument(
        "--warm-malloc",
        action="store_true",
        help="rerun with glibc keeping freed memory (no page faults on fresh temporaries)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=GROUPS,
        help="run only these groups of rows (repeatable); default: all",
    )
    parser.add_argument(
        "--gpu-length",
        action="append",
        type=int,
        help=f"the gpu group's lengths (repeatable); default: {', '.join(map(str, GPU_LENGTHS))}",
    )
    parser.add_argument(
        "--gpu-dtype",
        action="append",
        choices=("bfloat16", "float16", "float32"),
        help=f"the gpu group's dtypes (repeatable); default: {', '.join(GPU_DTYPES)}",
    )
    args = parser.parse_args(argv)
    if args.warm_malloc and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc serves large arrays with fresh mmap()s, zero-filled page by page on first
        # touch; on a VM that can be most of a CPU attention's time. Keep memory instead.
        env = {**os.environ, **WARM_MALLOC}
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)
    repeats = 3 if args.quick else 9

    def available(candidates: tuple[str, ...] | list[str]) -> list[str]:
        found = []
        for name in candidates:
            try:
                common.get_backend(name)
            except NotImplementedError as e:
                print(f"skipping {name}: {e}", file=sys.stderr)
            else:
                found.append(name)
        return found

    groups = set(args.only or GROUPS)
    names = available([n for n in args.backend or CPU if n in CPU])
    wanted_gpus = [n for n in args.backend or GPU_TARGETS if n in GPU_TARGETS]
    gpus = available(wanted_gpus) if groups & {"gpu", "plans"} and wanted_gpus else []

    malloc = "; glibc malloc kept warm" if "MALLOC_MMAP_THRESHOLD_" in os.environ else ""
    print(f"relattn {relattn.__version__}; {environment()}; repeats {repeats}{malloc}\n")
    rows = []
    if "speed" in groups:
        rows += against_native(names, repeats)
        rows += other_functions(names, repeats)
        rows += position_schemes(names, repeats)
        rows += against_products(names, repeats)
    if "memory" in groups and not args.no_memory:
        if args.backend is None or "numpy" in args.backend:
            rows += shaw_memory(2048)
    if "dispatch" in groups:
        rows += dispatch(names, args.quick)
    if "decode" in groups:
        rows += decode(names, repeats)
    if "plans" in groups:
        # The GPU targets only where named: the CPU ones are the default.
        rows += plans(names + [n for n in gpus if args.backend], repeats, args.quick)
    if "vision" in groups:
        rows += vision_rows(names, repeats, args.quick, memory=not args.no_memory)
    if "gpu" in groups:
        if "torch_cuda" in gpus:
            rows += cuda_vs_sdpa(repeats)
        if gpus:
            lengths = tuple(args.gpu_length or GPU_LENGTHS)
            rows += gpu(gpus, repeats, lengths, tuple(args.gpu_dtype or GPU_DTYPES))
            rows += vision_gpu(gpus, repeats, tuple(args.gpu_dtype or GPU_DTYPES))
        else:
            print("gpu rows skipped: no GPU target found\n")
    print(table(rows))
    missed = [r for r in rows if r.ok is False]
    summary = f"{len(missed)} of {sum(r.ok is not None for r in rows)} targets missed"
    print(f"\n{summary}")
    if args.markdown:
        command = " ".join(["python asv_bench/compare.py", *(argv or sys.argv[1:])])
        when = time.strftime("%Y-%m-%d")
        Path(args.markdown).write_text(
            f"Generated by `{command}` on {when}: relattn {relattn.__version__}; "
            f"{environment()}; median of {repeats}{malloc}.\n\n{table(rows)}\n\n{summary}.\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
