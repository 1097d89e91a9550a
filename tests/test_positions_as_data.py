"""Positions as data (SPEC §2.15–2.17) against a NumPy float64 loop over every ``(i, j)``.

``positions=``, ``segment_ids=``, ``score_mod=`` and ``mask_mod=`` on every attention
function, dense and blockwise, on every backend: the loop :func:`_loop` reads
``δ = key_position - query_position`` for each pair and each term, clipped to the
tables' edge rows. Then the properties that follow from it: packed documents equal each
document run alone, a left-padded batch equals each row unpadded, a decode loop over a
static cache equals one causal call (compiling once under ``jax.jit`` and
``torch.compile``), and masked keys holding NaN or inf never reach a result.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn

B, H, D = 2, 3, 4


def _loop(q, k, v, qpos, kpos, *, key_table=None, query_table=None, value_table=None,
          relative_bias=None, content_bias=None, position_bias=None, qseg=None, kseg=None,
          mask=None, causal=False, scale=None, score_mod=None, mask_mod=None):  # fmt: skip
    """Attention of ``q (B, H, Lq, d)`` one pair at a time; positions ``(B, L)``; tables in
    the full layout ``(W, d)`` of ``W = Lq + Lk - 1`` rows (``relative_bias (H, W)``),
    row ``m = clip(δ + Lk - 1, 0, W - 1)``; ``score_mod(s, b, h, qp, kp)`` and
    ``mask_mod(b, h, qp, kp)`` on Python scalars."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    u = np.zeros(d) if content_bias is None else content_bias
    pv = np.zeros(d) if position_bias is None else position_bias
    out = np.zeros((*q.shape[:-2], lq, v.shape[-1]))
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            scores = np.full((lq, lk), -np.inf)
            rows = {}
            for i in range(lq):
                for j in range(lk):
                    qp, kp = int(qpos[b, i]), int(kpos[b, j])
                    delta = kp - qp
                    m = min(max(delta + lk - 1, 0), lq + lk - 2)
                    rows[i, j] = m
                    if causal and delta > 0:
                        continue
                    if qseg is not None and qseg[b, i] != kseg[b, j]:
                        continue
                    if mask is not None and not mask[b, i, j]:
                        continue
                    if mask_mod is not None and not mask_mod(b, h, qp, kp):
                        continue
                    s = (q[b, h, i] + u) @ k[b, h, j]
                    if key_table is not None:
                        s += (q[b, h, i] + pv) @ key_table[m]
                    if query_table is not None:
                        s += k[b, h, j] @ query_table[m]
                    s *= scale
                    if relative_bias is not None:
                        s += relative_bias[h, m]
                    if score_mod is not None:
                        s = score_mod(s, b, h, qp, kp)
                    scores[i, j] = s
            for i in range(lq):
                if np.isneginf(scores[i]).all():
                    continue
                w = np.exp(scores[i] - scores[i].max())
                w /= w.sum()
                for j in range(lk):
                    row = v[b, h, j] if w[j] else 0.0  # a masked key is selected out
                    out[b, h, i] += w[j] * row
                    if value_table is not None:
                        out[b, h, i] += w[j] * value_table[rows[i, j]]
    return out


def _softcap(score, b, h, qp, kp):
    return 2.0 * np.tanh(score / 2.0)


SLOPES = np.array([0.5, 0.25, 0.125])


def _window(b, h, qp, kp):
    return abs(kp - qp) <= 3


#: name -> (function, its table arguments, loop terms)
SCHEMES = ["xl", "all_terms", "shaw", "deberta", "t5", "mods"]


def _inputs(rng, lq, lk):
    w = lq + lk - 1
    return {
        "q": rng.normal(size=(B, H, lq, D)),
        "k": rng.normal(size=(B, H, lk, D)),
        "v": rng.normal(size=(B, H, lk, D)),
        "key_table": rng.normal(size=(w, D)),
        "query_table": rng.normal(size=(w, D)),
        "value_table": rng.normal(size=(w, D)),
        "relative_bias": rng.normal(size=(H, w)),
        "u": rng.normal(size=D),
        "pv": rng.normal(size=D),
        "key_embeddings": rng.normal(size=(5, D)),  # Shaw, K = 2
        "value_embeddings": rng.normal(size=(5, D)),
    }


