"""relattn: attention with position information, written once for every array library.

Every function takes and returns arrays of the caller's library (NumPy, CuPy,
PyTorch, JAX, Dask, array-api-strict …), on the caller's device, in the
caller's dtype. See ``README.md`` for the conventions: relative distance
``δ = j - i`` (key minus query), the relative layout, and boolean masks with
``True`` = may attend.
"""

from ._config import config
from .attention import masked_softmax, relative_attention, scaled_dot_product_attention
from .biases import (
    alibi_slopes,
    kerple_bias,
    log_bucket_position,
    relative_bias_matrix,
    relative_position_bucket,
    sandwich_bias,
)
from .blocks import BlockState, attention_block, finish_block_state, merge_block_states
from .complex_order import complex_attention, complex_linear, complex_order_embedding
from .cope import cope_bias
from .decomposed import (
    decomposed_relative_attention,
    decomposed_relative_terms,
    resize_relative_table,
)
from .disan import multi_dimensional_attention, source2token_attention
from .disentangled import disentangled_attention
from .encodings import inverse_frequencies, sinusoidal_position_encoding
from .grid import (
    continuous_position_bias,
    continuous_position_coordinates,
    grid_bias_mod,
    grid_positions,
    grid_relative_bias,
    grid_relative_index,
    shifted_window_mask,
    window_merge,
    window_partition,
)
from .heads import merge_heads, split_heads
from .learned_positions import (
    dynamic_position_bias,
    fire_bias,
    fire_score_mod,
)
from .local import local_p_weights, predicted_positions
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
from .plan import explain
from .positions import relative_distances, relative_positions, relative_table
from .ring import ring_attention, zigzag_shard, zigzag_unshard
from .rope_scaling import rope_frequencies
from .rotary import rotary_position_embedding
from .rotary_axes import (
    axial_rotary_embedding,
    mixed_rotary_embedding,
    mixed_rotary_frequencies,
    multimodal_rotary_embedding,
    rope_index,
)
from .scores import (
    additive_scores,
    bilinear_scores,
    cosine_scores,
    dot_product_scores,
    location_scores,
    relative_scores,
    scaled_dot_product_scores,
)
from .shaw import shaw_attention
from .shift import rel_shift, rel_unshift
from .ulysses import ulysses_attention
from .xpos import xpos_embedding

__version__ = "0.2.0"

__all__ = [
    "BlockState",
    "additive_scores",
    "alibi_slopes",
    "attention_block",
    "axial_rotary_embedding",
    "backward_mask",
    "bilinear_scores",
    "causal_mask",
    "complex_attention",
    "complex_linear",
    "complex_order_embedding",
    "config",
    "continuous_position_bias",
    "continuous_position_coordinates",
    "cope_bias",
    "cosine_scores",
    "decomposed_relative_attention",
    "decomposed_relative_terms",
    "diagonal_disabled_mask",
    "disentangled_attention",
    "dot_product_scores",
    "dynamic_position_bias",
    "explain",
    "finish_block_state",
    "fire_bias",
    "fire_score_mod",
    "forward_mask",
    "grid_bias_mod",
    "grid_positions",
    "grid_relative_bias",
    "grid_relative_index",
    "inverse_frequencies",
    "kerple_bias",
    "local_p_weights",
    "local_window_mask",
    "location_scores",
    "log_bucket_position",
    "mask_to_bias",
    "masked_softmax",
    "merge_block_states",
    "merge_heads",
    "mixed_rotary_embedding",
    "mixed_rotary_frequencies",
    "multi_dimensional_attention",
    "multimodal_rotary_embedding",
    "padding_mask",
    "predicted_positions",
    "rel_shift",
    "rel_unshift",
    "relative_attention",
    "relative_bias_matrix",
    "relative_distances",
    "relative_position_bucket",
    "relative_positions",
    "relative_scores",
    "relative_table",
    "resize_relative_table",
    "ring_attention",
    "rope_frequencies",
    "rope_index",
    "rotary_position_embedding",
    "sandwich_bias",
    "scaled_dot_product_attention",
    "scaled_dot_product_scores",
    "shaw_attention",
    "shifted_window_mask",
    "sinusoidal_position_encoding",
    "source2token_attention",
    "split_heads",
    "stop_gradient",
    "ulysses_attention",
    "update_memory",
    "window_merge",
    "window_partition",
    "xpos_embedding",
    "zigzag_shard",
    "zigzag_unshard",
]
