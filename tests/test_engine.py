"""The one engine: every attention function through one checker and one block fold.

New in 0.2.0 and checked here against a NumPy float64 loop over every ``(i, j)`` pair
written from the formula (:func:`_loop`): ``relative_attention``'s ``query_position_table``
(the position-to-content term ``k_j · Qʳ[δ]``), ``attention_block``'s ``bias`` and
``block_size`` (sub-blocks of one block pair), ``ring_attention``'s ``bias`` and
``block_size`` (on a ring of 4 host devices), the empty result of ``Lq = 0`` with a
causal-layout value table, and ``RELATTN_MAX_SCORE_BYTES``'s validation (read at import).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import relattn


def _loop(q, k, v, *, key_table=None, query_table=None, bias=None, scale=None):
    """``softmax_j(scale·(q_i·k_j + q_i·Kʳ[m] + k_j·Qʳ[m]) + bias_ij) v``, ``m = δ + Lk - 1``,
    one pair at a time; tables in the full layout, shared by the leading dims."""
    *lead, lq, d = q.shape
    lk = k.shape[-2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    bias = np.broadcast_to(0.0 if bias is None else bias, (*lead, lq, lk))
    out = np.zeros((*lead, lq, v.shape[-1]))
    for b in np.ndindex(*lead):
        for i in range(lq):
            e = np.empty(lk)
            for j in range(lk):
                m = j - (i + lk - lq) + lk - 1
                s = q[b][i] @ k[b][j]
                if key_table is not None:
                    s += q[b][i] @ key_table[m]
                if query_table is not None:
                    s += k[b][j] @ query_table[m]
                e[j] = s * scale + bias[b][i, j]
            w = np.exp(e - e.max())
            out[b][i] = (w / w.sum()) @ v[b]
    return out


@pytest.fixture
def data(rng):
    lq, lk, d = 5, 7, 4
    return {
        "q": rng.normal(size=(2, lq, d)),
        "k": rng.normal(size=(2, lk, d)),
        "v": rng.normal(size=(2, lk, 3)),
        "key_table": rng.normal(size=(lq + lk - 1, d)),
        "query_table": rng.normal(size=(lq + lk - 1, d)),
        "bias": rng.normal(size=(2, lq, lk)),
    }


@pytest.mark.parametrize("block_size", [None, 2, (3, 2)])
def test_query_position_table(backend, dtype, data, block_size):
    """``relative_attention(query_position_table=)`` adds DeBERTa's p2c term."""
    a = {name: backend.asarray(x, dtype) for name, x in data.items()}
    out = relattn.relative_attention(
        a["q"], a["k"], a["v"], a["key_table"], query_position_table=a["query_table"],
        bias=a["bias"], block_size=block_size,
    )  # fmt: skip
    expected = _loop(
        data["q"], data["k"], data["v"], key_table=data["key_table"],
        query_table=data["query_table"], bias=data["bias"],
    )  # fmt: skip
    backend.assert_close(out, expected, dtype)


@pytest.mark.parametrize("block_size", [None, 1, (2, 3)])
def test_attention_block_bias_and_sub_blocks(backend, data, block_size):
    """Two key blocks folded by ``attention_block`` with the block's ``bias`` slice, in
    sub-blocks of ``block_size``, give the whole problem's attention."""
    dtype = "float64"
    a = {name: backend.asarray(x, dtype) for name, x in data.items()}
    lq, lk = data["q"].shape[-2], data["k"].shape[-2]
    state = None
    for j0, j1 in ((0, 4), (4, lk)):
        state = relattn.attention_block(
            a["q"], a["k"][:, j0:j1, :], a["v"][:, j0:j1, :], a["key_table"],
            query_start=0, key_start=j0, query_length=lq, key_length=lk,
            bias=a["bias"][:, :, j0:j1], block_size=block_size, state=state,
        )  # fmt: skip
    out = relattn.finish_block_state(state)
    expected = _loop(
        data["q"], data["k"], data["v"], key_table=data["key_table"], bias=data["bias"]
    )
    backend.assert_close(out, expected, dtype)


def test_attention_block_bias_must_fit_the_block(data):
    with pytest.raises(ValueError, match=r"bias must be broadcastable to the block's scores"):
        relattn.attention_block(
            data["q"], data["k"][:, :4, :], data["v"][:, :4, :], query_start=0, key_start=0,
            query_length=5, key_length=7, bias=data["bias"],
        )  # fmt: skip