def _run(backend, scheme, data, dtype, **kw):
    """The scheme's relattn call on ``backend`` (positions, segments, … in ``kw``)."""
    a = {name: backend.asarray(x, dtype) for name, x in data.items()}
    q, k, v = a["q"], a["k"], a["v"]
    if scheme == "xl":
        return relattn.relative_attention(
            q, k, v, a["key_table"], content_bias=a["u"], position_bias=a["pv"], **kw
        )
    if scheme == "all_terms":
        return relattn.relative_attention(
            q, k, v, a["key_table"], query_position_table=a["query_table"],
            value_table=a["value_table"], relative_bias=a["relative_bias"], **kw,
        )  # fmt: skip
    if scheme == "shaw":
        return relattn.shaw_attention(q, k, v, a["key_embeddings"], a["value_embeddings"], **kw)
    if scheme == "deberta":
        return relattn.disentangled_attention(q, k, v, a["key_table"], a["query_table"], **kw)
    if scheme == "t5":
        return relattn.scaled_dot_product_attention(q, k, v, relative_bias=a["relative_bias"], **kw)
    slopes = backend.asarray(SLOPES, dtype)

    def score_mod(score, batch, head, q_pos, kv_pos):
        score = 2.0 * backend.xp.tanh(score / 2.0)
        return score + backend.xp.take(slopes, backend.xp.reshape(head, (-1,)), axis=0)[
            ..., None, None
        ] * backend.xp.astype(kv_pos - q_pos, score.dtype)

    def mask_mod(batch, head, q_pos, kv_pos):
        return backend.xp.abs(kv_pos - q_pos) <= 3

    return relattn.scaled_dot_product_attention(
        q, k, v, score_mod=score_mod, mask_mod=mask_mod, **kw
    )


def _expected(scheme, data, qpos, kpos, **kw):
    d = data
    if scheme == "xl":
        return _loop(d["q"], d["k"], d["v"], qpos, kpos, key_table=d["key_table"],
                     content_bias=d["u"], position_bias=d["pv"], **kw)  # fmt: skip
    if scheme == "all_terms":
        return _loop(d["q"], d["k"], d["v"], qpos, kpos, key_table=d["key_table"],
                     query_table=d["query_table"], value_table=d["value_table"],
                     relative_bias=d["relative_bias"], **kw)  # fmt: skip
    if scheme == "shaw":
        lq, lk = d["q"].shape[-2], d["k"].shape[-2]
        delta = np.arange(lq + lk - 1) - (lk - 1)
        rows = np.clip(delta, -2, 2) + 2
        return _loop(d["q"], d["k"], d["v"], qpos, kpos, key_table=d["key_embeddings"][rows],
                     value_table=d["value_embeddings"][rows], **kw)  # fmt: skip
    if scheme == "deberta":
        return _loop(d["q"], d["k"], d["v"], qpos, kpos, key_table=d["key_table"],
                     query_table=d["query_table"], scale=1 / math.sqrt(3 * D), **kw)  # fmt: skip
    if scheme == "t5":
        return _loop(d["q"], d["k"], d["v"], qpos, kpos, relative_bias=d["relative_bias"], **kw)

    def score_mod(s, b, h, qp, kp):
        return _softcap(s, b, h, qp, kp) + SLOPES[h] * (kp - qp)

    return _loop(d["q"], d["k"], d["v"], qpos, kpos, score_mod=score_mod, mask_mod=_window, **kw)


def _ints(backend, a):
    return backend.from_host(np.asarray(a))


