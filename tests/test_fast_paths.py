"""Every fast path against the generic array-API path it replaces.

- ``shift(..., fill=-inf)``, the causal layout as a masked bias, against the
  zero-filled shift and the causal mask, on every backend;
- a backend's fused attention kernel where it has one (torch
  ``scaled_dot_product_attention``; cuDNN through ``jax.nn.dot_product_attention``
  on a GPU) against ``attend_generic``: values, dtype, device and gradients,
  with and without bias, causal, broadcast leading dimensions;
- the JAX adapter, run with ``implementation="xla"`` so that it is checked on
  the CPU too;
- the public functions with the fused kernel switched off, so that both ways
  through ``relative_attention`` and ``scaled_dot_product_attention`` are
  compared end to end. The fast call must have run a kernel (``kernel_runs``):
  where the backend offers none for the inputs the test skips, with the reason,
  rather than compare the generic path with itself. On JAX, whose kernel is
  cuDNN's (a GPU, half precision), the offer is JAX's XLA implementation through
  relattn's adapter, so that the kernel route is compared on every device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys

import numpy as np
import pytest

import relattn
import relattn.core
from relattn.backends import backend_for
from relattn.core import attend_generic
from relattn.shift import shift
from relattn.testing import tolerance

SHAPES = [(1, 1), (1, 6), (3, 3), (3, 7), (6, 3), (5, 5), (8, 13)]


@pytest.mark.parametrize(("lq", "lk"), SHAPES)
def test_shift_filled_with_minus_inf_is_the_masked_shift(backend, lq, lk, rng):
    """``fill=-inf`` (relative_attention's causal bias) against the zero-filled shift."""
    x = rng.normal(size=(2, 3, lq, lk))
    xp = backend.xp
    filled = backend.to_host(shift(backend.asarray(x), lk, xp, fill=-math.inf))
    plain = backend.to_host(shift(backend.asarray(x), lk, xp))
    keep = backend.to_host(relattn.causal_mask(lq, lk, xp=backend.lib, device=backend.device))
    assert filled.shape == plain.shape == (2, 3, lq, lk)
    np.testing.assert_array_equal(filled, np.where(keep, plain, -np.inf))


@pytest.mark.parametrize(("lq", "lk"), [(3, 7), (5, 5)])
def test_fill_does_not_touch_the_full_layout(backend, lq, lk, rng):
    x = backend.asarray(rng.normal(size=(2, lq, lq + lk - 1)))
    xp = backend.xp
    np.testing.assert_array_equal(
        backend.to_host(shift(x, lk, xp, fill=-math.inf)), backend.to_host(shift(x, lk, xp))
    )


# --------------------------------------------------------------------------------------------
# Fused attention kernels
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fused_backend(backend):
    """The backends whose Backend record has a fused attention kernel."""
    if backend_for(backend.xp).fused_attention is None:
        pytest.skip(f"{backend.name} has no fused attention kernel: the generic path is all")
    return backend


def _attention_inputs(rng, case, dv=6):
    """q, k, v (B=2, H=3), bias and mask for one named case; row 1 of batch 0 fully masked
    where there is a mask; Lq = Lk in the causal case."""
    lq, lk, d = (6, 6, 8) if "causal" in case else (5, 7, 8)
    q, k = rng.normal(size=(2, 3, lq, d)), rng.normal(size=(2, 3, lk, d))
    v = rng.normal(size=(2, 3, lk, dv))
    bias = rng.normal(size=(lq, lk)) if "bias" in case else None
    mask = None
    if "mask" in case:
        mask = rng.random((2, 1, lq, lk)) < 0.6
        mask[..., 0] = True
        mask[0, 0, 1] = False
    if "causal" in case:
        mask = np.tril(np.ones((lq, lk), dtype=bool))
    if "broadcast" in case:
        k, v = k[:1], v[:1]
    return q, k, v, bias, mask


CASES = ["plain", "bias", "bias+mask", "bias+mask+broadcast"]
KERNEL_CASES = ["plain", "bias", "causal", "bias+broadcast"]


def _to_backend(backend, dtype, arrays):
    return [
        None if a is None else backend.asarray(a, dtype if a.dtype.kind == "f" else None)
        for a in arrays
    ]


def _kernel(q, k, v, bias, causal, xp):
    kernel = relattn.core.fused_kernel(q, k, v, xp)
    if kernel is None:
        pytest.skip("the backend offers no kernel for these inputs here (cuDNN: GPU, half)")
    return kernel(bias=bias, mask=None, causal=causal, scale=0.4)


@pytest.mark.parametrize("case", KERNEL_CASES)
@pytest.mark.parametrize("fdtype", ["float16", "bfloat16", "float32", "float64"])
def test_fused_kernel_equals_generic(fused_backend, fdtype, case, rng):
    """The kernel against the generic path; ``causal`` is its own flag (the causal mask)."""
    q, k, v, bias, mask = _to_backend(fused_backend, fdtype, _attention_inputs(rng, case))
    fast = _kernel(q, k, v, bias, mask is not None, fused_backend.xp)
    plain = attend_generic(q, k, v, bias, mask, 0.4, fused_backend.xp)
    assert fast.dtype == plain.dtype
    assert fast.shape == plain.shape
    assert fused_backend.is_array(fast)
    got, want = fused_backend.to_host(fast), fused_backend.to_host(plain)
    np.testing.assert_allclose(got, want, **tolerance(fdtype))


@pytest.mark.parametrize("case", KERNEL_CASES)
def test_fused_kernel_gradients_equal_generic(torch_backend, case, rng):
    arrays = _to_backend(torch_backend, "float64", _attention_inputs(rng, case))
    mask = arrays[4]
    grads = []
    for generic in (False, True):
        leaves = [None if a is None else a.detach().clone().requires_grad_() for a in arrays[:4]]
        q, k, v, bias = leaves
        if generic:
            out = attend_generic(q, k, v, bias, mask, 0.4, torch_backend.xp)
        else:
            out = _kernel(q, k, v, bias, mask is not None, torch_backend.xp)
        out.pow(2).sum().backward()
        grads.append([None if a is None else torch_backend.to_host(a.grad) for a in leaves])
    for fast, plain in zip(*grads, strict=True):
        if plain is not None:
            np.testing.assert_allclose(fast, plain, rtol=1e-10, atol=1e-12)
            assert not np.isnan(fast).any()


@pytest.mark.parametrize("case", CASES)
def test_jax_dot_product_attention_adapter_equals_generic(jax_backend, case, rng):
    """The cuDNN route's adapter, run with JAX's XLA implementation on whatever device."""
    from relattn.backends._jax import dot_product_attention

    q, k, v, bias, mask = _to_backend(jax_backend, "float32", _attention_inputs(rng, case, dv=8))
    fast = dot_product_attention(q, k, v, bias=bias, mask=mask, scale=0.4, implementation="xla")
    if "broadcast" in case:
        assert fast is None  # JAX wants one batch size: relattn's generic path runs
        return
    plain = attend_generic(q, k, v, bias, mask, 0.4, jax_backend.xp)
    jax_backend.assert_close(fast, jax_backend.to_host(plain), "float32")


def test_jax_dot_product_attention_adapter_turns_down_what_does_not_fit(jax_backend, rng):
    from relattn.backends._jax import dot_product_attention

    def call(*shapes):
        q, k, v = (jax_backend.asarray(rng.normal(size=s), "float32") for s in shapes)
        return dot_product_attention(q, k, v, bias=None, mask=None, scale=1.0)

    assert call((5, 8), (7, 8), (7, 8)) is None  # not (B, H, L, d)
    assert call((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)) is None  # d_v != d


@pytest.fixture
def generic_only(monkeypatch):
    """relattn.core with every backend's fused kernel switched off.

    ``staged=None`` too: a JAX call runs one operation at a time instead of reusing
    the program that ``Backend.staged`` compiled for the same problem and shapes,
    which traced whatever path the fast call took.
    """
    real = relattn.core.backend_for

    def without_fused(xp):
        return dataclasses.replace(real(xp), fused_attention=None, staged=None)

    monkeypatch.setattr(relattn.core, "backend_for", without_fused)
    _forget_plans(monkeypatch)


def _forget_plans(monkeypatch):
    """The plans relattn keeps per call signature (``relattn.plan``), empty for the rest of
    the test and restored after it: a plan chosen with another backend record (the kernel
    on or off) names a path that this record may not have."""
    plan = sys.modules.get("relattn.plan")
    if isinstance(getattr(plan, "_PLANS", None), dict):
        monkeypatch.setattr(plan, "_PLANS", {})


def _jax_xla_offer(q, k, v):
    """JAX's offer with the XLA implementation, on any device and dtype: relattn's adapter
    where ``jax.nn.dot_product_attention`` takes the inputs ((B, H, L, d), one batch and
    head size, ``d_v = d``), as ``_fused_attention`` offers cuDNN on a GPU."""
    from relattn.backends import _jax

    fits = q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]
    if not fits or v.shape[-1] != q.shape[-1]:
        return None
    # Looked up at each call, so that a scratch edit of the adapter reaches the test.
    return lambda **options: _jax.dot_product_attention(q, k, v, **options, implementation="xla")


