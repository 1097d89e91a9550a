"""Training a Flax NNX model with relattn's attention layer: ``nnx.Optimizer`` and optax.

The model is token embeddings, one :class:`relattn.nnx.RelativeAttention`
layer (causal, any scheme; Transformer-XL's relative scores by default), a
residual connection, layer norm and a linear read-out. It has no absolute
position encoding: all it knows about order comes from the layer's relative
positions.

The toy task is "repeat the token from ``LAG`` steps back": at position ``t``
the target is ``tokens[t - LAG]``, which a head solves by attending to the key
``LAG`` positions back. One training step is ``nnx.value_and_grad`` of the
cross-entropy and ``optimizer.update(model, grads)`` (optax's Adam), compiled
with ``nnx.jit``; the model and the optimizer are updated in place.

Run with ``python examples/nnx_training.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from relattn.nnx import RelativeAttention

VOCAB, D_MODEL, HEADS, LAG = 8, 16, 2, 2
BATCH, LENGTH, LEARNING_RATE = 32, 8, 0.02


class LagModel(nnx.Module):
    """Embedding, a causal relative-attention layer, residual and layer norm, read-out."""

    def __init__(
        self,
        scheme: str = "transformer_xl",
        *,
        vocab: int = VOCAB,
        d_model: int = D_MODEL,
        heads: int = HEADS,
        rngs: nnx.Rngs,
    ) -> None:
        self.embed = nnx.Embed(vocab, d_model, rngs=rngs)
        self.attention = RelativeAttention(d_model, heads, scheme, causal=True, rngs=rngs)
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.readout = nnx.Linear(d_model, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits ``(B, L, vocab)`` for tokens ``(B, L)``."""
        h = self.embed(tokens)
        return self.readout(self.norm(h + self.attention(h)))


def loss_fn(model: LagModel, tokens: jax.Array, lag: int = LAG) -> jax.Array:
    """Mean cross-entropy of predicting ``tokens[t - lag]`` at every position ``t >= lag``."""
    logits = model(tokens)[:, lag:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, :-lag]).mean()


@nnx.jit
def train_step(model: LagModel, optimizer: nnx.Optimizer, tokens: jax.Array) -> jax.Array:
    """One Adam step on ``tokens``, in place; returns the loss before the update."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
    optimizer.update(model, grads)
    return loss


def make_batch(key: jax.Array, *, batch: int = BATCH, length: int = LENGTH) -> jax.Array:
    """Uniformly random token ids ``(batch, length)``."""
    return jax.random.randint(key, (batch, length), 0, VOCAB)


def train(
    steps: int = 150,
    seed: int = 0,
    *,
    scheme: str = "transformer_xl",
    learning_rate: float = LEARNING_RATE,
) -> tuple[LagModel, list[float]]:
    """Train from scratch on fresh random batches; returns ``(model, losses)``.

    ``losses[n]`` is the loss of step ``n``'s batch before its update.
    """
    model = LagModel(scheme, rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)
    data_key = jax.random.fold_in(jax.random.key(seed), 1)
    losses = [
        float(train_step(model, optimizer, make_batch(key)))
        for key in jax.random.split(data_key, steps)
    ]
    return model, losses


def accuracy(model: LagModel, tokens: jax.Array, lag: int = LAG) -> float:
    """Fraction of positions ``t >= lag`` where the arg-max prediction is ``tokens[t - lag]``."""
    predicted = jnp.argmax(nnx.jit(lambda m, t: m(t))(model, tokens)[:, lag:], axis=-1)
    return float(jnp.mean(predicted == tokens[:, :-lag]))


if __name__ == "__main__":
    model, losses = train(steps=150)
    for n in (0, 25, 50, 100, 149):
        print(f"step {n:3d}: loss {losses[n]:.3f}")
    print(f"chance loss ln {VOCAB} = {math.log(VOCAB):.3f}")
    held_out = make_batch(jax.random.key(1234), batch=256)
    print(f"accuracy on held-out batches (repeat the token {LAG} back): "
          f"{accuracy(model, held_out):.2f}")  # fmt: skip