@pytest.mark.grid
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("segments", [False, True])
@pytest.mark.parametrize("block_size", [None, 3, (2, 5)])
def test_positions_equal_the_loop(backend, scheme, causal, segments, block_size, rng):
    """Arbitrary positions (repeats, gaps, out of the tables' range) and document ids."""
    lq = lk = 7
    data = _inputs(rng, lq, lk)
    pos = rng.integers(-3, 12, size=(B, lq))
    seg = rng.integers(0, 2, size=(B, lq)) if segments else None
    kw = {"causal": causal}
    got = _run(
        backend, scheme, data, "float64", positions=_ints(backend, pos[:, None, :]),
        segment_ids=None if seg is None else _ints(backend, seg[:, None, :]),
        block_size=block_size, **kw,
    )  # fmt: skip
    want = _expected(scheme, data, pos, pos, qseg=seg, kseg=seg, **kw)
    backend.assert_close(got, want, "float64")


@pytest.mark.parametrize("scheme", ["all_terms", "mods"])
def test_query_and_key_positions_as_a_pair(backend, scheme, dtype, rng):
    """Cross-attention shapes (``Lq = 4``, ``Lk = 9``), positions given per side, float32
    and float64."""
    lq, lk = 4, 9
    data = _inputs(rng, lq, lk)
    qpos = rng.integers(0, 12, size=(B, lq))
    kpos = rng.integers(0, 12, size=(B, lk))
    positions = (_ints(backend, qpos[:, None, :]), _ints(backend, kpos[:, None, :]))
    got = _run(backend, scheme, data, dtype, positions=positions, causal=True, block_size=(3, 4))
    backend.assert_close(got, _expected(scheme, data, qpos, kpos, causal=True), dtype)


@pytest.mark.parametrize("block_size", [None, (2, 3)])
def test_prefix_lm_and_a_learned_function_of_distance(backend, block_size, rng):
    """The guide's recipes: a prefix-LM ``mask_mod`` (the first 3 positions see each other
    both ways, the rest causal) and a ``score_mod`` reading a table of 17 values at the
    distance clipped to ±8, against the loop."""
    xp = backend.xp
    lq = lk = 12
    data = _inputs(rng, lq, lk)
    learned_np = rng.normal(size=17)
    learned = backend.asarray(learned_np, "float64")

    def prefix_lm(batch, head, q_pos, kv_pos):
        return (kv_pos <= q_pos) | (kv_pos < 3)

    def per_distance(score, batch, head, q_pos, kv_pos):
        index = xp.clip(kv_pos - q_pos, -8, 8) + 8
        values = xp.take(learned, xp.reshape(index, (-1,)), axis=0)
        return score + xp.reshape(values, index.shape)

    q, k, v = (backend.asarray(data[n], "float64") for n in ("q", "k", "v"))
    got = relattn.scaled_dot_product_attention(
        q, k, v, mask_mod=prefix_lm, score_mod=per_distance, block_size=block_size
    )
    pos = np.broadcast_to(np.arange(lq), (B, lq))
    want = _loop(
        data["q"], data["k"], data["v"], pos, pos,
        mask_mod=lambda b, h, qp, kp: kp <= qp or kp < 3,
        score_mod=lambda s, b, h, qp, kp: s + learned_np[min(max(kp - qp, -8), 8) + 8],
    )  # fmt: skip
    backend.assert_close(got, want, "float64")


def test_score_mod_without_positions_sees_the_default_ones(backend, rng):
    """With no ``positions``, ``q_pos = i + Lk - Lq`` and ``kv_pos = j`` (memory first)."""
    lq, lk = 3, 6
    data = _inputs(rng, lq, lk)
    qpos = np.broadcast_to(np.arange(lq) + lk - lq, (B, lq))
    kpos = np.broadcast_to(np.arange(lk), (B, lk))

    def score_mod(score, batch, head, q_pos, kv_pos):
        return score - 0.1 * backend.xp.astype(q_pos - kv_pos, score.dtype) ** 2

    got = _run(backend, "xl", data, "float64", score_mod=score_mod)
    want = _loop(data["q"], data["k"], data["v"], qpos, kpos, key_table=data["key_table"],
                 content_bias=data["u"], position_bias=data["pv"],
                 score_mod=lambda s, b, h, qp, kp: s - 0.1 * (qp - kp) ** 2)  # fmt: skip
    backend.assert_close(got, want, "float64")


