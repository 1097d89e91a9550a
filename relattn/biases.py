"""Scalar biases per relative distance: the expansion to ``(Lq, Lk)``, T5 buckets, ALiBi slopes.

A bias that depends on the distance ``δ = j - (i + Lk - Lq)`` alone is given
once per column of the relative layout, ``values (..., W)``; the attention
functions take it unexpanded (``relative_bias=``), and
:func:`relative_bias_matrix` expands it to the Toeplitz matrix ``(..., Lq, Lk)``.
T5 (Raffel et al. 2020) gathers the values from a learned table by bucket
(:func:`relative_position_bucket`), DeBERTa-v2 indexes its tables by
:func:`log_bucket_position`, and ALiBi (Press et al. 2022) multiplies the
distance by a slope per head (:func:`alibi_slopes`). Kerple (Chi et al. 2022)
and Sandwich (Chi et al. 2023) are functions of the distance itself
(:func:`kerple_bias`, :func:`sandwich_bias`).
"""

from __future__ import annotations

import math
from typing import Any

import array_api_extra as xpx

from . import _checks
from ._namespace import device_of
from ._typing import Array, Namespace
from .encodings import _working_dtype
from .problem import relative_width
from .shift import shift

__all__ = [
    "alibi_slopes",
    "kerple_bias",
    "log_bucket_position",
    "relative_bias_matrix",
    "relative_position_bucket",
    "sandwich_bias",
]


def relative_bias_matrix(values: Array, query_length: int, key_length: int) -> Array:
    """Expand one bias per distance to every query–key pair (a Toeplitz matrix).

    Parameters
    ----------
    values : array of shape (..., W), real floating
        ``b[m]`` for the distance ``δ = m - (Lk - 1)`` of column ``m`` of the
        relative layout: ``W = Lq + Lk - 1`` (full layout) or ``W = Lk``
        (causal layout, ``δ <= 0``). Leading dimensions (heads) are kept.
    query_length, key_length : int
        ``Lq`` and ``Lk``, both ``>= 0``.

    Returns
    -------
    array of shape (..., Lq, Lk), dtype of ``values``
        ``out[..., i, j] = values[..., δ(i, j) + Lk - 1]``. In the causal
        layout the pairs with ``δ > 0`` have no value: they get half the most
        negative finite value of the dtype, as :func:`mask_to_bias` gives to
        masked pairs (finite, so that sums stay NaN-free in float16).

    Raises
    ------
    ValueError
        If ``values`` is 0-d, its width fits neither layout, or a length is
        negative.
    TypeError
        If ``values`` is not a real floating array or a length not an integer.

    See Also
    --------
    relative_position_bucket : T5's bucket of each distance.
    alibi_slopes : ALiBi's slope per head.
    scaled_dot_product_attention : Takes ``values`` unexpanded as ``relative_bias=``.

    Notes
    -----
    Raffel et al. 2020, §2.1: "a scalar is added to the corresponding logit
    ... each head uses a different learned position embedding", shared across
    layers; Press et al. 2022, §3: ``softmax(q_i Kᵀ + m · [-(i-1), …, -1, 0])``.
    The expansion is :func:`rel_shift` of the broadcast values: no gather.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import relative_bias_matrix, relative_distances
    >>> values = xp.astype(relative_distances(2, 3, xp=xp), xp.float64)   # b[δ] = δ
    >>> relative_bias_matrix(values, 2, 3)
    array([[-1.,  0.,  1.],
           [-2., -1.,  0.]])
    """
    xp = _checks.namespace(values=values)
    _checks.floating(xp, values=values)
    lq = _checks.length("query_length", query_length, minimum=0)
    lk = _checks.length("key_length", key_length, minimum=0)
    _checks.ndim("values", values, 1, "(..., W)")
    width = relative_width("values", values.shape[-1], lq, lk)
    fill = 0.0 if width == lq + lk - 1 else float(xp.finfo(values.dtype).min) / 2
    rows = xp.broadcast_to(values[..., None, :], (*values.shape[:-1], lq, width))
    return shift(rows, lk, xp, fill=fill)


def _distances(distances: Any) -> Any:
    xp = _checks.namespace(distances=distances)
    if not xp.isdtype(distances.dtype, "integral"):
        raise TypeError(
            f"distances must be an integer array (relative positions), got dtype {distances.dtype}"
        )
    return xp