def test_empty_queries_with_a_causal_value_table(backend, dtype):
    """``Lq = 0`` gives the empty ``(..., 0, d_v)`` result with a causal-layout value table."""
    q = backend.asarray(np.zeros((2, 0, 4)), dtype)
    k = backend.asarray(np.ones((2, 3, 4)), dtype)
    v = backend.asarray(np.ones((2, 3, 5)), dtype)
    table = backend.asarray(np.ones((3, 5)), dtype)  # W = Lk: the causal layout
    out = relattn.relative_attention(q, k, v, None, value_table=table)
    assert tuple(out.shape) == (2, 0, 5)
    backend.assert_close(out, np.zeros((2, 0, 5)), dtype)


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_finiteness_probe(backend, dtype_name):
    """The probe that sends a kernel's or a block's result down the clean path:
    ``all_finite`` (0-d, traceable) and ``is_finite`` (read now) agree; NaN and inf are
    found anywhere; a half-precision sum that overflows its dtype is still finite (it
    accumulates in float32); an input that requires a gradient is read without one."""
    from relattn.fold import all_finite, is_finite

    if not backend.has_dtype(dtype_name):
        pytest.skip(f"{backend.name} has no {dtype_name}")
    xp = backend.xp
    big = np.full((4, 64), 60000.0)  # float16's sum overflows (max 65504); float32's does not
    for data, want in ((np.ones((3, 5)), True), (big, True)):
        x = backend.asarray(data, dtype_name)
        assert is_finite(x, xp) is want
        assert bool(all_finite(x, xp)) is want
    for bad in (np.nan, np.inf, -np.inf):
        data = np.ones((3, 5))
        data[2, 4] = bad
        x = backend.asarray(data, dtype_name)
        assert is_finite(x, xp) is False, bad
        assert bool(all_finite(x, xp)) is False, bad
    if backend.library == "torch":
        x = backend.asarray(np.ones((3, 5)), dtype_name).requires_grad_()
        assert is_finite(x, xp) is True  # no warning (the suite's are errors)


@pytest.mark.parametrize("given", ["abc", "0", "-1", "1.5"])
def test_score_budget_variable_is_validated(monkeypatch, given):
    """The variable is read once, at import: a bad value fails there, naming it."""
    from relattn._config import _from_environment

    monkeypatch.setenv("RELATTN_MAX_SCORE_BYTES", given)
    with pytest.raises(ValueError, match=r"RELATTN_MAX_SCORE_BYTES must be a positive integer"):
        _from_environment()


def test_score_budget_variable_is_read_at_import_only():
    """Set before import, the variable is the budget; set afterwards, it changes nothing."""
    code = textwrap.dedent(
        """
        import os
        os.environ["RELATTN_MAX_SCORE_BYTES"] = "12345"
        import relattn
        os.environ["RELATTN_MAX_SCORE_BYTES"] = "999"
        print(relattn.config.max_score_bytes)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "12345"


RING = """
import functools
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import relattn

rng = np.random.default_rng(0)
n, L, H, d = 4, 16, 2, 8
q, k, v = (jnp.asarray(rng.normal(size=(H, L, d))) for _ in range(3))
table = jnp.asarray(rng.normal(size=(L, d)))            # causal layout
bias = jnp.asarray(rng.normal(size=(H, L, L)))
mesh = Mesh(np.array(jax.devices()[:n]), ("seq",))
spec = P(None, "seq")

# Compiled whole: a shard_map outside jit runs (and compiles) one operation at a time.
@functools.partial(jax.jit, static_argnums=1)
def ring(q, block_size):
    return jax.shard_map(
        lambda q, k, v: relattn.ring_attention(
            q, k, v, table, axis_name="seq", bias=bias, block_size=block_size),
        mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)(q, k, v)

@jax.jit
def whole(q):
    return relattn.relative_attention(q, k, v, table, bias=bias)

def differ(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))

whole_grad = jax.jit(jax.grad(lambda q: jnp.sum(whole(q) ** 2)))(q)
for block_size in (None, 3):
    assert differ(ring(q, block_size), whole(q)) < 1e-12
    g = jax.jit(jax.grad(lambda q: jnp.sum(ring(q, block_size) ** 2)))(q)
    assert differ(g, whole_grad) < 1e-12

# Positions and segment ids: each device's shards, the keys' travelling with them.
pos = jnp.asarray(rng.integers(0, 20, size=(L,)))
seg = jnp.asarray(rng.integers(0, 2, size=(L,)))
ring_pos = jax.jit(jax.shard_map(
    lambda q, k, v, p, s: relattn.ring_attention(
        q, k, v, table, axis_name="seq", positions=p, segment_ids=s, block_size=3),
    mesh=mesh, in_specs=(spec,) * 3 + (P("seq"),) * 2, out_specs=spec))(q, k, v, pos, seg)
whole_pos = relattn.relative_attention(q, k, v, table, positions=pos, segment_ids=seg)
assert differ(ring_pos, whole_pos) < 1e-12
print("ok")
"""


@pytest.mark.subprocess
def test_ring_bias_and_block_size():
    """``ring_attention(bias=, block_size=)`` on 4 host devices equals one device, gradients
    too, and so do its ``positions`` and ``segment_ids`` (a fresh process: the device count
    is fixed when JAX starts)."""
    pytest.importorskip("jax")
    import os

    # conftest's XLA flags (compile-time savings) as well, beside the device count.
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
    env = {"XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RING)], env={**os.environ, **env},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
