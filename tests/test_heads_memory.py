"""split_heads / merge_heads, update_memory and stop_gradient.

Head splitting is checked against slicing the feature axis by hand, memory
against taking the last ``M`` rows of the concatenation by hand, and gradient
stopping with torch autograd and ``jax.grad``.
"""

from __future__ import annotations

import numpy as np
import pytest
from array_api_extra.testing import lazy_xp_function

import relattn

# Lazy on Dask (no graph computed), traced under jax.jit on JAX, for every backend test.
lazy_xp_modules = [relattn]
for _function in (
    relattn.split_heads,
    relattn.merge_heads,
    relattn.update_memory,
    relattn.stop_gradient,
    relattn.scaled_dot_product_attention,
):
    lazy_xp_function(_function)

# -- split / merge heads ------------------------------------------------------------------------


def _split_loop(x, heads):
    """out[..., h, t, c] = x[..., t, h * d_head + c]."""
    *lead, length, features = x.shape
    dh = features // heads
    out = np.zeros((*lead, heads, length, dh), dtype=x.dtype)
    for idx in np.ndindex(*lead):
        for h in range(heads):
            for t in range(length):
                for c in range(dh):
                    out[(*idx, h, t, c)] = x[(*idx, t, h * dh + c)]
    return out


def _merge_loop(x):
    """Concat(head_1 … head_H) along features: out[..., t, h * d_head + c] = x[..., h, t, c]."""
    *lead, heads, length, dh = x.shape
    out = np.zeros((*lead, length, heads * dh), dtype=x.dtype)
    for idx in np.ndindex(*lead):
        for h in range(heads):
            out[(*idx, slice(None), slice(h * dh, (h + 1) * dh))] = x[(*idx, h)]
    return out


LEADS = [(), (2, 1)]


@pytest.mark.parametrize("heads", [1, 2, 8])
@pytest.mark.parametrize("lead", LEADS)
def test_split_heads(backend, dtype, rng, lead, heads):
    x = rng.normal(size=(*lead, 3, 8))
    out = relattn.split_heads(backend.asarray(x, dtype), heads)
    assert tuple(out.shape) == (*lead, heads, 3, 8 // heads)
    assert backend.to_host(out).dtype == np.dtype(dtype)
    expected = _split_loop(x, heads)
    backend.assert_close(out, expected, dtype)
    # head h is the h-th slice of width d_head of the feature axis
    got = backend.to_host(out)
    dh = 8 // heads
    for h in range(heads):
        np.testing.assert_array_equal(
            got[..., h, :, :], x[..., h * dh : (h + 1) * dh].astype(dtype)
        )


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("lead", LEADS)
def test_merge_heads(backend, dtype, rng, lead, heads):
    x = rng.normal(size=(*lead, heads, 3, 2))
    out = relattn.merge_heads(backend.asarray(x, dtype))
    assert tuple(out.shape) == (*lead, 3, heads * 2)
    backend.assert_close(out, _merge_loop(x), dtype)


@pytest.mark.parametrize("lead", LEADS)
def test_split_merge_round_trip(backend, dtype, rng, lead):
    x = rng.normal(size=(*lead, 5, 6))
    for heads in (2, 3):
        there = relattn.split_heads(backend.asarray(x, dtype), heads)
        back = relattn.merge_heads(there)
        assert tuple(back.shape) == x.shape
        np.testing.assert_array_equal(backend.to_host(back), x.astype(dtype))
    y = rng.normal(size=(*lead, 3, 4, 2))
    again = relattn.split_heads(relattn.merge_heads(backend.asarray(y, dtype)), 3)
    np.testing.assert_array_equal(backend.to_host(again), y.astype(dtype))


def test_split_heads_integer_dtype(backend):
    # any dtype: positions or ids split like features
    x = np.arange(2 * 3 * 6).reshape(2, 3, 6)
    out = relattn.split_heads(backend.asarray(x, "int64"), 3)
    assert backend.is_array(out)
    got = backend.to_host(out)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _split_loop(x, 3))


