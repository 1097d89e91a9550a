"""Sinusoidal position encodings (Vaswani et al. 2017, section 3.5)."""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import array_api_extra as xpx

from . import _checks

__all__ = ["sinusoidal_position_encoding"]

LAYOUTS = ("interleaved", "concatenated")


def _working_dtype(xp: Any, device: Any) -> Any:
    """float64 where the device has it: angles ``p·ω`` lose digits in float32."""
    floats = xp.__array_namespace_info__().dtypes(device=device, kind="real floating")
    return floats.get("float64", floats["float32"])


def sinusoidal_position_encoding(
    positions: Any,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: Any = None,
    device: Any = None,
    xp: Any = None,
) -> Any:
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
        negative count, ``base`` is not positive, or ``layout`` is unknown.
    TypeError
        If ``dtype`` is not real floating, ``positions`` is complex or boolean,
        or ``xp`` does not match the library of ``positions``.

    Notes
    -----
    Vaswani et al. 2017, section 3.5:

    .. math::

        PE(p, 2k) = \sin(p / b^{2k/d}), \qquad PE(p, 2k+1) = \cos(p / b^{2k/d}).

    Angles are formed in float64 where the device supports it, then cast to
    ``dtype``. For every offset ``k`` there is a fixed linear map (a 2×2
    rotation per frequency) taking ``PE(p)`` to ``PE(p + k)``, and
    ``PE(p + k)·PE(p)`` depends on ``k`` alone.

    Examples
    --------
    >>> import array_api_strict as xp
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
    if not base > 0:
        raise ValueError(f"base must be positive, got {base}")
    _checks.choice("layout", layout, LAYOUTS)
    if isinstance(positions, int) and not isinstance(positions, bool):
        xp = _checks.creation_namespace(xp)
        count = _checks.length("positions", positions, minimum=0)
        if dtype is None:
            dtype = xpx.default_dtype(xp, device=device)
        work = _working_dtype(xp, device)
        p = xp.arange(count, dtype=work, device=device)
    else:
        xp = _checks.creation_namespace(xp, positions=positions)
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
            device = array_api_compat.device(positions)
        if dtype is None:
            floating = xp.isdtype(positions.dtype, "real floating")
            dtype = positions.dtype if floating else xpx.default_dtype(xp, device=device)
        work = _working_dtype(xp, device)
        p = xp.astype(positions, work) if positions.dtype != work else positions
    if not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"dtype must be a real floating dtype, got {dtype}")

    # ω_k = base^(-2k/d), k = 0 … d/2 - 1
    k = xp.arange(d_model // 2, dtype=work, device=device)
    inv_freq = xp.exp(k * (-2.0 * math.log(base) / d_model))
    angle = p[:, None] * inv_freq[None, :]
    sin, cos = xp.sin(angle), xp.cos(angle)
    if layout == "interleaved":
        pe = xp.reshape(xp.stack((sin, cos), axis=-1), (p.shape[0], d_model))
    else:
        pe = xp.concat((sin, cos), axis=-1)
    return xp.astype(pe, dtype) if pe.dtype != dtype else pe
