"""The documentation's figures, drawn at build time from relattn itself.

Each public function here draws one figure on a new matplotlib figure; the
pages call them through matplotlib's ``plot`` directive
(``.. plot:: figures.py sinusoid_heatmap``). Where a figure shows an
intermediate step that relattn does not return (the flat view of the shift,
DiSAN's per-feature weights), the step is computed here and checked against
relattn's own result, so a figure cannot drift from the library.
"""

from __future__ import annotations

import array_api_compat
import numpy as np
from matplotlib import pyplot as plt
from matplotlib.colors import ListedColormap, Normalize, PowerNorm, TwoSlopeNorm
from matplotlib.patches import Patch

import relattn

#: Allowed (True) and masked (False) cells.
MASK_CMAP = ListedColormap(["#eeeeee", "#2b6cb0"])
WORDS = ["I", "come", "from", "China", "!"]


def _grid(ax, rows: int, cols: int) -> None:
    """Thin white lines between the cells of an ``imshow``."""
    ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)


def _mask_panel(ax, mask, title, xlabels=None, ylabels=None, xlabel="key j", ylabel="query i"):
    mask = np.asarray(mask)
    ax.imshow(mask, cmap=MASK_CMAP, vmin=0, vmax=1)
    rows, cols = mask.shape
    _grid(ax, rows, cols)
    ax.set_xticks(range(cols), xlabels if xlabels is not None else range(cols))
    ax.set_yticks(range(rows), ylabels if ylabels is not None else range(rows))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.xaxis.set_ticks_position("top")


def _mask_legend(fig) -> None:
    fig.legend(
        handles=[
            Patch(color=MASK_CMAP(1), label="True: may attend"),
            Patch(color=MASK_CMAP(0), label="False: masked"),
        ],
        loc="lower center",
        ncol=2,
        frameon=False,
    )


# ----------------------------------------------------------------------------------------
# Sinusoidal encoding
# ----------------------------------------------------------------------------------------


def sinusoid_heatmap() -> None:
    """``sinusoidal_position_encoding(50, 100)`` in both layouts."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for ax, layout in zip(axes, ["interleaved", "concatenated"], strict=True):
        pe = relattn.sinusoidal_position_encoding(50, 100, layout=layout)
        image = ax.imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set_xlabel("dimension")
        ax.set_ylabel("position p")
        ax.set_title(f'layout="{layout}"', fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.9, label="PE(p, dimension)")


def sinusoid_dot_products() -> None:
    """``PE(p+k)·PE(p)`` and ``PE(p+k)ᵀ W PE(p)`` against ``k``, for three ``p``."""
    d, ks = 100, np.arange(-40, 41)
    rng = np.random.default_rng(0)
    w = rng.normal(scale=1 / np.sqrt(d), size=(d, d))
    _, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained", sharex=True)
    for p, style in zip([20, 50, 80], ["-", "--", ":"], strict=True):
        pe_p = relattn.sinusoidal_position_encoding(np.array([float(p)]), d)[0]
        pe_pk = relattn.sinusoidal_position_encoding((p + ks).astype(float), d)
        axes[0].plot(ks, pe_pk @ pe_p, style, lw=2, label=f"p = {p}")
        axes[1].plot(ks, pe_pk @ w @ pe_p, style, lw=2, label=f"p = {p}")
    axes[0].set_title("PE(p+k) · PE(p): the same curve for every p,\nand even in k", fontsize=10)
    axes[1].set_title("PE(p+k)ᵀ W PE(p), W random: depends on p", fontsize=10)
    for ax in axes:
        ax.set_xlabel("offset k")
        ax.axvline(0, color="grey", lw=0.5)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("dot product")


# ----------------------------------------------------------------------------------------
# Masks
# ----------------------------------------------------------------------------------------


def masks() -> None:
    """Causal (with and without memory), padding and local-window masks."""
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.9), layout="constrained")
    _mask_panel(axes[0], relattn.causal_mask(5, 5), "causal_mask(5, 5)")
    memory = relattn.causal_mask(3, 6)
    _mask_panel(
        axes[1],
        memory,
        "causal_mask(3, 6)\n3 memory keys precede the queries",
        xlabels=[f"m{j}" for j in range(3)] + [str(j) for j in range(3, 6)],
    )
    _mask_panel(
        axes[2],
        relattn.padding_mask(np.array([5, 3, 1]), 5),
        "padding_mask([5, 3, 1], 5)\n(B, L): broadcast as [:, None, :]",
        xlabel="position",
        ylabel="sequence b",
    )
    _mask_panel(axes[3], relattn.local_window_mask(6, 6, 1), "local_window_mask(6, 6, 1)")
    _mask_legend(fig)
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))


def disan_masks() -> None:
    """DiSAN's three masks on "I come from China !", query rows and key columns."""
    n = len(WORDS)
    fig, axes = plt.subplots(1, 3, figsize=(11, 4.2), layout="constrained")
    for ax, (name, mask) in zip(
        axes,
        [
            ("forward_mask", relattn.forward_mask(n)),
            ("backward_mask", relattn.backward_mask(n)),
            ("diagonal_disabled_mask", relattn.diagonal_disabled_mask(n)),
        ],
        strict=True,
    ):
        _mask_panel(ax, mask, f"{name}({n})", xlabels=WORDS, ylabels=WORDS)
    _mask_legend(fig)
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))


