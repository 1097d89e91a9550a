"""SPEC §4 recipe 3: Transformer-XL, two layers, three segments, memory.

The segment-by-segment run (relattn calls with ``update_memory``) is checked
against ``reference.transformer_xl``, a whole-sequence run of an independent
NumPy float64 model whose attention is the per-pair loop of
``reference.relative_attention``, under the causal mask. With a memory that
covers all history the two must agree.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference

import relattn
from relattn.demo import Config, TransformerXLEncoder


@pytest.fixture(scope="module")
def problem():
    config = Config(segment=5, memory=10, d_model=8, heads=2, layers=2, clamp_len=7, seed=3)
    tokens = np.random.default_rng(0).integers(0, 256, size=15)  # three segments
    weights = TransformerXLEncoder.init_weights(config)
    return (
        config,
        tokens,
        weights,
        reference.transformer_xl(weights, tokens, heads=config.heads, clamp_len=config.clamp_len),
    )


def _segmented(backend, dtype, config, tokens):
    encoder = TransformerXLEncoder(config, backend.xp, backend.dtype(dtype), backend.device)
    memories = [None] * config.layers
    outputs = []
    for start in range(0, len(tokens), config.segment):
        h = encoder.embed(tokens[start : start + config.segment])
        out, memories = encoder.step(h, memories)
        outputs.append(out)
        assert all(m.shape[-2] == min(config.memory, start + config.segment) for m in memories)
    return backend.xp.concat(outputs, axis=0)


def test_segments_with_full_memory_equal_whole_sequence(backend, dtype, problem):
    config, tokens, _, expected = problem
    got = _segmented(backend, dtype, config, tokens)
    backend.assert_close(got, expected, dtype)


def test_whole_sequence_relattn_equals_reference(backend, dtype, problem):
    config, tokens, _, expected = problem
    encoder = TransformerXLEncoder(config, backend.xp, backend.dtype(dtype), backend.device)
    out, _ = encoder.step(encoder.embed(tokens), [None] * config.layers)
    backend.assert_close(out, expected, dtype)


def test_short_memory_differs_from_whole_sequence(problem):
    """A memory shorter than the history loses context: the test above can fail."""
    config, tokens, _, expected = problem
    short = Config(**{**config.__dict__, "memory": 2})
    xp = relattn.backends.namespace_of_module(None)
    encoder = TransformerXLEncoder(short, xp, xp.float64)
    memories = [None] * short.layers
    outputs = []
    for start in range(0, len(tokens), short.segment):
        out, memories = encoder.step(encoder.embed(tokens[start : start + short.segment]), memories)
        outputs.append(out)
    got = np.concatenate(outputs)
    np.testing.assert_allclose(got[: short.segment], expected[: short.segment], rtol=1e-10)
    assert np.max(np.abs(got[short.segment :] - expected[short.segment :])) > 1e-3


def test_memory_is_cut_from_gradients_torch(torch_backend):
    config = Config(segment=4, memory=4, d_model=8, heads=2, layers=1)
    encoder = TransformerXLEncoder(
        config, torch_backend.xp, torch_backend.dtype("float64"), torch_backend.device
    )
    tokens = np.arange(8)
    h1 = encoder.embed(tokens[:4]).requires_grad_(True)
    _, memories = encoder.step(h1, [None])
    assert not memories[0].requires_grad
    h2 = encoder.embed(tokens[4:]).requires_grad_(True)
    out, _ = encoder.step(h2, memories)
    out.sum().backward()
    assert h1.grad is None and h2.grad is not None
    assert math.isfinite(float(h2.grad.abs().sum()))
