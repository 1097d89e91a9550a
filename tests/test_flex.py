"""FlexAttention as a kernel (``relattn.backends._flex``) against relattn's block fold.

Each problem is checked by :func:`relattn.problem.check` with the keywords of the
public functions and run by FlexAttention, eager (the unfused reference, cheap) and,
for a few, compiled (Inductor's C++ template on the CPU: seconds per signature,
marked ``subprocess`` and ``slow`` like ``tests/test_compile.py``); the reference is
:func:`relattn.scaled_dot_product_attention` with ``block_size=4`` (the fold). Then
the terms the kernel refuses, and that a second call of one signature with new
arrays does not recompile.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import relattn  # noqa: E402
from relattn import problem  # noqa: E402
from relattn.backends import _flex  # noqa: E402
from relattn.testing import tolerance  # noqa: E402

B, H, D = 2, 3, 8


def _t(rng, shape, dtype="float32"):
    return torch.asarray(rng.normal(size=shape), dtype=getattr(torch, dtype))


def _qkv(lead=(B, H), lq=6, lk=6, dtype="float32", d_v=D, seed=0):
    rng = np.random.default_rng(seed)
    return (
        _t(rng, (*lead, lq, D), dtype), _t(rng, (*lead, lk, D), dtype),
        _t(rng, (*lead, lk, d_v), dtype),
    )  # fmt: skip


def _compare(q, k, v, compiled=False, **kw):
    """FlexAttention's output for the call's problem equals the fold's; returns it."""
    p = problem.check(q, k, v, **kw)
    assert _flex.refusal(p, compiled=compiled) is None
    out = _flex.flex_run(p, compiled)
    expected = relattn.scaled_dot_product_attention(q, k, v, block_size=4, **kw)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.numpy(), expected.numpy(), **tolerance(q.dtype))
    return out


def _alibi(lk, heads=H, dtype=torch.float32):
    """ALiBi's ``m_h·δ`` over the causal layout, ``(H, Lk)``."""
    slopes = relattn.alibi_slopes(heads, xp=torch, dtype=dtype)
    return slopes[:, None] * torch.arange(-(lk - 1), 1, dtype=dtype)


def _t5(lq, lk, heads=H, dtype=torch.float32, seed=1):
    """T5's bucketed values over the full layout, ``(H, Lq + Lk - 1)``."""
    distances = relattn.relative_distances(lq, lk, xp=torch)
    buckets = relattn.relative_position_bucket(distances, num_buckets=8, max_distance=16)
    table = _t(np.random.default_rng(seed), (8, heads), str(dtype).removeprefix("torch."))
    return table[buckets].T


# -------------------------------------------------------------------------------------------
# Eager FlexAttention (the unfused reference): every term
# -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("lead", [(B, H), (H,), ()])
def test_alibi_causal_layout(dtype, lead):
    q, k, v = _qkv(lead, 7, 7, dtype)
    heads = lead[-1] if lead else 1
    values = _alibi(7, heads, getattr(torch, dtype))
    _compare(q, k, v, relative_bias=values if lead else values[0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_t5_full_layout(dtype):
    q, k, v = _qkv((B, H), 5, 9, dtype, d_v=5)  # d_v != d
    _compare(q, k, v, relative_bias=_t5(5, 9, dtype=getattr(torch, dtype)), scale=1.0)


@pytest.mark.parametrize("lq", [1, 3])
def test_decode(lq):
    """Lq < Lk: queries at the last Lq key positions (lower-right causal alignment)."""
    q, k, v = _qkv((B, H), lq, 17)
    _compare(q, k, v, relative_bias=_alibi(17))
    _compare(q, k, v, relative_bias=_t5(lq, 17), causal=True)
    _compare(q, k, v, causal=True)


def test_more_queries_than_keys():
    """Lq > Lk under causal: the first Lq - Lk queries see no key and give zeros."""
    q, k, v = _qkv((B, H), 7, 4)
    out = _compare(q, k, v, causal=True, relative_bias=_t5(7, 4))
    assert (out[..., :3, :] == 0).all()


def test_positions_restart():
    """Packed rows whose positions restart: δ from the data, clipped to the layout's edges."""
    lq = lk = 10
    q, k, v = _qkv((B, H), lq, lk)
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2], [5, 6, 7, 8, 9, 10, 0, 1, 2, 3]])
    positions = positions[:, None, :]  # (B, 1, L)
    _compare(q, k, v, relative_bias=_alibi(lk), positions=positions)
    _compare(q, k, v, relative_bias=_t5(lq, lk), positions=positions)


def test_packed_segments():
    """Documents packed in one row: segment ids and restarting positions."""
    q, k, v = _qkv((B, H), 11, 11)
    segments = torch.tensor([[0] * 4 + [1] * 5 + [2] * 2, [0] * 11])[:, None, :]
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1], list(range(11))])[:, None, :]
    _compare(q, k, v, relative_bias=_alibi(11), positions=positions, segment_ids=segments)
    _compare(q, k, v, causal=True, segment_ids=segments)


