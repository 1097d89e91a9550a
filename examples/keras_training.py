"""Training a Keras 3 model with relattn's attention layer: ``model.fit`` on JAX or PyTorch.

The model is token embeddings, one :class:`relattn.keras.RelativeAttention`
layer (causal, any scheme; Transformer-XL's relative scores by default), a
residual connection, layer norm and a linear read-out, built with Keras's
functional API. It has no absolute position encoding: all it knows about
order comes from the layer's relative positions.

The toy task is "repeat the token from ``LAG`` steps back": at position ``t``
the target is ``tokens[t - LAG]``, which a head solves by attending to the key
``LAG`` positions back. ``model.fit`` trains it for a few epochs over a fixed
set of random sequences (Adam, sparse cross-entropy), compiled as Keras
compiles on the backend (XLA on JAX, eager on PyTorch).

Keras takes its backend from ``KERAS_BACKEND`` when it is first imported; this
script uses ``"jax"`` where the variable is unset. Run with
``python examples/keras_training.py`` or ``KERAS_BACKEND=torch python
examples/keras_training.py``.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras is imported

import keras
import numpy as np

from relattn.keras import RelativeAttention

VOCAB, D_MODEL, HEADS, LAG = 8, 16, 2, 2
SAMPLES, BATCH, LENGTH, LEARNING_RATE = 512, 32, 8, 0.02


def build_model(
    scheme: str = "transformer_xl",
    *,
    vocab: int = VOCAB,
    d_model: int = D_MODEL,
    heads: int = HEADS,
    length: int = LENGTH,
    lag: int = LAG,
) -> keras.Model:
    """Tokens ``(B, length)`` -> logits ``(B, length - lag, vocab)`` of positions ``t >= lag``."""
    tokens = keras.Input((length,), dtype="int32")
    h = keras.layers.Embedding(vocab, d_model)(tokens)
    attended = RelativeAttention(d_model, heads, scheme, causal=True)(h)
    h = keras.layers.LayerNormalization()(h + attended)
    logits = keras.layers.Dense(vocab)(h)
    return keras.Model(tokens, logits[:, lag:])


def make_data(
    seed: int, *, samples: int = SAMPLES, length: int = LENGTH, lag: int = LAG
) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids ``(samples, length)`` and their targets ``tokens[:, :-lag]``."""
    tokens = np.random.default_rng(seed).integers(0, VOCAB, (samples, length), dtype="int32")
    return tokens, tokens[:, :-lag]


def train(
    epochs: int = 8,
    seed: int = 0,
    *,
    scheme: str = "transformer_xl",
    learning_rate: float = LEARNING_RATE,
    samples: int = SAMPLES,
) -> tuple[keras.Model, list[float]]:
    """Train from scratch with ``model.fit``; returns ``(model, losses)``, one loss per epoch.

    ``losses[n]`` is the mean loss of epoch ``n``'s batches, each before its
    update.
    """
    keras.utils.set_random_seed(seed)
    model = build_model(scheme)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    tokens, targets = make_data(seed, samples=samples)
    history = model.fit(tokens, targets, batch_size=BATCH, epochs=epochs, verbose=0)
    return model, [float(loss) for loss in history.history["loss"]]


def accuracy(model: keras.Model, tokens: np.ndarray, lag: int = LAG) -> float:
    """Fraction of positions ``t >= lag`` where the arg-max prediction is ``tokens[t - lag]``."""
    predicted = np.argmax(model.predict(tokens, verbose=0), axis=-1)
    return float(np.mean(predicted == tokens[:, :-lag]))


if __name__ == "__main__":
    print(f"Keras {keras.__version__} on {keras.backend.backend()}")
    model, losses = train()
    for epoch, loss in enumerate(losses):
        print(f"epoch {epoch}: loss {loss:.3f}")
    print(f"chance loss ln {VOCAB} = {math.log(VOCAB):.3f}")
    held_out, _ = make_data(1234, samples=256)
    print(f"accuracy on held-out sequences (repeat the token {LAG} back): "
          f"{accuracy(model, held_out):.2f}")  # fmt: skip
