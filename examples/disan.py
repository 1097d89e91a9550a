"""Recipe: DiSAN (Shen et al. 2018) on "I come from China !".

Directional Self-Attention Network: two DiSA blocks, one with the forward mask
(each word attends only to the words before it) and one with the backward mask
(only to the words after it), each ``h = elu(x W_h + b_h)``, multi-dimensional
token2token attention and a fusion gate; their outputs are concatenated and
compressed into one sentence vector by multi-dimensional source2token
attention. The batch holds the sentence and its padded prefix "I come from".

Run on NumPy with ``python examples/disan.py``; ``run(xp)`` takes any array
library (``numpy``, ``torch``, ``jax.numpy``, ``array_api_strict`` …).
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

import relattn

WORDS = ("I", "come", "from", "China", "!")
LENGTHS = (5, 3)  # the sentence, and "I come from" padded to 5 tokens
D_EMBED, D = 6, 4  # word embedding size; DiSA block size (the sentence vector has 2·D)


def inputs(seed: int = 0) -> dict[str, Any]:
    """Random NumPy float64 embeddings and parameters of the recipe."""
    rng = np.random.default_rng(seed)
    embedding = rng.normal(size=(len(WORDS), D_EMBED))
    x = np.zeros((len(LENGTHS), len(WORDS), D_EMBED))  # padding positions stay 0
    for b, n in enumerate(LENGTHS):
        x[b, :n] = embedding[:n]

    def dense(n_in: int, n_out: int) -> np.ndarray:
        return rng.normal(scale=1 / np.sqrt(n_in), size=(n_in, n_out))

    def block() -> dict[str, np.ndarray]:
        return {
            # h = elu(x W_x + b_x)
            "w_x": dense(D_EMBED, D),
            "b_x": np.zeros(D),
            # logits c·tanh((h_i W_1 + h_j W_2 + b_1) / c)
            "w_1": dense(D, D),
            "w_2": dense(D, D),
            "b_1": rng.normal(scale=0.1, size=D),
            # fusion gate F = sigmoid(s W_f1 + h W_f2 + b_f)
            "w_f1": dense(D, D),
            "w_f2": dense(D, D),
            "b_f": np.zeros(D),
        }

    return {
        "x": x,
        "forward": block(),
        "backward": block(),
        "sentence": {
            "w_1": dense(2 * D, 2 * D),
            "b_1": np.zeros(2 * D),
            "w": dense(2 * D, 2 * D),
            "b": np.zeros(2 * D),
        },
    }


def elu(z: Any, xp: Any) -> Any:
    return xp.where(z > 0, z, xp.expm1(xp.clip(z, max=0.0)))


def disa_block(x: Any, p: dict[str, Any], direction: str, token_mask: Any, xp: Any) -> Any:
    """One DiSA block: ``u = F ⊙ h + (1 - F) ⊙ s``, zero at padding positions."""
    h = elu(x @ p["w_x"] + p["b_x"], xp)  # (B, L, D)
    u = relattn.multi_dimensional_attention(
        h,
        p["w_1"],
        p["w_2"],
        p["b_1"],
        direction=direction,
        mask=token_mask[:, None, :],  # (B, 1, L): padded keys are never attended
        fusion=(p["w_f1"], p["w_f2"], p["b_f"]),
    )
    return u * xp.astype(token_mask[:, :, None], u.dtype)


def disan(x: Any, p: dict[str, Any], token_mask: Any, xp: Any) -> tuple[Any, Any, Any]:
    """Forward and backward DiSA, concatenated, then source2token: ``(B, 2·D)``."""
    u_forward = disa_block(x, p["forward"], "forward", token_mask, xp)
    u_backward = disa_block(x, p["backward"], "backward", token_mask, xp)
    u = xp.concat((u_forward, u_backward), axis=-1)  # (B, L, 2·D)
    q = p["sentence"]
    sentence = relattn.source2token_attention(
        u, q["w_1"], q["b_1"], q["w"], q["b"], mask=token_mask
    )
    return u_forward, u_backward, sentence


def mask_table(mask: np.ndarray, words: tuple[str, ...] = WORDS) -> str:
    """Rows: query word ``i``; columns: key word ``j``; ``x`` = may attend."""
    width = max(len(w) for w in words)
    head = " " * width + " | " + " ".join(w.rjust(width) for w in words)
    lines = [head, "-" * len(head)]
    for word, row in zip(words, mask, strict=True):
        cells = " ".join(("x" if allowed else ".").rjust(width) for allowed in row)
        lines.append(f"{word.rjust(width)} | {cells}")
    return "\n".join(lines)


def _to_numpy(a: Any) -> np.ndarray:
    return np.from_dlpack(a)


def _to_xp(tree: Any, xp: Any) -> Any:
    if isinstance(tree, dict):
        return {name: _to_xp(value, xp) for name, value in tree.items()}
    return xp.asarray(tree)


def run(xp: Any, *, seed: int = 0) -> dict[str, Any]:
    """DiSAN on the batch; also the forward and backward masks and their tables."""
    p = _to_xp(inputs(seed), xp)
    x = p.pop("x")
    # torch, jax.numpy … as their array-API namespace (``astype``, ``concat``, ``clip``).
    xp = array_api_compat.array_namespace(x)
    device = array_api_compat.device(x)
    token_mask = relattn.padding_mask(xp.asarray(np.asarray(LENGTHS), device=device), len(WORDS))
    u_forward, u_backward, sentence = disan(x, p, token_mask, xp)
    forward = _to_numpy(relattn.forward_mask(len(WORDS), xp=xp, device=device))
    backward = _to_numpy(relattn.backward_mask(len(WORDS), xp=xp, device=device))
    return {
        "u_forward": np.asarray(_to_numpy(u_forward), dtype=np.float64),
        "u_backward": np.asarray(_to_numpy(u_backward), dtype=np.float64),
        "sentence": np.asarray(_to_numpy(sentence), dtype=np.float64),
        "forward_mask": forward,
        "backward_mask": backward,
        "forward_table": mask_table(forward),
        "backward_table": mask_table(backward),
    }


if __name__ == "__main__":
    results = run(np)
    print("forward mask (query row, key column):\n" + results["forward_table"])
    print("backward mask:\n" + results["backward_table"])
    print("sentence vectors (B, 2·D):\n", np.round(results["sentence"], 3))
