"""Boolean attention masks (``True`` = may attend) and additive biases.

Masks are ``(Lq, Lk)`` with entry ``[i, j]`` for query ``i`` and key ``j``,
broadcastable against scores ``(..., Lq, Lk)``: the polarity of
``torch.nn.functional.scaled_dot_product_attention``'s boolean ``attn_mask``
and ``jax.nn.dot_product_attention``'s ``mask``.
"""

from __future__ import annotations

from typing import Any

from . import _checks
from ._namespace import device_of
from ._typing import Array, Namespace
from .backends import backend_for
from .positions import relative_positions

__all__ = [
    "backward_mask",
    "causal_mask",
    "diagonal_disabled_mask",
    "forward_mask",
    "local_window_mask",
    "mask_to_bias",
    "padding_mask",
]


def causal_mask(
    query_length: int,
    key_length: int,
    *,
    query_start: Any = 0,
    key_start: Any = 0,
    offset: Any = None,
    xp: Namespace = None,
    device: Any = None,
) -> Array:
    """Sequence mask: each query sees the keys at or before its own position.

    Parameters
    ----------
    query_length, key_length : int
        ``Lq`` and ``Lk >= 0``; with ``Lk > Lq`` the first ``Lk - Lq`` keys are
        memory, visible to every query.
    query_start, key_start, offset : int or 0-d integer array, optional
        A block of a larger problem, as in :func:`relative_positions`
        (traced integers are allowed under a jit).
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (Lq, Lk), bool
        ``True`` where ``δ(i, j) = j - (i + Lk - Lq) <= 0``.

    Raises
    ------
    ValueError
        If a length or start is negative.
    TypeError
        If a length or start is not an integer.

    See Also
    --------
    relative_positions : The distances ``δ(i, j)``.
    padding_mask : Keys beyond each sequence's length.

    Notes
    -----
    Vaswani et al. 2017, section 3.2.3 (decoder self-attention); with memory,
    Dai et al. 2019, section 3.2 (key ``j`` visible to query ``i`` when
    ``j <= i + M``).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import causal_mask
    >>> causal_mask(2, 3, xp=xp)
    array([[ True,  True, False],
           [ True,  True,  True]])
    >>> causal_mask(2, 2, query_start=0, key_start=2, offset=0, xp=xp)   # a block above it
    array([[False, False],
           [False, False]])
    """
    delta = relative_positions(
        query_length, key_length, query_start=query_start, key_start=key_start, offset=offset,
        xp=xp, device=device,
    )  # fmt: skip
    return delta <= 0


def local_window_mask(
    query_length: int, key_length: int, window: int, *, xp: Namespace = None, device: Any = None
) -> Array:
    """Local attention: each query sees the keys within ``window`` of it.

    Parameters
    ----------
    query_length, key_length : int
        ``Lq`` and ``Lk >= 1``, aligned as in :func:`relattn.relative_positions`.
    window : int
        Half-width ``D >= 0``, in token positions.
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (Lq, Lk), bool
        ``True`` where ``|δ(i, j)| <= window``.

    Raises
    ------
    ValueError
        If a length is below 1 or ``window`` is negative.
    TypeError
        If a length or ``window`` is not an integer.

    Notes
    -----
    Luong et al. 2015, section 3.2 (local-m: the window ``[p_t - D, p_t + D]``
    centred on the aligned position).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import local_window_mask
    >>> local_window_mask(3, 3, 1, xp=xp)
    array([[ True,  True, False],
           [ True,  True,  True],
           [False,  True,  True]])
    """
    window = _checks.length("window", window, minimum=0)
    xp = _checks.creation_namespace(xp)
    delta = relative_positions(query_length, key_length, xp=xp, device=device)
    return xp.abs(delta) <= window


def _square(length: int, xp: Any, device: Any) -> Any:
    return relative_positions(length, length, xp=xp, device=device)


def forward_mask(length: int, *, xp: Namespace = None, device: Any = None) -> Array:
    """DiSAN's forward mask: each query sees the strictly earlier keys.

    Parameters
    ----------
    length : int
        Sequence length ``L >= 1``.
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (L, L), bool
        ``True`` where key ``j < i`` (query ``i``). Row 0 is all ``False``.

    Raises
    ------
    ValueError
        If ``length`` is below 1.
    TypeError
        If ``length`` is not an integer.

    Notes
    -----
    Shen et al. 2018 (DiSAN), eq. (10)–(11), in relattn's ``[query, key]``
    orientation as in the authors' code (query row, key column).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import forward_mask
    >>> forward_mask(3, xp=xp)
    array([[False, False, False],
           [ True, False, False],
           [ True,  True, False]])
    """
    xp = _checks.creation_namespace(xp)
    return _square(_checks.length("length", length, minimum=0), xp, device) < 0


