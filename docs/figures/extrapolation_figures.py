"""The figure of the extrapolation guide page, drawn at build time from relattn itself.

``.. plot:: extrapolation_figures.py extrapolation_bias`` (matplotlib's ``plot``
directive, as ``figures.py``'s figures are drawn).
"""

from __future__ import annotations

import numpy as np
from matplotlib import pyplot as plt

import relattn
from relattn.learned_positions import dynamic_position_bias, fire_bias


def _fire_layers() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A FIRE MLP, 1 → 4 → 1 with ReLU, set by hand to a decreasing, saturating curve of
    the normalised distance ``x ∈ [0, 1]`` (a trained one is learned)."""
    w1 = np.array([[1.0, 1.0, 1.0, 1.0]])
    b1 = np.array([0.0, -0.25, -0.5, -0.75])
    w2 = np.array([[-4.0], [-2.0], [-1.0], [1.0]])
    return [w1, w2], [b1, np.array([0.0])]


def extrapolation_bias() -> None:
    """Left: the fixed and parametric biases of the distance (ALiBi, Kerple, Sandwich).
    Right: FIRE at two query positions (its input is the distance over the query's
    position, so a longer context stretches the same curve) and a dynamic position bias."""
    _, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    distances = relattn.relative_distances(1, 129, causal=True, xp=np)  # δ = -128 … 0
    x = -distances
    alibi = relattn.alibi_slopes(8, xp=np)[2] * distances
    log = relattn.kerple_bias(distances, np.array([1.0]), np.array([0.5]), kind="log")[0]
    power = relattn.kerple_bias(distances, np.array([0.5]), np.array([0.6]), kind="power")[0]
    sandwich = relattn.sandwich_bias(distances, 128, num_heads=8)[3]
    for values, label in (
        (alibi, "ALiBi, head 3 of 8: $m\\,\\delta$"),
        (log, "Kerple log: $-r_1\\log(1 + r_2|\\delta|)$"),
        (power, "Kerple power: $-r_1|\\delta|^{r_2}$"),
        (sandwich, "Sandwich, head 4 of 8 ($d' = 128$)"),
    ):
        left.plot(x, values, label=label)
    left.set_xlabel("distance to the key, $i - j$")
    left.set_ylabel("bias added to the score")
    left.set_title("functions of the distance")
    left.legend(fontsize=8)

    weights, biases = _fire_layers()
    for query in (32, 128):
        keys = np.arange(query + 1)
        values = fire_bias(np.array([query]), keys, weights, biases, 0.5, 16.0)[0, 0]
        right.plot(query - keys, values, label=f"FIRE, query at $i = {query}$")
    rng = np.random.default_rng(0)
    w = [rng.normal(size=(1, 16)), rng.normal(size=(16, 16)) / 4, rng.normal(size=(16, 1)) / 4]
    b = [rng.normal(size=16), np.zeros(16), np.zeros(1)]
    dynamic = dynamic_position_bias(-distances, w, b, log_distance=True)[0]
    right.plot(x, dynamic - dynamic[-1], label="dynamic position bias (random MLP, log)")
    right.set_xlabel("distance to the key, $i - j$")
    right.set_title("learned functions (MLPs)")
    right.legend(fontsize=8)