def relative_position_bucket(
    distances: Array, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
) -> Array:
    """T5's bucket of each relative distance: exact for small ones, logarithmic beyond.

    Parameters
    ----------
    distances : array, integer dtype
        ``δ = key position - query position`` (relattn's sign, T5's
        ``memory_position - context_position``), any shape; e.g.
        :func:`relative_distances` for one bucket per column of the relative
        layout.
    num_buckets : int, optional
        Number of buckets, ``>= 2`` (32 in T5).
    max_distance : int, optional
        Distances from ``max_distance`` on share the last bucket (128 in T5);
        more than ``n/2``, the distances that have a bucket each (``n`` the
        buckets of one direction).
    bidirectional : bool, optional
        ``True`` (encoder): half the buckets for ``δ <= 0``, half for ``δ > 0``.
        ``False`` (decoder): every bucket for ``δ <= 0``; ``δ > 0`` shares
        bucket 0.

    Returns
    -------
    array, shape of ``distances``, default integer dtype
        Buckets in ``[0, num_buckets)``.

    Raises
    ------
    ValueError
        If ``num_buckets < 2`` or ``max_distance <= n/2`` (``n`` the buckets
        of one direction), where the logarithmic spacing is undefined.
    TypeError
        If ``distances`` is not an integer array, or a parameter is not an
        integer (``bidirectional`` not a bool).

    See Also
    --------
    relative_bias_matrix : Expands the gathered per-bucket values to ``(Lq, Lk)``.
    relative_distances : The distance of each column of the relative layout.

    Notes
    -----
    Raffel et al. 2020, §2.1, as Mesh TensorFlow's ``_relative_position_bucket``
    computes it: with ``n = num_buckets / 2`` (bidirectional) or
    ``num_buckets``, ``a = |δ|`` or ``max(-δ, 0)`` and ``e = ⌊n/2⌋``, the
    bucket is ``a`` for ``a < e`` and
    ``min(n - 1, e + ⌊ln(a/e) / ln(max_distance/e) · (n - e)⌋)`` otherwise;
    bidirectional adds ``n`` for ``δ > 0``. The logarithm is taken in float64
    where the device has it.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import relative_position_bucket
    >>> d = xp.asarray([-200, -20, -3, 0, 3, 20, 200])
    >>> relative_position_bucket(d, num_buckets=8, max_distance=20)
    array([3, 3, 2, 0, 6, 7, 7])
    """
    xp = _distances(distances)
    num_buckets = _checks.length("num_buckets", num_buckets, minimum=2)
    bidirectional = _checks.flag("bidirectional", bidirectional)
    n = num_buckets // 2 if bidirectional else num_buckets
    exact = n // 2
    max_distance = _checks.length("max_distance", max_distance, minimum=1)
    if exact > 0 and max_distance <= exact:
        raise ValueError(
            f"max_distance must be > n/2 = {exact}, the distances with a bucket of their own "
            f"(n = {n} buckets per direction), got {max_distance}"
        )
    device = device_of(distances)
    integer = xpx.default_dtype(xp, "integral", device=device)
    delta = xp.astype(distances, integer) if distances.dtype != integer else distances
    zero = xp.zeros((), dtype=integer, device=device)
    if bidirectional:
        offset = xp.where(delta > 0, xp.full((), n, dtype=integer, device=device), zero)
        a = xp.abs(delta)
    else:
        offset = zero
        a = xp.maximum(-delta, zero)
    if exact == 0:
        return xp.asarray(offset + xp.minimum(a, xp.full((), n - 1, dtype=integer, device=device)))
    # The logarithmic buckets as integer thresholds: the k-th is the smallest a whose
    # bucket is exact + k. Found on the host in float64, so that the device needs no
    # logarithm (XLA's vectorised log is not correctly rounded, and a bucket boundary
    # that falls on a whole number would come out one bucket low).
    thresholds = xp.asarray(_t5_thresholds(n, exact, max_distance), dtype=integer, device=device)
    buckets = exact + _count_below(thresholds, a, "right", integer, xp)
    return xp.asarray(offset + xp.where(a < exact, a, buckets))


