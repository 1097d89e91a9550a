"""Sinusoidal position encodings (Vaswani et al. 2017, section 3.5) and their frequencies.

Angles ``p·ω`` are formed in float64 where the device has it. Where it has not
(JAX without ``jax_enable_x64``, some accelerators) a float32 product would be
off by ``ulp(p·ω)``: ``1e-3`` rad near position ``1e5``, whole radians near
``1e8``. There the integer part of each position is split into base-256
digits, each digit's rotation ``exp(i·D·256^n·ω)`` is read from a table
computed on the host in float64 (with ``256^n·ω`` reduced modulo ``2π`` in
exact arithmetic), and the rotations are multiplied: float32 rounding of a few
unit complex products, whatever the position.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from typing import Any

import array_api_extra as xpx
import numpy as np

from . import _checks
from ._namespace import device_of, is_array
from ._typing import Array, Namespace

__all__ = ["inverse_frequencies", "sinusoidal_position_encoding"]

LAYOUTS = ("interleaved", "concatenated")

#: π to 60 digits, for reducing ``256^n·ω`` modulo 2π exactly enough.
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459")
#: Digits of the integer part of a position in the float32 path: base 256, 5 digits, |p| < 2^40.
_DIGIT_BASE = 256
_DIGITS = 5


def inverse_frequencies(
    count: int,
    *,
    base: float = 10000.0,
    endpoint: bool = False,
    dtype: Any = None,
    device: Any = None,
    xp: Namespace = None,
) -> Array:
    """Geometric frequencies ``ω_k = base^(-k/count)`` (or ``base^(-k/(count - 1))``).

    Parameters
    ----------
    count : int
        Number of frequencies ``n >= 0``: ``d_model / 2`` for a sinusoid,
        ``rotary_dim / 2`` for rotary embeddings.
    base : float, optional
        Wavelength base, ``> 0`` (10000 in Vaswani et al. and RoFormer).
    endpoint : bool, optional
        ``False``: ``ω_k = base^(-k/n)``, ``k = 0 … n-1`` (Vaswani et al.,
        Transformer-XL, RoFormer, LLaMA). ``True``: ``ω_k = base^(-k/(n-1))``,
        the last frequency exactly ``1/base`` (tensor2tensor's timing signal,
        fairseq, TENER's released code).
    dtype : dtype, optional
        Real floating dtype of the result (default: the library's default).
    device : device, optional
        Device of the result.
    xp : module, optional
        Array library of the result (default NumPy).

    Returns
    -------
    array of shape (count,)
        ``ω_k`` in radians per token position, decreasing from 1.

    Raises
    ------
    ValueError
        If ``count`` is negative or ``base`` not positive and finite.
    TypeError
        If ``count`` is not an integer, ``endpoint`` not a bool, ``dtype`` not
        a real floating dtype of the library, or ``xp`` not an array library.

    See Also
    --------
    sinusoidal_position_encoding : ``sin``/``cos`` of ``p·ω_k``.
    rotary_position_embedding : Rotations by ``p·ω_k``.

    Notes
    -----
    Vaswani et al. 2017, section 3.5: ``PE(p, 2k) = sin(p / base^(2k/d))``, so
    ``ω_k = base^(-2k/d) = base^(-k/(d/2))``. tensor2tensor's
    ``get_timing_signal_1d`` spaces ``log ω`` by ``log(base)/(n - 1)``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import inverse_frequencies
    >>> inverse_frequencies(2, base=100.0, xp=xp)
    array([1. , 0.1])
    >>> inverse_frequencies(3, base=100.0, endpoint=True, xp=xp)
    array([1.  , 0.1 , 0.01])
    """
    xp = _checks.creation_namespace(xp)
    values = _host_frequencies(
        _checks.length("count", count, minimum=0),
        _check_base(base),
        _checks.flag("endpoint", endpoint),
    )
    dtype = (
        xpx.default_dtype(xp, device=device) if dtype is None else _checks.dtype("dtype", dtype, xp)
    )
    return xp.asarray(values, dtype=dtype, device=device)


def _check_base(base: Any) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float, np.floating, np.integer)):
        raise TypeError(f"base must be a real number, got {type(base).__name__}")
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"base must be positive and finite, got {base}")
    return float(base)


def _host_frequencies(count: int, base: float, endpoint: bool) -> list[float]:
    """``ω_k`` as Python floats (float64)."""
    denominator = count - 1 if endpoint else count
    if denominator <= 0:
        return [1.0] * count
    step = -math.log(base) / denominator
    return [math.exp(k * step) for k in range(count)]


def _working_dtype(xp: Any, device: Any) -> Any:
    """float64 where the device has it, else float32."""
    floats = xp.__array_namespace_info__().dtypes(device=device, kind="real floating")
    return floats.get("float64", floats["float32"])


def _rotation_tables(frequencies: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``cos``, ``sin`` of ``D·256^n·ω_k`` for every digit ``D``, place ``n`` and frequency.

    Shape ``(_DIGITS, 256, len(frequencies))``, float64. ``256^n·ω`` is reduced
    modulo ``2π`` with 60-digit decimals (``ω`` itself is an exact float), so
    that ``D`` times it, at most ``256·2π``, keeps float64's precision.
    """
    key = frequencies
    found = _TABLES.get(key)
    if found is not None:
        return found
    with localcontext() as ctx:
        ctx.prec = 60
        two_pi = 2 * _PI
        reduced = np.array(
            [
                [float((Decimal(w) * _DIGIT_BASE**n) % two_pi) for w in frequencies]
                for n in range(_DIGITS)
            ]
        )
    digits = np.arange(_DIGIT_BASE, dtype=np.float64)[None, :, None]
    angle = digits * reduced[:, None, :]
    found = _TABLES[key] = (np.cos(angle), np.sin(angle))
    return found


_TABLES: dict[tuple[float, ...], tuple[np.ndarray, np.ndarray]] = {}


def _exact_angles(p: Any, frequencies: tuple[float, ...], work: Any, xp: Any, device: Any) -> Any:
    """``cos(p·ω)``, ``sin(p·ω)`` of shape ``(P, n)`` in ``work`` without forming ``p·ω``.

    ``|p| = whole + fraction``; the rotation of ``whole`` is the product of its
    base-256 digits' rotations (tables), that of ``fraction`` is computed
    directly (``fraction·ω < 1``). ``sin`` is odd: negative positions flip it.
    """
    cos_tables, sin_tables = _rotation_tables(frequencies)
    omega = xp.asarray(np.asarray(frequencies), dtype=work, device=device)
    if xp.isdtype(p.dtype, "integral"):
        magnitude = xp.abs(p)
        fraction = None
    else:
        magnitude = xp.abs(p)
        whole = xp.floor(magnitude)
        fraction = magnitude - whole
        magnitude = whole
    if fraction is None:
        cos = xp.ones((p.shape[0], len(frequencies)), dtype=work, device=device)
        sin = xp.zeros((p.shape[0], len(frequencies)), dtype=work, device=device)
    else:
        small = fraction[:, None] * omega[None, :]
        cos, sin = xp.cos(small), xp.sin(small)
    for n in range(_DIGITS):
        place = _DIGIT_BASE**n
        if xp.isdtype(magnitude.dtype, "integral"):
            if place > xp.iinfo(magnitude.dtype).max:
                break
            digit = (magnitude // place) % _DIGIT_BASE
        else:
            # Multiplying by a power of two is exact, and so is floor of the result.
            shifted = xp.floor(magnitude * (1.0 / place))
            digit = shifted - _DIGIT_BASE * xp.floor(shifted * (1.0 / _DIGIT_BASE))
            digit = xp.astype(digit, xp.int32)
        c = xp.take(xp.asarray(cos_tables[n], dtype=work, device=device), digit, axis=0)
        s = xp.take(xp.asarray(sin_tables[n], dtype=work, device=device), digit, axis=0)
        cos, sin = cos * c - sin * s, sin * c + cos * s
    negative = (p < 0)[:, None]
    return cos, xp.where(negative, -sin, sin)


def sinusoidal_position_encoding(
    positions: Array,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    frequencies: Array = None,
    dtype: Any = None,
    device: Any = None,
    xp: Namespace = None,
) -> Array:
    r"""Sinusoidal encoding of positions (absolute or relative).

    Parameters
    ----------
    positions : int or array of shape (P,)
        An integer ``n`` encodes positions ``0 … n-1``; a 1-D real or integer
        array encodes the positions it holds (any reals, negative ones too,
        e.g. relative distances). Unit: token positions.
    d_model : int
        Width of the encoding; must be even.
    base : float, optional
        Wavelength base, 10000 in the paper. Wavelengths run from ``2π`` to
        ``2π·base``.
    layout : {"interleaved", "concatenated"}, optional
        ``"interleaved"``: column ``2k`` is the sine and ``2k+1`` the cosine of
        frequency ``k`` (the formula as written; Vaswani, ESPnet).
        ``"concatenated"``: all sines, then all cosines (Transformer-XL, TENER,
        fairseq).
    frequencies : array of shape (d_model/2,), real floating, optional
        ``ω_k`` in radians per position, replacing ``base^(-2k/d)``: e.g.
        ``inverse_frequencies(d_model // 2, endpoint=True)`` for
        tensor2tensor's and fairseq's spacing. Same library as ``positions``
        (or ``xp``).
    dtype : dtype, optional
        Real floating result dtype. Default: the dtype of a floating
        ``positions`` array, else the namespace's default floating dtype.
    device : device, optional
        Device of the result. Default: that of ``positions``, else the
        library's default.
    xp : module, optional
        Array library for an integer ``positions`` (``numpy``, ``torch``,
        ``jax.numpy``, ``cupy``, ``dask.array``, ``array_api_strict`` or an
        array-API namespace). Default: the library of ``positions``, else NumPy.

    Returns
    -------
    array of shape (P, d_model)
        The encodings, one row per position.

    Raises
    ------
    ValueError
        If ``d_model`` is odd or not positive, ``positions`` is not 1-D or a
        negative count, ``base`` is not positive, ``frequencies`` has the
        wrong shape, or ``layout`` is unknown.
    TypeError
        If ``dtype`` is not a real floating dtype of the library,
        ``positions`` is complex or boolean, ``frequencies`` is not a real
        floating array, or ``xp`` does not match the library of
        ``positions``.

    See Also
    --------
    inverse_frequencies : The frequencies ``ω_k``.
    relative_distances : Relative positions to encode (Transformer-XL, TENER).
    rotary_position_embedding : The same frequencies applied as rotations.

    Notes
    -----
    Vaswani et al. 2017, section 3.5:

    .. math::

        PE(p, 2k) = \sin(p / b^{2k/d}), \qquad PE(p, 2k+1) = \cos(p / b^{2k/d}).

    Angles are formed in float64 where the device supports it, then cast to
    ``dtype``. Without float64 (JAX without x64), the angles of the integer
    part of each position are built from exact per-digit rotations (see the
    module notes), so positions up to ``2^40`` keep float32 accuracy; given
    ``frequencies`` are used as they are, in the working precision. For
    every offset ``k`` there is a fixed linear map (a 2×2 rotation per
    frequency) taking ``PE(p)`` to ``PE(p + k)``, and ``PE(p + k)·PE(p)``
    depends on ``k`` alone.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import sinusoidal_position_encoding
    >>> pe = sinusoidal_position_encoding(3, 4, xp=xp)
    >>> pe.shape
    (3, 4)
    >>> [round(float(v), 4) for v in pe[1, :]]
    [0.8415, 0.5403, 0.01, 1.0]
    """
    d_model = _checks.length("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sine and cosine pairs), got {d_model}")
    base = _check_base(base)
    _checks.choice("layout", layout, LAYOUTS)
    if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
        xp = _checks.creation_namespace(xp, frequencies=frequencies)
        count = _checks.length("positions", positions, minimum=0)
        if device is None and frequencies is not None:
            device = device_of(frequencies)
        work = _working_dtype(xp, device)
        p = xp.arange(count, device=device)  # integers: exact in every path
        if dtype is None:
            dtype = xpx.default_dtype(xp, device=device)
    else:
        if isinstance(positions, float) or not is_array(positions):
            raise TypeError(
                "positions must be an array or an integer count, "
                f"got {'None' if positions is None else type(positions).__name__}"
            )
        xp = _checks.creation_namespace(xp, positions=positions, frequencies=frequencies)
        if positions.ndim != 1:
            raise ValueError(
                "positions must be an integer count or a 1-D array, "
                f"got shape {tuple(positions.shape)}"
            )
        if not xp.isdtype(positions.dtype, ("real floating", "integral")):
            raise TypeError(
                f"positions must be a real or integer array, got dtype {positions.dtype}"
            )
        if device is None:
            device = device_of(positions)
        if dtype is None:
            floating = xp.isdtype(positions.dtype, "real floating")
            dtype = positions.dtype if floating else xpx.default_dtype(xp, device=device)
        work = _working_dtype(xp, device)
        p = positions
    _checks.dtype("dtype", dtype, xp)
    half = d_model // 2
    if frequencies is not None:
        _checks.floating(xp, frequencies=frequencies)
        _checks.exact_shape("frequencies", frequencies, (half,), "(d_model/2,)")
    omega = tuple(_host_frequencies(half, base, False)) if frequencies is None else frequencies
    sin, cos = _sin_cos(p, omega, work, xp, device)
    if layout == "interleaved":
        pe = xp.reshape(xp.stack((sin, cos), axis=-1), (p.shape[0], d_model))
    else:
        pe = xp.concat((sin, cos), axis=-1)
    return xp.astype(pe, dtype) if pe.dtype != dtype else pe


def _sin_cos(p: Any, omega: Any, work: Any, xp: Any, device: Any) -> tuple[Any, Any]:
    """``sin(p·ω)``, ``cos(p·ω)`` of shape ``(P, len(ω))`` in ``work``; ``ω`` host floats
    (a tuple: exact per-digit angles where ``work`` is not float64) or an array."""
    if isinstance(omega, tuple):
        if work != xp.float64:
            cos, sin = _exact_angles(p, omega, work, xp, device)
            return sin, cos
        omega = xp.asarray(omega, dtype=work, device=device)
    elif omega.dtype != work:
        omega = xp.astype(omega, work)
    positions = xp.astype(p, work) if p.dtype != work else p
    angle = positions[:, None] * omega[None, :]
    return xp.sin(angle), xp.cos(angle)
