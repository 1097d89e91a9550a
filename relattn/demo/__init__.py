"""The demo: every position scheme over real text, on every backend, checked.

Byte tokens of a text (the Zen of Python by default) run through small
encoders with seeded random weights, one per scheme: absolute sinusoids
(Vaswani), Shaw's clipped relative representations, Transformer-XL with
segment memory, TENER, complex-order embeddings and DiSAN. Each backend runs
the same relattn code; the demo checks it against a NumPy float64 run and
against the same model computed naively (per-pair gathers, materialised
relative tensors, unchunked logits), and times each segment.
"""

from .models import SCHEMES, Config, TransformerXLEncoder
from .runner import (
    BACKENDS,
    TOLERANCES,
    available,
    byte_tokens,
    demo,
    exceeds,
    read_text,
    run,
    zen_of_python,
)

__all__ = [
    "BACKENDS",
    "SCHEMES",
    "TOLERANCES",
    "Config",
    "TransformerXLEncoder",
    "available",
    "byte_tokens",
    "demo",
    "exceeds",
    "read_text",
    "run",
    "zen_of_python",
]
