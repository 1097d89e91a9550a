"""The demo: every position scheme over real text, on every backend, checked.

Byte tokens of a text (the Zen of Python by default) run through small
encoders with seeded random weights, one per scheme: absolute sinusoids
(Vaswani), Shaw's clipped relative representations, Transformer-XL with
segment memory, TENER, complex-order embeddings, DiSAN, T5's bucketed bias,
ALiBi, RoPE and DeBERTa's disentangled attention. Each backend runs the same
relattn code; the demo checks it against a NumPy float64 run and against the
same model computed naively (per-pair gathers, materialised relative tensors
and biases, per-pair rotations, unchunked logits), and times each segment.
``check=`` and ``check_segments=`` skip or shorten the two comparisons, and
``progress=True`` draws a progress bar per run on standard error.

The backends are those of :data:`relattn.backends.MODULES`, each run by
:func:`demo_target` on their GPU where they have one (:mod:`relattn.testing`).
"""

from .models import SCHEMES, Config, TransformerXLEncoder
from .runner import (
    CHECKS,
    TOLERANCES,
    WITH_MEMORY,
    byte_tokens,
    config_problem,
    demo,
    demo_target,
    exceeds,
    find_backends,
    progress_bar,
    read_text,
    run,
    zen_of_python,
)

__all__ = [
    "CHECKS",
    "SCHEMES",
    "TOLERANCES",
    "WITH_MEMORY",
    "Config",
    "TransformerXLEncoder",
    "byte_tokens",
    "config_problem",
    "demo",
    "demo_target",
    "exceeds",
    "find_backends",
    "progress_bar",
    "read_text",
    "run",
    "zen_of_python",
]