# ----------------------------------------------------------------------------------------
# Conventions of other codebases
# ----------------------------------------------------------------------------------------


def _sub(n: int) -> str:
    digits = str(abs(n)).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))
    return ("₋" if n < 0 else "") + digits


def conventions_map() -> None:
    """Which table row each codebase stores at each column of relattn's full layout."""
    lq = lk = 4
    delta = np.asarray(relattn.relative_distances(lq, lk))  # the full layout, ascending
    causal = np.asarray(relattn.relative_distances(lq, lk, causal=True))
    radius = 2
    # Each codebase's own sequence of stored distances, from its formula.
    txl_pos_seq = np.arange(lk - 1, -1, -1)  # Transformer-XL: klen-1 … 0, values of i - j
    xlnet_pos_seq = np.arange(lk, -lq, -1)  # XLNet: klen … -qlen+1
    espnet = np.arange(lq - 1, -lq, -1)  # ESPnet "latest": T-1 … -(T-1)
    assert np.array_equal(txl_pos_seq, -causal)
    assert np.array_equal(xlnet_pos_seq[1:], -delta)
    assert np.array_equal(espnet, -delta)

    same, negated, absent = "#c6f6d5", "#fed7aa", "#e2e8f0"
    rows = [
        ("relattn: δ = j − i", [f"δ={d}" for d in delta], [same] * len(delta)),
        (
            f"Shaw / tensor2tensor\nw_clip(j−i, K={radius})",
            [f"w{_sub(int(np.clip(d, -radius, radius)))}" for d in delta],
            [same] * len(delta),
        ),
        ("T5\nbucket(j − i)", [f"b({d})" for d in delta], [same] * len(delta)),
        (
            "Transformer-XL\nr_{i−j}, pos_seq klen−1 … 0",
            [f"r{_sub(int(-d))}" if d <= 0 else "masked" for d in delta],
            [negated if d <= 0 else absent for d in delta],
        ),
        (
            "XLNet\nr_{i−j}, pos_seq klen … −qlen+1",
            [f"r{_sub(int(-d))}" for d in delta],
            [negated] * len(delta),
        ),
        (
            'ESPnet "latest" / Conformer\nr_{i−j}, T−1 … −(T−1)',
            [f"r{_sub(int(-d))}" for d in delta],
            [negated] * len(delta),
        ),
        ("TENER\nR_{t−j}, unprojected", [f"R{_sub(int(-d))}" for d in delta], [negated] * 7),
    ]
    fig, ax = plt.subplots(figsize=(11, 5.2), layout="constrained")
    for r, (_, texts, colors) in enumerate(rows):
        for c, (text, color) in enumerate(zip(texts, colors, strict=True)):
            ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=color, edgecolor="white", lw=2))
            ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=10)
    ax.set_xlim(0, len(delta))
    ax.set_ylim(len(rows), 0)
    ax.set_yticks(np.arange(len(rows)) + 0.5, [name for name, _, _ in rows], fontsize=9)
    ax.set_xticks(np.arange(len(delta)) + 0.5, [f"m={m}" for m in range(len(delta))])
    ax.xaxis.set_ticks_position("top")
    ax.set_xlabel(f"column m of relattn's full relative layout (Lq = Lk = {lq}, W = 7)")
    ax.xaxis.set_label_position("top")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.legend(
        handles=[
            Patch(color=same, label="indexes δ (same sign as relattn)"),
            Patch(color=negated, label="indexes −δ = i − j: build its table from −δ"),
            Patch(color=absent, label="no row: future keys are masked"),
        ],
        loc="lower center",
        ncol=3,
        frameon=False,
    )
    fig.get_layout_engine().set(rect=(0, 0.07, 1, 0.93))


