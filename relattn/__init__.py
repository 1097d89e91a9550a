"""relattn: attention with position information, written once for every array library.

Every function takes and returns arrays of the caller's library (NumPy, CuPy,
PyTorch, JAX, Dask, array-api-strict …), on the caller's device, in the
caller's dtype. See ``README.md`` for the conventions: relative distance
``δ = j - i`` (key minus query), the relative layout, and boolean masks with
``True`` = may attend.
"""

from .attention import masked_softmax, relative_attention, scaled_dot_product_attention
from .encodings import sinusoidal_position_encoding
from .heads import merge_heads, split_heads
from .masks import (
    backward_mask,
    causal_mask,
    diagonal_disabled_mask,
    forward_mask,
    local_window_mask,
    mask_to_bias,
    padding_mask,
)
from .memory import stop_gradient, update_memory
from .positions import relative_distances, relative_positions, relative_table
from .scores import relative_scores
from .shift import rel_shift, rel_unshift

__version__ = "0.1.0"

__all__ = [
    "backward_mask",
    "causal_mask",
    "diagonal_disabled_mask",
    "forward_mask",
    "local_window_mask",
    "mask_to_bias",
    "masked_softmax",
    "merge_heads",
    "padding_mask",
    "rel_shift",
    "rel_unshift",
    "relative_attention",
    "relative_distances",
    "relative_positions",
    "relative_scores",
    "relative_table",
    "scaled_dot_product_attention",
    "sinusoidal_position_encoding",
    "split_heads",
    "stop_gradient",
    "update_memory",
]