# -------------------------------------------------------------------------------------------
# Properties: packing, left padding, a decode loop over a static cache
# -------------------------------------------------------------------------------------------
def _xl_alone(xp_call, q, k, v, table, lo, hi, total):
    """Transformer-XL on the document ``[lo, hi)`` alone, causal, its slice of the table."""
    n = hi - lo
    rows = table[total - n : total + n - 1]  # δ in [-(n-1), n-1] of the whole full layout
    return xp_call(q[..., lo:hi, :], k[..., lo:hi, :], v[..., lo:hi, :], rows)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    block=st.sampled_from([None, 2, (3, 2)]),
    seed=st.integers(0, 2**16),
)
def test_packed_documents_equal_each_document_alone(lengths, block, seed):
    """NumPy float64: a row packing documents (positions restart, ids differ) equals each
    document run alone, every term, dense and blockwise."""
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    data = _inputs(rng, total, total)
    ids = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths])
    q, k, v = data["q"], data["k"], data["v"]
    packed = relattn.relative_attention(
        q, k, v, data["key_table"], query_position_table=data["query_table"],
        value_table=data["value_table"], causal=True, positions=pos, segment_ids=ids,
        block_size=block,
    )  # fmt: skip
    lo = 0
    for n in lengths:
        hi = lo + n
        sl = slice(total - n, total + n - 1)
        alone = relattn.relative_attention(
            q[..., lo:hi, :], k[..., lo:hi, :], v[..., lo:hi, :], data["key_table"][sl],
            query_position_table=data["query_table"][sl], value_table=data["value_table"][sl],
            causal=True,
        )  # fmt: skip
        np.testing.assert_allclose(packed[..., lo:hi, :], alone, rtol=1e-12, atol=1e-12)
        lo = hi


@pytest.mark.parametrize("block_size", [None, 2])
def test_packed_documents_on_every_backend(backend, block_size, rng):
    lengths = [3, 1, 4]
    total = sum(lengths)
    data = _inputs(rng, total, total)
    ids = np.repeat(np.arange(3), lengths)[None, None]
    pos = np.concatenate([np.arange(n) for n in lengths])[None, None]
    got = _run(backend, "xl", data, "float64", causal=True, block_size=block_size,
               positions=_ints(backend, pos), segment_ids=_ints(backend, ids))  # fmt: skip
    lo, parts = 0, []
    for n in lengths:
        hi = lo + n
        d = {**data, "q": data["q"][..., lo:hi, :], "k": data["k"][..., lo:hi, :],
             "v": data["v"][..., lo:hi, :],
             "key_table": data["key_table"][total - n : total + n - 1]}  # fmt: skip
        parts.append(_run(backend, "xl", d, "float64", causal=True))
        lo = hi
    backend.assert_close(got, np.concatenate([backend.to_host(p) for p in parts], axis=-2),
                         "float64")  # fmt: skip


def test_left_padded_batch_equals_each_row_unpadded(backend, rng):
    """Each row at its own offset: pads first (masked keys holding NaN), positions from 0
    at the first real token."""
    lengths, width = [5, 3], 6
    data = _inputs(rng, width, width)
    pads = [width - n for n in lengths]
    pos = np.stack([np.arange(width) - p for p in pads])  # negative under the pads
    keep = np.stack([np.arange(width) >= p for p in pads])  # (B, L) real keys
    for name in ("k", "v"):
        data[name] = data[name].copy()
        for b, p in enumerate(pads):
            data[name][b, :, :p] = np.nan
    mask = _ints(backend, keep[:, None, None, :])
    got = backend.to_host(
        _run(
            backend,
            "all_terms",
            data,
            "float64",
            causal=True,
            mask=mask,
            positions=_ints(backend, pos[:, None, :]),
        )
    )
    for b, (n, p) in enumerate(zip(lengths, pads, strict=True)):
        row = {name: x[b : b + 1, ..., p:, :] if name in "qkv" else x for name, x in data.items()}
        row["relative_bias"] = data["relative_bias"][:, width - n : width + n - 1]
        for name in ("key_table", "query_table", "value_table"):
            row[name] = data[name][width - n : width + n - 1]
        alone = _run(backend, "all_terms", row, "float64", causal=True)
        np.testing.assert_allclose(got[b : b + 1, :, p:], backend.to_host(alone), rtol=1e-10)
        assert np.isfinite(got[b]).all()


