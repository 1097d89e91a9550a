"""Backends, sizes, inputs and the benchmark classes of relattn's own calls.

Every benchmark class is parameterised over ``backend`` (the names in
:data:`BACKENDS`) and the query length ``Lq``; keys and values cover a memory
as long again (``Lk = 2·Lq``, Transformer-XL with ``M = Lq``). Shapes follow
relattn's convention ``(B, H, L, d_head)`` with ``B = 2``, ``H = 8``,
``d_head = 64``, float32. A backend that is not installed or has no device
raises ``NotImplementedError`` in ``setup``, which asv reports as skipped.

``RELATTN_BENCH_QUICK=1`` keeps ``Lq = 128`` only and runs fewer repeats in
the ``track_*`` ratios: the CI smoke run (see ``asv_bench/README.md``).

A topic module's classes subclass :class:`_Speed` (``time_relattn``,
``peakmem_relattn``) and :class:`_GPUMemory` (``track_gpu_peak_bytes``),
giving only their ``params`` and the two methods of :class:`_Topic`, which
build relattn's call. The native baselines (``baselines.py``) subclass a
topic's class and add the native call.

relattn calls of more than one function, :func:`rotary_qk` (RoPE of ``q``
and ``k``) and :func:`t5_attention` (T5's table gathered per distance, then
attention), are defined here, for the topic modules and ``native.check`` alike.

What is library-specific (host copies, waiting for a device, ``jax.jit``,
device look-up, GPU memory counters) comes from :mod:`relattn.testing`'s
targets; this module only says which targets the benchmarks run
(:data:`BACKENDS`) and how Dask chunks their inputs. Imports flow one way:
``native`` (the baselines' code) and the topic modules import ``common``;
``baselines`` imports them all; ``common`` imports none.

The array libraries are imported here, once, when asv's forkserver imports the
benchmark suite, so that the forked benchmark processes do not each pay for
``import torch`` and ``import jax``; importing JAX does not start its runtime
(that happens on the first array), so forking afterwards is safe.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from relattn.testing import Target

# JAX would otherwise take 75 % of a GPU's memory when it first starts, which
# the CuPy and PyTorch benchmarks and the GPU memory counters would then miss.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

QUICK = os.environ.get("RELATTN_BENCH_QUICK", "") not in ("", "0")

BATCH = 2
HEADS = 8
D_HEAD = 64
#: Shaw et al.'s clipping radius K.
RADIUS = 16

#: The targets of :mod:`relattn.testing` the benchmarks run on, by device (array-api-strict
#: and read-only NumPy check behaviour; they are not benchmarked).
CPU_BACKENDS = ("numpy", "torch", "jax", "dask")
GPU_BACKENDS = ("cupy", "torch_cuda", "jax_gpu")
BACKENDS = CPU_BACKENDS + GPU_BACKENDS
QUERY_LENGTHS = (128,) if QUICK else (128, 512, 2048)
#: Sizes of the ``track_ratio_*`` benchmarks, which run both sides several
#: times in one call: the target (SPEC §5, issue 4) is stated at Lq = 512.
RATIO_LENGTHS = (128,) if QUICK else (128, 512)

#: Feature size of DiSAN's tokens ``h (B, L, d)``. Its feature-wise logits are
#: ``O(B·L²·d)``: at L = 2048 that is 2^29 elements, 16 times L = 512's 0.3-1.4 s
#: per call on two CPU cores, so :mod:`disan` stops at L = 512 on CPU backends.
DISAN_FEATURES = 64


def key_length(query_length: int) -> int:
    """``Lk = 2·Lq``: the segment and a memory as long as it."""
    return 2 * query_length


def skip_on_cpu_from(backend: str, query_length: int, largest: int) -> None:
    """``NotImplementedError`` when a CPU ``backend`` gets ``Lq >= largest``."""
    if backend in CPU_BACKENDS and query_length >= largest:
        raise NotImplementedError(f"Lq = {query_length} is too slow for {backend} on a CPU")


def asarray(backend: Target, a: np.ndarray, batched: bool = False) -> Any:
    """NumPy data ``a`` as ``backend``'s array on its device.

    Dask: one chunk per batch element when ``batched`` (the leading axis is
    the batch), so that the two cores each get one; one chunk otherwise.
    """
    return backend.from_host(a, chunks=(1, *a.shape[1:]) if batched else None)


def peak_device_bytes(backend: Target, fn: Callable[[], Any]) -> int:
    """Peak device bytes of ``fn()``; ``NotImplementedError`` (a skip) where none are counted."""
    try:
        return backend.peak_device_bytes(fn)
    except LookupError as e:
        raise NotImplementedError(str(e)) from None


@functools.cache
def get_backend(name: str) -> Target:
    """The target called ``name``, or ``NotImplementedError`` saying why not.

    The reasons are :mod:`relattn.testing`'s: the library is not installed, or
    has no such device; or a relattn older than ``relattn.testing`` (an old
    commit in ``asv continuous``: its benchmarks are skipped).
    """
    if name not in BACKENDS:
        raise NotImplementedError(f"unknown backend {name!r}")
    import relattn

    try:
        from relattn.testing import target
    except ImportError:  # an older commit, in `asv continuous` or `asv run A..B`
        raise NotImplementedError(f"relattn {relattn.__version__} has no relattn.testing") from None
    found = target(name)
    if found.unavailable:
        raise NotImplementedError(f"{name}: {found.unavailable}")
    return found


def _import_libraries() -> None:
    """Import every installed library once, here (see the module's docstring)."""
    with contextlib.suppress(ImportError):
        from relattn.testing import target

        for name in ("torch", "jax", "dask"):
            with contextlib.suppress(ImportError):
                target(name).lib  # noqa: B018 - the import is the point


_import_libraries()


def require(*functions: str) -> None:
    """``NotImplementedError`` (a skip) where this relattn lacks one of ``functions``."""
    import relattn

    missing = [name for name in functions if not hasattr(relattn, name)]
    if missing:  # an older commit, in `asv continuous` or `asv run A..B`
        raise NotImplementedError(f"relattn {relattn.__version__} has no {', '.join(missing)}")


def relattn_function(function: str, backend: Target, **static: Any) -> Any:
    """relattn's ``function`` with ``static`` keywords bound, through ``backend.default_jit``.

    ``jax.jit`` on JAX (the bound keywords stay Python values), the function
    itself elsewhere. ``NotImplementedError`` where this relattn lacks it.
    """
    import relattn

    require(function)
    fn = getattr(relattn, function)
    return backend.default_jit(functools.partial(fn, **static) if static else fn)


def rotary_qk(q: Any, k: Any) -> tuple[Any, Any]:
    """relattn's RoPE of ``q`` and ``k`` at positions ``0 … L-1``, LLaMA's concatenated layout."""
    from relattn import rotary_position_embedding

    return (
        rotary_position_embedding(q, layout="concatenated"),
        rotary_position_embedding(k, layout="concatenated"),
    )


def t5_attention(q: Any, k: Any, v: Any, table: Any, buckets: Any) -> Any:
    """T5's attention with relattn: the table gathered per distance, then ``relative_bias=``.

    ``table (num_buckets, H)`` (HF's ``relative_attention_bias`` embedding),
    ``buckets (W,)`` the bucket of each column of the full layout: ``W·H``
    values gathered, no ``(H, Lq, Lk)`` bias. T5 does not scale its scores.
    """
    import array_api_compat
    from relattn import scaled_dot_product_attention

    xp = array_api_compat.array_namespace(table)
    values = xp.permute_dims(xp.take(table, buckets, axis=0), (1, 0))  # (H, W)
    return scaled_dot_product_attention(q, k, v, relative_bias=values, scale=1.0)


# -- inputs ------------------------------------------------------------
def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def attention_inputs(query_length: int, key_len: int | None = None, seed: int = 0) -> dict:
    """NumPy float32 ``q (B, H, Lq, d)``, ``k``, ``v (B, H, Lk, d)``."""
    lk = key_length(query_length) if key_len is None else key_len
    rng = np.random.default_rng(seed)
    return {
        "q": normal(rng, BATCH, HEADS, query_length, D_HEAD),
        "k": normal(rng, BATCH, HEADS, lk, D_HEAD),
        "v": normal(rng, BATCH, HEADS, lk, D_HEAD),
    }


def relative_inputs(query_length: int, layout: str, key_len: int | None = None) -> dict:
    """:func:`attention_inputs` plus Transformer-XL's per-head table ``(H, W, d)`` and biases.

    ``layout="causal"``: ``W = Lk`` (distances ``δ <= 0``, keys with ``δ > 0``
    masked); ``"full"``: ``W = Lq + Lk - 1`` (XLNet, Conformer), no mask. The
    biases ``u``, ``v`` are per head, ``(H, 1, d)``.
    """
    arrays = attention_inputs(query_length, key_len)
    lq, lk = query_length, arrays["k"].shape[-2]
    width = {"causal": lk, "full": lq + lk - 1}[layout]
    rng = np.random.default_rng(1)
    arrays["position_table"] = normal(rng, HEADS, width, D_HEAD)
    arrays["content_bias"] = normal(rng, HEADS, 1, D_HEAD)
    arrays["position_bias"] = normal(rng, HEADS, 1, D_HEAD)
    return arrays


def shaw_inputs(query_length: int, key_len: int | None = None) -> dict:
    """:func:`attention_inputs` plus Shaw's tables ``(2K+1, d)``, shared by the heads."""
    arrays = attention_inputs(query_length, key_len)
    rng = np.random.default_rng(2)
    arrays["key_table"] = normal(rng, 2 * RADIUS + 1, D_HEAD)
    arrays["value_table"] = normal(rng, 2 * RADIUS + 1, D_HEAD)
    return arrays


def bias_inputs(query_length: int, key_len: int | None = None) -> dict:
    """:func:`attention_inputs` plus an additive bias ``(Lq, Lk)`` (a precomputed position term)."""
    arrays = attention_inputs(query_length, key_len)
    rng = np.random.default_rng(3)
    arrays["bias"] = normal(rng, query_length, arrays["k"].shape[-2])
    return arrays


def rotary_inputs(length: int) -> dict:
    """NumPy float32 ``q``, ``k (B, H, L, d)``: what RoPE rotates."""
    rng = np.random.default_rng(7)
    return {
        "q": normal(rng, BATCH, HEADS, length, D_HEAD),
        "k": normal(rng, BATCH, HEADS, length, D_HEAD),
    }


#: T5's buckets (``num_buckets``, ``max_distance``; bidirectional: the encoder).
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128


def t5_inputs(length: int) -> dict:
    """:func:`attention_inputs` with ``Lq = Lk = length``, T5's table and bucket indices.

    ``table (32, H)``; ``buckets (W,)`` (``W = 2L - 1``) is relattn's
    ``relative_position_bucket`` of each distance of the full layout, int64,
    computed here once (it depends on ``L`` alone). The native baseline's
    ``(L, L)`` indices are ``native.t5_pair_buckets``.
    """
    from relattn import relative_distances, relative_position_bucket

    arrays = attention_inputs(length, length)
    rng = np.random.default_rng(6)
    arrays["table"] = normal(rng, T5_BUCKETS, HEADS)
    distances = relative_distances(length, length)
    buckets = relative_position_bucket(
        distances, num_buckets=T5_BUCKETS, max_distance=T5_MAX_DISTANCE
    )
    arrays["buckets"] = np.asarray(buckets, dtype=np.int64)
    return arrays


#: Arrays whose leading axis is the batch (Dask chunks them along it).
BATCHED = ("q", "k", "v", "h")
#: The arrays of a relative-attention call, in the native functions' order.
RELATIVE_NAMES = ("q", "k", "v", "position_table", "content_bias", "position_bias")


def on(backend: Target, arrays: dict) -> dict:
    """Every array of ``arrays`` converted to ``backend``."""
    return {name: asarray(backend, a, batched=name in BATCHED) for name, a in arrays.items()}


# -- side-by-side timing ----------------------------------------------
def repeats() -> int:
    return 3 if QUICK else 7


def ready(backend: Target, out: Any) -> Any:
    """Wait for ``out``, one array or a tuple of them (RoPE returns ``q`` and ``k``)."""
    if isinstance(out, tuple):
        return tuple(backend.ready(x) for x in out)
    return backend.ready(out)


def timed(fn: Callable[[], Any], backend: Target) -> float:
    """Seconds for one call of ``fn``, waiting for its result."""
    start = time.perf_counter()
    ready(backend, fn())
    return time.perf_counter() - start


def median_ratio(
    fn: Callable[[], Any], baseline: Callable[[], Any], backend: Target, n: int | None = None
) -> tuple[float, float, float]:
    """``(median time of fn / median time of baseline, median fn, median baseline)``.

    The two run alternately, ``n`` times each, in this process after one warm-up
    call each (compilation, caches), so that drifts in clock speed and memory
    state hit both alike.
    """
    n = repeats() if n is None else n
    ready(backend, fn())
    ready(backend, baseline())
    ours, theirs = [], []
    for _ in range(n):
        ours.append(timed(fn, backend))
        theirs.append(timed(baseline, backend))
    a, b = statistics.median(ours), statistics.median(theirs)
    return a / b, a, b


# -- the benchmark classes every topic shares ----------------------------
# Their names start with "_": asv's discovery skips such module attributes, so
# these are collected only through the public topic classes that subclass them
# (asv lists a class's benchmarks with ``inspect.getmembers``, inherited
# methods included, and names them after the subclass).


class _Topic:
    """One relattn function on one backend.

    A topic class gives ``params`` and ``param_names`` (the first parameter
    is always ``backend``, a name in :data:`BACKENDS`), :meth:`inputs` and
    :meth:`call`; :meth:`setup` prepares relattn's call and the base classes
    below add the measurements.
    """

    params = [BACKENDS, QUERY_LENGTHS]
    param_names = ["backend", "query_length"]
    timeout = 300

    def inputs(self, backend: Target, *params: Any) -> dict:
        """The arrays of one call on ``backend``; ``params`` follow ``backend``."""
        # TypeError, not NotImplementedError: asv would report the latter as a skip.
        raise TypeError(f"{type(self).__name__} does not define inputs()")

    def call(self, backend: Target, arrays: dict, *params: Any) -> Callable[[], Any]:
        """relattn's call on ``arrays`` (from :meth:`inputs`), without arguments.

        ``NotImplementedError`` where the backend or the function is missing,
        which asv reports as skipped.
        """
        raise TypeError(f"{type(self).__name__} does not define call()")

    def setup(self, backend: str, *params: Any) -> None:
        """``self.backend``, ``self.arrays`` and ``self.ours`` (relattn's call), run once."""
        self.backend = get_backend(backend)
        self.arrays = self.inputs(self.backend, *params)
        self.ours = self.call(self.backend, self.arrays, *params)
        ready(self.backend, self.ours())  # compile (jax.jit) and touch the memory once


class _Speed(_Topic):
    """Speed and host peak memory of relattn on every backend."""

    def time_relattn(self, *params: Any) -> None:
        ready(self.backend, self.ours())

    def peakmem_relattn(self, *params: Any) -> None:
        ready(self.backend, self.ours())


class _GPUMemory(_Topic):
    """Peak device memory of relattn's call (GPU backends only)."""

    params = [GPU_BACKENDS, QUERY_LENGTHS]

    def track_gpu_peak_bytes(self, *params: Any) -> int:
        """Bytes relattn's call allocates on the device at its peak."""
        return peak_device_bytes(self.backend, self.ours)

    track_gpu_peak_bytes.unit = "bytes"


class _Constant:
    """Time of one of relattn's constant makers, ``function(count, xp=…, device=…)``.

    ``inverse_frequencies`` and ``alibi_slopes`` return a few numbers that a
    model computes once; their time is relattn's argument checks and the
    library's call overhead. Called eagerly (under ``jax.jit`` they would be
    compile-time constants), with the backend's library as ``xp`` and its device.
    """

    params = [BACKENDS]
    param_names = ["backend"]
    timeout = 60
    #: The relattn function and its one positional argument.
    function = ""
    count = 0

    def setup(self, backend: str) -> None:
        require(self.function)
        import relattn

        self.backend = get_backend(backend)
        self.call = functools.partial(
            getattr(relattn, self.function),
            self.count,
            xp=self.backend.lib,
            device=self.backend.device,
        )
        ready(self.backend, self.call())

    def time_relattn(self, backend: str) -> None:
        ready(self.backend, self.call())


# -- plans: relattn's chosen path against the block fold --------------------------------
#: The schemes whose plan ``plans.py`` and ``compare.py --only plans`` time against the
#: fold: causal plain attention, ALiBi (causal), T5 (a per-distance bias, bidirectional),
#: packed documents (segment ids, causal), causal Transformer-XL, Shaw, DeBERTa.
PLAN_SCHEMES = ("causal", "alibi", "t5", "segments", "transformer-xl", "shaw", "deberta")
#: Documents packed into the one row of ``segments``, of equal lengths.
DOCUMENTS = 4
#: scheme -> (relattn's function, its keywords that are not arrays, the names of its
#: positional arrays after ``q, k, v``).
PLAN_CALLS = {
    "causal": ("scaled_dot_product_attention", {"causal": True}, ()),
    "alibi": ("scaled_dot_product_attention", {"causal": True}, ()),
    "t5": ("scaled_dot_product_attention", {"scale": 1.0}, ()),
    "segments": ("scaled_dot_product_attention", {"causal": True}, ()),
    "transformer-xl": ("relative_attention", {"causal": True}, ("position_table",)),
    "shaw": ("shaw_attention", {}, ("key_embeddings", "value_embeddings")),
    "deberta": ("disentangled_attention", {}, ("position_table", "query_position_table")),
}


def plan_inputs(scheme: str, length: int, batch: int = 1, heads: int = HEADS) -> dict:
    """NumPy inputs of one ``scheme`` (:data:`PLAN_SCHEMES`), self-attention of ``length``.

    ``q``, ``k``, ``v (B, H, L, d)`` float32 and the scheme's own: ALiBi's
    ``relative_bias (H, L)`` (slopes times the causal layout's distances), T5's
    ``(H, 2L - 1)`` (one value per distance, as gathered from its buckets), the
    ``segment_ids (B, 1, L)`` of :data:`DOCUMENTS` documents, Transformer-XL's
    per-head table ``(H, L, d)`` and ``u``, ``v (H, 1, d)``, Shaw's clipped
    embeddings ``(2K + 1, d)``, DeBERTa's per-head tables ``(H, 2L - 1, d)``.
    """
    import relattn

    rng = np.random.default_rng(11)
    arrays = {name: normal(rng, batch, heads, length, D_HEAD) for name in ("q", "k", "v")}
    width = 2 * length - 1
    if scheme == "alibi":
        slopes = np.asarray(relattn.alibi_slopes(heads), dtype=np.float32)
        distances = np.asarray(relattn.relative_distances(length, length, causal=True))
        arrays["relative_bias"] = (slopes[:, None] * distances).astype(np.float32)
    elif scheme == "t5":
        arrays["relative_bias"] = normal(rng, heads, width)
    elif scheme == "segments":
        documents = np.arange(length) * DOCUMENTS // length
        arrays["segment_ids"] = np.broadcast_to(documents, (batch, 1, length)).astype(np.int32)
    elif scheme == "transformer-xl":
        arrays["position_table"] = normal(rng, heads, length, D_HEAD)
        arrays["content_bias"] = normal(rng, heads, 1, D_HEAD)
        arrays["position_bias"] = normal(rng, heads, 1, D_HEAD)
    elif scheme == "shaw":
        arrays["key_embeddings"] = normal(rng, 2 * RADIUS + 1, D_HEAD)
        arrays["value_embeddings"] = normal(rng, 2 * RADIUS + 1, D_HEAD)
    elif scheme == "deberta":
        arrays["position_table"] = normal(rng, heads, width, D_HEAD)
        arrays["query_position_table"] = normal(rng, heads, width, D_HEAD)
    elif scheme != "causal":
        raise ValueError(f"unknown scheme {scheme!r}; the schemes are {PLAN_SCHEMES}")
    return arrays


def plan_and_fold(
    scheme: str, backend: Target, arrays: dict
) -> tuple[Callable[[], Any], Callable[[], Any], Any]:
    """``(plan, fold, chosen)``: relattn's call of ``scheme`` on ``arrays`` (on ``backend``,
    from :func:`plan_inputs`) at its default plan, the same call forced onto the block fold
    (``relattn.config.override(path="fold")``), and the default's
    :class:`relattn.plan.Plan` (:func:`relattn.explain`) once warm.

    Both are called here first. On JAX each is its own ``jax.jit`` function and the
    forced one is traced under the override: the path is chosen when a call is traced.
    A plan that takes a compiled kernel from a signature's ``compile_after``-th call on
    (FlexAttention on a CPU) is called that many times first, so that the plan timed is
    the one a loop settles on, compiled.
    """
    require("explain", "config")
    import relattn

    name, static, positional = PLAN_CALLS[scheme]
    function = getattr(relattn, name)
    args = tuple(arrays[n] for n in ("q", "k", "v", *positional))
    kwargs = {n: a for n, a in arrays.items() if n not in ("q", "k", "v", *positional)}

    def compiled() -> Callable[..., Any]:
        # A new function object per setting: jax.jit keeps its traces per function.
        def call(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **static, **kwargs)

        return backend.default_jit(call)

    default, forced = compiled(), compiled()

    def plan() -> Any:
        return default(*args, **kwargs)

    def fold() -> Any:
        with relattn.config.override(path="fold"):
            return forced(*args, **kwargs)

    ready(backend, fold())
    first = relattn.explain(function, *args, **static, **kwargs)
    for _ in range((first.compile_after or 0) + 1):
        ready(backend, plan())
    return plan, fold, relattn.explain(function, *args, **static, **kwargs)