@pytest.fixture
def kernel_runs(fused_backend, monkeypatch):
    """The options of every fused-kernel call that relattn.core makes in the test, and
    whether the backend offers its kernel for given inputs (``kernel_runs.offers``).

    The backend's record with its offer wrapped to record each call; JAX's offer is its
    XLA implementation (``_jax_xla_offer``), and on JAX the calls run one operation at a
    time (``staged=None``: a compiled program of an earlier test would run no offer, and a
    traced call never takes the kernel under a mask, whose keys it cannot check).
    """
    real = relattn.core.backend_for
    offer = _jax_xla_offer if fused_backend.is_jax else real(fused_backend.xp).fused_attention
    runs = _KernelRuns(offer)

    def spied(q, k, v):
        kernel = offer(q, k, v)
        if kernel is None:
            return None
        return functools.partial(runs.run, kernel)

    def with_spy(xp):
        return dataclasses.replace(real(xp), fused_attention=spied, staged=None)

    monkeypatch.setattr(relattn.core, "backend_for", with_spy)
    _forget_plans(monkeypatch)
    return runs


class _KernelRuns(list):
    def __init__(self, offer):
        super().__init__()
        self.offer = offer

    def offers(self, q, k, v):
        return self.offer(q, k, v) is not None

    def run(self, kernel, **options):
        self.append(options)
        return kernel(**options)


