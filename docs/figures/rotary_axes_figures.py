"""Figures of the guide page on multimodal RoPE (``docs/guide/multimodal_rope.md``).

Called through matplotlib's ``plot`` directive (``.. plot:: rotary_axes_figures.py
mrope_sections``), like ``figures.py``. Each figure checks what it draws against the
formula it illustrates, so that it cannot drift from the library.
"""

from __future__ import annotations

import numpy as np
from matplotlib import pyplot as plt

from relattn.grid import grid_positions
from relattn.rotary_axes import (
    axial_rotary_embedding,
    mixed_rotary_embedding,
    mixed_rotary_frequencies,
    multimodal_rotary_embedding,
    rope_index,
)

IMAGE, VIDEO = 9, 10


def mrope_sections() -> None:
    """M-RoPE: the angle of each frequency pair over a text, image, text sequence.

    Left: the ``(t, h, w)`` ids of :func:`rope_index`. Right: ``cos`` of each pair's
    angle, read off M-RoPE's rotation of the unit vector ``e_k``; the sections
    ``[t | h | w]`` of ``mrope_section`` turn with their own axis.
    """
    ids = np.asarray([[1, 2, 3, IMAGE, *[IMAGE] * 5, 4, 5, 6]])
    positions, _ = rope_index(
        ids, image_token_id=IMAGE, video_token_id=VIDEO, image_grid_thw=np.asarray([[1, 4, 6]])
    )
    d, section, base = 32, [4, 6, 6], 10.0
    half = d // 2
    length = ids.shape[1]
    # cos of pair k's angle: rotate e_k (first half) and read feature k back.
    basis = np.zeros((half, length, d))
    basis[np.arange(half), :, np.arange(half)] = 1.0
    rotated = multimodal_rotary_embedding(basis, positions, mrope_section=section, base=base)
    cos = rotated[np.arange(half), :, np.arange(half)]  # (half, L)
    owner = np.repeat(np.arange(3), section)
    theta = base ** (-2.0 * np.arange(half) / d)
    expected = np.cos(positions[0][:, owner].T * theta[:, None])
    np.testing.assert_allclose(cos, expected, atol=1e-12)

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1, 1.6]}, layout="constrained"
    )
    kinds = ["text"] * 3 + ["image"] * 6 + ["text"] * 3
    for axis, (name, style) in enumerate(zip("thw", ["o-", "s--", "^:"], strict=True)):
        left.plot(positions[0, :, axis], style, label=name)
    left.set_xticks(range(length), kinds, rotation=90)
    left.set_ylabel("position id")
    left.set_title("rope_index: (t, h, w) per token")
    left.legend()
    im = right.imshow(cos, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    edges = np.cumsum(section)[:-1] - 0.5
    for edge in edges:
        right.axhline(edge, color="black", linewidth=1.5)
    for name, middle in zip("thw", np.cumsum(section) - np.asarray(section) / 2 - 0.5, strict=True):
        right.text(length - 0.4, middle, f" {name}", va="center", fontsize=12)
    right.set_xticks(range(length), kinds, rotation=90)
    right.set_ylabel("frequency pair k")
    right.set_title(f"cos(angle), mrope_section={section}")
    fig.colorbar(im, ax=right, shrink=0.8)


def rope_2d_patterns() -> None:
    """The score of the centre patch's query with every key of a 9x9 grid, ``q = k``:
    axial RoPE (rows and columns separable) and RoPE-Mixed (oblique, learned directions).
    Both depend on ``(Δrow, Δcol)`` only."""
    size, d = 9, 16
    positions = grid_positions(size, size)
    rng = np.random.default_rng(0)
    q = rng.normal(size=d)
    x = np.broadcast_to(q, (size * size, d))
    centre = (size // 2) * size + size // 2
    axial = axial_rotary_embedding(x, positions, layout="interleaved", base=10.0)
    freqs = mixed_rotary_frequencies(d, 1, base=10.0, angles=[0.6])
    mixed = mixed_rotary_embedding(x[None], positions[:, ::-1], freqs, layout="interleaved")[0]
    panels = []
    for name, rotated in (("axial RoPE", axial), ("RoPE-Mixed (φ = 0.6 rad)", mixed)):
        scores = (rotated @ rotated[centre]).reshape(size, size)
        # Toeplitz in both axes: a shifted query sees the shifted picture
        shifted = rotated @ rotated[centre + size + 1]
        np.testing.assert_allclose(
            shifted.reshape(size, size)[1:, 1:], scores[:-1, :-1], atol=1e-10
        )
        panels.append((name, scores))
    fig, axes = plt.subplots(1, 2, figsize=(8, 4), layout="constrained")
    limit = max(np.abs(s).max() for _, s in panels)
    for ax, (name, scores) in zip(axes, panels, strict=True):
        im = ax.imshow(scores, cmap="RdBu_r", vmin=-limit, vmax=limit)
        ax.plot(size // 2, size // 2, "k+", markersize=12)
        ax.set_title(name)
        ax.set_xlabel("key column")
        ax.set_ylabel("key row")
    fig.colorbar(im, ax=axes, shrink=0.8, label="q·k after rotation")