def _count_below(thresholds: Any, x: Any, side: str, dtype: Any, xp: Any) -> Any:
    """``searchsorted(thresholds, x, side)`` for ``x`` of any shape (Dask wants it 1-D)."""
    found = xp.searchsorted(thresholds, xp.reshape(x, (-1,)), side=side)
    return xp.reshape(xp.astype(found, dtype), x.shape)


def _t5_thresholds(n: int, exact: int, max_distance: int) -> list[int]:
    """The smallest ``a`` in each of T5's logarithmic buckets ``exact + 1 … n - 1`` (cached)."""

    def bucket(a: int) -> int:
        steps = math.log(a / exact) / math.log(max_distance / exact) * (n - exact)
        return min(n - 1, exact + math.floor(steps))

    key = (n, exact, max_distance)
    if key not in _T5_THRESHOLDS:
        found = [_first_reaching(bucket, target, exact) for target in range(exact + 1, n)]
        _T5_THRESHOLDS[key] = found
    return _T5_THRESHOLDS[key]


_T5_THRESHOLDS: dict[tuple[int, int, int], list[int]] = {}


def _first_reaching(bucket: Any, target: int, low: int) -> int:
    """The smallest integer ``a >= low`` with ``bucket(a) >= target`` (``bucket`` nondecreasing)."""
    high = max(low, 1)
    while bucket(high) < target:
        high *= 2
    while low < high:
        middle = (low + high) // 2
        if bucket(middle) >= target:
            high = middle
        else:
            low = middle + 1
    return low


def log_bucket_position(distances: Array, *, bucket_size: int, max_position: int) -> Array:
    """DeBERTa-v2's log-bucketed relative position: exact near 0, logarithmic beyond.

    Parameters
    ----------
    distances : array, integer dtype
        Relative positions, any shape and sign (DeBERTa passes query minus key,
        ``-δ``); the function is odd, so the sign passes through.
    bucket_size : int
        DeBERTa's ``position_buckets``, ``>= 2``; ``mid = bucket_size // 2``.
    max_position : int
        DeBERTa's ``max_relative_positions``, ``> mid + 1``.

    Returns
    -------
    array, shape of ``distances``, default integer dtype
        ``r`` itself where ``|r| <= mid``, else
        ``sign(r) · (mid + ⌈ln(|r|/mid) / ln((max_position - 1)/mid) · (mid - 1)⌉)``.
        Not bounded by ``±mid``: DeBERTa clips only when it indexes its table,
        ``clip(bucket + k, 0, 2k - 1)``.

    Raises
    ------
    ValueError
        If ``bucket_size < 2`` or ``max_position <= bucket_size // 2 + 1``.
    TypeError
        If ``distances`` is not an integer array or a parameter not an integer.

    See Also
    --------
    disentangled_attention : DeBERTa's attention, whose tables are indexed by it.
    relative_position_bucket : T5's buckets.

    Notes
    -----
    He et al. 2021 (DeBERTa), the v2 models' ``make_log_bucket_position``.
    The logarithm is taken in float64 where the device has it.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import log_bucket_position
    >>> log_bucket_position(xp.asarray([-300, -5, 0, 3, 10, 300]), bucket_size=8, max_position=64)
    array([-9, -5,  0,  3,  5,  9])
    """
    xp = _distances(distances)
    bucket_size = _checks.length("bucket_size", bucket_size, minimum=2)
    mid = bucket_size // 2
    max_position = _checks.length("max_position", max_position, minimum=1)
    if max_position <= mid + 1:
        raise ValueError(
            f"max_position must be > bucket_size // 2 + 1 = {mid + 1}, got {max_position}"
        )
    device = device_of(distances)
    integer = xpx.default_dtype(xp, "integral", device=device)
    r = xp.astype(distances, integer) if distances.dtype != integer else distances
    magnitude = xp.abs(r)
    # ceil(log(|r| / mid) / log((max_position - 1) / mid) · (mid - 1)) as the count of
    # integer thresholds below |r|, found on the host (no device logarithm; see
    # relative_position_bucket), up to the largest |r| the integer dtype holds.
    largest = int(xp.iinfo(integer).max)
    thresholds = xp.asarray(
        _log_thresholds(mid, max_position, largest), dtype=integer, device=device
    )
    log_position = mid + _count_below(thresholds, magnitude, "left", integer, xp)
    signed = xp.where(r < 0, -log_position, log_position)
    return xp.asarray(xp.where(magnitude <= mid, r, signed))