def test_key_padding_with_fully_masked_row():
    q, k, v = _qkv((B, H), 5, 9)
    lengths = torch.tensor([6, 0])  # the second batch row sees no key at all
    mask = (torch.arange(9) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    out = _compare(q, k, v, mask=mask, relative_bias=_t5(5, 9))
    assert (out[1] == 0).all()
    # A mask of every pair, one query row of which sees nothing.
    full = torch.asarray(np.random.default_rng(3).random((B, H, 5, 9)) < 0.6)
    full[0, 1, 2] = False
    out = _compare(q, k, v, mask=full, causal=True)
    assert (out[0, 1, 2] == 0).all()


def test_bias():
    q, k, v = _qkv((B, H), 4, 6)
    bias = _t(np.random.default_rng(4), (H, 1, 6))
    _compare(q, k, v, bias=bias, relative_bias=_alibi(6))


def test_score_mod():
    """Softcapping (Gemma 2) and a per-head table read at the positions' distance."""
    q, k, v = _qkv((B, H), 3, 17)
    table = _t(np.random.default_rng(5), (H, 33))

    def softcap(score, batch, head, q_pos, kv_pos):
        return torch.tanh(score / 2.0) * 2.0

    def per_head(score, batch, head, q_pos, kv_pos):
        return score + table[head, torch.clamp(kv_pos - q_pos + 16, 0, 32)]

    _compare(q, k, v, score_mod=softcap, relative_bias=_alibi(17))
    _compare(q, k, v, score_mod=per_head, causal=True)
    positions = (torch.tensor([4, 5, 6])[None, None], torch.arange(17)[None, None])
    _compare(q, k, v, score_mod=per_head, causal=True, positions=positions)


def test_mask_mod():
    """A sliding window over the positions, and one per batch row and head."""
    q, k, v = _qkv((B, H), 3, 17)

    def window(batch, head, q_pos, kv_pos):
        return (q_pos - kv_pos >= 0) & (q_pos - kv_pos < 4)

    def uneven(batch, head, q_pos, kv_pos):
        return kv_pos <= q_pos - 2 * head - batch

    _compare(q, k, v, mask_mod=window, relative_bias=_t5(3, 17))
    _compare(q, k, v, mask_mod=uneven, relative_bias=_alibi(17))


def test_broadcast_leading_dims():
    """k and v shared by the batch (H, Lk, d) and queries (B, H, Lq, d)."""
    rng = np.random.default_rng(6)
    q, k, v = _t(rng, (B, H, 4, D)), _t(rng, (H, 6, D)), _t(rng, (H, 6, D))
    _compare(q, k, v, relative_bias=_alibi(6), causal=True)


def test_sizes_not_multiples_of_the_block():
    q, k, v = _qkv((1, 2), 130, 133)
    segments = (torch.arange(133) // 50)[None, None]
    _compare(q, k, v, relative_bias=_alibi(133, 2), segment_ids=(segments[..., 3:], segments))


# -------------------------------------------------------------------------------------------
# What the kernel refuses
# -------------------------------------------------------------------------------------------
def test_refuses_tables_and_value_tables():
    q, k, v = _qkv((B, H), 4, 4)
    xl = problem.check(q, k, v, position_table=_t(np.random.default_rng(7), (4, D)))
    assert "not a score_mod term" in _flex.refuse(xl)
    assert "Transformer-XL" in _flex.refuse(xl)
    shaw = problem.check(q, k, v, value_table=_t(np.random.default_rng(8), (7, D)))
    assert "value table (Shaw)" in _flex.refuse(shaw)
    with pytest.raises(ValueError, match="value table"):
        _flex.flex_run(shaw, compiled=False)


def test_refuses_what_it_cannot_run():
    q, k, v = _qkv((B, H), 4, 4, "float64")
    p = problem.check(q, k, v, causal=True)
    assert "not float64" in _flex.refuse(p)  # the compiled kernels
    assert _flex.refusal(p, compiled=False) is None  # the eager reference takes it
    p = problem.check(q[None], k[None], v[None])
    assert "more than two leading dims" in _flex.refuse(p)
    p = problem.check(q.numpy(), k.numpy(), v.numpy())
    assert "not torch tensors" in _flex.refuse(p)
    p = problem.check(q[..., :0, :], k, v)
    assert "empty axis" in _flex.refuse(p)
    q = q.float().requires_grad_(True)
    p = problem.check(q, k.float(), v.float())
    assert "no backward on the CPU" in _flex.refuse(p)
    with torch.no_grad():
        p = problem.check(q, k.float(), v.float())
        assert _flex.refuse(p) is None
        out = _flex.flex_run(p, compiled=False)
        assert not out.requires_grad


# -------------------------------------------------------------------------------------------
# The compiled kernel (Inductor's C++ FlexAttention template)
# -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("case", ["alibi", "t5_decode", "packed", "padding_mods"])
def test_compiled(case):
    if case == "alibi":  # static causal BlockMask, a score_mod; sizes not multiples of 128
        q, k, v = _qkv((1, 2), 130, 130)
        _compare(q, k, v, True, relative_bias=_alibi(130, 2))
    elif case == "t5_decode":  # Lq = 1 and Lq = 3 of Lk = 17, lower-right causal
        for lq in (1, 3):
            q, k, v = _qkv((B, H), lq, 17, d_v=5)
            _compare(q, k, v, True, relative_bias=_t5(lq, 17), causal=True)
    elif case == "packed":  # positions and segments: a BlockMask of data per call
        q, k, v = _qkv((H,), 11, 11)
        segments = torch.tensor([0] * 4 + [1] * 5 + [2] * 2)
        positions = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1])
        _compare(q, k, v, True, relative_bias=_alibi(11), positions=positions,
                 segment_ids=segments)  # fmt: skip
    else:  # key padding with a fully masked row, softcap, a sliding window, no leading dims
        q, k, v = _qkv((B, H), 5, 9)
        mask = (torch.arange(9) < torch.tensor([6, 0])[:, None])[:, None, None, :]

        def softcap(score, batch, head, q_pos, kv_pos):
            return torch.tanh(score / 2.0) * 2.0

        def window(batch, head, q_pos, kv_pos):
            return q_pos - kv_pos < 4

        out = _compare(q, k, v, True, mask=mask, score_mod=softcap, mask_mod=window)
        assert (out[1] == 0).all()
        q, k, v = _qkv((), 5, 9)
        _compare(q, k, v, True, relative_bias=_t5(5, 9, 1)[0], causal=True)


