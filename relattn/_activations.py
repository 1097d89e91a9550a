"""Activations the array API standard lacks, written so they never overflow."""

from __future__ import annotations

from typing import Any

from ._namespace import device_of


def sigmoid(x: Any, xp: Any) -> Any:
    """``1 / (1 + exp(-x))`` as ``(1 + tanh(x/2)) / 2``: no overflow, finite gradient everywhere."""
    return 0.5 + 0.5 * xp.tanh(0.5 * x)


def elu(x: Any, xp: Any) -> Any:
    """``x`` for ``x > 0``, ``exp(x) - 1`` otherwise (Clevert et al. 2016, alpha = 1)."""
    zero = xp.zeros((), dtype=x.dtype, device=device_of(x))
    # expm1 sees x <= 0 only: the branch not taken never overflows, so its
    # gradient is 0 rather than 0 * inf = NaN.
    return xp.where(x > 0, x, xp.expm1(xp.where(x > 0, zero, x)))


def relu(x: Any, xp: Any) -> Any:
    """``max(x, 0)``."""
    return xp.maximum(x, xp.zeros((), dtype=x.dtype, device=device_of(x)))


def silu(x: Any, xp: Any) -> Any:
    """``x · sigmoid(x)`` (SiLU, swish; Elfwing et al. 2018)."""
    return x * sigmoid(x, xp)