# ----------------------------------------------------------------------------------------
# The shift
# ----------------------------------------------------------------------------------------


def _cells(ax, values, labels, title, norm, greyed=None, col_labels=None, row_labels=None):
    values = np.atleast_2d(values)
    rows, cols = values.shape
    ax.imshow(values, cmap="Blues_r", norm=norm, aspect="equal")
    if greyed is not None:
        grey = np.where(np.atleast_2d(greyed), 1.0, np.nan)
        ax.imshow(grey, cmap=ListedColormap(["#d9d9d9"]), aspect="equal")
    labels = np.atleast_2d(labels)
    for i in range(rows):
        for j in range(cols):
            ax.text(j, i, labels[i, j], ha="center", va="center", fontsize=8)
    _grid(ax, rows, cols)
    ax.set_xticks(range(cols), col_labels if col_labels is not None else [""] * cols, fontsize=7)
    ax.set_yticks(range(rows), row_labels if row_labels is not None else [""] * rows, fontsize=8)
    ax.set_title(title, fontsize=9, loc="left")
    ax.tick_params(length=0)


def shift_steps() -> None:
    """``rel_shift`` on the causal layout, Lq = 3 queries, Lk = 5 keys (2 in memory)."""
    lq, lk = 3, 5
    full = lq + lk - 1
    delta_causal = np.asarray(relattn.relative_distances(lq, lk, causal=True))
    # Cell value: 1 + its column in the full layout, so 0 marks a padding zero.
    x = np.tile(delta_causal + lk, (lq, 1)).astype(float)
    out = np.asarray(relattn.rel_shift(x, lk))

    # The steps rel_shift takes (relattn/shift.py), redone here to draw them.
    padded = np.pad(x, [(0, 0), (0, full - lk)])
    flat = padded.reshape(-1)
    kept = np.zeros(flat.shape, bool)
    kept[lq - 1 : lq - 1 + lq * (full - 1)] = True
    reshaped = flat[kept].reshape(lq, full - 1)
    assert np.array_equal(reshaped[:, :lk], out), "the drawing no longer matches rel_shift"
    assert np.array_equal(
        np.where(out > 0, out - lk, 0),
        np.minimum(np.asarray(relattn.relative_positions(lq, lk)), 0),
    )

    def label(v):
        v = np.asarray(v)
        return np.where(v > 0, np.char.add("δ=", (v - lk).astype(int).astype(str)), "0")

    def value(v):
        return np.where(np.asarray(v) > 0, np.asarray(v) - lk, np.nan)

    norm = Normalize(vmin=-(lk + 1), vmax=1.5)
    fig = plt.figure(figsize=(11, 7.2), layout="constrained")
    grid = fig.add_gridspec(3, 2, height_ratios=[1.3, 0.55, 1.3])
    rows = [f"i={i}" for i in range(lq)]
    _cells(
        fig.add_subplot(grid[0, 0]),
        value(x),
        label(x),
        f"1. relative layout (causal): x = q·Rᵀ, shape (Lq, W) = ({lq}, {lk});\n"
        "every row holds δ = −(Lk−1) … 0",
        norm,
        col_labels=[f"m={m}" for m in range(lk)],
        row_labels=rows,
    )
    _cells(
        fig.add_subplot(grid[0, 1]),
        value(padded),
        label(padded),
        f"2. padded with zero columns (white) for δ = 1 … Lq−1\nto the full width Lq+Lk−1 = {full}",
        norm,
        col_labels=[f"m={m}" for m in range(full)],
        row_labels=rows,
    )
    _cells(
        fig.add_subplot(grid[1, :]),
        value(flat),
        label(flat),
        f"3. flattened to {lq * full} elements; keep [Lq−1 : Lq−1 + Lq·(W−1)] = "
        f"[{lq - 1} : {lq - 1 + lq * (full - 1)}] (grey: dropped)",
        norm,
        greyed=~kept,
        col_labels=[str(n) for n in range(flat.size)],
    )
    _cells(
        fig.add_subplot(grid[2, 0]),
        value(reshaped),
        label(reshaped),
        f"4. reshaped to (Lq, W−1) = ({lq}, {full - 1}): row stride W−1\n"
        f"moves row i left by Lq−1−i; columns ≥ Lk dropped",
        norm,
        greyed=np.arange(full - 1)[None, :] >= lk,
        col_labels=[f"j={j}" for j in range(full - 1)],
        row_labels=rows,
    )
    _cells(
        fig.add_subplot(grid[2, 1]),
        value(out),
        label(out),
        f"5. rel_shift(x, {lk}): shape (Lq, Lk) = ({lq}, {lk}), cell [i, j] holds\n"
        f"δ = j − (i + {lk - lq}); zeros where δ > 0 (masked)",
        norm,
        col_labels=[f"j={j}" for j in range(lk)],
        row_labels=rows,
    )


