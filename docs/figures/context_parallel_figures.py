"""The figure of the context-parallelism page, drawn at build time from relattn itself."""

from __future__ import annotations

import numpy as np
from matplotlib import pyplot as plt

import relattn


def _owners(devices: int, sharding: str) -> np.ndarray:
    """The device that holds each of the ``2n`` chunks of the sequence."""
    chunks = np.arange(2 * devices)
    layout = relattn.zigzag_shard(chunks, devices, axis=0) if sharding == "zigzag" else chunks
    owners = np.empty(2 * devices, dtype=int)
    owners[layout] = np.repeat(np.arange(devices), 2)  # shard p: positions 2p and 2p + 1
    return owners


def zigzag_work() -> None:
    """The causal chunk pairs each device folds, contiguous and zig-zag, on 4 devices."""
    devices = 4
    chunks = 2 * devices
    colors = plt.get_cmap("Set2")
    _, axes = plt.subplots(1, 3, figsize=(13, 4.6), layout="constrained", width_ratios=[1, 1, 0.9])
    counts = {}
    for ax, sharding in zip(axes[:2], ("contiguous", "zigzag"), strict=True):
        owners = _owners(devices, sharding)
        work = np.zeros(devices, dtype=int)
        for i in range(chunks):
            for j in range(chunks):
                visible = j <= i  # causal: a key chunk after the query chunk is skipped
                device = owners[i]  # the queries' device folds the pair
                work[device] += visible
                ax.add_patch(
                    plt.Rectangle(
                        (j, i), 1, 1, facecolor=colors(device) if visible else "white",
                        hatch=None if visible else "//", edgecolor="#4a5568", lw=0.8,
                    )
                )  # fmt: skip
                if visible:
                    ax.text(j + 0.5, i + 0.5, str(device), ha="center", va="center", fontsize=9)
        counts[sharding] = work
        ax.set_xlim(0, chunks)
        ax.set_ylim(chunks, 0)
        ticks = np.arange(chunks) + 0.5
        ax.set_xticks(ticks, [str(c) for c in range(chunks)])
        ax.set_yticks(ticks, [f"{c} (dev {owners[c]})" for c in range(chunks)])
        ax.set_xlabel("key chunk")
        ax.set_ylabel("query chunk (its device)")
        ax.set_title(f'sharding="{sharding}": chunk pairs per device\n{work.tolist()}')
    ax = axes[2]
    x = np.arange(devices)
    for offset, sharding in ((-0.2, "contiguous"), (0.2, "zigzag")):
        ax.bar(x + offset, counts[sharding], width=0.4, label=sharding,
               color="#a0aec0" if sharding == "contiguous" else "#2b6cb0")  # fmt: skip
    ax.set_xticks(x, [f"device {d}" for d in x])
    ax.set_ylabel("causal chunk pairs folded")
    ax.set_title("the ring moves in lockstep:\nthe most loaded device sets the time")
    ax.legend()
    assert counts["zigzag"].tolist() == [2 * devices + 1] * devices
