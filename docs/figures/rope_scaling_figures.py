"""The figure of the RoPE page's frequency scalings (``docs/guide/rope.md``), drawn by relattn.

Called through matplotlib's ``plot`` directive (``.. plot:: rope_scaling_figures.py
scaled_frequencies``), like ``figures.py``. It checks what it draws against the formulas
it illustrates, so that it cannot drift from the library.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib import pyplot as plt

from relattn import rope_frequencies

#: A 128-feature head, pretrained on 8192 positions, stretched 8 times.
DIM, BASE, ORIGINAL, FACTOR = 128, 500000.0, 8192, 8.0


def scaled_frequencies() -> None:
    """θ'_k / θ_k against the wavelength 2π/θ_k of each pair, for every scaling."""
    plain, _ = rope_frequencies(DIM, base=BASE)
    common = {"base": BASE, "factor": FACTOR, "original_max_position": ORIGINAL}
    scalings = {
        "linear (position interpolation)": rope_frequencies(
            DIM, base=BASE, scaling="linear", factor=FACTOR
        ),
        "dynamic NTK at 4× the context": rope_frequencies(
            DIM, scaling="dynamic", sequence_length=4 * ORIGINAL, **common
        ),
        "YaRN": rope_frequencies(DIM, scaling="yarn", **common),
        "llama3": rope_frequencies(
            DIM, scaling="llama3", low_freq_factor=1.0, high_freq_factor=4.0, **common
        ),
    }
    wavelength = 2 * math.pi / np.asarray(plain)
    # Position interpolation divides every frequency by the factor; llama3 keeps the
    # fast pairs (wavelength < L/4) and divides the slow ones (wavelength > L) by it.
    linear, _ = scalings["linear (position interpolation)"]
    np.testing.assert_allclose(np.asarray(linear), np.asarray(plain) / FACTOR, rtol=1e-12)
    llama3 = np.asarray(scalings["llama3"][0]) / np.asarray(plain)
    np.testing.assert_allclose(llama3[wavelength < ORIGINAL / 4], 1.0)
    np.testing.assert_allclose(llama3[wavelength > ORIGINAL], 1 / FACTOR)

    _, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
    for name, (theta, factor) in scalings.items():
        label = name if factor == 1.0 else f"{name} (attention factor {factor:.3f})"
        ax.plot(wavelength, np.asarray(theta) / np.asarray(plain), marker=".", label=label)
    ax.axvline(ORIGINAL, color="grey", linestyle=":", linewidth=1)
    ax.text(ORIGINAL, 1.02, " pretraining context", color="grey", fontsize=8, va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("wavelength of the pair, 2π/θ_k (positions)")
    ax.set_ylabel("θ'_k / θ_k")
    ax.set_title(f"RoPE frequency scalings: d = {DIM}, base {BASE:g}, {FACTOR:g}× of {ORIGINAL}")
    ax.legend(fontsize=8, loc="lower left")