# ----------------------------------------------------------------------------------------
# Attention maps of the demo's encoders
# ----------------------------------------------------------------------------------------


def demo_attention_maps() -> None:
    """First-layer, first-head attention weights of each demo encoder on the Zen of Python."""
    from relattn.demo import models, runner

    xp = array_api_compat.array_namespace(np.zeros(1))
    config = models.Config()
    tokens = runner.byte_tokens(runner.zen_of_python())
    length = 32
    memory_tokens, tokens_now = tokens[:length], tokens[length : 2 * length]

    def show(t: int) -> str:
        return {" ": "␣", "\n": "⏎"}.get(chr(t), chr(t))

    chars = [show(t) for t in tokens_now]
    mem_chars = [show(t) for t in memory_tokens]

    def eye(n, heads=config.heads):
        return np.broadcast_to(np.eye(n), (heads, n, n)).copy()

    maps = {}
    enc = models.AbsoluteEncoder(config, xp, xp.float64)
    p = enc.layers[0]
    h = enc.embed(tokens_now)
    q, k = enc.heads(h @ p["w_q"]), enc.heads(h @ p["w_k"])
    maps["absolute (Vaswani)"] = relattn.scaled_dot_product_attention(q, k, eye(length))

    enc = models.ShawEncoder(config, xp, xp.float64)
    p = enc.layers[0]
    h = enc.embed(tokens_now)
    q, k = enc.heads(h @ p["w_q"]), enc.heads(h @ p["w_k"])
    zeros = np.zeros((2 * config.radius + 1, length))
    maps[f"Shaw (K = {config.radius})"] = relattn.shaw_attention(
        q, k, eye(length), p["key_table"], zeros
    )

    enc = models.TransformerXLEncoder(config, xp, xp.float64)
    p = enc.layers[0]
    h, memory = enc.embed(tokens_now), enc.embed(memory_tokens)
    context = np.concatenate([memory, h])
    q, k = enc.heads(h @ p["w_q"]), enc.heads(context @ p["w_k"])
    r = enc.heads(enc.position_table(length, 2 * length) @ p["w_r"])
    maps["Transformer-XL (32 memory keys)"] = relattn.relative_attention(
        q, k, eye(2 * length), r, content_bias=p["u"][:, None, :], position_bias=p["v"][:, None, :]
    )

    enc = models.TenerEncoder(config, xp, xp.float64)
    p = enc.layers[0]
    h = enc.embed(tokens_now)
    q, k = enc.heads(h @ p["w_q"]), enc.heads(h)
    table = relattn.sinusoidal_position_encoding(
        -relattn.relative_distances(length, length), q.shape[-1], layout="concatenated"
    )
    maps["TENER (scale 1)"] = relattn.relative_attention(
        q,
        k,
        eye(length),
        table,
        content_bias=p["u"][:, None, :],
        position_bias=p["v"][:, None, :],
        scale=1.0,
    )

    enc = models.ComplexOrderEncoder(config, xp, xp.float64)
    p = enc.layers[0]
    h = enc.embed(tokens_now)
    q, k = (enc.heads(relattn.complex_linear(h, p[w])) for w in ("w_q", "w_k"))
    weights = relattn.complex_attention(q, k, eye(length).astype(complex), reduction="real")
    maps["complex order, Re(q · conj(k))"] = np.real(weights)

    enc = models.DisanEncoder(config, xp, xp.float64)
    p = enc.layers[0]  # the forward block
    x = enc.embed(tokens_now)
    x = np.where(x @ p["w_h"] > 0, x @ p["w_h"], np.expm1(x @ p["w_h"]))  # elu
    c = 5.0
    logits = c * np.tanh(((x @ p["w_1"])[:, None, :] + (x @ p["w_2"])[None, :, :] + p["b_1"]) / c)
    mask = np.asarray(relattn.forward_mask(length))
    per_feature = relattn.masked_softmax(logits, mask[:, :, None], axis=-2)  # (Lq, Lk, d)
    check = relattn.multi_dimensional_attention(
        x, p["w_1"], p["w_2"], p["b_1"], direction="forward"
    )
    assert np.allclose(np.sum(per_feature * x[None, :, :], axis=1), check)
    maps["DiSAN forward (mean over features)"] = np.mean(per_feature, axis=-1)

    fig, axes = plt.subplots(2, 3, figsize=(13, 9.2), layout="constrained")
    for ax, (name, weights) in zip(axes.flat, maps.items(), strict=True):
        weights = np.asarray(weights)
        if weights.ndim == 3:
            weights = weights[0]  # head 0
        image = ax.imshow(
            weights, cmap="viridis", norm=PowerNorm(0.5, vmin=0, vmax=1), aspect="auto"
        )
        ax.set_title(name, fontsize=10)
        cols = weights.shape[1]
        xlabels = (mem_chars + chars) if cols == 2 * length else chars
        ax.set_xticks(range(cols), xlabels, fontsize=5 if cols > length else 6)
        ax.set_yticks(range(length), chars, fontsize=6)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        if cols == 2 * length:
            ax.axvline(length - 0.5, color="white", lw=1)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight (square-root scale)")