def test_heads_multihead_attention(backend, dtype, rng):
    # Vaswani MultiHead: per-head attention on slices, then concatenation
    lq, heads, dm = 3, 2, 4
    x = rng.normal(size=(lq, dm))
    q = relattn.split_heads(backend.asarray(x, dtype), heads)
    out = relattn.merge_heads(relattn.scaled_dot_product_attention(q, q, q))
    dh = dm // heads
    expected = np.zeros((lq, dm))
    for h in range(heads):
        xh = x[:, h * dh : (h + 1) * dh]
        e = xh @ xh.T / np.sqrt(dh)
        w = np.exp(e - e.max(-1, keepdims=True))
        expected[:, h * dh : (h + 1) * dh] = (w / w.sum(-1, keepdims=True)) @ xh
    backend.assert_close(out, expected, dtype)


# -- update_memory ------------------------------------------------------------------------------


def _memory_loop(memory, hidden, m):
    """The last m positions of concat(memory, hidden) along the length axis, oldest first."""
    rows = [] if memory is None else [memory[..., t, :] for t in range(memory.shape[-2])]
    rows += [hidden[..., t, :] for t in range(hidden.shape[-2])]
    kept = rows[len(rows) - min(m, len(rows)) :]
    shape = (*hidden.shape[:-2], 0, hidden.shape[-1])
    return np.stack(kept, axis=-2) if kept else np.zeros(shape)


@pytest.mark.grid
@pytest.mark.parametrize("lead", [(), (2, 2)])
@pytest.mark.parametrize(("m_old", "length", "m"), [(3, 2, 3), (3, 2, 4), (2, 3, 1), (1, 2, 0)])
def test_update_memory(backend, dtype, rng, lead, m_old, length, m):
    memory = rng.normal(size=(*lead, m_old, 4))
    hidden = rng.normal(size=(*lead, length, 4))
    out = relattn.update_memory(backend.asarray(memory, dtype), backend.asarray(hidden, dtype), m)
    assert tuple(out.shape) == (*lead, min(m, m_old + length), 4)
    backend.assert_close(out, _memory_loop(memory, hidden, m), dtype)


def test_update_memory_keeps_last_positions_oldest_first(backend, dtype):
    # rows numbered by absolute position: memory 0..2, segment 3..4
    memory = np.repeat(np.arange(3.0)[:, None], 2, axis=1)
    hidden = np.repeat(np.arange(3.0, 5.0)[:, None], 2, axis=1)
    mem = backend.asarray(memory, dtype)
    hid = backend.asarray(hidden, dtype)
    for m, rows in [(0, []), (1, [4]), (2, [3, 4]), (3, [2, 3, 4]), (5, [0, 1, 2, 3, 4])]:
        got = backend.to_host(relattn.update_memory(mem, hid, m))
        np.testing.assert_array_equal(got[:, 0], rows)
        np.testing.assert_array_equal(got[:, 1], rows)


def test_update_memory_none(backend, dtype, rng):
    hidden = rng.normal(size=(2, 4, 3))
    hid = backend.asarray(hidden, dtype)
    backend.assert_close(relattn.update_memory(None, hid, 2), hidden[:, 2:], dtype)
    backend.assert_close(relattn.update_memory(None, hid, 4), hidden, dtype)
    backend.assert_close(relattn.update_memory(None, hid, 10), hidden, dtype)  # M > available
    empty = relattn.update_memory(None, hid, 0)
    assert backend.is_array(empty)
    assert tuple(empty.shape) == (2, 0, 3)


def test_update_memory_more_than_available(backend, dtype, rng):
    memory = rng.normal(size=(2, 3))
    hidden = rng.normal(size=(1, 3))
    out = relattn.update_memory(backend.asarray(memory, dtype), backend.asarray(hidden, dtype), 7)
    backend.assert_close(out, np.concatenate([memory, hidden]), dtype)


def test_update_memory_zero_length(backend, dtype, rng):
    memory = rng.normal(size=(2, 3, 4))
    hidden = rng.normal(size=(2, 2, 4))
    out = relattn.update_memory(backend.asarray(memory, dtype), backend.asarray(hidden, dtype), 0)
    assert backend.is_array(out)
    assert tuple(out.shape) == (2, 0, 4)


def test_update_memory_empty_memory(backend, dtype, rng):
    # a memory of length 0 (first segment with a preallocated cache) behaves like None
    hidden = rng.normal(size=(3, 2))
    out = relattn.update_memory(
        backend.asarray(np.zeros((0, 2)), dtype), backend.asarray(hidden, dtype), 2
    )
    backend.assert_close(out, hidden[1:], dtype)


