"""Recipe 6: complex-order embeddings with complex attention (Wang et al. 2020).

Each word of a small vocabulary has an amplitude, a frequency and an initial
phase per dimension; a token at position ``pos`` is embedded as
``r ⊙ exp(i(ω·pos + θ))``. Complex linear maps give queries, keys and values,
and complex attention turns them into a complex output, with both named
variants: the Hermitian real part ``Re(q·k̄)`` (the relative variant) and the
authors' modulus ``|q·k|`` (no conjugation).

Run ``python examples/complex_order.py`` to see it on NumPy; ``run(xp)`` takes
any array library (``numpy``, ``torch``, ``jax.numpy``, ``array_api_strict`` …).
"""

from __future__ import annotations

import array_api_compat
import numpy as np

from relattn import complex_attention, complex_linear, complex_order_embedding

VOCAB, D_MODEL = 10, 4
TOKENS = [3, 1, 4, 1, 5, 9]  # the same word (1) at positions 1 and 3


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """The recipe's parameters and tokens as NumPy arrays (float64, complex128, int64)."""
    rng = np.random.default_rng(seed)

    def complex_weight() -> np.ndarray:
        # Real and imaginary parts N(0, 1/(2 d)): unit-scale outputs.
        parts = rng.normal(scale=(2 * D_MODEL) ** -0.5, size=(2, D_MODEL, D_MODEL))
        return parts[0] + 1j * parts[1]

    return {
        "tokens": np.asarray(TOKENS),
        "positions": np.arange(len(TOKENS), dtype=np.float64),
        "amplitude": rng.uniform(0.5, 1.5, size=(VOCAB, D_MODEL)),
        "frequency": rng.normal(scale=0.5, size=(VOCAB, D_MODEL)),
        "phase": rng.uniform(-np.pi, np.pi, size=(VOCAB, D_MODEL)),
        "w_q": complex_weight(),
        "w_k": complex_weight(),
        "w_v": complex_weight(),
    }


def run(xp, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Embed, project and attend with ``xp``'s arrays; results as float64 NumPy arrays."""
    a = {name: xp.asarray(value) for name, value in inputs(seed).items()}
    xp = array_api_compat.array_namespace(a["tokens"])  # the standard API of that library

    # Gather each token's amplitude, frequency and phase: (L, d) each.
    r, w, theta = (
        xp.take(a[name], a["tokens"], axis=0) for name in ("amplitude", "frequency", "phase")
    )
    x = complex_order_embedding(r, w, theta, a["positions"])  # complex (L, d)

    q, k, v = (complex_linear(x, a[name]) for name in ("w_q", "w_k", "w_v"))
    relative = complex_attention(q, k, v, conjugate=True, reduction="real")
    authors = complex_attention(q, k, v, conjugate=False, reduction="modulus")

    out = {}
    for name, z in (("embedding", x), ("relative", relative), ("modulus", authors)):
        z = np.asarray(z)
        out[f"{name}_real"] = np.asarray(z.real, dtype=np.float64)
        out[f"{name}_imag"] = np.asarray(z.imag, dtype=np.float64)
    return out


if __name__ == "__main__":
    results = run(np)
    for name in ("relative", "modulus"):
        z = results[f"{name}_real"] + 1j * results[f"{name}_imag"]
        print(f"{name:9s} output {z.shape}, first token: {np.round(z[0], 3)}")