# -------------------------------------------------------------------------------------------
# Masked keys holding NaN or inf
# -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["dense", "blockwise", "positions"])
@pytest.mark.parametrize("scheme", ["sdpa", "xl", "all_terms"])
def test_unfilled_cache_slots_holding_nan_never_reach_a_result(backend, path, scheme, rng):
    """A cache of 10 slots, 6 filled per row: keys and values of the other 4 are NaN, and
    inf in a second run; the result equals the run on the filled slots alone."""
    lmax, filled, lq = 10, 6, 2
    data = _inputs(rng, lq, lmax)
    keep = np.arange(lmax) < filled
    dirty = {**data, "k": data["k"].copy(), "v": data["v"].copy()}
    clean = {**data, "k": data["k"][..., :filled, :], "v": data["v"][..., :filled, :]}
    # The clean call: queries at positions filled-2, filled-1 of filled keys, full layout of
    # its own width, which is the dirty call's table from row lmax - filled on.
    width = lq + filled - 1
    for name in ("key_table", "query_table", "value_table"):
        clean[name] = data[name][lmax - filled : lmax - filled + width]
    clean["relative_bias"] = data["relative_bias"][:, lmax - filled : lmax - filled + width]
    scheme_name = "t5" if scheme == "sdpa" else scheme
    if scheme == "sdpa":
        scheme_name = "xl"
        for d in (dirty, clean):
            d["key_table"] = np.zeros_like(d["key_table"])
    kw = {"causal": False}
    if path == "blockwise":
        kw["block_size"] = (1, 3)
    if path == "positions":
        qpos = np.arange(filled - lq, filled)
        kw["positions"] = (_ints(backend, qpos), _ints(backend, np.arange(lmax)))
        kw["causal"] = True
    want = backend.to_host(
        _run(
            backend,
            scheme_name,
            clean,
            "float64",
            **({"causal": True} if path == "positions" else {}),
        )
    )
    if path != "positions":
        # Without positions the queries sit at the end of the 10 slots: compare against the
        # same call on a cache whose unfilled slots hold zeros instead.
        zeros = {**dirty, "k": dirty["k"].copy(), "v": dirty["v"].copy()}
        zeros["k"][..., filled:, :] = 0
        zeros["v"][..., filled:, :] = 0
        want = backend.to_host(
            _run(backend, scheme_name, zeros, "float64", mask=backend.asarray(keep), **kw)
        )
    for bad in (np.nan, np.inf):
        dirty["k"][..., filled:, :] = bad
        dirty["v"][..., filled:, :] = -bad
        got = backend.to_host(
            _run(backend, scheme_name, dirty, "float64", mask=backend.asarray(keep), **kw)
        )
        assert np.isfinite(got).all(), f"{bad} in a masked slot reached the result"
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("block_size", [None, 4, 7])
def test_a_nan_key_in_the_causal_future_stays_there(backend, block_size, rng):
    """SPEC §2.17: a NaN key at position 5 of 16 (causal) leaves rows 0–4 finite on every
    path (the issue's example: dense gave NaN in all 16 rows)."""
    data = _inputs(rng, 16, 16)
    data["k"] = data["k"].copy()
    data["k"][..., 5, :] = np.nan
    for scheme in ("xl", "t5"):
        out = backend.to_host(
            _run(backend, scheme, data, "float64", causal=True, block_size=block_size)
        )
        assert np.isfinite(out[..., :5, :]).all()
        assert np.isnan(out[..., 5:, :]).all()  # rows that see the NaN key: NaN, as they must