def test_update_memory_three_segments(backend, dtype, rng):
    # Transformer-XL recurrence over three segments: always the last M positions of the stream
    stream = rng.normal(size=(2, 9, 3))
    m = 4
    memory = None
    for s in range(3):
        seg = stream[:, 3 * s : 3 * (s + 1)]
        memory = relattn.update_memory(memory, backend.asarray(seg, dtype), m)
        end = 3 * (s + 1)
        backend.assert_close(memory, stream[:, max(0, end - m) : end], dtype)


def test_update_memory_promotes_dtype(backend, rng):
    memory = rng.normal(size=(2, 3))
    hidden = rng.normal(size=(2, 3))
    out = relattn.update_memory(
        backend.asarray(memory, "float32"), backend.asarray(hidden, "float64"), 3
    )
    got = backend.to_host(out)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got[0], memory[1].astype(np.float32), rtol=0, atol=0)
    np.testing.assert_allclose(got[1:], hidden, rtol=0, atol=0)


# -- stop_gradient ------------------------------------------------------------------------------


def test_stop_gradient_values(backend, dtype, rng):
    x = rng.normal(size=(2, 3))
    arr = backend.asarray(x, dtype)
    out = relattn.stop_gradient(arr)
    assert backend.is_array(out)
    assert tuple(out.shape) == (2, 3)
    got = backend.to_host(out)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, x.astype(dtype))


def test_stop_gradient_torch(torch_backend, dtype, rng):
    to_host = torch_backend.to_host
    x = torch_backend.asarray(rng.normal(size=(3, 2)), dtype).requires_grad_(True)
    sg = relattn.stop_gradient(x)
    assert not sg.requires_grad
    # d/dx sum(x * SG(x)) = SG(x) = x, not 2x
    (x * relattn.stop_gradient(x)).sum().backward()
    np.testing.assert_array_equal(to_host(x.grad), to_host(x))
    # without stop_gradient the gradient would be 2x
    x.grad = None
    (x * x).sum().backward()
    np.testing.assert_array_equal(to_host(x.grad), 2 * to_host(x))


def test_stop_gradient_jax(jax_backend, dtype, rng):
    import jax

    to_host = jax_backend.to_host
    x = jax_backend.asarray(rng.normal(size=(3, 2)), dtype)
    grad = jax.grad(lambda a: (a * relattn.stop_gradient(a)).sum())(x)
    np.testing.assert_array_equal(to_host(grad), to_host(x))
    plain = jax.grad(lambda a: (a * a).sum())(x)
    np.testing.assert_array_equal(to_host(plain), 2 * to_host(x))


def test_update_memory_cut_from_gradient_torch(torch_backend, dtype, rng):
    to_host = torch_backend.to_host
    memory = torch_backend.asarray(rng.normal(size=(2, 3)), dtype).requires_grad_(True)
    hidden = torch_backend.asarray(rng.normal(size=(2, 3)), dtype).requires_grad_(True)
    new = relattn.update_memory(memory, hidden, 4)  # keeps all of concat(memory, hidden)
    assert not new.requires_grad
    loss = (new[:2] * memory).sum() + (new[2:] * hidden).sum()
    loss.backward()
    # only the direct factor contributes: grad = the other factor's values = the inputs
    np.testing.assert_array_equal(to_host(memory.grad), to_host(memory))
    np.testing.assert_array_equal(to_host(hidden.grad), to_host(hidden))
    # None memory: the result is hidden, detached
    h2 = relattn.update_memory(None, hidden, 1)
    assert not h2.requires_grad


def test_update_memory_cut_from_gradient_jax(jax_backend, dtype, rng):
    import jax

    to_host = jax_backend.to_host
    memory = jax_backend.asarray(rng.normal(size=(2, 3)), dtype)
    hidden = jax_backend.asarray(rng.normal(size=(2, 3)), dtype)

    def loss(m, h):
        new = relattn.update_memory(m, h, 4)
        return (new[:2] * m).sum() + (new[2:] * h).sum()

    gm, gh = jax.grad(loss, argnums=(0, 1))(memory, hidden)
    np.testing.assert_array_equal(to_host(gm), to_host(memory))
    np.testing.assert_array_equal(to_host(gh), to_host(hidden))
    # with M cutting into the segment, the discarded memory gets no gradient through the cache
    g_only = jax.grad(lambda m: relattn.update_memory(m, hidden, 3).sum())(memory)
    np.testing.assert_array_equal(to_host(g_only), np.zeros((2, 3)))
