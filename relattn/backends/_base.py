"""The record of what one array library offers beyond the array API standard."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any


def _identity(x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _always(x: Any) -> bool:
    return True


def _never(x: Any) -> bool:
    return False


def _unknown(x: Any) -> None:
    return None


@dataclass(frozen=True)
class Kernel:
    """A library kernel that a plan (:mod:`relattn.plan`) may lower a problem to.

    Attributes
    ----------
    name : str
        The path's name in plans and messages (``"sdpa"``, ``"flex"``,
        ``"dot_product_attention"``).
    refuse : callable
        ``(problem) -> str or None``: ``None`` where the kernel computes the
        checked :class:`relattn.problem.Problem` exactly (its terms, masks,
        layouts, positions, dtypes and device), else one sentence saying why
        not (``"a Transformer-XL position table is not a score_mod term"``).
        Reads static facts only (shapes, dtypes, which fields are present,
        the device), so that a plan keeps its answer for every call of the
        same signature.
    prepare : callable
        ``(problem) -> run``: builds what every call of the plan shares (a
        compiled function, a mask made of the shapes alone) once;
        ``run(problem) -> out`` computes one call's output ``(*lead, Lq, d_v)``
        in the problem's dtype, fully masked rows zero. ``problem.q`` (and
        ``qp``, ``ks``) are already scaled: the kernel scales by 1.
    compiles : bool
        The first call of each shape compiles (seconds on a CPU): the plan
        takes such a kernel only where it is worth its compile (see
        :mod:`relattn.plan`).
    gpu_only : bool
        A GPU kernel, which a CPU runs only in its library's interpreter: the
        plan takes it on a CPU only where ``relattn.config.path`` forces it
        (relattn's Triton and Pallas kernels, for tests).
    """

    name: str
    refuse: Callable[[Any], str | None]
    prepare: Callable[[Any], Callable[[Any], Any]]
    compiles: bool = False
    gpu_only: bool = False


@dataclass(frozen=True)
class Backend:
    """What the array API standard lacks, for one array library: runtime facts only.

    relattn's algorithms (the core, the block fold, the ring) are written once
    against the standard and ask :func:`relattn.backends.backend_for` for this
    record where they need more: a primitive (a traced loop, a collective), a
    kernel, or a fact about the arrays. The test and benchmark harness (host
    copies, devices, compilers, memory counters) is :mod:`relattn.testing`'s.

    Attributes
    ----------
    name : str
        Short name of the library (``"numpy"``, ``"torch"``, ``"jax"`` …), for
        messages.
    stop_gradient : callable
        ``x -> x`` cut from the autograd graph (identity where the library has
        no autograd).
    has_values : callable
        ``x -> bool``: the values of ``x`` can be read now (False for JAX
        tracers under a jit and for Dask graphs), so checks may look at them.
    materialize : callable
        ``x -> x`` computed now (Dask ``persist``), so that a cache such as a
        segment memory does not drag its whole history along.
    query_chunks : bool
        The generic dense path runs a block of queries at a time
        (:func:`relattn.fold.dense_in_query_blocks`): right for libraries
        that run one operation at a time and free intermediates as soon as
        they are dropped; ``False`` where a compiler plans the memory (JAX).
    checkpoint : callable
        ``(fn, *arrays) -> fn(*arrays)``, its intermediates recomputed in the
        backward pass instead of kept (``jax.checkpoint``,
        ``torch.utils.checkpoint``); a plain call where there is no autograd.
        The block fold wraps each query block in it.
    fori_loop : callable or None
        ``(n, body, carry) -> carry``: ``body(step, carry)`` for ``step`` in
        ``0 … n-1`` as one traced loop (``lax.fori_loop``), so that a jit
        compiles the block fold's step once; ``None`` where the fold runs as
        Python loops over static blocks (every eager library).
    staged : callable or None
        ``(fn, statics, arrays) -> fn(*statics, *arrays)`` compiled once per
        ``statics`` (hashable) and the arrays' shapes and dtypes (``jax.jit``
        kept per ``statics``): how :func:`relattn.core.attention` runs an
        eager call on a library whose users compile, where one operation at a
        time compiles each operation for each new shape and a traced loop
        (:attr:`fori_loop`) its body on every call. ``None``: eager calls run
        one operation at a time.
    cond : callable or None
        ``(pred, true_fn, false_fn, operand) -> result``: a traced branch
        (``lax.cond``) for a traced ``pred``; ``None`` with ``fori_loop``.
    map : callable or None
        ``(fn, n) -> stacked``: ``fn(i)`` for ``i`` in ``0 … n-1``, stacked along
        a new first axis, one after the other (``lax.map``); with ``fori_loop``.
    dynamic_slice : callable or None
        ``(x, start, size, axis) -> x[start:start + size]`` along ``axis``
        (``-1`` or ``-2``) for a traced ``start``; ``x`` itself where it is
        ``None``, has fewer dimensions or broadcasts along ``axis``; with
        ``fori_loop``.
    align : callable
        ``(x, inputs) -> x`` typed to vary over the mesh axes the arrays
        ``inputs`` vary over (JAX inside ``shard_map``, whose loop carries and
        branches must agree); identity elsewhere.
    collective : object or None
        The communication of :func:`relattn.ring_attention` and
        :func:`relattn.ulysses_attention` over ``axis`` (a mesh axis name of the
        enclosing ``jax.shard_map``; a ``torch.distributed`` process group, ``None``
        the default): ``axis_size(axis)``, ``axis_index(axis)`` (this device's index),
        ``rotate(xs, axis) -> receive`` (start sending the tuple ``xs`` to the next
        device and receiving the previous one's; ``receive()`` waits and gives them:
        JAX's ``lax.ppermute``, torch's ``batch_isend_irecv``), ``depend(x, others)``
        (``x``, whose backward reaches ``others`` too, so that every device runs the
        transpose of every transfer, as its peers do; identity on JAX),
        ``all_to_all(x, split_axis, concat_axis, axis)`` (JAX's tiled
        ``lax.all_to_all``) and ``all_gather(x, dim, axis)`` (along ``dim``); rotate
        and all_to_all differentiable through their transposes. ``None`` where the
        library has none.
    join : callable
        ``(x, like) -> x`` made to mix with ``like`` in one operation (a plain
        tensor as a replicated ``DTensor`` beside DTensors); identity elsewhere
        and for ``None``.
    fused_attention : callable or None
        ``(q, k, v) -> kernel or None``: the library's own attention kernel for
        these inputs, where it takes them and is worth using;
        ``kernel(*, bias, mask, causal, scale) -> out`` computes
        ``softmax(q kᵀ · scale + bias, mask) v`` with relattn's semantics
        (fully masked rows are zero; either may be ``None``), or with
        ``causal`` (``Lq = Lk``, no bias or mask) the causal attention.
        Kernels add ``-inf`` for a mask, which a NaN or inf in a masked key
        turns into NaN: with a mask the core keeps a kernel's output only
        where it sees it finite (eager values), and runs its own paths
        otherwise. Asked
        before the bias is built, so that a bias is never computed twice.
        ``None`` (the field) where the library has no kernel worth using;
        relattn then runs the generic array-API path.
    kernel_name : str
        What :attr:`fused_attention` calls, for plans and messages
        (``"torch SDPA"``).
    kernels : tuple of Kernel
        The library's kernels a plan may lower a problem to, fastest first
        (:class:`Kernel`); the plan asks each in turn and records why each
        one it passes over refused.
    matmul_transposed : callable or None
        ``(a, b) -> a @ bᵀ`` over the last axis of both (leading dims
        broadcast), where the library computes it faster than ``a @
        matrix_transpose(b)``: XLA copies a transposed ``b`` first (a decode
        step's whole key cache), ``jnp.einsum`` contracts in place. ``None``:
        ``a @ matrix_transpose(b)``.
    take_along_axis : callable or None
        ``(x, indices, axis) -> out`` for arrays of equal shape but along
        ``axis``: the standard's ``take_along_axis`` (2024.12), where the
        namespace lacks it (Dask). ``None``: the namespace's own.
    cumulative_sum : callable or None
        ``(x, axis) -> out``: the standard's ``cumulative_sum``, where the
        namespace's cannot serve (array-api-compat's torch wrapper resolves the
        namespace through a cache that ``torch.compile`` refuses to trace).
        ``None``: the namespace's own.
    rechunk_like : callable
        ``(x, like) -> x`` for ``x`` made from ``like`` by a reshape (the shift
        of :mod:`relattn.shift`), of ``like``'s shape but for the last axis:
        ``x`` chunked as ``like`` along every other axis (the query axis
        ``-2`` included) and in regular chunks of ``like``'s largest along the
        last. Dask's reshapes otherwise leave ragged chunks along the sequence
        (``63, 64, 1, 63, 64, 1, …``) that every later operation inherits.
        Identity where arrays are not chunked.
    chunk_pairs : callable or None
        ``(pair, merge, finish, arrays, axes, lead, keep, width, dtype) -> out``:
        the block fold's driver over a chunked library's chunks (Dask), one task
        per (query chunk, key chunk) pair, so that the graph grows with the chunk
        pairs, not the block pairs. ``axes`` names each array's trailing axes
        (``"q"`` the query axis, ``"k"`` the key axis, ``"-"`` whole; an array
        with fewer dims takes the last names), its other dims leading, broadcast
        against ``lead``; the query axis keeps the chunks of the first array that
        spans it, and every array is rechunked to match. ``pair(lead_start,
        lead_shape, (i0, i1), (j0, j1), *blocks) -> state`` runs on the chunks'
        own arrays (``None`` for an absent array), given where they lie;
        ``merge(states) -> state`` combines a query chunk's states;
        ``finish(state)`` is its output chunk ``(*lead_shape, i1 - i0, width)``
        of ``dtype``. Pairs with ``keep((i0, i1), (j0, j1))`` False have no task
        (a query chunk keeps one at least). ``None``: the fold runs on the
        library's arrays (:func:`relattn.fold.blockwise`).
    needs_grad : callable
        ``arrays -> bool``: a gradient will be taken through a call of these
        arrays (one requires it and autograd records; ``None`` entries are
        skipped); part of a plan's signature, since some kernels have no
        backward pass on some devices.
    step_compiler : callable or None
        ``() -> compile_step``: a compiler of the block fold's step for one plan;
        ``compile_step(fn) -> fn`` compiles one step (a closure of
        :func:`relattn.fold.fold_keys`) into one fused function
        (``torch.compile``), reusing what earlier steps of the plan compiled.
        ``None``: the fold runs eagerly, or (JAX) its loops are compiled whole.
    free_memory : callable
        ``device -> int or None``: the device's free memory in bytes
        (``torch.cuda.mem_get_info``, JAX's ``memory_stats``, CuPy's
        ``mem_info``), for the dense budget on a GPU; ``None`` where unknown
        (a CPU: the budget is a constant there).
    takes_blockwise : callable
        ``x -> bool``: the blockwise path runs on arrays like ``x``. ``False``
        for PyTorch's ``DTensor``, which refuses to mix with the plain tensors
        that the block loop starts from; the automatic choice then stays dense.
    quiet : callable
        ``() -> context manager`` inside which the library warns of no NaN or
        inf it computes (NumPy's ``errstate``): the first try of
        :func:`relattn.fold.clean_unless_finite` meets the NaN of an unfilled
        cache slot by design. A null context elsewhere.
    """

    name: str
    stop_gradient: Callable[[Any], Any] = _identity
    has_values: Callable[[Any], bool] = _always
    materialize: Callable[[Any], Any] = _identity
    query_chunks: bool = True
    checkpoint: Callable[..., Any] = _call
    fori_loop: Callable[..., Any] | None = None
    staged: Callable[..., Any] | None = None
    cond: Callable[..., Any] | None = None
    map: Callable[..., Any] | None = None
    dynamic_slice: Callable[..., Any] | None = None
    align: Callable[..., Any] = _identity
    collective: Any = None
    join: Callable[..., Any] = _identity
    fused_attention: Callable[..., Any] | None = None
    kernel_name: str = ""
    kernels: tuple[Kernel, ...] = ()
    needs_grad: Callable[[Any], bool] = _never
    chunk_pairs: Callable[..., Any] | None = None
    step_compiler: Callable[[], Callable[..., Any]] | None = None
    free_memory: Callable[[Any], int | None] = _unknown
    matmul_transposed: Callable[[Any, Any], Any] | None = None
    take_along_axis: Callable[..., Any] | None = None
    cumulative_sum: Callable[..., Any] | None = None
    rechunk_like: Callable[[Any, Any], Any] = _identity
    takes_blockwise: Callable[[Any], bool] = _always
    quiet: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