@pytest.mark.parametrize("path", ["mask", "blockwise", "positions"])
def test_nan_in_unfilled_slots_reaches_no_gradient(jit_backend, path, rng):
    """The gradients of a call over a cache whose 3 unfilled slots hold NaN (keys) and inf
    (values) equal those of the same cache holding zeros: finite for q, and 0 for the
    unfilled slots (torch autograd on eager values; ``jax.grad``, whose traced branch is
    ``lax.cond``)."""
    lmax, filled, lq = 8, 5, 2
    data = _inputs(rng, lq, lmax)
    table = jit_backend.asarray(data["key_table"], "float64")
    keep = np.arange(lmax) < filled
    kw = {"mask": jit_backend.asarray(keep)}
    if path == "blockwise":
        kw["block_size"] = (1, 3)
    if path == "positions":
        kw = {"causal": True, "positions": (_ints(jit_backend, np.arange(filled - lq, filled)),
                                            _ints(jit_backend, np.arange(lmax)))}  # fmt: skip

    def loss(q, k, v):
        out = relattn.relative_attention(q, k, v, table, **kw)
        return (out**2).sum()

    grads = []
    for k_fill, v_fill in ((0.0, 0.0), (np.nan, np.inf)):
        k, v = data["k"].copy(), data["v"].copy()
        k[..., filled:, :], v[..., filled:, :] = k_fill, v_fill
        args = [jit_backend.asarray(x, "float64") for x in (data["q"], k, v)]
        if jit_backend.is_jax:
            import jax

            grads.append([jit_backend.to_host(g) for g in jax.grad(loss, (0, 1, 2))(*args)])
        else:
            args = [a.requires_grad_() for a in args]
            loss(*args).backward()
            grads.append([jit_backend.to_host(a.grad) for a in args])
    for clean, dirty in zip(*grads, strict=True):
        assert np.isfinite(dirty).all()
        np.testing.assert_allclose(dirty, clean, rtol=1e-12, atol=1e-12)
    assert not grads[1][1][..., filled:, :].any() and not grads[1][2][..., filled:, :].any()


# -------------------------------------------------------------------------------------------
# A decode loop over a static cache: one compile for the whole generation
# -------------------------------------------------------------------------------------------
def _decode(backend, step_fn, data, lmax, steps):
    """Write each step's key and value into a preallocated cache whose unfilled slots hold
    NaN, attend from the step's query at its position; return the stacked outputs."""
    xp = backend.xp
    q, k, v = (backend.asarray(data[n], "float64") for n in ("q", "k", "v"))
    cache_k = np.full((B, H, lmax, D), np.nan)
    cache_v = np.full((B, H, lmax, D), np.nan)
    outs = []
    for t in range(steps):
        cache_k[:, :, t] = data["k"][:, :, t]
        cache_v[:, :, t] = data["v"][:, :, t]
        position = backend.from_host(np.full((B, 1, 1), t))
        out = step_fn(q[..., t : t + 1, :], backend.asarray(cache_k, "float64"),
                      backend.asarray(cache_v, "float64"), position)  # fmt: skip
        outs.append(backend.to_host(out))
    del k, v, xp
    return np.concatenate(outs, axis=-2)


