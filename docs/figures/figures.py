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
        q, k, eye(length), p["key_embeddings"], zeros
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


# ----------------------------------------------------------------------------------------
# Per-distance biases, rotary embeddings and DeBERTa
# ----------------------------------------------------------------------------------------


#: Bias and score maps: cells with no value (masked) drawn in light grey.
def _diverging(limit: float) -> tuple[object, Normalize]:
    cmap = plt.get_cmap("RdBu_r").copy()
    cmap.set_bad("#d9d9d9")
    return cmap, Normalize(vmin=-limit, vmax=limit)


def _no_value(bias):
    """A causal-layout bias as floats, NaN (drawn grey) where ``δ > 0`` has no value."""
    bias = np.asarray(bias)
    return np.where(bias < np.finfo(bias.dtype).min / 4, np.nan, bias)


def _matrix(ax, values, title, cmap, norm, *, xlabel="key j", ylabel="query i"):
    image = ax.imshow(values, cmap=cmap, norm=norm)
    rows, cols = values.shape
    ax.set_xticks(range(0, cols, 4))
    ax.set_yticks(range(0, rows, 4))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return image


def t5_buckets() -> None:
    """T5's bucket of every distance, both directions, and the bias matrices of a table."""
    num_buckets, max_distance = 32, 128
    delta = np.arange(-160, 161)
    fig = plt.figure(figsize=(12, 7.6), layout="constrained")
    grid = fig.add_gridspec(2, 4, height_ratios=[1.0, 1.15])
    ax = fig.add_subplot(grid[0, :])
    for bidirectional, style, label in (
        (True, "-", "bidirectional=True (encoder): 16 buckets per direction"),
        (False, "--", "bidirectional=False (decoder): 32 buckets for δ ≤ 0, bucket 0 for δ > 0"),
    ):
        buckets = relattn.relative_position_bucket(
            delta, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional
        )
        ax.step(delta, np.asarray(buckets), style, where="mid", lw=2, label=label)
    for x in (-max_distance, max_distance):
        ax.axvline(x, color="grey", lw=0.8, ls=":")
    ax.axvspan(-7.5, 7.5, color="#c6f6d5", alpha=0.6, lw=0)
    ax.text(0, 33.5, "encoder: |δ| < 8\none bucket each", ha="center", va="bottom", fontsize=9)
    ax.text(-max_distance, 33.5, "δ = −max_distance", ha="center", va="bottom", fontsize=9)
    ax.text(max_distance, 33.5, "δ = max_distance", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(-1, 40)
    ax.set_yticks(range(0, 33, 8))
    ax.set_xlabel("δ = j − i (key minus query)")
    ax.set_ylabel("bucket")
    ax.set_title(
        f"relative_position_bucket(δ, num_buckets={num_buckets}, max_distance={max_distance}): "
        "exact near 0, logarithmic beyond, one shared bucket past max_distance",
        fontsize=10,
    )
    ax.legend(loc="lower right", bbox_to_anchor=(1, 0.07), fontsize=9, frameon=False)

    # A small configuration, to see the buckets in a matrix: 16 buckets, max_distance 20.
    length, small, reach, heads = 24, 16, 20, 3
    table = np.random.default_rng(5).normal(size=(small, heads))  # a (num_buckets, H) table
    encoder_buckets = relattn.relative_position_bucket(
        relattn.relative_distances(length, length), num_buckets=small, max_distance=reach
    )
    encoder = relattn.relative_bias_matrix(table[encoder_buckets].T, length, length)  # (H, L, L)
    decoder_buckets = relattn.relative_position_bucket(
        relattn.relative_distances(length, length, causal=True),
        num_buckets=small,
        max_distance=reach,
        bidirectional=False,
    )
    decoder = _no_value(relattn.relative_bias_matrix(table[decoder_buckets, 0], length, length))
    cmap, norm = _diverging(float(np.max(np.abs(table))))
    for h in range(heads):
        image = _matrix(
            fig.add_subplot(grid[1, h]),
            np.asarray(encoder[h]),
            f"encoder, head {h}: table[bucket(δ), {h}]",
            cmap,
            norm,
        )
    _matrix(
        fig.add_subplot(grid[1, 3]),
        decoder,
        "decoder, head 0: unidirectional,\ncausal layout (grey: masked)",
        cmap,
        norm,
    )
    fig.colorbar(image, ax=fig.axes[1:], shrink=0.8, label="bias added to the logit")
    fig.text(
        0.5,
        0.005,
        f"below: L = {length}, num_buckets = {small}, max_distance = {reach}, "
        "a random (num_buckets, H) table; every diagonal is one distance",
        ha="center",
        fontsize=9,
    )


def alibi_bias() -> None:
    """ALiBi's slopes for 8 and 12 heads, and the causal bias matrices of three heads."""
    fig, axes = plt.subplots(
        1, 4, figsize=(13, 3.9), layout="constrained", width_ratios=[1.25, 1, 1, 1]
    )
    for heads, marker, size in ((8, "o", 8), (12, "x", 7)):
        slopes = np.asarray(relattn.alibi_slopes(heads))
        axes[0].plot(np.arange(1, heads + 1), slopes, marker, ms=size, mew=2, label=f"H = {heads}")
    axes[0].set_yscale("log", base=2)
    axes[0].set_xticks(range(1, 13))
    axes[0].set_xlabel("head h")
    axes[0].set_ylabel("slope m_h")
    axes[0].set_title(
        "alibi_slopes(H): H = 8 gives $2^{-h}$;\n"
        "H = 12 adds $2^{-0.5}, 2^{-1.5}, 2^{-2.5}, 2^{-3.5}$ (heads 9–12)",
        fontsize=10,
    )
    axes[0].legend(fontsize=9)
    length, heads = 12, 12
    slopes = np.asarray(relattn.alibi_slopes(heads))
    delta = np.asarray(relattn.relative_distances(length, length, causal=True))
    values = slopes[:, None] * delta[None, :]  # (H, Lk): the causal layout
    bias = _no_value(relattn.relative_bias_matrix(values, length, length))
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("#d9d9d9")
    norm = Normalize(vmin=float(values.min()), vmax=0)
    for ax, h in zip(axes[1:], (9, 1, 4), strict=True):
        image = _matrix(
            ax,
            bias[h - 1],
            f"H = 12, head {h}: $m = 2^{{{np.log2(slopes[h - 1]):g}}}$\nbias m·δ (grey: masked)",
            cmap,
            norm,
        )
    fig.colorbar(image, ax=axes[1:], shrink=0.85, label="bias m_h · δ")


def rope_rotation() -> None:
    """RoPE: pairs rotating with the position, the relative property, the two pairings."""
    fig = plt.figure(figsize=(13, 4.6), layout="constrained")
    grid = fig.add_gridspec(1, 3, width_ratios=[1, 1.35, 1.25])

    # 1. One query, d = 8, at positions 0 … 8: pair k turns by θ_k per position.
    ax = fig.add_subplot(grid[0])
    positions = np.arange(9)
    x = np.tile([1.0, 0.0], 4)[None, :].repeat(len(positions), axis=0)
    rotated = np.asarray(relattn.rotary_position_embedding(x, positions, layout="interleaved"))
    theta = np.asarray(relattn.inverse_frequencies(4))
    circle = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(circle), np.sin(circle), color="#cbd5e0", lw=1)
    for k, color in zip(range(2), ["#2b6cb0", "#dd6b20"], strict=True):
        a, b = rotated[:, 2 * k], rotated[:, 2 * k + 1]
        ax.plot(a, b, "o-", color=color, ms=5, lw=1, label=f"pair {k}: θ_{k} = {theta[k]:g} rad")
        for p in (0, 1, 2, 8) if k == 0 else (8,):
            ax.annotate(
                f"p={p}", (a[p], b[p]), textcoords="offset points", xytext=(5, 4), fontsize=8
            )
    ax.set_aspect("equal")
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)
    ax.set_xlabel("first feature of the pair")
    ax.set_ylabel("second feature of the pair")
    ax.set_title("RoPE(x, p) of x = (1, 0, 1, 0, …):\npair k turns by p·θ_k", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")

    # 2. ⟨RoPE(q, m), RoPE(k, n)⟩ against n − m, for several m.
    ax = fig.add_subplot(grid[1])
    rng = np.random.default_rng(1)
    d = 64
    q, k = rng.normal(size=(2, d))
    offsets = np.arange(-40, 41)
    for m, style, width in ((50, "-", 4), (200, "--", 2.2), (1000, ":", 1.6)):
        rq = np.asarray(
            relattn.rotary_position_embedding(q[None, :], np.array([m]), layout="interleaved")
        )[0]
        rk = np.asarray(
            relattn.rotary_position_embedding(
                np.tile(k, (len(offsets), 1)), m + offsets, layout="interleaved"
            )
        )
        ax.plot(offsets, rk @ rq, style, lw=width, label=f"m = {m}")
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xlabel("n − m")
    ax.set_ylabel("⟨RoPE(q, m), RoPE(k, n)⟩")
    ax.set_title(
        "one curve for every m: the score depends on n − m only\n(d = 64, q, k random)", fontsize=10
    )
    ax.legend(fontsize=9)

    # 3. Which features form a pair: the partner of feature i is where RoPE(e_i) moves it.
    ax = fig.add_subplot(grid[2])
    d = 8
    colors = plt.get_cmap("tab10")
    for row, layout in enumerate(("interleaved", "concatenated")):
        turned = np.asarray(
            relattn.rotary_position_embedding(np.eye(d), np.ones(d), base=2.0, layout=layout)
        )
        partner = [
            int(np.flatnonzero((np.abs(turned[i]) > 1e-12) & (np.arange(d) != i))[0])
            for i in range(d)
        ]
        pair = {}
        for i in range(d):
            pair.setdefault(frozenset((i, partner[i])), len(pair))
        y = 1.6 * (1 - row)
        for i in range(d):
            index = pair[frozenset((i, partner[i]))]
            ax.add_patch(plt.Rectangle((i, y), 0.92, 0.6, color=colors(index), alpha=0.75))
            ax.text(i + 0.46, y + 0.3, f"x{_sub(i)}", ha="center", va="center", fontsize=10)
            ax.text(i + 0.46, y - 0.15, f"θ{_sub(index)}", ha="center", va="center", fontsize=9)
        for i in range(d):
            j = partner[i]
            if j > i:
                middle, span = (i + j) / 2 + 0.46, j - i
                ax.annotate(
                    "",
                    (j + 0.46, y + 0.62),
                    (i + 0.46, y + 0.62),
                    arrowprops={
                        "arrowstyle": "-",
                        "connectionstyle": f"arc3,rad={-0.5 if span < 2 else -0.25}",
                        "color": colors(pair[frozenset((i, j))]),
                        "lw": 1.5,
                    },
                )
                del middle
        ax.text(-0.2, y + 0.3, f'"{layout}"', ha="right", va="center", fontsize=10)
    ax.set_xlim(-3.2, d + 0.1)
    ax.set_ylim(-0.5, 3.2)
    ax.axis("off")
    ax.set_title(
        "the two layouts, d = 8: the pairs rotated together\n"
        "interleaved: paper, GPT-J\nconcatenated: GPT-NeoX, LLaMA",
        fontsize=10,
    )


def deberta_positions() -> None:
    """DeBERTa-v2's φ over distances, and the three score terms of one head."""
    k, max_position = 16, 64
    fig = plt.figure(figsize=(13, 7.4), layout="constrained")
    grid = fig.add_gridspec(2, 4, height_ratios=[1, 1.05])
    ax = fig.add_subplot(grid[0, :])
    r = np.arange(-100, 101)  # i − j, DeBERTa's query minus key
    bucket = np.asarray(relattn.log_bucket_position(r, bucket_size=k, max_position=max_position))
    phi = np.clip(bucket + k, 0, 2 * k - 1)
    ax.plot(r, bucket, lw=2.5, label="log_bucket_position(i − j): unbounded")
    ax.plot(r, phi - k, "--", lw=2, label="φ − k = clip(bucket + k, 0, 2k − 1) − k: the table row")
    ax.axvspan(-k // 2, k // 2, color="#c6f6d5", alpha=0.6, lw=0)
    ax.text(0, 19, f"|i − j| ≤ {k // 2}:\nexact", ha="center", va="bottom", fontsize=9)
    for y, text in ((k - 1, "row 2k − 1"), (-k, "row 0")):
        ax.axhline(y, color="grey", lw=0.8, ls=":")
        ax.text(101, y, text, va="center", fontsize=9)
    for x in (-(max_position - 1), max_position - 1):
        ax.axvline(x, color="grey", lw=0.8, ls=":")
    ax.text(max_position - 1, -21, "max_position − 1", ha="center", fontsize=9)
    ax.set_ylim(-24, 26)
    ax.set_xlabel("i − j = −δ (query minus key, DeBERTa's sign)")
    ax.set_ylabel("bucket")
    ax.set_title(
        f"bucket_size = k = {k}, max_position = {max_position}: the logarithmic buckets "
        "keep growing; only the clip bounds φ to the 2k rows of the table",
        fontsize=10,
    )
    ax.legend(loc="upper left", fontsize=9, frameon=False)

    # The three terms of one head, L = 12, tables of 2k = 8 rows (k = 4, max_position 8).
    length, d, small = 12, 16, 4
    rng = np.random.default_rng(2)
    q, kc, v = rng.normal(size=(3, length, d))
    rows_k, rows_q = rng.normal(size=(2, 2 * small, d))
    delta = relattn.relative_distances(length, length)
    phi = np.clip(
        np.asarray(relattn.log_bucket_position(-delta, bucket_size=small, max_position=8)) + small,
        0,
        2 * small - 1,
    )
    key_table, query_table = rows_k[phi], rows_q[phi]  # (W, d): one row per distance
    m = np.asarray(relattn.relative_positions(length, length)) + length - 1  # column of (i, j)
    terms = {
        "content-to-content\nq_i · k_j": q @ kc.T,
        "content-to-position\nq_i · Kʳ[φ(i, j)]": np.einsum("id,ijd->ij", q, key_table[m]),
        "position-to-content\nk_j · Qʳ[φ(i, j)]": np.einsum("jd,ijd->ij", kc, query_table[m]),
    }
    total = sum(terms.values())
    terms["sum A_ij (scaled by 1/√(3d)\nin the softmax)"] = total
    scaled = total / np.sqrt(3 * d)
    weights = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    expected = (weights / weights.sum(axis=1, keepdims=True)) @ v
    got = relattn.disentangled_attention(q, kc, v, key_table, query_table)
    assert np.allclose(got, expected), "the drawing no longer matches disentangled_attention"
    cmap, norm = _diverging(float(np.max(np.abs(total))))
    for c, (name, values) in enumerate(terms.items()):
        image = _matrix(fig.add_subplot(grid[1, c]), values, name, cmap, norm)
    fig.colorbar(image, ax=fig.axes[1:], shrink=0.8, label="score term")
    fig.text(
        0.5,
        0.005,
        f"below: one head, L = {length}, d = {d}, bucket_size = {small}, max_position = 8, "
        f"random q, k and tables of 2k = {2 * small} rows gathered by φ",
        ha="center",
        fontsize=9,
    )


def tener_released_forms() -> None:
    """TENER's paper form against its released code: position terms, frequencies, weights."""
    import importlib.util
    from pathlib import Path

    path = Path(relattn.__file__).resolve().parents[1] / "examples" / "tener_released.py"
    spec = importlib.util.spec_from_file_location("tener_released_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    d_head, length = 16, 14
    fig, axes = plt.subplots(
        1, 4, figsize=(14, 3.9), layout="constrained", width_ratios=[1.25, 1, 1, 1]
    )
    # 1. The position terms of one query and one key against j − t.
    rng = np.random.default_rng(4)
    q, k = rng.normal(size=(2, d_head))
    offsets = np.arange(-(length - 1), length)  # j − t
    plus, minus = example.released_position_tables(length, d_head, like=np.zeros(1))
    delta = np.asarray(relattn.relative_distances(length, length))
    assert np.array_equal(delta, offsets)
    paper = relattn.sinusoidal_position_encoding(-delta, d_head, layout="concatenated")
    axes[0].plot(offsets, minus @ q, lw=2.5, label=r"paper's sign: $Q_t \cdot R_{t-j}$")
    axes[0].plot(offsets, plus @ q, "--", lw=2, label=r"released: $Q_t \cdot R_{j-t}$ (mirrored)")
    axes[0].plot(offsets, minus @ k, ":", lw=2, label=r"released, extra: $K_j \cdot R_{t-j}$")
    axes[0].axvline(0, color="grey", lw=0.5)
    axes[0].set_xlabel("j − t (key minus query)")
    axes[0].set_title(
        "the sign of R: one query, one key, one table\n(the released frequencies)", fontsize=10
    )
    axes[0].legend(fontsize=8, loc="lower left")
    # 2. The frequencies.
    half = d_head // 2
    axes[1].semilogy(
        range(half), relattn.inverse_frequencies(half), "o-", label=r"paper: $10000^{-2k/d}$"
    )
    axes[1].semilogy(
        range(half),
        relattn.inverse_frequencies(half, endpoint=True),
        "x--",
        mew=2,
        label=r"released: $10000^{-k/(d/2-1)}$",
    )
    axes[1].set_xlabel("frequency index k")
    axes[1].set_ylabel("rad per position")
    axes[1].set_title(f"frequencies, d_head = {d_head}", fontsize=10)
    axes[1].legend(fontsize=8)
    # 3–4. Attention weights of the two forms on the same parameters (v = I gives them).
    x = rng.normal(size=(1, length, d_head))
    w_q, w_k = rng.normal(scale=0.5 / np.sqrt(d_head), size=(2, d_head, d_head))
    u, w = rng.normal(scale=0.5, size=(2, 1, d_head))
    qs, ks = (x @ w_q)[:, None], (x @ w_k)[:, None]  # (B, H, L, d), one head
    eye = np.eye(length)[None, None]
    released = example.tener_released_attention(qs, ks, eye, u, w)[0, 0]
    paper_weights = relattn.relative_attention(
        qs, ks, eye, paper, content_bias=u[:, None, :], position_bias=w[:, None, :], scale=1.0
    )[0, 0]
    norm = PowerNorm(0.5, vmin=0, vmax=float(max(released.max(), paper_weights.max())))
    for ax, (name, weights) in zip(
        axes[2:], (("paper form", paper_weights), ("released form", released)), strict=True
    ):
        image = ax.imshow(weights, cmap="viridis", norm=norm)
        ax.set_title(f"{name}: attention weights,\nsame parameters", fontsize=10)
        ax.set_xticks(range(0, length, 4))
        ax.set_yticks(range(0, length, 4))
        ax.set_xlabel("key j")
        ax.set_ylabel("query t")
    fig.colorbar(image, ax=axes[2:], shrink=0.85, label="weight (square-root scale)")


# ----------------------------------------------------------------------------------------
# Long sequences and devices
# ----------------------------------------------------------------------------------------


def _layout_strip(ax, width, lk, slices, title):
    """The columns ``m`` of the full relative layout, ``slices``: ``(m0, width, colour, label)``."""
    for m in range(width):
        absent = m > lk - 1
        ax.add_patch(
            plt.Rectangle(
                (m, 0),
                1,
                1,
                facecolor="#edf2f7" if absent else "#bee3f8",
                edgecolor="white",
                lw=1.5,
            )
        )
        ax.text(m + 0.5, 0.5, str(m - (lk - 1)), ha="center", va="center", fontsize=8)
    for row, (m0, span, color, label) in enumerate(slices):
        y = -0.55 - 0.5 * row
        ax.add_patch(plt.Rectangle((m0, y), span, 0.35, facecolor=color, alpha=0.85))
        ax.text(m0 + span + 0.3, y + 0.17, label, va="center", fontsize=9)
    ax.set_xlim(-0.2, width + 9)
    ax.set_ylim(-0.55 - 0.5 * len(slices), 1.2)
    ax.set_xticks(np.arange(0, width, 2) + 0.5, [str(m) for m in range(0, width, 2)], fontsize=8)
    ax.set_yticks([0.5], ["δ"])
    ax.tick_params(length=0)
    ax.xaxis.set_ticks_position("top")
    ax.set_xlabel(title)
    ax.xaxis.set_label_position("top")
    for side in ax.spines.values():
        side.set_visible(False)


def blockwise_blocks() -> None:
    """A causal score matrix in blocks: skipped blocks, one block and its table columns."""
    length, size = 16, 4
    i0, j0 = 8, 4  # the highlighted block
    fig = plt.figure(figsize=(11, 9.6), layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[4.2, 1])
    ax = fig.add_subplot(grid[0])
    mask = np.asarray(relattn.causal_mask(length, length))
    ax.imshow(mask, cmap=MASK_CMAP, vmin=0, vmax=1, alpha=0.55)
    _grid(ax, length, length)
    column = np.asarray(relattn.relative_positions(length, length)) + length - 1  # m of (i, j)
    for bi in range(0, length, size):
        for bj in range(0, length, size):
            visible = np.asarray(
                relattn.causal_mask(size, size, query_start=bi, key_start=bj, offset=0)
            )
            assert np.array_equal(visible, mask[bi : bi + size, bj : bj + size])
            if not visible.any():
                ax.add_patch(
                    plt.Rectangle(
                        (bj - 0.5, bi - 0.5),
                        size,
                        size,
                        facecolor="#f7fafc",
                        hatch="//",
                        edgecolor="#a0aec0",
                        lw=0,
                    )
                )
                ax.text(
                    bj + size / 2 - 0.5,
                    bi + size / 2 - 0.5,
                    "skipped",
                    ha="center",
                    va="center",
                    fontsize=10,
                    color="#4a5568",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )
            ax.add_patch(
                plt.Rectangle(
                    (bj - 0.5, bi - 0.5),
                    size,
                    size,
                    fill=False,
                    edgecolor="#2d3748",
                    lw=1.8,
                    zorder=4,
                )
            )
    m0 = j0 - i0 - (size - 1) + length - 1
    block_columns = column[i0 : i0 + size, j0 : j0 + size]
    distances = np.asarray(
        relattn.relative_distances(size, size, query_start=i0, key_start=j0, offset=0)
    )
    assert np.array_equal(np.unique(block_columns), distances + length - 1)
    assert block_columns.min() == m0 and block_columns.max() == m0 + 2 * size - 2
    for i in range(i0, i0 + size):
        for j in range(j0, j0 + size):
            ax.text(
                j,
                i,
                str(column[i, j]),
                ha="center",
                va="center",
                fontsize=9,
                color="#9b2c2c",
                weight="bold",
            )
    ax.add_patch(
        plt.Rectangle(
            (j0 - 0.5, i0 - 0.5), size, size, fill=False, edgecolor="#e53e3e", lw=3.5, zorder=5
        )
    )
    diagonal = column[i0 : i0 + size, i0 : i0 + size]
    ax.add_patch(
        plt.Rectangle(
            (i0 - 0.5, i0 - 0.5),
            size,
            size,
            fill=False,
            edgecolor="#dd6b20",
            lw=3.5,
            ls="--",
            zorder=5,
        )
    )
    ax.set_xticks(range(length))
    ax.set_yticks(range(length))
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.xaxis.set_ticks_position("top")
    ax.xaxis.set_label_position("top")
    ax.set_title(
        f"causal scores, L = {length}, blocks of {size}: the red block (i0 = {i0}, j0 = {j0}) "
        "reads table columns m (numbers)",
        fontsize=10,
    )
    ax.legend(
        handles=[
            Patch(color=MASK_CMAP(1), alpha=0.55, label="pair computed"),
            Patch(color=MASK_CMAP(0), alpha=0.55, label="pair masked\n(in a visited block)"),
            Patch(facecolor="#f7fafc", hatch="//", edgecolor="#a0aec0", label="block skipped"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize=9,
        frameon=False,
    )
    strip = fig.add_subplot(grid[1])
    _layout_strip(
        strip,
        2 * length - 1,
        length,
        [
            (
                m0,
                2 * size - 1,
                "#e53e3e",
                f"red block: m0 = j0 − i0 − (bq − 1) + Lq − 1 = {m0},"
                f" width bq + bk − 1 = {2 * size - 1}",
            ),
            (
                int(diagonal.min()),
                2 * size - 1,
                "#dd6b20",
                f"dashed diagonal block: m0 = {int(diagonal.min())};"
                " its columns past δ = 0 are masked",
            ),
        ],
        f"columns m = 0 … {2 * length - 2} of the full relative layout (cells: δ = m − (Lk − 1)); "
        f"a causal-layout table has only m ≤ {length - 1} (blue)",
    )


#: The fallback measurement of :func:`long_sequence_memory`: lengths and block size.
MEASURED_LENGTHS = (256, 512, 1024, 2048)
MEASURED_BLOCK_SIZE = 256


def _long_sequence_rows() -> tuple[list[dict], str | None]:
    """Rows of ``asv_bench/long-sequences.json`` and its provenance, or ``[]`` and ``None``."""
    import json
    from pathlib import Path

    path = Path(relattn.__file__).resolve().parents[1] / "asv_bench" / "long-sequences.json"
    if not path.exists():
        return [], None
    saved = json.loads(path.read_text(encoding="utf-8"))
    keys = {"backend", "path", "length", "peak_bytes", "seconds"}
    rows = [
        r
        for r in saved.get("rows", [])
        if keys <= set(r) and r["path"] in ("before", "dense", "blockwise")
    ]
    source = (
        "asv_bench/long-sequences.json (python asv_bench/long_sequences.py memory); "
        f"{saved.get('environment', 'environment not recorded')}"
    )
    return rows, source if rows else None


def _measure_long_sequences() -> list[dict]:
    """tracemalloc peak of one causal ``relative_attention`` call, NumPy float32, both paths."""
    import tracemalloc

    heads, d = 8, 64
    rows = []
    for length in MEASURED_LENGTHS:
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((1, heads, length, d), dtype=np.float32) for _ in range(3))
        table = rng.standard_normal((heads, length, d), dtype=np.float32)  # causal layout
        u, w = (0.1 * rng.standard_normal((heads, 1, d), dtype=np.float32) for _ in range(2))
        for path, block_size in (("dense", None), ("blockwise", MEASURED_BLOCK_SIZE)):
            tracemalloc.start()
            out = relattn.relative_attention(
                q, k, v, table, content_bias=u, position_bias=w, block_size=block_size
            )
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            del out
            rows.append({"backend": "numpy", "path": path, "length": length, "peak_bytes": peak})
    return rows


def long_sequence_memory() -> None:
    """Peak memory (and time, from the benchmark) of causal relative attention against L.

    Reads the benchmark's ``asv_bench/long-sequences.json`` when it exists;
    otherwise measures NumPy's peak with tracemalloc while the page is built
    (memory only: timings on a shared build machine mean little).
    """
    rows, source = _long_sequence_rows()
    measured = source is None
    if measured:
        rows = _measure_long_sequences()
        source = (
            "no asv_bench/long-sequences.json in this build: measured while this page was built, "
            f"NumPy, tracemalloc peak of one call, blockwise with block_size={MEASURED_BLOCK_SIZE}"
        )
    panels = 1 if measured else 2
    fig, axes = plt.subplots(
        1, panels, figsize=(9 if measured else 13, 4.6), layout="constrained", squeeze=False
    )
    axes = axes[0]
    colors = {"numpy": "#2b6cb0", "torch": "#dd6b20", "jax": "#38a169"}
    # "before": the release before the blockwise path, whose dense path held whole (L, L) scores
    styles = {"before": (":", "^"), "dense": ("-", "o"), "blockwise": ("--", "s")}
    for backend in colors:
        for path, (line, marker) in styles.items():
            points = sorted(
                (r["length"], r["peak_bytes"], r.get("seconds", np.nan))
                for r in rows
                if r["backend"] == backend and r["path"] == path
            )
            if not points:
                continue
            lengths, peaks, seconds = (
                np.asarray(c, dtype=float) for c in zip(*points, strict=True)
            )
            style = {
                "ls": line,
                "marker": marker,
                "color": colors[backend],
                "label": f"{backend}, {'dense, earlier release' if path == 'before' else path}",
            }
            axes[0].loglog(lengths, peaks / 2**20, **style)
            if not measured:
                axes[1].loglog(lengths, seconds, **style)
    lengths = np.asarray(sorted({r["length"] for r in rows}), dtype=float)
    axes[0].loglog(
        lengths,
        8 * lengths**2 * 4 / 2**20,
        ":",
        color="grey",
        label="one (H, L, L) float32 score array",
    )
    axes[0].set_ylabel("peak memory (MiB)")
    axes[0].set_title("peak memory of one call", fontsize=10)
    if not measured:
        axes[1].set_ylabel("seconds per call")
        axes[1].set_title("time of one call", fontsize=10)
    for ax in axes:
        ax.set_xlabel("sequence length L")
        ax.set_xticks(lengths, [str(int(n)) for n in lengths])
        ax.minorticks_off()
        ax.grid(True, which="major", color="#e2e8f0")
        ax.legend(fontsize=9)
    lines = [
        "causal Transformer-XL attention (relative_attention, causal-layout table), "
        "B = 1, H = 8, d = 64, float32",
        *_wrapped(source, 100 if measured else 150),
    ]
    fig.suptitle("\n".join(lines), fontsize=10)


def _wrapped(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)


def ring_steps() -> None:
    """Ring attention on 4 devices: the key block each holds per step, the columns it reads."""
    devices, size = 4, 4
    length = devices * size
    fig = plt.figure(figsize=(13, 7.4), layout="constrained")
    grid = fig.add_gridspec(1, 2, width_ratios=[1, 2.0])
    ax = fig.add_subplot(grid[0])
    colors = plt.get_cmap("Set2")
    bars = []
    for p in range(devices):
        i0 = p * size
        for step in range(devices):
            j = (p - step) % devices  # the key block at hand: it started on device p − step
            j0 = j * size
            visible = bool(
                np.asarray(
                    relattn.causal_mask(size, size, query_start=i0, key_start=j0, offset=0)
                ).any()
            )
            ax.add_patch(
                plt.Rectangle(
                    (step, p),
                    1,
                    1,
                    facecolor=colors(j) if visible else "white",
                    hatch=None if visible else "//",
                    edgecolor="#4a5568",
                    lw=1,
                )
            )
            ax.text(
                step + 0.5,
                p + 0.5,
                f"K/V\nblock {j}" + ("" if visible else "\nskipped"),
                ha="center",
                va="center",
                fontsize=10.5,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5, "alpha": 0.85},
            )
            m0 = j0 - i0 - (size - 1) + length - 1
            columns = (
                np.asarray(
                    relattn.relative_distances(size, size, query_start=i0, key_start=j0, offset=0)
                )
                + length
                - 1
            )
            assert columns[0] == m0 and len(columns) == 2 * size - 1
            bars.append((p, step, j, m0, visible))
    ax.set_xlim(0, devices)
    ax.set_ylim(devices, 0)
    ax.set_xticks(np.arange(devices) + 0.5, [f"step {s}" for s in range(devices)], fontsize=11)
    ax.set_yticks(
        np.arange(devices) + 0.5,
        [f"device {p}\nqueries {p * size}–{p * size + size - 1}" for p in range(devices)],
        fontsize=11,
    )
    ax.xaxis.set_ticks_position("top")
    ax.tick_params(length=0)
    ax.set_title(
        "causal: later key blocks are skipped\n(lax.cond); after each step the blocks\n"
        "move one device on (lax.ppermute)",
        fontsize=11,
        pad=30,
    )

    ax = fig.add_subplot(grid[1])
    width = 2 * length - 1
    rows = len(bars)
    for m in range(width):
        ax.add_patch(
            plt.Rectangle(
                (m, -1.3), 1, 1, facecolor="#bee3f8" if m < length else "#edf2f7", edgecolor="white"
            )
        )
        ax.text(m + 0.5, -0.8, str(m - (length - 1)), ha="center", va="center", fontsize=8)
    for r, (p, step, j, m0, visible) in enumerate(bars):
        y = r + 0.4 * p
        ax.add_patch(
            plt.Rectangle(
                (m0, y),
                2 * size - 1,
                0.8,
                facecolor=colors(j) if visible else "white",
                hatch=None if visible else "//",
                edgecolor="#4a5568",
                lw=0.8,
            )
        )
        ax.text(-0.4, y + 0.4, f"device {p}, step {step}", ha="right", va="center", fontsize=10)
    ax.set_xlim(-7, width + 0.2)
    ax.set_ylim(rows + 0.4 * devices, -1.5)
    ax.set_xticks(np.arange(0, width, 2) + 0.5, [str(m) for m in range(0, width, 2)], fontsize=9)
    ax.xaxis.set_ticks_position("top")
    ax.set_yticks([])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(
        f"the table columns m each step reads: m0 = j0 − i0 − (bq − 1) + Lq − 1,\n"
        f"width bq + bk − 1 = {2 * size - 1}; "
        f"Lq = Lk = {length}, bq = bk = {size} (top row: δ of each column, blue: δ ≤ 0)",
        fontsize=11,
    )