def _log_thresholds(mid: int, max_position: int, largest: int) -> list[int]:
    """``t_k``: the largest ``|r|`` (up to ``largest``) in log bucket ``mid + k``, ``k = 0, 1, …``.

    The bucket of ``|r| > mid`` is ``mid + ⌈f(|r|)⌉`` with ``f`` increasing from
    ``f(mid) = 0``, so it is ``mid`` plus the number of thresholds below ``|r|``.
    Computed once per ``(mid, max_position, largest)``.
    """
    key = (mid, max_position, largest)
    if key in _LOG_THRESHOLDS:
        return _LOG_THRESHOLDS[key]
    out: list[int] = []
    if mid > 1:  # with mid = 1 every |r| > 1 is in bucket 1

        def bucket(a: int) -> int:
            steps = math.log(a / mid) / math.log((max_position - 1) / mid) * (mid - 1)
            return mid + math.ceil(steps)

        a = mid
        while a < largest:
            following = _first_reaching(bucket, bucket(a) + 1, a)
            # Where ln((max_position - 1) / mid) < 1 a step of |r| can skip buckets: the
            # threshold then counts once per bucket skipped.
            out += [min(following - 1, largest)] * (bucket(following) - bucket(a))
            a = following
    _LOG_THRESHOLDS[key] = out
    return out


_LOG_THRESHOLDS: dict[tuple[int, int, int], list[int]] = {}


def alibi_slopes(
    num_heads: int, *, dtype: Any = None, device: Any = None, xp: Namespace = None
) -> Array:
    """ALiBi's head-specific slopes ``m_h``.

    Parameters
    ----------
    num_heads : int
        ``H >= 1``.
    dtype : dtype, optional
        Real floating dtype of the result (default: the library's default).
    device : device, optional
        Device of the result.
    xp : module, optional
        Array library of the result (default NumPy).

    Returns
    -------
    array of shape (H,)
        ``m_h = 2^(-8h/H)``, ``h = 1 … H``, for ``H`` a power of 2. Otherwise,
        with ``p`` the largest power of 2 at most ``H``: the ``p`` slopes
        ``2^(-8h/p)``, then ``2^(-8h/(2p))`` for ``h = 1, 3, 5, …``, the first
        ``H - p`` of them (the authors' code, BLOOM, MPT).

    Raises
    ------
    ValueError
        If ``num_heads < 1``.
    TypeError
        If ``num_heads`` is not an integer or ``dtype`` not a real floating
        dtype of the library.

    See Also
    --------
    relative_bias_matrix : Expands ``m_h · δ`` to ``(H, Lq, Lk)``.
    relative_distances : ``δ`` of each column of the causal layout.

    Notes
    -----
    Press et al. 2022, §3: "for 8 heads, the slopes are the geometric
    sequence 1/2¹, 1/2², …, 1/2⁸"; the bias of query ``i`` and key ``j`` is
    ``m_h · δ(i, j)`` (``δ <= 0`` in a causal model). A bidirectional encoder
    uses ``-m_h · |δ|`` over the full layout. BLOOM and MPT add ``m_h · j``,
    which differs by a constant per row and gives the same weights.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import alibi_slopes
    >>> alibi_slopes(4, xp=xp) * 256                   # 2^-2, 2^-4, 2^-6, 2^-8
    array([64., 16.,  4.,  1.])
    >>> alibi_slopes(3, xp=xp) * 256                   # 2^-4, 2^-8, then 2^-2
    array([16.,  1., 64.])
    """
    xp = _checks.creation_namespace(xp)
    heads = _checks.length("num_heads", num_heads)
    dtype = (
        xpx.default_dtype(xp, device=device) if dtype is None else _checks.dtype("dtype", dtype, xp)
    )
    power = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * h / power) for h in range(1, power + 1)]
    slopes += [2.0 ** (-8.0 * h / (2 * power)) for h in range(1, 2 * (heads - power), 2)]
    return xp.asarray(slopes, dtype=dtype, device=device)