# ----------------------------------------------------------------------------------------
# Per-method pictures of the user guide
# ----------------------------------------------------------------------------------------


def _annotated(ax, values, fmt, title, cmap="coolwarm", norm=None, xlabel="key j"):
    values = np.asarray(values)
    ax.imshow(values, cmap=cmap, norm=norm)
    for (i, j), v in np.ndenumerate(values):
        ax.text(j, i, fmt(v), ha="center", va="center", fontsize=8)
    _grid(ax, *values.shape)
    ax.set_xticks(range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("query i")
    ax.set_title(title, fontsize=10)


def relative_positions_layouts() -> None:
    """``relative_positions`` without and with memory, and the two layouts' columns."""
    _, axes = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
    norm = TwoSlopeNorm(vcenter=0, vmin=-6, vmax=4)
    _annotated(
        axes[0], relattn.relative_positions(4, 4), str, "relative_positions(4, 4)", norm=norm
    )
    _annotated(
        axes[1],
        relattn.relative_positions(3, 6),
        str,
        "relative_positions(3, 6): 3 memory keys, offset 3",
        norm=norm,
    )


def shaw_clipping() -> None:
    """Which row of a ``(2K+1, d)`` table each (query, key) pair uses, K = 2."""
    lq, lk, radius = 6, 6, 2
    # Table row r holds the value r + 1, so a zero marks Music Transformer's zero row.
    table = np.arange(1.0, 2 * radius + 2)[:, None]
    _, axes = plt.subplots(1, 2, figsize=(10, 3.9), layout="constrained")
    for ax, mode in zip(axes, ["clip", "zero"], strict=True):
        layout = np.asarray(relattn.relative_table(table, lq, lk, out_of_range=mode))[:, 0]
        rows = np.asarray(relattn.rel_shift(np.tile(layout, (lq, 1)), lk))
        _annotated(
            ax,
            np.where(rows > 0, rows - 1 - radius, np.nan),
            lambda v: "0" if np.isnan(v) else f"w{_sub(int(v))}",
            f'relative_table(table, 6, 6, out_of_range="{mode}") then rel_shift',
            cmap="PuOr",
            norm=TwoSlopeNorm(vcenter=0, vmin=-radius - 0.5, vmax=radius + 0.5),
        )


def xl_segments() -> None:
    """Three segments of 4 with memory 4 inside the causal mask of the whole sequence."""
    segment, memory, n = 4, 4, 12
    whole = np.asarray(relattn.causal_mask(n, n)).astype(float)
    _, ax = plt.subplots(figsize=(5.6, 6.0), layout="constrained")
    ax.imshow(whole, cmap=MASK_CMAP, vmin=0, vmax=1)
    _grid(ax, n, n)
    colors = ["#e53e3e", "#dd6b20", "#38a169"]
    for s, color in enumerate(colors):
        start = s * segment
        keys = min(memory, start) + segment
        block = np.asarray(relattn.causal_mask(segment, keys))  # what relattn builds
        assert np.array_equal(
            block, whole[start : start + segment, start + segment - keys : start + segment]
        )
        ax.add_patch(
            plt.Rectangle(
                (start + segment - keys - 0.5, start - 0.5),
                keys,
                segment,
                fill=False,
                edgecolor=color,
                lw=3,
                zorder=5,
                clip_on=False,
                label=f"segment {s + 1}: causal_mask({segment}, {keys})",
            )
        )
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(
        "whole-sequence causal mask; each box is one\nsegment's queries × [memory ∘ segment] keys"
    )
    ax.legend(loc="upper center", fontsize=8, bbox_to_anchor=(0.5, -0.12), ncol=1, frameon=False)


def tener_signed_sinusoid() -> None:
    """TENER's table: the sinusoid of the signed distance i − j = −δ; sin is odd, cos even."""
    length, d = 20, 32
    distance = -np.asarray(relattn.relative_distances(length, length))
    table = relattn.sinusoidal_position_encoding(distance, d, layout="concatenated")
    q = np.random.default_rng(0).normal(size=d)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    image = axes[0].imshow(
        table[::-1].T,  # columns by ascending i - j
        cmap="RdBu_r",
        vmin=-1,
        vmax=1,
        aspect="auto",
        extent=(distance[-1] - 0.5, distance[0] + 0.5, d - 0.5, -0.5),
    )
    axes[0].axhline(d / 2 - 0.5, color="black", lw=0.8)
    axes[0].set_xlabel("i − j = −δ (TENER's t − j)")
    axes[0].set_ylabel("dimension: sin half | cos half")
    axes[0].set_title("sinusoidal_position_encoding(−δ, 32, concatenated)", fontsize=10)
    fig.colorbar(image, ax=axes[0], shrink=0.85)
    axes[1].plot(distance, table @ q, lw=2, label="q · R(i − j)")
    axes[1].plot(distance, table[::-1] @ q, "--", lw=2, label="q · R(j − i)")
    axes[1].set_xlabel("i − j")
    axes[1].set_title("a query's position term tells past from future", fontsize=10)
    axes[1].legend(fontsize=8)


def complex_order_spiral() -> None:
    """One word's complex-order embedding at positions 0 … 9, three dimensions."""
    amplitude = np.array([[1.0, 0.7, 0.4]])
    frequency = np.array([[0.15, 0.5, -0.6]])
    phase = np.array([[0.0, 1.0, 2.0]])
    positions = np.arange(10.0)
    z = relattn.complex_order_embedding(amplitude, frequency, phase, positions[:, None])
    z = np.asarray(z)[:, 0, :] if z.ndim == 3 else np.asarray(z)
    shifted = relattn.complex_order_embedding(amplitude, frequency, phase, positions[:, None] + 3)
    shifted = np.asarray(shifted)[:, 0, :] if shifted.ndim == 3 else np.asarray(shifted)
    assert np.allclose(shifted, z * np.exp(1j * frequency * 3))  # a fixed rotation per dimension
    _, ax = plt.subplots(figsize=(5.4, 6.0), layout="constrained")
    for k, color in zip(range(3), ["#2b6cb0", "#dd6b20", "#38a169"], strict=True):
        ax.plot(
            z[:, k].real,
            z[:, k].imag,
            "o-",
            color=color,
            ms=4,
            lw=1,
            label=f"dim {k}: r={amplitude[0, k]}, ω={frequency[0, k]}, θ={phase[0, k]}",
        )
        ax.annotate("pos 0", (z[0, k].real, z[0, k].imag), fontsize=7)
    ax.set_aspect("equal")
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xlabel("real part")
    ax.set_ylabel("imaginary part")
    ax.set_title(
        "r·exp(i(ω·pos + θ)): moving by n positions\nrotates dimension k by ω_k·n", fontsize=10
    )
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)


def classic_scores() -> None:
    """Dot, cosine and additive scores of the same queries and keys; local-p weights."""
    rng = np.random.default_rng(3)
    lq, lk, d = 6, 10, 8
    q, k = rng.normal(size=(lq, d)), rng.normal(size=(lk, d))
    panels = {
        "dot_product_scores": relattn.dot_product_scores(q, k),
        "cosine_scores": relattn.cosine_scores(q, k),
        "additive_scores": relattn.additive_scores(
            q, k, rng.normal(size=(d, 16)), rng.normal(size=(d, 16)), rng.normal(size=16)
        ),
    }
    positions = np.array([1.0, 2.5, 4.0, 5.5, 7.0, 8.5])
    panels["local_p_weights(dot, p, window=2)"] = relattn.local_p_weights(
        panels["dot_product_scores"], positions, 2
    )
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.0), layout="constrained")
    for ax, (name, scores) in zip(axes, panels.items(), strict=True):
        image = ax.imshow(np.asarray(scores), cmap="viridis", aspect="auto")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        fig.colorbar(image, ax=ax, shrink=0.8)
    axes[3].plot(positions, range(lq), "r+", ms=10, label="p_i")
    axes[3].legend(fontsize=7, loc="upper right")
