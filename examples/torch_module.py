"""relattn inside a PyTorch ``nn.Module``, trained with ``torch.optim``.

:class:`RelativeSelfAttention` is Transformer-XL's attention layer (Dai et al.
2019, section 3.3) as a module: ``nn.Linear`` projections for queries, keys,
values, the position table and the output, and ``nn.Parameter`` content and
position biases ``u`` and ``v`` (one ``d_head`` vector per head). Its
``forward`` calls :func:`relattn.relative_attention` on the torch tensors
themselves, so autograd reaches every parameter, ``u`` and ``v`` included. It
takes an optional memory ``(B, M, d)`` (keys and values see ``[memory ∘ x]``),
an optional boolean mask (``True`` = may attend), and either the causal layout
(a decoder: distances ``i - j >= 0``) or the full layout (an encoder, XLNet and
Conformer style: both directions).

:class:`LagModel` puts the layer between an embedding and a read-out and learns
the toy task "repeat the token from ``LAG`` steps back" with ``torch.optim.Adam``.

Run with ``python examples/torch_module.py``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import relattn

VOCAB, D_MODEL, HEADS, LAG = 8, 16, 2, 2
BATCH, LENGTH, LEARNING_RATE = 32, 8, 1e-2


class RelativeSelfAttention(nn.Module):
    """Multi-head self-attention with Transformer-XL relative position scores.

    Parameters
    ----------
    d_model : int
        Model width, even and divisible by ``heads``.
    heads : int
        Number of attention heads.
    causal : bool, optional
        ``True``: causal layout, a query sees keys at distances ``i - j >= 0``
        only (memory and earlier tokens). ``False``: full layout, every key,
        with its own encoding for each signed distance.
    """

    def __init__(self, d_model: int, heads: int, *, causal: bool = True) -> None:
        super().__init__()
        self.d_model, self.heads, self.causal = d_model, heads, causal
        d_head = d_model // heads
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.w_r = nn.Linear(d_model, d_model, bias=False)  # W_{k,R}: projects the sinusoid
        self.w_o = nn.Linear(d_model, d_model, bias=False)
        self.u = nn.Parameter(torch.randn(heads, d_head) / math.sqrt(d_head))  # content bias
        self.v = nn.Parameter(torch.randn(heads, d_head) / math.sqrt(d_head))  # position bias

    def position_table(self, query_length: int, key_length: int, like: torch.Tensor):
        """Projected sinusoid of ``i - j = -δ`` over the relative layout, ``(H, W, d_head)``."""
        distance = -relattn.relative_distances(
            query_length, key_length, causal=self.causal, xp=torch, device=like.device
        )
        table = relattn.sinusoidal_position_encoding(
            distance, self.d_model, layout="concatenated", dtype=like.dtype
        )
        return relattn.split_heads(self.w_r(table), self.heads)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x (B, L, d)`` attends over ``[memory ∘ x]``; returns ``(B, L, d)``.

        ``mask`` is boolean, ``True`` = may attend, broadcastable to
        ``(B, H, L, M + L)``.
        """
        context = x if memory is None else torch.cat((memory, x), dim=-2)
        q = relattn.split_heads(self.w_q(x), self.heads)  # (B, H, L, d_head)
        k = relattn.split_heads(self.w_k(context), self.heads)  # (B, H, M + L, d_head)
        v = relattn.split_heads(self.w_v(context), self.heads)
        r = self.position_table(x.shape[-2], context.shape[-2], x)
        attended = relattn.relative_attention(
            q,
            k,
            v,
            r,
            content_bias=self.u[:, None, :],
            position_bias=self.v[:, None, :],
            mask=mask,
        )
        return self.w_o(relattn.merge_heads(attended))


class LagModel(nn.Module):
    """Embedding, one causal :class:`RelativeSelfAttention` with a residual, layer norm, read-out.

    No absolute position encoding: order reaches the model through the
    relative scores only.
    """

    def __init__(self, vocab: int = VOCAB, d_model: int = D_MODEL, heads: int = HEADS) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.attention = RelativeSelfAttention(d_model, heads, causal=True)
        self.norm = nn.LayerNorm(d_model, elementwise_affine=False)
        self.read_out = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, L, vocab)`` for tokens ``(B, L)``."""
        h = self.embedding(tokens)
        return self.read_out(self.norm(h + self.attention(h)))


def lag_loss(model: LagModel, tokens: torch.Tensor, lag: int = LAG) -> torch.Tensor:
    """Cross-entropy of predicting ``tokens[t - lag]`` at every position ``t >= lag``."""
    logits = model(tokens)[:, lag:]
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, :-lag].reshape(-1)
    )


def train(
    steps: int = 200,
    seed: int = 0,
    *,
    batch: int = BATCH,
    length: int = LENGTH,
    learning_rate: float = LEARNING_RATE,
) -> tuple[LagModel, list[float]]:
    """Train a :class:`LagModel` on fresh random batches with Adam; ``(model, losses)``."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = LagModel()
    optimiser = torch.optim.Adam(model.parameters(), lr=learning_rate)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (batch, length), generator=generator)
        loss = lag_loss(model, tokens)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return model, losses


if __name__ == "__main__":
    model, losses = train(steps=150)
    for n in (0, 25, 50, 100, 149):
        print(f"step {n:3d}: loss {losses[n]:.3f}")
    print(f"chance loss ln {VOCAB} = {math.log(VOCAB):.3f}")
    test = torch.randint(0, VOCAB, (256, LENGTH), generator=torch.Generator().manual_seed(1234))
    with torch.no_grad():
        predicted = model(test)[:, LAG:].argmax(-1)
    accuracy = (predicted == test[:, :-LAG]).float().mean().item()
    print(f"accuracy on held-out batches (repeat the token {LAG} back): {accuracy:.2f}")
    layer = RelativeSelfAttention(D_MODEL, HEADS, causal=False)
    x, memory = torch.randn(2, 5, D_MODEL), torch.randn(2, 3, D_MODEL)
    print(f"full-layout layer with memory: x {tuple(x.shape)} -> {tuple(layer(x, memory).shape)}")