def backward_mask(length: int, *, xp: Namespace = None, device: Any = None) -> Array:
    """DiSAN's backward mask: each query sees the strictly later keys.

    Parameters
    ----------
    length : int
        Sequence length ``L >= 1``.
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (L, L), bool
        ``True`` where key ``j > i`` (query ``i``). The last row is all
        ``False``.

    Raises
    ------
    ValueError
        If ``length`` is below 1.
    TypeError
        If ``length`` is not an integer.

    Notes
    -----
    Shen et al. 2018 (DiSAN), eq. (12), in relattn's ``[query, key]``
    orientation.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import backward_mask
    >>> backward_mask(3, xp=xp)
    array([[False,  True,  True],
           [False, False,  True],
           [False, False, False]])
    """
    xp = _checks.creation_namespace(xp)
    return _square(_checks.length("length", length, minimum=0), xp, device) > 0


def diagonal_disabled_mask(length: int, *, xp: Namespace = None, device: Any = None) -> Array:
    """DiSAN's diag-disabled mask: each query sees every key but itself.

    Parameters
    ----------
    length : int
        Sequence length ``L >= 1``.
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (L, L), bool
        ``True`` where ``i != j``.

    Raises
    ------
    ValueError
        If ``length`` is below 1.
    TypeError
        If ``length`` is not an integer.

    Notes
    -----
    Shen et al. 2018 (DiSAN), eq. (9).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import diagonal_disabled_mask
    >>> diagonal_disabled_mask(2, xp=xp)
    array([[False,  True],
           [ True, False]])
    """
    xp = _checks.creation_namespace(xp)
    return _square(_checks.length("length", length, minimum=0), xp, device) != 0


def padding_mask(lengths: Array, max_length: int) -> Array:
    """Key padding mask from per-sequence lengths.

    Parameters
    ----------
    lengths : array of shape (B,), integer dtype
        Number of real tokens in each sequence, ``0 <= lengths[b]``; a length
        beyond ``max_length`` marks the whole row real.
    max_length : int
        Padded length ``L >= 0``.

    Returns
    -------
    array of shape (B, max_length), bool
        ``True`` for real tokens (position ``< lengths[b]``), ``False`` for
        padding. As a key mask for scores ``(B, H, Lq, Lk)``, index it as
        ``mask[:, None, None, :]``.

    Raises
    ------
    ValueError
        If ``lengths`` is not 1-D, ``max_length`` is negative, or (when the
        values can be read, i.e. outside a jit trace or lazy graph) a length is
        negative.
    TypeError
        If ``lengths`` is not an integer array or ``max_length`` not an integer.

    Notes
    -----
    Vaswani et al. 2017: padded keys take no part in attention.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import padding_mask
    >>> padding_mask(xp.asarray([1, 3]), 3)
    array([[ True, False, False],
           [ True,  True,  True]])
    """
    xp = _checks.namespace(lengths=lengths)
    max_length = _checks.length("max_length", max_length, minimum=0)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must have shape (B,), got shape {tuple(lengths.shape)}")
    if not xp.isdtype(lengths.dtype, "integral"):
        raise TypeError(f"lengths must have an integer dtype, got {lengths.dtype}")
    if backend_for(xp).has_values(lengths) and lengths.shape[0] > 0:
        smallest = int(xp.min(lengths))
        if smallest < 0:
            raise ValueError(f"lengths must be >= 0, got a length of {smallest}")
    positions = xp.arange(max_length, dtype=lengths.dtype, device=device_of(lengths))
    return positions[None, :] < lengths[:, None]


def mask_to_bias(mask: Array, *, dtype: Any) -> Array:
    """Additive bias from a boolean mask: 0 where allowed, a large negative elsewhere.

    Parameters
    ----------
    mask : array, bool
        ``True`` = may attend; any shape.
    dtype : dtype
        Real floating dtype of the bias, from the mask's library.

    Returns
    -------
    array, shape of ``mask``, ``dtype``
        ``0`` where ``mask`` is ``True``, else half the most negative finite
        value of ``dtype`` (``-inf`` never appears, so two such biases can be
        added, even in float16 or bfloat16, without overflow).

    Raises
    ------
    TypeError
        If ``mask`` is not boolean or ``dtype`` is not real floating.

    Notes
    -----
    Added to the scores before the softmax (Vaswani et al. 2017, section
    3.2.3). A row whose every key is masked this way gets uniform weights, not
    zeros: pass the mask itself to :func:`relattn.masked_softmax` for exact
    zeros.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import mask_to_bias
    >>> mask_to_bias(xp.asarray([True, False]), dtype=xp.float32)
    array([ 0.0000000e+00, -1.7014117e+38], dtype=float32)
    """
    xp = _checks.namespace(mask=mask)
    _checks.boolean("mask", mask, xp)
    _checks.dtype("dtype", dtype, xp)
    device = device_of(mask)
    zero = xp.zeros((), dtype=dtype, device=device)
    blocked = xp.full((), xp.finfo(dtype).min / 2, dtype=dtype, device=device)
    return xp.where(mask, zero, blocked)