@pytest.mark.slow
@pytest.mark.subprocess
def test_compiled_runs_again_without_recompiling():
    """A plan's second call with new arrays of the same shapes (positions, segments,
    biases, a score_mod's closure) reuses the compiled code: the arrays are graph inputs."""
    from torch._dynamo.utils import counters

    def problem_of(seed):
        rng = np.random.default_rng(seed)
        q, k, v = _qkv((B, H), 9, 9, seed=seed)
        table = _t(rng, (H, 17))
        positions = torch.asarray(rng.integers(0, 9, (B, 1, 9)))
        segments = torch.asarray(np.sort(rng.integers(0, 3, (B, 1, 9)), axis=-1))

        def score_mod(score, batch, head, q_pos, kv_pos):
            return score + table[head, torch.clamp(kv_pos - q_pos + 8, 0, 16)]

        kw = dict(relative_bias=_t5(9, 9, seed=seed), positions=positions,
                  segment_ids=segments, score_mod=score_mod, causal=True)  # fmt: skip
        return (q, k, v), kw

    (q, k, v), kw = problem_of(0)
    run = _flex.prepare(problem.check(q, k, v, **kw))
    graphs = counters["stats"]["unique_graphs"]
    run(problem.check(q, k, v, **kw))
    assert counters["stats"]["unique_graphs"] > graphs  # the first call compiles
    graphs = counters["stats"]["unique_graphs"]
    for seed in (1, 2):
        (q, k, v), kw = problem_of(seed)
        out = run(problem.check(q, k, v, **kw))
        expected = relattn.scaled_dot_product_attention(q, k, v, block_size=4, **kw)
        np.testing.assert_allclose(out.numpy(), expected.numpy(), **tolerance("float32"))
    assert counters["stats"]["unique_graphs"] == graphs


# -------------------------------------------------------------------------------------------
# Gradients: through the plan's flex path, against the fold's (GPUs only)
# -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gradients_equal_the_folds(device):
    """q, k, v and ALiBi's per-distance values get the fold's gradients through the plan's
    FlexAttention path. FlexAttention has no backward on the CPU: there the plan refuses
    the forced path with that reason, and the test skips with it."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch has no GPU here")
    q, k, v = (x.to(device).requires_grad_() for x in _qkv(lq=40, lk=40))
    bias = _alibi(40).to(device).requires_grad_()
    segments = torch.asarray(np.arange(40) // 13, device=device)[None, None]
    kw = {"relative_bias": bias, "causal": True, "segment_ids": segments}
    sdpa = relattn.scaled_dot_product_attention
    with relattn.config.override(path="flex", compile=True):
        try:
            out = sdpa(q, k, v, **kw)
        except ValueError as e:
            assert device == "cpu" and "no backward on the CPU" in str(e)
            pytest.skip(str(e))
    expected = sdpa(q, k, v, **kw, block_size=16)
    cotangent = torch.asarray(np.random.default_rng(2).normal(size=out.shape), dtype=out.dtype)
    got = torch.autograd.grad(out, (q, k, v, bias), cotangent.to(device))
    want = torch.autograd.grad(expected, (q, k, v, bias), cotangent.to(device))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.cpu().numpy(), w.cpu().numpy(), rtol=1e-4, atol=1e-5)
