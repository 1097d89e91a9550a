"""The checks every patched ``transformers`` attention module runs before relattn's call."""

from __future__ import annotations

from typing import Any


def dropout_off(module: Any, p: float, field: str) -> None:
    """Raise where ``module`` trains with attention dropout ``p > 0`` (configuration ``field``)."""
    if module.training and p > 0:
        raise ValueError(
            f"{field} must be 0 in training: relattn has no attention dropout (set it to 0 or "
            f"call model.eval()), got {p}"
        )


def no_weights(output_attentions: Any) -> None:
    """Raise where the caller asks for the attention weights, which relattn never forms."""
    if output_attentions:
        raise ValueError("output_attentions must be False: relattn returns no attention weights")