def kerple_bias(distances: Array, r1: Array, r2: Array, *, kind: str) -> Array:
    """Kerple's per-head bias of each distance: ``-r1·log(1 + r2·|δ|)`` or ``-r1·|δ|^r2``.

    Parameters
    ----------
    distances : array, integer dtype
        ``δ = key position - query position``, any shape ``(...)``; e.g.
        :func:`relative_distances` for one value per column of the relative
        layout (the bias depends on ``|δ|`` only, so either sign convention
        gives the same values).
    r1, r2 : arrays of shape (H,), real floating
        The learned parameters of each head: ``r1 > 0`` and ``r2 > 0``, and
        ``r2 <= 2`` for the power form (the range where the kernel is
        conditionally positive definite). Gradients reach both.
    kind : {"log", "power"}
        The logarithmic or the power variant.

    Returns
    -------
    array of shape (H, ...), the promoted dtype of ``r1`` and ``r2``
        ``out[h, ...] = -r1[h]·log(1 + r2[h]·|δ|)`` (``"log"``) or
        ``-r1[h]·|δ|^r2[h]`` (``"power"``), ready for ``relative_bias=``.

    Raises
    ------
    ValueError
        If ``kind`` is neither ``"log"`` nor ``"power"``, or ``r1`` and ``r2``
        are not both of shape ``(H,)``.
    TypeError
        If ``distances`` is not an integer array, ``r1`` or ``r2`` not a real
        floating one, or they come from different libraries.

    See Also
    --------
    sandwich_bias : Sandwich's bias, also a function of ``δ``.
    relative_distances : ``δ`` of each column of the relative layout.
    scaled_dot_product_attention : Takes the values as ``relative_bias=``.

    Notes
    -----
    Chi et al. 2022 (KERPLE, NeurIPS), §4, the two practical choices of the
    shift-invariant conditionally positive definite kernel ``k̃(m, n)`` added
    to the scores: power ``-r1·|m - n|^r2`` (``r1 > 0``, ``0 < r2 <= 2``) and
    logarithmic ``-r1·log(1 + r2·|m - n|)`` (``r1, r2 > 0``); the authors'
    code computes the same with ``p = r1``, ``a = r2`` over the causal layout.
    The parameters are not clipped to their ranges (the authors clamp them
    after each step), with two exceptions that keep every value and gradient
    finite: in the log form ``r2 < 0`` counts as ``0`` (no logarithm of a
    negative number), and in the power form ``0^r2`` is ``0`` with zero
    gradient (no ``0·log 0``). A bidirectional model uses the full layout.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import kerple_bias, relative_distances
    >>> d = relative_distances(1, 4, causal=True, xp=xp)            # [-3, -2, -1, 0]
    >>> kerple_bias(d, xp.asarray([1.0]), xp.asarray([1.0]), kind="power")
    array([[-3., -2., -1.,  0.]])
    """
    xp = _checks.namespace(distances=distances, r1=r1, r2=r2)
    if not _checks.is_integer_dtype(xp, distances.dtype):
        raise TypeError(
            f"distances must be an integer array (relative positions), got dtype {distances.dtype}"
        )
    dtype = _checks.floating(xp, r1=r1, r2=r2)
    kind = _checks.choice("kind", kind, ("log", "power"))
    for name, r in (("r1", r1), ("r2", r2)):
        if r.ndim != 1:
            raise ValueError(f"{name} must have shape (H,), got shape {tuple(r.shape)}")
    if r2.shape != r1.shape:
        raise ValueError(
            f"r2 must have the shape of r1, (H,) = {tuple(r1.shape)}, got shape {tuple(r2.shape)}"
        )
    r1 = _checks.cast(xp, r1, dtype)
    r2 = _checks.cast(xp, r2, dtype)
    delta = _checks.cast_integer(xp, distances)
    device = device_of(r1)
    heads = (r1.shape[0],) + (1,) * delta.ndim
    scale = xp.reshape(r1, heads)
    exponent = xp.reshape(r2, heads)
    a = xp.abs(xp.astype(delta, dtype))[None, ...]
    zero = xp.zeros((), dtype=dtype, device=device)
    if kind == "log":
        return zero - scale * xp.log1p(xp.maximum(exponent, zero) * a)
    positive = a > 0
    base = xp.where(positive, a, xp.ones((), dtype=dtype, device=device))
    return zero - scale * xp.where(positive, xp.pow(base, exponent), zero)


