"""Training a relative-attention model in JAX: ``jax.value_and_grad``, ``jax.jit``, plain SGD.

The model is one Transformer-XL-style layer (Dai et al. 2019, section 3.3):
token embeddings, multi-head causal self-attention with relative scores
``(q_i + u)·k_j + (q_i + v)·r_{i-j}`` (:func:`relattn.relative_attention`, the
sinusoid of ``i - j`` projected by ``w_r``, content bias ``u`` and position
bias ``v`` per head), a residual connection, layer norm and a linear read-out.
It has no absolute position encoding: all it knows about order comes from the
relative scores.

The toy task is "repeat the token from ``LAG`` steps back": at position ``t``
the target is ``tokens[t - LAG]``, which a head solves by attending to the key
at distance ``δ = -LAG``. The parameters are a pytree (a dict of arrays); one
training step is ``jax.value_and_grad`` of the cross-entropy and an SGD update
written with ``jax.tree_util.tree_map``, compiled with ``jax.jit``.

Run with ``python examples/jax_training.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

import relattn

VOCAB, D_MODEL, HEADS, LAG = 8, 16, 2, 2
BATCH, LENGTH, LEARNING_RATE = 32, 8, 0.5


def init_params(key: jax.Array, *, vocab: int = VOCAB, d_model: int = D_MODEL, heads: int = HEADS):
    """The parameter pytree: a dict of float32 arrays."""
    keys = iter(jax.random.split(key, 9))
    d_head = d_model // heads

    def normal(shape: tuple[int, ...]) -> jax.Array:
        return jax.random.normal(next(keys), shape, dtype=jnp.float32)

    def dense(n_in: int, n_out: int) -> jax.Array:
        return normal((n_in, n_out)) / math.sqrt(n_in)

    return {
        "embedding": normal((vocab, d_model)),
        "w_q": dense(d_model, d_model),
        "w_k": dense(d_model, d_model),
        "w_v": dense(d_model, d_model),
        "w_r": dense(d_model, d_model),
        "w_o": dense(d_model, d_model),
        "u": 0.1 * normal((heads, d_head)),  # content bias, one per head
        "v": 0.1 * normal((heads, d_head)),  # position bias, one per head
        "w_out": dense(d_model, vocab),
    }


def layer_norm(x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.var(x, axis=-1, keepdims=True) + eps)


def forward(params, tokens: jax.Array, *, heads: int = HEADS) -> jax.Array:
    """Logits ``(B, L, vocab)`` for tokens ``(B, L)``."""
    h = params["embedding"][tokens]  # (B, L, d)
    length, d_model = h.shape[-2], h.shape[-1]
    # Causal layout: row m encodes i - j = -δ = L - 1 - m (Transformer-XL's R_{i-j}).
    distance = -relattn.relative_distances(length, length, causal=True, xp=jnp)
    table = relattn.sinusoidal_position_encoding(
        distance, d_model, layout="concatenated", dtype=h.dtype
    )
    q = relattn.split_heads(h @ params["w_q"], heads)  # (B, H, L, d_head)
    k = relattn.split_heads(h @ params["w_k"], heads)
    v = relattn.split_heads(h @ params["w_v"], heads)
    r = relattn.split_heads(table @ params["w_r"], heads)  # (H, L, d_head)
    attended = relattn.relative_attention(
        q,
        k,
        v,
        r,
        content_bias=params["u"][:, None, :],
        position_bias=params["v"][:, None, :],
    )  # the causal layout masks the future keys
    h = layer_norm(h + relattn.merge_heads(attended) @ params["w_o"])
    return h @ params["w_out"]


def loss_fn(params, tokens: jax.Array, *, heads: int = HEADS, lag: int = LAG) -> jax.Array:
    """Mean cross-entropy of predicting ``tokens[t - lag]`` at every position ``t >= lag``."""
    logits = forward(params, tokens, heads=heads)[:, lag:]
    targets = tokens[:, :-lag]
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_p, targets[..., None], axis=-1))


def train_step(params, tokens: jax.Array, learning_rate, *, heads: int = HEADS, lag: int = LAG):
    """One SGD step: ``(new_params, loss)``, the loss taken before the update."""
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, heads=heads, lag=lag)
    new_params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
    return new_params, loss


#: :func:`forward` compiled (``heads`` fixes shapes, so it is static).
jit_forward = jax.jit(forward, static_argnames=("heads",))

#: :func:`train_step` compiled; ``heads`` and ``lag`` fix shapes, so they are static.
jit_train_step = jax.jit(train_step, static_argnames=("heads", "lag"))


def make_batch(key: jax.Array, *, batch: int = BATCH, length: int = LENGTH, vocab: int = VOCAB):
    """Uniformly random token ids ``(batch, length)``."""
    return jax.random.randint(key, (batch, length), 0, vocab)


def train(
    steps: int = 200,
    seed: int = 0,
    *,
    batch: int = BATCH,
    length: int = LENGTH,
    learning_rate: float = LEARNING_RATE,
    jit: bool = True,
):
    """Train from scratch on fresh random batches; returns ``(params, losses)``.

    ``losses[n]`` is the loss of step ``n``'s batch before its update.
    """
    param_key, data_key = jax.random.split(jax.random.PRNGKey(seed))
    params = init_params(param_key)
    step = jit_train_step if jit else train_step
    losses = []
    for batch_key in jax.random.split(data_key, steps):
        params, loss = step(
            params, make_batch(batch_key, batch=batch, length=length), learning_rate
        )
        losses.append(float(loss))
    return params, losses


def accuracy(params, tokens: jax.Array, *, lag: int = LAG) -> float:
    """Fraction of positions ``t >= lag`` where the arg-max prediction is ``tokens[t - lag]``."""
    predicted = jnp.argmax(jit_forward(params, tokens)[:, lag:], axis=-1)
    return float(jnp.mean(predicted == tokens[:, :-lag]))


if __name__ == "__main__":
    params, losses = train(steps=150)
    for n in (0, 25, 50, 100, 149):
        print(f"step {n:3d}: loss {losses[n]:.3f}")
    test = make_batch(jax.random.PRNGKey(1234), batch=256)
    print(f"chance loss ln {VOCAB} = {math.log(VOCAB):.3f}")
    print(
        f"accuracy on held-out batches (repeat the token {LAG} back): {accuracy(params, test):.2f}"
    )