def _fast_then_generic(backend, kernel_runs, request, call, q, k, v):
    """``call()`` through the backend's kernel, then with every kernel off, on the host. Skips
    where the backend offers no kernel for ``q, k, v``; fails where it offers one that the
    fast call did not run (the test would compare the generic path with itself)."""
    if not kernel_runs.offers(q, k, v):
        pytest.skip(f"{backend.name} offers no fused kernel for these inputs: nothing to compare")
    # The plan may pass the kernel over where it is measured slower (JAX's XLA path on a
    # CPU): the fast call forces it, as a user may.
    with relattn.config.override(path="fused"):
        fast = backend.to_host(call())
    assert kernel_runs, "the backend offers a kernel, but the call did not run it"
    request.getfixturevalue("generic_only")
    plain = backend.to_host(call())
    return fast, plain


def _kernel_dtype(backend):
    """float64, but float32 on JAX: ``jax.nn.dot_product_attention`` computes the softmax in
    float32 whatever its inputs' dtype (its XLA implementation included), so its float64
    results hold float32's tolerance only."""
    return "float32" if backend.is_jax else "float64"


def _relative_call(backend, rng, layout, with_mask):
    lq, lk, d = 4, 9, 8
    dv = d if backend.is_jax else 5  # JAX's function wants d_v = d; torch SDPA does not
    width = lk if layout == "causal" else lq + lk - 1
    dtype = _kernel_dtype(backend)
    q = backend.asarray(rng.normal(size=(2, 3, lq, d)), dtype)
    k = backend.asarray(rng.normal(size=(2, 3, lk, d)), dtype)
    v = backend.asarray(rng.normal(size=(2, 3, lk, dv)), dtype)
    table = backend.asarray(rng.normal(size=(3, width, d)), dtype)
    u = backend.asarray(rng.normal(size=(3, 1, d)), dtype)
    pos = backend.asarray(rng.normal(size=(3, 1, d)), dtype)
    mask = None
    if with_mask:
        m = rng.random((2, 1, lq, lk)) < 0.7
        m[0, 0, 2] = False
        mask = backend.asarray(m)

    def call():
        return relattn.relative_attention(
            q, k, v, table, content_bias=u, position_bias=pos, mask=mask
        )

    return call, (q, k, v)


