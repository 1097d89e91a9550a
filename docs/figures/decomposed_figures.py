"""Figures of the guide page on decomposed relative positions (``docs/guide/decomposed.md``).

Called through matplotlib's ``plot`` directive (``.. plot:: decomposed_figures.py
decomposed_terms``), like ``figures.py``. Each figure checks what it draws against the
formula it illustrates, so that it cannot drift from the library.
"""

from __future__ import annotations

import numpy as np
from matplotlib import pyplot as plt
from matplotlib.colors import TwoSlopeNorm

from relattn.decomposed import decomposed_relative_terms, resize_relative_table


def _cells(ax, rows: int, cols: int) -> None:
    """Thin white lines between the cells of an ``imshow``."""
    ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.2)
    ax.tick_params(which="minor", length=0)


def decomposed_terms() -> None:
    """SAM's resizing of a table, and one query's two terms and their sum over the key grid."""
    # d = 2: feature 0 of the row table is -(Δrow)²/4, feature 1 of the column table Δcol/2,
    # so that q = (1, 1) reads each term as a function of one distance (query minus key).
    side, query = 6, (2, 3)
    delta = np.arange(-(side - 1), side).astype(np.float64)
    table_h = np.stack([-(delta**2) / 4, np.zeros_like(delta)], axis=1)
    table_w = np.stack([np.zeros_like(delta), delta / 2], axis=1)
    q = np.ones((side * side, 2))
    rel_h, rel_w = decomposed_relative_terms(q, table_h, table_w, (side, side))
    i = query[0] * side + query[1]
    row_term = np.broadcast_to(rel_h[i][:, None], (side, side))
    col_term = np.broadcast_to(rel_w[i][None, :], (side, side))
    ky, kx = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    np.testing.assert_allclose(row_term, -((query[0] - ky) ** 2) / 4)
    np.testing.assert_allclose(col_term, (query[1] - kx) / 2)

    # a table learned on 4 rows (7 distances) read on a grid of 7 rows (13 distances)
    learned = np.stack([np.sin(np.arange(7.0)), np.zeros(7)], axis=1)
    resized = resize_relative_table(learned, 13)

    fig, axes = plt.subplots(1, 4, figsize=(13, 3.3), layout="constrained")
    ax = axes[0]
    ax.plot((np.arange(7) + 0.5) / 7, learned[:, 0], "o-", lw=1.5, label="learned: 7 rows")
    ax.plot((np.arange(13) + 0.5) / 13, resized[:, 0], "s--", ms=4, lw=1, label="resized: 13 rows")
    ax.set_xlabel("row centre, as a fraction of the table")
    ax.set_title("resize_relative_table(T, 13)", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    limit = float(np.abs(row_term + col_term).max())
    norm = TwoSlopeNorm(vcenter=0, vmin=-limit, vmax=limit)
    panels = (
        (row_term, "q · Rʰ[row − key row]: rows only"),
        (col_term, "q · Rʷ[col − key col]: columns only"),
        (row_term + col_term, "the sum, added to q·kᵀ·scale"),
    )
    for ax, (values, title) in zip(axes[1:], panels, strict=True):
        image = ax.imshow(values, cmap="RdBu_r", norm=norm)
        ax.plot(query[1], query[0], marker="*", color="black", ms=12)
        _cells(ax, side, side)
        ax.set_xticks(range(side))
        ax.set_yticks(range(side))
        ax.set_xlabel("key column")
        ax.set_ylabel("key row")
        ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=axes[1:], shrink=0.85)