@pytest.mark.parametrize("scheme", ["xl", "t5", "alibi", "rope", "deberta"])
def test_decode_loop_over_a_static_cache_equals_one_causal_call(jit_backend, scheme, rng):
    """Steps of one query against a cache of ``Lmax = 8`` slots (unfilled ones NaN), with
    ``positions`` and ``causal=True``: equal to one causal call over the tokens so far, and
    compiled once for the whole loop (``jax.jit``; ``torch.compile`` with no recompile).

    The recipes of the guide page "Positions as data": Transformer-XL's and DeBERTa's
    tables and T5's values per distance in the causal layout of ``Lmax`` rows; ALiBi's
    bias from the step's own distances in a ``score_mod``; RoPE's query rotated at its
    position, the keys when they are written."""
    lmax, steps = 8, 5
    xp = jit_backend.xp
    data = _inputs(rng, steps, steps)
    if scheme == "rope":
        keys = relattn.rotary_position_embedding(data["k"], layout="concatenated")
        data = {**data, "k": np.asarray(keys)}  # written to the cache rotated
    table = rng.normal(size=(lmax, D))  # rows δ = -(Lmax - 1) … 0
    query_table = rng.normal(size=(lmax, D))
    bias = rng.normal(size=(H, lmax))
    t_table, t_query_table, t_bias, slopes = (
        jit_backend.asarray(a, "float64") for a in (table, query_table, bias, SLOPES)
    )
    traces = []  # JAX: one entry per trace; torch: one per graph Dynamo compiles
    key_positions = jit_backend.from_host(np.arange(lmax)[None, None, :])

    def alibi(score, batch, head, q_pos, kv_pos):
        return score + slopes[head] * xp.astype(kv_pos - q_pos, score.dtype)

    def step(q, cache_k, cache_v, position):
        if jit_backend.is_jax:
            traces.append(1)  # runs once per trace
        kw = {"positions": (position, key_positions), "causal": True}
        if scheme == "xl":
            return relattn.relative_attention(q, cache_k, cache_v, t_table, **kw)
        if scheme == "t5":
            return relattn.scaled_dot_product_attention(
                q, cache_k, cache_v, relative_bias=t_bias, **kw
            )
        if scheme == "alibi":
            return relattn.scaled_dot_product_attention(q, cache_k, cache_v, score_mod=alibi, **kw)
        if scheme == "rope":
            q = relattn.rotary_position_embedding(q, position, layout="concatenated")
            return relattn.scaled_dot_product_attention(q, cache_k, cache_v, **kw)
        return relattn.disentangled_attention(q, cache_k, cache_v, t_table, t_query_table, **kw)

    if jit_backend.is_jax:
        import jax

        compiled = jax.jit(step)
    else:
        import torch

        def counting(graph, example_inputs):
            traces.append(1)
            return graph.forward

        compiled = torch.compile(step, backend=counting, dynamic=False)
    got = _decode(jit_backend, compiled, data, lmax, steps)
    first = len(traces)
    assert first >= 1
    got = _decode(jit_backend, compiled, data, lmax, steps)
    assert len(traces) == first, "a step of the decode loop compiled again"
    # One causal call over the tokens: the causal layout of its own width.
    q, k, v = (jit_backend.asarray(data[n], "float64") for n in ("q", "k", "v"))
    own = slice(lmax - steps, None)
    if scheme == "xl":
        whole = relattn.relative_attention(q, k, v, t_table[own])
    elif scheme == "t5":
        whole = relattn.scaled_dot_product_attention(q, k, v, relative_bias=t_bias[:, own])
    elif scheme == "alibi":
        delta = jit_backend.asarray(np.arange(-(steps - 1), 1), "float64")
        values = slopes[:, None] * delta[None, :]
        whole = relattn.scaled_dot_product_attention(q, k, v, relative_bias=values)
    elif scheme == "rope":
        q = relattn.rotary_position_embedding(q, layout="concatenated")
        whole = relattn.scaled_dot_product_attention(q, k, v, causal=True)
    else:
        whole = relattn.disentangled_attention(q, k, v, t_table[own], t_query_table[own])
    np.testing.assert_allclose(got, jit_backend.to_host(whole), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block_size", [None, (2, 3)])
def test_score_mod_gradients_reach_closed_over_arrays(jit_backend, block_size, rng):
    """ALiBi written as a ``score_mod`` closing over learned slopes, against the same bias
    passed as ``bias=``: equal outputs and equal gradients for the slopes (torch autograd,
    ``jax.grad``). No gradient flows through the softmax's running peak: with XLA's
    optimisations off (the suite's flags) one did, and made a head's gradient NaN."""
    lq = lk = 6
    q, k, v = (jit_backend.asarray(rng.normal(size=(B, H, lq, D)), "float64") for _ in "qkv")
    slopes0 = rng.uniform(0.1, 1.0, size=H)
    distance = jit_backend.asarray(np.arange(lk)[None, :] - np.arange(lq)[:, None], "float64")

    def through_mod(slopes):
        def score_mod(score, batch, head, q_pos, kv_pos):
            distance = jit_backend.xp.astype(kv_pos - q_pos, score.dtype)
            return score + slopes[head] * distance

        out = relattn.scaled_dot_product_attention(
            q, k, v, score_mod=score_mod, causal=True, block_size=block_size
        )
        return (out**2).sum()

    def through_bias(slopes):
        bias = slopes[:, None, None] * distance
        return (relattn.scaled_dot_product_attention(q, k, v, bias=bias, causal=True) ** 2).sum()

    if jit_backend.is_jax:
        import jax

        grads = [
            jax.grad(f)(jit_backend.asarray(slopes0, "float64"))
            for f in (through_mod, through_bias)
        ]
        values = [f(jit_backend.asarray(slopes0, "float64")) for f in (through_mod, through_bias)]
    else:
        grads, values = [], []
        for f in (through_mod, through_bias):
            slopes = jit_backend.asarray(slopes0, "float64").requires_grad_()
            value = f(slopes)
            value.backward()
            grads.append(slopes.grad)
            values.append(value.detach())
    np.testing.assert_allclose(
        jit_backend.to_host(values[0]), jit_backend.to_host(values[1]), rtol=1e-12
    )
    np.testing.assert_allclose(
        jit_backend.to_host(grads[0]), jit_backend.to_host(grads[1]), rtol=1e-10
    )
    assert np.abs(jit_backend.to_host(grads[0])).max() > 0


def test_default_positions_take_the_shift_path(backend, monkeypatch, rng):
    """Positions that are the contiguous default up to a shift per row (a prefill at 7,
    rows at offsets 3 and 10) equal no positions, without the fold where values are at
    hand; a different shift per side does not."""
    import relattn.core

    calls = []
    real = relattn.core.blockwise
    monkeypatch.setattr(
        relattn.core, "blockwise", lambda p, b, *rest: (calls.append(b), real(p, b, *rest))[1]
    )
    data = _inputs(rng, 4, 6)
    plain = _run(backend, "xl", {**data, "key_table": data["key_table"][:6]}, "float64")
    table = {**data, "key_table": data["key_table"][:6]}  # the causal layout, W = Lk
    shifted = (_ints(backend, np.arange(4) + 9), _ints(backend, np.arange(6) + 7))
    got = _run(backend, "xl", table, "float64", positions=shifted)
    backend.assert_close(got, backend.to_host(plain), "float64")
    offsets = np.array([3, 10])[:, None, None]  # (B, 1, 1): one offset per batch row
    per_row = (_ints(backend, np.arange(4) + 2 + offsets), _ints(backend, np.arange(6) + offsets))
    got = _run(backend, "xl", table, "float64", positions=per_row)
    backend.assert_close(got, backend.to_host(plain), "float64")
    if not (backend.name == "dask" or backend.is_jax):
        # Dask's values are not at hand, and an eager JAX call is compiled whole (as under
        # jax.jit, its positions traced): both fold.
        assert calls == []
    other = (_ints(backend, np.arange(4) + 9), _ints(backend, np.arange(6) + 6))
    moved = _run(backend, "xl", table, "float64", positions=other)
    assert not np.allclose(backend.to_host(moved), backend.to_host(plain))


@pytest.mark.parametrize("mod", ["score_mod", "mask_mod"])
def test_mods_see_the_given_positions_even_when_they_are_the_default_ones(backend, mod, rng):
    """Positions equal to the default up to a shift (100) still reach ``score_mod`` and
    ``mask_mod`` as given: a prefix of keys before position 102 masked or penalised."""
    xp = backend.xp
    data = _inputs(rng, 4, 4)
    pos = _ints(backend, np.arange(4) + 100)
    if mod == "mask_mod":
        kw = {"mask_mod": lambda b, h, qp, kp: kp >= 102}
        want = {"mask": backend.asarray(np.arange(4) >= 2)}
    else:
        kw = {"score_mod": lambda s, b, h, qp, kp: s - 5.0 * xp.astype(kp < 102, s.dtype)}
        want = {"bias": backend.asarray(np.where(np.arange(4) < 2, -5.0, 0.0), "float64")}
    got = _run(backend, "t5", data, "float64", positions=pos, **kw)
    backend.assert_close(got, backend.to_host(_run(backend, "t5", data, "float64", **want)),
                         "float64")  # fmt: skip
