"""Transformer-XL segment memory and gradient stopping."""

from __future__ import annotations

from . import _checks
from ._typing import Array
from .backends import backend_for

__all__ = ["stop_gradient", "update_memory"]


def stop_gradient(x: Array) -> Array:
    """The same values, cut from automatic differentiation.

    Parameters
    ----------
    x : array
        Any array, any dtype.

    Returns
    -------
    array
        ``x`` with no gradient flowing back through it: ``Tensor.detach`` for
        PyTorch, ``jax.lax.stop_gradient`` for JAX, ``x`` itself for libraries
        without autograd (NumPy, CuPy, Dask, array-api-strict).

    Raises
    ------
    TypeError
        If ``x`` is not an array.

    Notes
    -----
    ``SG(·)`` of Dai et al. 2019, section 3.2.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import stop_gradient
    >>> stop_gradient(xp.asarray([1.0, 2.0]))
    array([1., 2.])
    """
    xp = _checks.namespace(x=x)
    return backend_for(xp).stop_gradient(x)


def update_memory(memory: Array, hidden: Array, memory_length: int) -> Array:
    """New segment memory: the last ``M`` positions of ``[memory ∘ hidden]``, stop-gradient.

    Parameters
    ----------
    memory : array of shape (..., M_old, d) or None
        The previous memory of this layer (``None`` before the first segment).
    hidden : array of shape (..., L, d)
        This layer's input for the current segment, same leading shape and
        ``d`` as ``memory``.
    memory_length : int
        ``M >= 0``, the number of positions to keep.

    Returns
    -------
    array of shape (..., min(M, M_old + L), d)
        The most recent positions, oldest first, cut from autograd; dtype
        promoted from the inputs.

    Raises
    ------
    ValueError
        If the shapes differ except along the length axis, or
        ``memory_length`` is negative.
    TypeError
        If the inputs are not arrays of one library or ``memory_length`` is
        not an integer.

    Notes
    -----
    Dai et al. 2019, section 3.2: ``h̃ = [SG(m) ∘ h]``, and the cached memory
    for the next segment is the last ``M`` hidden states.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import update_memory
    >>> m = update_memory(None, xp.reshape(xp.arange(3.0), (3, 1)), 2)
    >>> update_memory(m, xp.asarray([[3.0]]), 2)[:, 0]
    array([2., 3.])
    """
    xp = _checks.namespace(hidden=hidden, optional={"memory": memory})
    keep = _checks.length("memory_length", memory_length, minimum=0)
    _checks.floating(xp, hidden=hidden, memory=memory)
    _checks.ndim("hidden", hidden, 2, "(..., L, d)")
    if memory is None:
        combined = hidden
    else:
        _checks.ndim("memory", memory, 2, "(..., M, d)")
        if memory.shape[:-2] != hidden.shape[:-2] or memory.shape[-1] != hidden.shape[-1]:
            raise ValueError(
                "memory and hidden must agree except along the length axis (-2), got "
                f"memory {tuple(memory.shape)} and hidden {tuple(hidden.shape)}"
            )
        dtype = _checks.floating(xp, memory=memory, hidden=hidden)
        combined = xp.concat(
            (_checks.cast(xp, memory, dtype), _checks.cast(xp, hidden, dtype)), axis=-2
        )
    total = combined.shape[-2]
    return backend_for(xp).stop_gradient(combined[..., total - min(keep, total) :, :])