@pytest.mark.parametrize("layout", ["causal", "full"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_relative_attention_fast_equals_generic(
    fused_backend, kernel_runs, layout, with_mask, rng, request
):
    call, qkv = _relative_call(fused_backend, rng, layout, with_mask)
    fast, plain = _fast_then_generic(fused_backend, kernel_runs, request, call, *qkv)
    np.testing.assert_allclose(fast, plain, **tolerance(_kernel_dtype(fused_backend)))


def test_scaled_dot_product_attention_fast_equals_generic(fused_backend, kernel_runs, rng, request):
    dv = 8 if fused_backend.is_jax else 6  # JAX's function wants d_v = d
    inputs = _attention_inputs(rng, "bias+mask", dv=dv)
    dtype = _kernel_dtype(fused_backend)
    q, k, v, bias, mask = _to_backend(fused_backend, dtype, inputs)

    def call():
        return relattn.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)

    fast, plain = _fast_then_generic(fused_backend, kernel_runs, request, call, q, k, v)
    np.testing.assert_allclose(fast, plain, **tolerance(dtype))
    np.testing.assert_array_equal(fast[0, :, 1], 0)


def test_scale_multiplies_queries_like_scores(backend, rng):
    """The generic path scales q before the product: the same as scaling the scores."""
    q, k, v, bias, mask = _to_backend(backend, "float64", _attention_inputs(rng, "bias"))
    got = backend.to_host(attend_generic(q, k, v, bias, mask, 0.25, backend.xp))
    qn, kn, vn = (backend.to_host(a) for a in (q, k, v))
    scores = qn @ np.swapaxes(kn, -1, -2) * 0.25 + backend.to_host(bias)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = weights / weights.sum(-1, keepdims=True) @ vn
    np.testing.assert_allclose(got, want, **tolerance("float64"))


# --------------------------------------------------------------------------------------------
# Small arrays kept between eager calls (relattn._memo)
# --------------------------------------------------------------------------------------------


def test_memo_keeps_eager_small_arrays_only():
    """Kept under its key for an eager call; made anew for a traced one and when large."""
    import array_api_compat.numpy as xp

    from relattn import _memo

    made = []

    def make(n):
        def build():
            made.append(n)
            return xp.zeros((n,))

        return build

    first = _memo.memo(xp, True, ("test", 4), make(4))
    assert _memo.memo(xp, True, ("test", 4), make(4)) is first and made == [4]
    assert _memo.memo(xp, False, ("test", 4), make(4)) is not first and made == [4, 4]
    big = _memo.MAX_ELEMENTS + 1
    assert _memo.memo(xp, True, ("test", big), make(big)) is not _memo.memo(
        xp, True, ("test", big), make(big)
    )
    assert _memo.memo(xp, True, ("test", [1]), make(2)).shape == (2,)  # unhashable key: made
    fill = _memo.constant(xp, True, -math.inf, xp.float32, "cpu")
    assert fill.shape == () and fill.dtype == xp.float32 and float(fill) == -math.inf
    assert _memo.constant(xp, True, -math.inf, xp.float32, "cpu") is fill
    assert _memo.constant(xp, True, -math.inf, xp.float64, "cpu").dtype == xp.float64


def test_eager_jax_calls_compile_once_per_shape(jax_backend, rng):
    """An eager JAX call is jitted whole once per problem and shape (``Backend.staged``),
    the blockwise fold's traced loops included, and equals the NumPy result; a 0-d array
    scale (unhashable) runs one operation at a time."""
    from relattn.backends import _jax

    q, k, v = (rng.normal(size=(2, 5, 4)) for _ in range(3))
    table = rng.normal(size=(5, 4))
    expected = relattn.relative_attention(q, k, v, table, causal=True, block_size=2)
    arrays = [jax_backend.asarray(x) for x in (q, k, v, table)]
    _jax._jitted.cache_clear()
    for _ in range(2):
        out = relattn.relative_attention(*arrays, causal=True, block_size=2)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12, atol=1e-12)
    info = _jax._jitted.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    scale = jax_backend.asarray(np.asarray(0.5))
    out = relattn.relative_attention(*arrays, causal=True, block_size=2, scale=scale)
    want = relattn.relative_attention(q, k, v, table, causal=True, block_size=2, scale=0.5)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-12, atol=1e-12)
    assert _jax._jitted.cache_info().currsize == 1


def test_constants_of_a_traced_call_do_not_outlive_it(jax_backend, rng):
    """A jitted call first, the eager call after it: no tracer was kept for the eager one
    (causal dense path: the memoised causal mask and softmax constants)."""
    import jax

    q, k, v = (jax_backend.asarray(rng.normal(size=(2, 5, 4))) for _ in range(3))
    jitted = jax.jit(lambda q, k, v: relattn.scaled_dot_product_attention(q, k, v, causal=True))
    traced = jitted(q, k, v)
    eager = relattn.scaled_dot_product_attention(q, k, v, causal=True)
    np.testing.assert_allclose(np.asarray(traced), np.asarray(eager), rtol=1e-12, atol=1e-12)
    # The causal-layout term: its -inf fill block (relattn.shift.extend) is kept too.
    table = jax_backend.asarray(rng.normal(size=(5, 4)))
    traced = jax.jit(relattn.relative_attention)(q, k, v, table)
    eager = relattn.relative_attention(q, k, v, table)
    np.testing.assert_allclose(np.asarray(traced), np.asarray(eager), rtol=1e-12, atol=1e-12)


