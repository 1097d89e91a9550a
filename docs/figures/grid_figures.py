"""Figures of the guide page on 2-D positions (``docs/guide/swin.md``), drawn by relattn.

Called through matplotlib's ``plot`` directive (``.. plot:: grid_figures.py
swin_relative_bias``), like ``figures.py``. Each figure checks what it draws
against the formula it illustrates, so that it cannot drift from the library.
"""

from __future__ import annotations

import numpy as np
from matplotlib import pyplot as plt
from matplotlib.colors import ListedColormap

from relattn.grid import (
    grid_positions,
    grid_relative_bias,
    grid_relative_index,
    shifted_window_mask,
    window_partition,
)

#: Allowed (True) and masked (False) cells, as figures.py draws masks.
MASK_CMAP = ListedColormap(["#eeeeee", "#2b6cb0"])


def _cells(ax, rows: int, cols: int) -> None:
    """Thin white lines between the cells of an ``imshow``."""
    ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.2)
    ax.tick_params(which="minor", length=0)


def _ink(level: float) -> str:
    """Text colour readable on viridis at ``level`` in [0, 1]."""
    return "black" if level > 0.6 else "white"


def swin_relative_bias() -> None:
    """A 3×3 window: the learned table over (Δrow, Δcol), the index of each pair, the bias."""
    h = w = 3
    side = (2 * h - 1, 2 * w - 1)
    # a smooth "learned" table for one head: larger for near pairs, tilted along Δcol
    d_row, d_col = np.meshgrid(np.arange(-(h - 1), h), np.arange(-(w - 1), w), indexing="ij")
    table = -np.hypot(d_row, d_col) + 0.3 * d_col
    flat = table.reshape(1, -1)  # (H = 1, T): row-major over (Δrow, Δcol)
    index = np.asarray(grid_relative_index(h, w))
    bias = np.asarray(grid_relative_bias(flat, h, w))[0]
    pos = np.asarray(grid_positions(h, w))
    delta = pos[:, None, :] - pos[None, :, :]  # query minus key
    assert np.array_equal(index, (delta[..., 0] + h - 1) * (2 * w - 1) + delta[..., 1] + w - 1)
    assert np.array_equal(bias, table[delta[..., 0] + h - 1, delta[..., 1] + w - 1])

    fig, axes = plt.subplots(
        1, 3, figsize=(14, 4.6), layout="constrained", width_ratios=[0.8, 1.15, 1.15]
    )
    norm = plt.Normalize(vmin=table.min(), vmax=table.max())
    ax = axes[0]
    image = ax.imshow(table, cmap="viridis", norm=norm)
    for (r, c), v in np.ndenumerate(np.arange(table.size).reshape(side)):
        ax.text(c, r, str(v), ha="center", va="center", fontsize=9, color=_ink(norm(table[r, c])))
    _cells(ax, *side)
    ax.set_xticks(range(side[1]), range(-(w - 1), w))
    ax.set_yticks(range(side[0]), range(-(h - 1), h))
    ax.set_xlabel("Δcol = col(query) − col(key)")
    ax.set_ylabel("Δrow = row(query) − row(key)")
    ax.set_title(
        f"the table: {side[0]}×{side[1]} = {table.size} entries\n(entry numbers)", fontsize=10
    )

    labels = [f"{r},{c}" for r, c in pos]
    ax = axes[1]
    ax.imshow(bias, cmap="viridis", norm=norm)
    for (i, j), v in np.ndenumerate(index):
        ax.text(j, i, str(v), ha="center", va="center", fontsize=8, color=_ink(norm(bias[i, j])))
    _cells(ax, *index.shape)
    ax.set_xticks(range(h * w), labels, fontsize=8)
    ax.set_yticks(range(h * w), labels, fontsize=8)
    ax.set_xlabel("key (row, col)")
    ax.set_ylabel("query (row, col)")
    ax.set_title("grid_relative_index(3, 3): the entry of each pair,\n"
                 "coloured by grid_relative_bias(table, 3, 3)", fontsize=10)  # fmt: skip

    ax = axes[2]
    mask = np.asarray(shifted_window_mask(6, 6, 3, 1))
    ids = np.arange(36).reshape(1, 6, 6, 1)
    rolled = window_partition(np.roll(ids, (-1, -1), axis=(1, 2)), 3)[..., 0]
    ax.imshow(mask[3], cmap=MASK_CMAP, vmin=0, vmax=1)
    _cells(ax, 9, 9)
    names = [f"{p // 6},{p % 6}" for p in rolled[3]]
    ax.set_xticks(range(9), names, fontsize=8)
    ax.set_yticks(range(9), names, fontsize=8)
    ax.set_xlabel("key: its (row, col) before the roll")
    ax.set_ylabel("query")
    title = "shifted_window_mask(6, 6, 3, 1)[3]: the last window\n"
    title += "after a roll by (−1, −1) holds 4 regions (blue: may attend)"
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=axes[:2], shrink=0.8, label="bias of one head")
