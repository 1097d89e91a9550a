"""Training relattn's Equinox layer with optax: ``eqx.filter_value_and_grad``, ``eqx.filter_jit``.

The model is token embeddings, one :class:`relattn.equinox.RelativeAttention`
layer (T5's learned bucketed bias by default, causal), a residual connection,
layer norm and a linear read-out. It has no absolute position encoding: all it
knows about order comes from the layer's relative positions.

The toy task is "repeat the token from ``LAG`` steps back": at position ``t``
the target is ``tokens[t - LAG]`` (positions ``t < LAG`` are not scored), which
a head solves by attending to the key at distance ``δ = -LAG``. One training
step is ``eqx.filter_value_and_grad`` of the cross-entropy and an Adam update
(``optax.adam``) of the model's arrays (``eqx.filter(model, eqx.is_array)``),
applied with ``eqx.apply_updates``, compiled with ``eqx.filter_jit``. The
trained model is saved and loaded with ``eqx.tree_serialise_leaves`` /
``eqx.tree_deserialise_leaves``.

Run with ``python examples/equinox_training.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from relattn.equinox import RelativeAttention

VOCAB, D_MODEL, HEADS, LAG = 8, 16, 2, 2
BATCH, LENGTH, LEARNING_RATE = 32, 8, 1e-2


class CopyModel(eqx.Module):
    """Embedding, one relative-attention layer with a residual, layer norm, read-out."""

    embedding: jax.Array
    attention: RelativeAttention
    readout: jax.Array

    def __init__(self, scheme: str = "t5", *, key: jax.Array) -> None:
        embed_key, attention_key, readout_key = jax.random.split(key, 3)
        self.embedding = jax.random.normal(embed_key, (VOCAB, D_MODEL), dtype=jnp.float32)
        self.attention = RelativeAttention(D_MODEL, HEADS, scheme, causal=True, key=attention_key)
        self.readout = jax.random.normal(readout_key, (D_MODEL, VOCAB), dtype=jnp.float32)
        self.readout = self.readout / D_MODEL**0.5

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits ``(B, L, VOCAB)`` for integer tokens ``(B, L)``."""
        h = self.embedding[tokens]
        h = h + self.attention(h)
        mean = jnp.mean(h, axis=-1, keepdims=True)
        h = (h - mean) / jnp.sqrt(jnp.var(h, axis=-1, keepdims=True) + 1e-5)
        return h @ self.readout


def batch(key: jax.Array) -> jax.Array:
    """Random tokens ``(BATCH, LENGTH)``."""
    return jax.random.randint(key, (BATCH, LENGTH), 0, VOCAB)


def loss_fn(model: CopyModel, tokens: jax.Array) -> jax.Array:
    """Mean cross-entropy of predicting ``tokens[t - LAG]`` at every ``t >= LAG``."""
    logits = model(tokens)[:, LAG:]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, :-LAG]))


def make_step(optimizer: optax.GradientTransformation):
    """One compiled training step ``(model, state, tokens) -> (model, state, loss)``."""

    @eqx.filter_jit
    def step(model: CopyModel, state: optax.OptState, tokens: jax.Array):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, tokens)
        updates, state = optimizer.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, loss

    return step


def train(steps: int = 100, seed: int = 0, scheme: str = "t5") -> tuple[CopyModel, list[float]]:
    """Train a fresh model for ``steps`` Adam steps; return it and the loss of every step."""
    model_key, data_key = jax.random.split(jax.random.key(seed))
    model = CopyModel(scheme, key=model_key)
    optimizer = optax.adam(LEARNING_RATE)
    state = optimizer.init(eqx.filter(model, eqx.is_array))
    step = make_step(optimizer)
    losses = []
    for key in jax.random.split(data_key, steps):
        model, state, loss = step(model, state, batch(key))
        losses.append(float(loss))
    return model, losses


def save_and_load(model: CopyModel, path: Path, scheme: str = "t5") -> CopyModel:
    """``model`` written to ``path`` and read back into a freshly built one."""
    eqx.tree_serialise_leaves(path, model)
    like = CopyModel(scheme, key=jax.random.key(12345))
    return eqx.tree_deserialise_leaves(path, like)


if __name__ == "__main__":
    model, losses = train()
    for n in range(0, len(losses), 20):
        print(f"step {n:3d}  loss {losses[n]:.3f}")
    print(f"step {len(losses) - 1:3d}  loss {losses[-1]:.3f}")
    tokens = batch(jax.random.key(99))
    with tempfile.TemporaryDirectory() as folder:
        loaded = save_and_load(model, Path(folder) / "model.eqx")
    difference = jnp.max(jnp.abs(loaded(tokens) - model(tokens)))
    print(f"saved and loaded: max |Δ logits| = {float(difference):.1e}")
    accuracy = jnp.mean(jnp.argmax(model(tokens)[:, LAG:], axis=-1) == tokens[:, :-LAG])
    print(f"accuracy on a fresh batch: {float(accuracy):.2f}")