def test_constants_made_under_inference_mode_serve_autograd(torch_backend, rng):
    """A constant kept from a call under ``torch.inference_mode`` is never saved for a
    later backward pass (which would raise for an inference tensor)."""
    import torch

    x = torch.tensor(rng.normal(size=(2, 5, 5)))
    mask = x > 0
    with torch.inference_mode():
        relattn.masked_softmax(x, mask)
    leaf = x.clone().requires_grad_(True)
    relattn.masked_softmax(leaf, mask).pow(2).sum().backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
    # The relative path's kept blocks (the causal layout's -inf fill, the causal mask), dense
    # and through the block fold (its -inf for masked scores).
    q, k, v, table = (torch.tensor(rng.normal(size=(2, 5, 4))) for _ in range(4))
    for block_size in (None, 2):
        with torch.inference_mode():
            relattn.relative_attention(q, k, v, table, block_size=block_size)
        leaf = q.clone().requires_grad_(True)
        relattn.relative_attention(leaf, k, v, table, block_size=block_size).pow(2).sum().backward()
        assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


def test_sdpa_gets_a_mask_starting_on_16_elements(torch_backend, monkeypatch, rng):
    """Transformer-XL's bias reaches SDPA as ``rel_shift``'s strided view, which starts
    mid-vector; SDPA's memory-efficient CUDA kernel stops on it ("misaligned address",
    seen on an H200 in bfloat16). relattn hands SDPA an aligned copy, broadcast
    dimensions kept."""
    import torch
    import torch.nn.functional as F

    from relattn.backends._torch import aligned_mask

    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    lq, d = 13, 8
    q, k, v = (torch.as_tensor(rng.normal(size=(2, 3, lq, d))) for _ in range(3))
    table = torch.as_tensor(rng.normal(size=(lq, d)))
    with relattn.config.override(path="fused"):
        got = relattn.relative_attention(q, k, v, table, causal=True)
    with relattn.config.override(path="dense"):
        want = relattn.relative_attention(q, k, v, table, causal=True)
    torch_backend.assert_close(got, want, "float64")
    (mask,) = seen
    assert mask.storage_offset() % 16 == 0

    view = torch.randn(2, 1, 9, 22, dtype=torch.bfloat16)[..., 1:12].expand(2, 4, 9, 11)
    copy = aligned_mask(view)
    assert torch.equal(copy, view) and copy.stride(1) == 0  # the broadcast stays one
    assert copy.storage_offset() == 0
    aligned = torch.randn(2, 1, 9, 24)[..., 16:]
    assert aligned_mask(aligned) is aligned


@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_takes_more_leading_dims_as_one(torch_backend, monkeypatch, rng, masked):
    """Swin's windows ``(B, nW, H, N, d)``: SDPA gets them as ``(B·nW, H, N, d)`` (with 5-D
    inputs it would fall back to its math kernel), with the bias and the window mask
    broadcast alike; the result equals the dense path's."""
    import torch
    import torch.nn.functional as F

    shapes = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        shapes.append((tuple(q.shape), None if attn_mask is None else tuple(attn_mask.shape)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, k, v = (torch.as_tensor(rng.normal(size=(2, 3, 4, 5, 8))) for _ in range(3))
    bias = torch.as_tensor(rng.normal(size=(4, 5, 5)))
    mask = torch.as_tensor(rng.random((3, 1, 5, 5)) < 0.7) | torch.eye(5, dtype=torch.bool)
    mask[1, 0, 2] = False  # a fully masked row: zeros on both paths
    mask = mask if masked else None
    with relattn.config.override(path="fused"):
        got = relattn.scaled_dot_product_attention(q, k[:1], v, bias=bias, mask=mask)
    with relattn.config.override(path="dense"):
        want = relattn.scaled_dot_product_attention(q, k[:1], v, bias=bias, mask=mask)
    torch_backend.assert_close(got, want, "float64")
    assert shapes == [((6, 4, 5, 8), (6, 4, 5, 5))]