def sandwich_bias(
    distances: Array, d_model: int, *, num_heads: int | None = None, dtype: Any = None
) -> Array:
    """Sandwich's bias: the inner product of two sinusoidal encodings, a function of ``δ``.

    Parameters
    ----------
    distances : array, integer dtype
        ``δ = key position - query position``, any shape ``(...)``; e.g.
        :func:`relative_distances` (the bias is even in ``δ``).
    d_model : int
        ``d'``, the width of the sinusoidal encodings: even, ``>= 2``.
    num_heads : int, optional
        ``H``: one compressed bias per head (the authors' implementation).
        ``None``: the inner product itself, one value per distance.
    dtype : dtype, optional
        Real floating dtype of the result (default: the library's default).

    Returns
    -------
    array of shape (...) or (H, ...)
        ``s(δ) = Σ_{k=1}^{d'/2} cos(δ / 10000^(2k/d'))`` (``num_heads=None``),
        else ``out[h-1, ...] = (s(δ) - d'/2) / (8h/H)``, ``h = 1 … H``: zero at
        ``δ = 0`` and negative elsewhere, compressed less in the later heads.

    Raises
    ------
    ValueError
        If ``d_model`` is odd or ``< 2``, or ``num_heads < 1``.
    TypeError
        If ``distances`` is not an integer array, ``d_model`` or ``num_heads``
        not an integer, or ``dtype`` not a real floating dtype of the library.

    See Also
    --------
    kerple_bias : Kerple's learned bias of ``|δ|``.
    sinusoidal_position_encoding : The encodings whose inner product this is.
    scaled_dot_product_attention : Takes the values as ``relative_bias=``.

    Notes
    -----
    Chi et al. 2023 (ACL), §5, Sandwich: the inner product of the sinusoidal
    encodings of positions ``m`` and ``n``, ``p_mᵀ p_n = Σ_{k=1}^{d'/2}
    cos((m - n) / 10000^(2k/d'))``, added to the scores with no learned
    parameter; the sum starts at ``k = 1``, as in the paper and in NeMo's
    ``SandwichRelativePositionEmbedding``. The per-head form is NeMo's (written
    with the authors): minus ``d'/2``, divided by ``8h/H``. Both the shift and
    the compression change each head's scores by a constant or a factor; the
    shift leaves the weights as they are. The angles are formed in float64
    where the device has it, then cast to ``dtype``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import sandwich_bias
    >>> d = xp.asarray([-300, -100, 0])
    >>> sandwich_bias(d, 4).round(4)                  # cos(δ/100) + cos(δ/10⁴)
    array([0.0096, 1.5403, 2.    ])
    >>> sandwich_bias(d, 4, num_heads=2).round(4)     # (s - 2) / 4, (s - 2) / 8
    array([[-0.4976, -0.1149,  0.    ],
           [-0.2488, -0.0575,  0.    ]])
    """
    xp = _distances(distances)
    d_model = _checks.length("d_model", d_model, minimum=2)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sine and cosine pairs), got {d_model}")
    heads = None if num_heads is None else _checks.length("num_heads", num_heads)
    device = device_of(distances)
    dtype = (
        xpx.default_dtype(xp, device=device) if dtype is None else _checks.dtype("dtype", dtype, xp)
    )
    work = _working_dtype(xp, device)
    frequencies = [10000.0 ** (-2.0 * k / d_model) for k in range(1, d_model // 2 + 1)]
    omega = xp.asarray(frequencies, dtype=work, device=device)
    angles = xp.astype(distances, work)[..., None] * omega
    inner = xp.sum(xp.cos(angles), axis=-1)
    if heads is None:
        return xp.astype(inner, dtype)
    shape = (heads,) + (1,) * distances.ndim
    compression = [8.0 * h / heads for h in range(1, heads + 1)]
    ratio = xp.reshape(xp.asarray(compression, dtype=work, device=device), shape)
    return xp.astype((inner[None, ...] - d_model / 2) / ratio, dtype)
