"""Blockwise attention (SPEC §2.13) equals the dense path and a loop reference, on every backend.

Every attention function takes ``block_size=``: an int runs the online softmax over query and key
blocks of that size (Python loops over static blocks, or JAX's ``lax.map`` + ``fori_loop`` +
``cond``); ``None`` is dense on these small inputs. Each configuration of ``CASES`` runs dense and
blockwise (block sizes 1, uneven ones, and ones larger than both lengths; odd lengths, ``Lq = 1``,
``Lq > Lk``, ``Lq < Lk``; masks of every broadcast shape, fully masked rows) and both are compared
with ``_loop_attention``, a NumPy float64 reference written here from the formula and sharing no
code with relattn:

.. code-block:: text

    score[i, j] = scale · ((q_i + u)·k_j + (q_i + v)·Kʳ(δ) + k_j·Qʳ(δ)) + b(δ) + bias[i, j]
    out[i]      = Σ_j softmax_j(score[i, :], allowed)[j] · (v_j + Vʳ(δ))

one ``(i, j)`` pair at a time, ``δ = j - (i + Lk - Lq)``, where a distance a relative input does not
have (a causal layout, ``δ > 0``) masks the pair, and ``Kʳ(δ)`` is a row of the relative layout
(column ``δ + Lk - 1``) or of Shaw's clipped table (row ``clip(δ, -K_past, K_future) + K_past``).

On JAX each test's calls run under one ``jax.jit`` (``Backend.jit``), on Dask under a scheduler
that fails if relattn computes the graph. Gradients (``torch.autograd.gradcheck`` through the
per-query-block checkpoints, ``jax.grad``), ``jax.jit``/``torch.compile``, the automatic choice
(``RELATTN_MAX_SCORE_BYTES``), JAX's program size and retracing, half precision and a Hypothesis
property follow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

import relattn
import relattn.blocks
import relattn.core
from relattn.testing import tolerance

#: The attention functions, as imported (never the lazy wrappers of other test modules).
FUNCTIONS = {
    "sdpa": relattn.scaled_dot_product_attention,
    "relative": relattn.relative_attention,
    "shaw": relattn.shaw_attention,
    "disentangled": relattn.disentangled_attention,
}

BATCH, HEADS, D, DV = 2, 2, 4, 3
BIG_BLOCK = 16  # larger than every length below


# ===============================================================================================
# The loop reference
# ===============================================================================================


def _delta(i, j, lq, lk):
    """Key minus query, the last query aligned with the last key."""
    return j - (i + lk - lq)


def _columns(x, lead, lk):
    """Per-distance rows of an array in the relative layout: ``x[..., δ + Lk - 1, :]``.

    ``x (..., W, f)``; ``None`` for a distance the layout does not have (``δ > 0`` in the causal
    layout of width ``Lk``): the pair is then masked.
    """
    x = np.broadcast_to(np.asarray(x, dtype=np.float64), (*lead, *x.shape[-2:]))
    width = x.shape[-2]

    def row(b, delta):
        m = delta + lk - 1
        return x[b][m] if m < width else None

    return row


def _scalar_columns(values, lead, lk):
    """Per-distance scalars of ``values (..., W)`` (T5, ALiBi), ``None`` where absent."""
    rows = _columns(np.asarray(values)[..., None], lead, lk)

    def value(b, delta):
        r = rows(b, delta)
        return None if r is None else r[0]

    return value


def _clipped(table, lead, k_past, k_future, out_of_range):
    """Shaw et al.'s ``w_{clip(δ, -K_past, K_future)}``: row ``clip(δ) + K_past`` of the table.

    ``"zero"`` (Music Transformer): distances beyond the radius get a zero row instead.
    """
    table = np.broadcast_to(np.asarray(table, dtype=np.float64), (*lead, *table.shape[-2:]))

    def row(b, delta):
        if out_of_range == "zero" and not -k_past <= delta <= k_future:
            return np.zeros(table.shape[-1])
        return table[b][min(max(delta, -k_past), k_future) + k_past]

    return row


def _loop_attention(
    q, k, v, *, lead, scale, u=None, pv=None, key_rows=None, query_rows=None,
    value_rows=None, bias_values=None, bias=None, mask=None, causal=False,
):  # fmt: skip
    """Attention with every term of the module docstring, one ``(i, j)`` pair at a time.

    ``key_rows``, ``query_rows``, ``value_rows``, ``bias_values``: ``(b, δ) -> row`` (``None``:
    that distance is absent and the pair masked). Returns the output and the boolean
    ``(*lead, Lq)`` array of the rows with no allowed key.
    """
    q, k, v = (
        np.broadcast_to(np.asarray(a, np.float64), (*lead, *a.shape[-2:])) for a in (q, k, v)
    )
    lq, lk = q.shape[-2], k.shape[-2]
    u = np.zeros(q.shape) if u is None else np.broadcast_to(u, q.shape)
    pv = np.zeros(q.shape) if pv is None else np.broadcast_to(pv, q.shape)
    bias = np.broadcast_to(0.0 if bias is None else bias, (*lead, lq, lk))
    mask = np.broadcast_to(True if mask is None else mask, (*lead, lq, lk))
    out = np.zeros((*lead, lq, v.shape[-1]))
    empty = np.zeros((*lead, lq), bool)
    for b in np.ndindex(lead):
        for i in range(lq):
            scores = np.zeros(lk)
            allowed = np.array(mask[b][i])
            values = np.array(v[b])
            for j in range(lk):
                delta = _delta(i, j, lq, lk)
                if causal and delta > 0:
                    allowed[j] = False
                s = (q[b][i] + u[b][i]) @ k[b][j]
                extra = 0.0
                rows = {
                    name: provider(b, delta)
                    for name, provider in (
                        ("key", key_rows), ("query", query_rows),
                        ("value", value_rows), ("bias", bias_values),
                    )
                    if provider is not None
                }  # fmt: skip
                if any(r is None for r in rows.values()):
                    allowed[j] = False  # a distance this layout does not have
                    rows = {}
                if "key" in rows:
                    s = s + (q[b][i] + pv[b][i]) @ rows["key"]
                if "query" in rows:
                    s = s + k[b][j] @ rows["query"]
                if "value" in rows:
                    values[j] = values[j] + rows["value"]
                if "bias" in rows:
                    extra = rows["bias"]
                scores[j] = s * scale + extra + bias[b][i, j]
            weights = reference.softmax_row(scores, allowed)
            empty[b][i] = not allowed.any()
            out[b][i] = weights @ values
    return out, empty


# ===============================================================================================
# The configurations
# ===============================================================================================


@dataclass(frozen=True)
class Case:
    """One attention call: the function, its shapes and which inputs it gets.

    ``layout``: of every relative input, ``"full"`` (``W = Lq + Lk - 1``) or ``"causal"``
    (``W = Lk``). ``mask``: ``"pair"`` ``(Lq, Lk)``, ``"keys"`` ``(B, 1, 1, Lk)`` key padding,
    ``"full"`` ``(B, 1, Lq, Lk)``, ``"key_row"`` ``(1, Lk)``, ``"rows"`` ``(Lq, 1)`` (fully masked
    rows), ``"vector"`` ``(Lk,)``. ``bias``: ``"pair"`` ``(Lq, Lk)``, ``"heads"`` ``(H, 1, Lk)``,
    ``"all"`` ``(B, H, Lq, Lk)``, ``"vector"`` ``(Lk,)``. ``relative_bias``: ``"t5"`` (a bucket
    table gathered at ``relative_position_bucket``) or ``"alibi"`` (``m_h·δ``, ``-m_h·|δ|`` in
    the full layout). ``table``/``value_table``: ``"shared"`` ``(W, f)``, ``"heads"``
    ``(H, W, f)``, ``"tener"`` (the unprojected sinusoid of ``-δ``). ``radius``: Shaw's
    ``(K_past, K_future)``.
    ``tables``: DeBERTa's ``"both"``, ``"key"`` or ``"query"``.
    """

    function: str
    lq: int
    lk: int
    blocks: tuple[int | tuple[int, int], ...]  # a size, or (query block, key block)
    layout: str = "full"
    causal: bool = False
    mask: str | None = None
    bias: str | None = None
    relative_bias: str | None = None
    scale: float | None = None
    shared_kv: bool = False
    table: str | None = None
    biases: bool = False
    value_table: str | None = None
    radius: tuple[int, int] = (2, 2)
    asymmetric: bool = False
    out_of_range: str = "clip"
    shaw_values: bool = True
    tables: str = "both"


CASES = {
    # scaled_dot_product_attention
    "sdpa-plain": Case("sdpa", 5, 7, (3, BIG_BLOCK)),
    "sdpa-bias-mask": Case("sdpa", 6, 5, (1, 4), bias="pair", mask="full", shared_kv=True),
    "sdpa-t5": Case("sdpa", 6, 9, (4, (2, 3)), relative_bias="t5", mask="keys", scale=1.0),
    "sdpa-alibi-causal-layout": Case("sdpa", 7, 4, (3,), layout="causal", relative_bias="alibi"),
    "sdpa-causal-decode": Case("sdpa", 1, 6, (1, 4), causal=True),
    "sdpa-causal": Case("sdpa", 6, 6, (4, (3, 2)), causal=True, relative_bias="alibi", mask="rows"),
    # relative_attention
    "txl-memory": Case(
        "relative",
        5,
        8,
        (3, BIG_BLOCK),
        layout="causal",
        table="heads",
        biases=True,
        mask="keys",
    ),
    "xlnet-full": Case("relative", 7, 5, (2, (3, 2)), table="shared", biases=True, mask="pair"),
    "tener": Case("relative", 5, 7, (4,), table="tener", biases=True, scale=1.0),
    "relative-values-causal-layout": Case(
        "relative",
        4,
        7,
        (3,),
        layout="causal",
        table="shared",
        value_table="shared",
        mask="rows",
        bias="all",
    ),
    "relative-values-per-head": Case(
        "relative",
        5,
        3,
        (1, 2),
        table="heads",
        value_table="heads",
        relative_bias="t5",
        shared_kv=True,
    ),
    "relative-values-only": Case(
        "relative", 5, 5, (2,), value_table="heads", causal=True, relative_bias="alibi"
    ),
    # shaw_attention
    "shaw-clip": Case("shaw", 5, 7, (3, (2, 4)), radius=(2, 2), mask="vector"),
    "shaw-zero": Case(
        "shaw", 7, 5, (2, BIG_BLOCK), radius=(1, 1), out_of_range="zero", mask="key_row"
    ),
    "shaw-asymmetric-causal": Case(
        "shaw", 6, 6, (4,), radius=(3, 1), asymmetric=True, causal=True, bias="heads"
    ),
    "shaw-keys-only": Case("shaw", 1, 5, (1,), radius=(2, 2), shaw_values=False),
    # disentangled_attention
    "deberta-both": Case("disentangled", 5, 7, (3, (1, 2)), mask="full", bias="vector"),
    "deberta-key": Case("disentangled", 6, 4, (2,), tables="key", mask="pair"),
    "deberta-query-causal-layout": Case(
        "disentangled", 4, 6, (4,), tables="query", layout="causal"
    ),
    "deberta-causal": Case(
        "disentangled", 6, 4, (1, 3), causal=True, relative_bias="alibi", shared_kv=True
    ),
}


@dataclass(frozen=True)
class Data:
    """NumPy float64 inputs of a case, its static options and the loop reference."""

    positional: tuple[np.ndarray, ...]
    keyword: dict[str, np.ndarray]
    options: dict[str, Any]
    expected: np.ndarray
    empty: np.ndarray


def _mask(kind, rng, batch, lq, lk):
    if kind == "pair":
        mask = rng.random((lq, lk)) < 0.7
        mask[0] = False
    elif kind == "keys":
        mask = np.ones((batch, 1, 1, lk), bool)
        mask[-1, ..., -2:] = False  # padding
        if batch > 1:
            mask[0] = False  # a sequence of padding only
    elif kind == "full":
        mask = rng.random((batch, 1, lq, lk)) < 0.7
        mask[0, 0, min(2, lq - 1)] = False
    elif kind == "key_row":
        mask = rng.random((1, lk)) < 0.6
        mask[0, 0], mask[0, -2:] = False, True  # two keys at least: the weights vary
    elif kind == "vector":
        mask = np.ones(lk, bool)
        mask[1] = False
    else:  # "rows"
        mask = np.ones((lq, 1), bool)
        mask[lq // 2] = False
    return mask


def _bias(kind, rng, batch, lq, lk):
    shapes = {"pair": (lq, lk), "heads": (HEADS, 1, lk), "all": (batch, HEADS, lq, lk)}
    shape = (lk,) if kind == "vector" else shapes[kind]
    return rng.normal(size=shape)


def _relative_bias(kind, rng, lq, lk, causal_layout):
    """``(H, W)`` per-distance values: T5's gathered bucket table or ALiBi's ``m_h·δ``."""
    distances = np.asarray(relattn.relative_distances(lq, lk, causal=causal_layout))
    if kind == "t5":
        buckets = relattn.relative_position_bucket(
            distances, num_buckets=8, max_distance=6, bidirectional=not causal_layout
        )
        return rng.normal(size=(8, HEADS))[np.asarray(buckets)].T
    slopes = np.asarray(relattn.alibi_slopes(HEADS))
    if causal_layout:
        return slopes[:, None] * distances[None, :]
    return -slopes[:, None] * np.abs(distances)[None, :]


def _build(case: Case, rng: np.random.Generator, batch: int = BATCH) -> Data:
    """Random inputs of ``case`` (NumPy float64, masks boolean) and their loop reference."""
    lq, lk = case.lq, case.lk
    kv_heads = 1 if case.shared_kv else HEADS
    positional: list[Any] = [
        rng.normal(size=(batch, HEADS, lq, D)),
        rng.normal(size=(batch, kv_heads, lk, D)),
        rng.normal(size=(batch, kv_heads, lk, DV)),
    ]
    causal_layout = case.layout == "causal"
    width = lk if causal_layout else lq + lk - 1
    keyword: dict[str, np.ndarray] = {}
    if case.mask is not None:
        keyword["mask"] = _mask(case.mask, rng, batch, lq, lk)
    if case.bias is not None:
        keyword["bias"] = _bias(case.bias, rng, batch, lq, lk)
    if case.relative_bias is not None:
        keyword["relative_bias"] = _relative_bias(case.relative_bias, rng, lq, lk, causal_layout)
    options: dict[str, Any] = {}
    if case.causal:
        options["causal"] = True
    if case.scale is not None:
        options["scale"] = case.scale
    if case.function == "relative":
        if case.table == "tener":
            # TENER: the unprojected sinusoid of the signed distance t - j = -δ.
            distances = relattn.relative_distances(lq, lk, causal=causal_layout)
            positional.append(reference.sinusoid(-np.asarray(distances), D))
        elif case.table is not None:
            per_head = case.table == "heads"
            positional.append(rng.normal(size=(HEADS, width, D) if per_head else (width, D)))
        else:
            positional.append(None)
        if case.biases:
            keyword["content_bias"] = rng.normal(size=(HEADS, 1, D))
            keyword["position_bias"] = rng.normal(size=(HEADS, 1, D))
        if case.value_table is not None:
            per_head = case.value_table == "heads"
            keyword["value_table"] = rng.normal(
                size=(HEADS, width, DV) if per_head else (width, DV)
            )
    elif case.function == "shaw":
        rows = sum(case.radius) + 1
        positional.append(rng.normal(size=(rows, D)))
        if case.shaw_values:
            positional.append(rng.normal(size=(rows, DV)))
        options["out_of_range"] = case.out_of_range
        if case.asymmetric:
            options["radius"] = case.radius
    elif case.function == "disentangled":
        for name in ("key", "query"):
            wanted = case.tables in (name, "both")
            positional.append(rng.normal(size=(HEADS, width, D)) if wanted else None)
    expected, empty = _reference(case, positional, keyword)
    return Data(tuple(positional), keyword, options, expected, empty)


def _reference(case: Case, positional, keyword) -> tuple[np.ndarray, np.ndarray]:
    """``_loop_attention`` of the arrays of ``case`` (the terms each function stands for)."""
    q, k, v, *tables = positional
    lead, lk = (q.shape[0], HEADS), case.lk
    ref: dict[str, Any] = {
        "mask": keyword.get("mask"),
        "bias": keyword.get("bias"),
        "causal": case.causal,
        "scale": 1 / math.sqrt(D) if case.scale is None else case.scale,
    }
    if "relative_bias" in keyword:
        ref["bias_values"] = _scalar_columns(keyword["relative_bias"], lead, lk)
    if case.function == "relative":
        if tables[0] is not None:
            ref["key_rows"] = _columns(tables[0], lead, lk)
        ref["u"], ref["pv"] = keyword.get("content_bias"), keyword.get("position_bias")
        if "value_table" in keyword:
            ref["value_rows"] = _columns(keyword["value_table"], lead, lk)
    elif case.function == "shaw":
        # Shaw et al. eq. (3)-(4): a^K_ij = w^K_clip(j - i), a^V_ij = w^V_clip(j - i).
        k_past, k_future = case.radius
        rows = [_clipped(t, lead, k_past, k_future, case.out_of_range) for t in tables]
        ref["key_rows"] = rows[0]
        ref["value_rows"] = rows[1] if len(rows) > 1 else None
    elif case.function == "disentangled":
        # DeBERTa: c2p q_i·Kʳ and p2c k_j·Qʳ, scaled by 1/sqrt((1 + number of tables)·d).
        key_table, query_table = tables
        ref["key_rows"] = None if key_table is None else _columns(key_table, lead, lk)
        ref["query_rows"] = None if query_table is None else _columns(query_table, lead, lk)
        if case.scale is None:
            terms = 1 + (key_table is not None) + (query_table is not None)
            ref["scale"] = 1 / math.sqrt(terms * D)
    return _loop_attention(q, k, v, lead=lead, **ref)


@functools.cache
def _data(name: str) -> Data:
    """The inputs and the reference of ``CASES[name]`` (one seed per case, computed once)."""
    return _build(CASES[name], np.random.default_rng(zlib.crc32(name.encode())))


# ===============================================================================================
# Running a case on a backend
# ===============================================================================================


def _forbid_compute(dsk, keys, **kwargs):
    raise AssertionError("relattn computed a Dask graph: the result must stay lazy")


def _lazy(target):
    """On Dask, a scheduler that fails if anything computes the graph; elsewhere nothing."""
    if target.module != "dask.array":
        return contextlib.nullcontext()
    import dask

    return dask.config.set(scheduler=_forbid_compute)


def _inputs(target, data: Data, dtype: str):
    def convert(a):
        if a is None:
            return None
        return target.asarray(a) if a.dtype == bool else target.asarray(a, dtype)

    positional = [convert(a) for a in data.positional]
    keyword = {name: convert(a) for name, a in data.keyword.items()}
    return positional, keyword


def _call(target, case: Case, data: Data, dtype: str, block_sizes):
    """``function(..., block_size=b)`` for each ``b``; on JAX all of them under one ``jax.jit``."""
    function = FUNCTIONS[case.function]
    positional, keyword = _inputs(target, data, dtype)

    def run(positional, keyword):
        return tuple(
            function(*positional, **keyword, **data.options, block_size=b) for b in block_sizes
        )

    with _lazy(target):
        outs = target.default_jit(run)(positional, keyword)  # jax.jit; the call itself elsewhere
    for out in outs:
        assert target.is_array(out), type(out)
    return outs


def _host(target, x):
    return np.asarray(target.to_host(x), dtype=np.float64)


def _check_rows(target, out, data: Data):
    """Finite everywhere; rows with no allowed key exactly 0."""
    got = _host(target, out)
    assert np.isfinite(got).all()
    assert np.all(got[data.empty] == 0)


# ===============================================================================================
# Blockwise == dense == loop reference
# ===============================================================================================


def test_cases_cover_the_brief():
    """The configurations reach every shape class and every mask shape (guards edits)."""
    cases = CASES.values()
    assert any(c.lq == 1 for c in cases)
    assert any(c.lq > c.lk for c in cases) and any(c.lq < c.lk for c in cases)
    assert any(1 in c.blocks for c in cases)
    square = [(c, b) for c in cases for b in c.blocks if isinstance(b, int)]
    assert any(b > max(c.lq, c.lk) for c, b in square)
    assert any(c.lq % b and c.lk % b for c, b in square)
    assert any(isinstance(b, tuple) and b[0] != b[1] for c in cases for b in c.blocks)
    assert {c.mask for c in cases} >= {"pair", "keys", "full", "key_row", "rows", "vector"}
    assert {c.function for c in cases} == set(FUNCTIONS)
    # rows with no key at all, under causal with Lq > Lk
    assert any(_data(n).empty.any() and CASES[n].lq > CASES[n].lk for n in CASES)


#: Libraries that run the cases in float64 only, on a GPU too: on JAX each case compiles the
#: blockwise loop (about a second on a loaded 2-core machine). The CPU targets' float32 items
#: of JAX and Dask are not even collected (``FLOAT64_TARGETS`` in ``conftest.py``).
FLOAT64_ONLY = {
    "jax.numpy": (
        "JAX: float64 here; float32 blockwise under jax.jit is in test_jax_compiles_once and "
        "test_half_precision (float32 accumulators)"
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_blockwise_equals_dense(backend, dtype, name):
    """Dense, and blockwise at each of the case's block sizes: equal, and equal to the loop
    reference, at SPEC §5's tolerances; finite, fully masked rows exactly 0."""
    if dtype == "float32" and backend.module in FLOAT64_ONLY:
        pytest.skip(FLOAT64_ONLY[backend.module])
    case, data = CASES[name], _data(name)
    dense, *blocked = _call(backend, case, data, dtype, (None, *case.blocks))
    backend.assert_close(dense, data.expected, dtype)
    _check_rows(backend, dense, data)
    for out in blocked:
        backend.assert_close(out, backend.to_host(dense), dtype)
        backend.assert_close(out, data.expected, dtype)
        _check_rows(backend, out, data)


#: Fully masked rows: a sequence of padding only (Transformer-XL with memory, per-head table,
#: u and v); rows with no key at all (DeBERTa, causal, Lq > Lk, ALiBi).
HALF_CASES = ["txl-memory", "deberta-causal"]


@pytest.mark.parametrize("name", HALF_CASES)
@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_half_precision(backend, low, name):
    """float16/bfloat16: the blockwise path accumulates in float32. Its result is in the input
    dtype, finite, 0 on fully masked rows, and close to the float64 reference of the rounded
    inputs (the looser tolerance of ``low``), as is the dense one."""
    case, data = CASES[name], _data(name)

    def rounded(a):
        if a is None or a.dtype == bool:
            return a
        return _host(backend, backend.asarray(a, low))

    expected, _ = _reference(
        case,
        [rounded(a) for a in data.positional],
        {n: rounded(a) for n, a in data.keyword.items()},
    )
    dense, blocked = _call(backend, case, data, low, (None, case.blocks[0]))
    for out in (dense, blocked):
        backend.assert_close(out, expected, low)  # checks the dtype too
        _check_rows(backend, out, data)
    backend.assert_close(blocked, _host(backend, dense), low)


# ===============================================================================================
# The automatic choice: dense within relattn.config.max_score_bytes, blockwise beyond
# ===============================================================================================


def _spy_blockwise(monkeypatch):
    """Record the ``block_size`` of every call of the blockwise path.

    ``relattn.core`` imports ``blockwise`` from ``relattn.fold`` by name, so its binding is
    the one the core calls.
    """
    calls = []
    original = relattn.fold.blockwise

    def spy(problem, block_size, *rest):
        calls.append(block_size)
        return original(problem, block_size, *rest)

    monkeypatch.setattr(relattn.core, "blockwise", spy)
    return calls


@pytest.mark.parametrize("name", ["sdpa-t5", "txl-memory"])
def test_automatic_choice_goes_blockwise(backend, name, monkeypatch):
    """``block_size=None``: dense on small inputs; with a budget of 1 byte the same call takes
    the blockwise path (the device's ``BLOCK_SIZES``, (2, 3) here) and gives the same result."""
    case, data = CASES[name], _data(name)
    calls = _spy_blockwise(monkeypatch)
    (dense,) = _call(backend, case, data, "float64", (None,))
    assert calls == []
    monkeypatch.setitem(relattn.plan.BLOCK_SIZES, "cpu", (2, 3))
    with relattn.config.override(max_score_bytes=1):
        (automatic,) = _call(backend, case, data, "float64", (None,))
    assert calls == [(2, 3)]
    backend.assert_close(automatic, _host(backend, dense), "float64")
    backend.assert_close(automatic, data.expected, "float64")
    _check_rows(backend, automatic, data)


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_automatic_choice_threshold(dtype_name, monkeypatch):
    """The budget bounds the dense path's peak, three ``(..., Lq, Lk)`` score arrays for
    plain attention, leading dims broadcast (here ``q (B, H, ·)`` against ``k, v (B, 1,
    ·)``): at it, dense; one byte below, blockwise."""
    import array_api_strict as xp

    name = "sdpa-bias-mask"  # k and v shared across heads
    case, data = CASES[name], _data(name)
    q, k, v = (xp.asarray(a, dtype=getattr(xp, dtype_name)) for a in data.positional)
    peak = 3 * BATCH * HEADS * case.lq * case.lk * np.dtype(dtype_name).itemsize
    calls = _spy_blockwise(monkeypatch)
    monkeypatch.setitem(relattn.plan.BLOCK_SIZES, "cpu", (2, 2))
    with relattn.config.override(max_score_bytes=peak):
        dense = relattn.scaled_dot_product_attention(q, k, v)
        assert relattn.explain(relattn.scaled_dot_product_attention, q, k, v).peak_bytes == peak
    assert calls == []
    with relattn.config.override(max_score_bytes=peak - 1):
        blocked = relattn.scaled_dot_product_attention(q, k, v)
    assert calls == [(2, 2)]
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(dense), **tolerance(dtype_name))


def test_automatic_choice_keeps_a_fused_kernel_without_relative_terms(torch_backend, monkeypatch):
    """A call that PyTorch's fused kernel takes with nothing of ``(Lq, Lk)`` to pass (it
    tiles the scores itself) stays fused at any budget, causal or not (finite keys); a
    ``relative_bias`` over the budget goes blockwise, and a NaN key under a mask (which
    the kernel would add ``-inf`` to) takes relattn's own path."""
    name = "sdpa-plain"
    data = _data(name)
    q, k, v = (torch_backend.asarray(a, "float64") for a in data.positional)
    calls = _spy_blockwise(monkeypatch)
    sdpa = relattn.scaled_dot_product_attention
    with relattn.config.override(max_score_bytes=1):
        plain = sdpa(q, k, v)
        assert calls == []
        torch_backend.assert_close(plain, data.expected, "float64")
        for args in ((q, k, v), (k, k, v), (q[..., :1, :], k, v)):  # lower right, is_causal
            assert relattn.explain(sdpa, *args, causal=True).path == "fused"
            sdpa(*args, causal=True)
        assert calls == []
        nan_key = torch_backend.xp.where(
            torch_backend.xp.arange(k.shape[-2])[:, None] == 0, float("nan"), k
        )
        sdpa(k, nan_key, v, causal=True)  # is_causal: the kernel's own mask, no NaN met
        assert calls == []
        values = torch_backend.asarray(np.zeros((q.shape[-2] + k.shape[-2] - 1,)), "float64")
        sdpa(q, k, v, relative_bias=values)
        assert calls == [relattn.plan.BLOCK_SIZES["cpu"]]
    calls.clear()
    mask = torch_backend.xp.ones((q.shape[-2], k.shape[-2]), dtype=torch_backend.xp.bool)
    mask[:, 0] = False
    assert relattn.explain(sdpa, q, nan_key, v, mask=mask).checked
    out = sdpa(q, nan_key, v, mask=mask)  # the kernel's NaN output: relattn's dense path
    assert not torch_backend.xp.isnan(out).any()
    torch_backend.assert_close(out, torch_backend.to_host(sdpa(q, k, v, mask=mask)), "float64")


# ===============================================================================================
# Compilers: jax.jit and torch.compile(fullgraph=True) of blockwise calls
# ===============================================================================================

#: One small case per function (torch.compile unrolls the Python block loops), with every kind
#: of floating input between them: q, k, v, key/query/value tables (causal and full layout, per
#: head), content and position biases, bias, relative_bias (T5, ALiBi).
JIT_CASES = {
    "sdpa": dataclasses.replace(CASES["sdpa-t5"], lq=3, lk=5, blocks=(2,), bias="heads"),
    "relative": dataclasses.replace(
        CASES["txl-memory"],
        lq=3,
        lk=5,
        blocks=(2,),
        value_table="heads",
        bias="pair",
        relative_bias="t5",
    ),
    "shaw": dataclasses.replace(CASES["shaw-zero"], lq=4, lk=3, blocks=(2,)),
    "disentangled": dataclasses.replace(CASES["deberta-causal"], lq=4, lk=3, blocks=(2,)),
}


@functools.cache
def _small_data(name: str, batch: int = 1) -> Data:
    return _build(JIT_CASES[name], np.random.default_rng(zlib.crc32(name.encode())), batch)


@pytest.mark.parametrize("name", list(JIT_CASES))
def test_jit_equals_eager(jit_backend, name):
    """``jax.jit`` / ``torch.compile(fullgraph=True)`` of a blockwise call equals the eager call."""
    case, data = JIT_CASES[name], _small_data(name)
    function = FUNCTIONS[case.function]
    positional, keyword = _inputs(jit_backend, data, "float32")

    def run(positional, keyword):
        return function(*positional, **keyword, **data.options, block_size=case.blocks[0])

    eager = run(positional, keyword)
    compiled = jit_backend.jit(run)(positional, keyword)
    jit_backend.assert_close(compiled, _host(jit_backend, eager), "float32")
    jit_backend.assert_close(compiled, data.expected, "float32")
    _check_rows(jit_backend, compiled, data)


# ===============================================================================================
# Gradients: blockwise equals dense
# ===============================================================================================


def _float_leaves(data: Data):
    """``(where, name)`` of every floating input: ``("p", index)`` or ``("k", keyword)``."""
    leaves = [("p", i) for i, a in enumerate(data.positional) if a is not None]
    return leaves + [("k", n) for n, a in data.keyword.items() if a.dtype != bool]


def _assemble(data: Data, leaves, values, fixed):
    """Positional and keyword arrays with ``values`` at ``leaves``, ``fixed`` elsewhere."""
    positional, keyword = list(fixed[0]), dict(fixed[1])
    for (where, key), value in zip(leaves, values, strict=True):
        if where == "p":
            positional[key] = value
        else:
            keyword[key] = value
    return positional, keyword


@pytest.mark.parametrize("name", list(JIT_CASES))
def test_torch_gradcheck(torch_backend, name, monkeypatch):
    """``torch.autograd.gradcheck`` in float64 through the blockwise path, which recomputes each
    query block in the backward pass (``torch.utils.checkpoint``, once per query block); its
    gradients equal the dense path's for every input (q, k, v, tables, biases, relative_bias)."""
    import torch
    import torch.utils.checkpoint

    case, data = JIT_CASES[name], _small_data(name)
    function = FUNCTIONS[case.function]
    fixed = _inputs(torch_backend, data, "float64")
    leaves = _float_leaves(data)
    values = [
        (fixed[0][key] if where == "p" else fixed[1][key]).clone().requires_grad_(True)
        for where, key in leaves
    ]
    checkpoints = []
    original = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        checkpoints.append(fn)
        return original(fn, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)

    def f(*values, block_size=case.blocks[0]):
        positional, keyword = _assemble(data, leaves, values, fixed)
        return function(*positional, **keyword, **data.options, block_size=block_size)

    assert torch.autograd.gradcheck(f, tuple(values))
    checkpoints.clear()
    weights = torch_backend.asarray(np.random.default_rng(0).normal(size=data.expected.shape))
    blocked = torch.autograd.grad((f(*values) * weights).sum(), values)
    assert len(checkpoints) == -(-case.lq // case.blocks[0])  # one per query block
    dense = torch.autograd.grad((f(*values, block_size=None) * weights).sum(), values)
    for (_, key), a, b in zip(leaves, blocked, dense, strict=True):
        torch_backend.assert_close(a, torch_backend.to_host(b), "float64")
        assert torch.count_nonzero(b) > 0, key


@pytest.mark.parametrize("name", ["relative", "shaw", "disentangled"])  # "relative" has sdpa's
def test_jax_grad(jax_backend, name):
    """``jax.grad`` through JAX's blockwise loop (``lax.map`` + ``fori_loop`` + ``cond`` under
    ``jax.checkpoint``) equals ``jax.grad`` of the dense path for every input."""
    import jax
    import jax.numpy as jnp

    case, data = JIT_CASES[name], _small_data(name, BATCH)
    function = FUNCTIONS[case.function]
    fixed = _inputs(jax_backend, data, "float64")
    leaves = _float_leaves(data)
    values = [fixed[0][key] if where == "p" else fixed[1][key] for where, key in leaves]
    weights = jax_backend.asarray(np.random.default_rng(0).normal(size=data.expected.shape))

    def loss(values, block_size):
        positional, keyword = _assemble(data, leaves, values, fixed)
        out = function(*positional, **keyword, **data.options, block_size=block_size)
        return jnp.sum(out * weights)

    blocked_jaxpr = str(jax.make_jaxpr(lambda v: loss(v, case.blocks[0]))(values))
    assert "checkpoint" in blocked_jaxpr or "remat" in blocked_jaxpr
    both = jax.jit(lambda v: (jax.grad(loss)(v, case.blocks[0]), jax.grad(loss)(v, None)))
    blocked, dense = both(values)
    for (_, key), a, b in zip(leaves, blocked, dense, strict=True):
        jax_backend.assert_close(a, _host(jax_backend, b), "float64")
        assert bool(jnp.any(b != 0)), key


# ===============================================================================================
# JAX: one compiled block step, whatever the number of blocks
# ===============================================================================================


def _jax_inputs(jax_backend, length, seed=0):
    rng = np.random.default_rng(seed)
    arrays = (
        rng.normal(size=(1, HEADS, length, D)),
        rng.normal(size=(1, HEADS, length, D)),
        rng.normal(size=(1, HEADS, length, DV)),
        rng.normal(size=(length, D)),  # causal layout
        rng.normal(size=(length, DV)),
        rng.normal(size=(HEADS, length)),
    )
    mask = rng.random((1, 1, 1, length)) < 0.9
    return [jax_backend.asarray(a, "float32") for a in arrays] + [jax_backend.asarray(mask)]


def _jax_blockwise(q, k, v, table, value_table, values, mask):
    return relattn.relative_attention(
        q, k, v, table, value_table=value_table, relative_bias=values, mask=mask, block_size=4
    )


def test_jax_compiles_once(jax_backend):
    """A jitted blockwise call traces once for two inputs of the same shape."""
    import jax

    traces = []

    def f(*args):
        traces.append(None)  # a Python side effect runs at trace time only
        return _jax_blockwise(*args)

    compiled = jax.jit(f)
    first, second = _jax_inputs(jax_backend, 9, seed=1), _jax_inputs(jax_backend, 9, seed=2)
    out1, out2 = compiled(*first), compiled(*second)
    assert len(traces) == 1
    assert not np.allclose(_host(jax_backend, out1), _host(jax_backend, out2))
    for args, out in ((first, out1), (second, out2)):
        host = [_host(jax_backend, a) for a in args[:6]] + [np.asarray(args[6])]
        dense = relattn.relative_attention(  # NumPy, float64
            *host[:4], value_table=host[4], relative_bias=host[5], mask=host[6]
        )
        jax_backend.assert_close(out, dense, "float32")


def test_jax_program_size_does_not_grow_with_blocks(jax_backend):
    """L = 16 and L = 64 with block 4 (16 and 256 block pairs): the jaxpr and the lowered HLO
    have about the same size (an unrolled loop would be 16 times larger)."""
    import jax

    sizes = {}
    for length in (16, 64):
        args = _jax_inputs(jax_backend, length)
        jaxpr = jax.make_jaxpr(_jax_blockwise)(*args)
        hlo = jax.jit(_jax_blockwise).lower(*args).as_text()
        sizes[length] = (len(str(jaxpr)), _equations(jaxpr.jaxpr), len(hlo))
    small, large = sizes[16], sizes[64]
    assert large[1] == small[1], sizes  # the same equations
    assert large[0] < 1.2 * small[0] and large[2] < 1.2 * small[2], sizes


def _equations(jaxpr) -> int:
    """Equations of ``jaxpr`` and of every jaxpr nested in its equations' parameters."""
    from jax.extend import core

    count = 0
    for eqn in jaxpr.eqns:
        count += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, core.ClosedJaxpr):
                    count += _equations(sub.jaxpr)
                elif isinstance(sub, core.Jaxpr):
                    count += _equations(sub)
    return count


# ===============================================================================================
# Dask: the blockwise result is a lazy graph
# ===============================================================================================


def test_dask_blockwise_stays_lazy():
    """On Dask every blockwise call returns a ``dask.array.Array`` without computing anything;
    computed, it equals the reference."""
    da = pytest.importorskip("dask.array")
    import dask

    for name in ("txl-memory", "shaw-clip", "deberta-both", "sdpa-t5"):
        case, data = CASES[name], _data(name)
        positional = [None if a is None else da.from_array(a, chunks=-1) for a in data.positional]
        keyword = {n: da.from_array(a, chunks=-1) for n, a in data.keyword.items()}
        with dask.config.set(scheduler=_forbid_compute):
            out = FUNCTIONS[case.function](
                *positional, **keyword, **data.options, block_size=case.blocks[0]
            )
        assert isinstance(out, da.Array)
        np.testing.assert_allclose(out.compute(), data.expected, **tolerance("float64"))


# ===============================================================================================
# Property: relative_attention, random shapes, layouts, blocks and masked rows
# ===============================================================================================


#: A random relative_attention problem: lengths, block, layout, causal flag, a value table,
#: masked query rows (a ``(Lq, 1)`` mask) and the seed of its arrays.
PROBLEMS = st.fixed_dictionaries(
    {
        "lq": st.integers(1, 7),
        "lk": st.integers(1, 7),
        "block_size": st.integers(1, 8),
        "layout": st.sampled_from(["full", "causal"]),
        "causal": st.booleans(),
        "values": st.booleans(),
        "masked_rows": st.lists(st.booleans(), min_size=7, max_size=7),
        "seed": st.integers(0, 2**16),
    }
)


def _problem(p) -> tuple[Case, Data]:
    case = Case(
        "relative", p["lq"], p["lk"], (p["block_size"],), layout=p["layout"],
        causal=p["causal"], table="heads", biases=True,
        value_table="shared" if p["values"] else None,
    )  # fmt: skip
    data = _build(case, np.random.default_rng(p["seed"]), batch=1)
    keyword = {**data.keyword, "mask": ~np.asarray(p["masked_rows"][: p["lq"]])[:, None]}
    expected, empty = _reference(case, data.positional, keyword)
    return case, dataclasses.replace(data, keyword=keyword, expected=expected, empty=empty)


@settings(max_examples=50)
@given(p=PROBLEMS)
def test_property_relative_attention(p):
    """Blockwise == dense == loop reference for relative_attention on NumPy, float64."""
    case, data = _problem(p)
    dense, blocked = (
        relattn.relative_attention(*data.positional, **data.keyword, **data.options, block_size=b)
        for b in (None, case.blocks[0])
    )
    np.testing.assert_allclose(blocked, dense, **tolerance("float64"))
    np.testing.assert_allclose(blocked, data.expected, **tolerance("float64"))
    assert np.isfinite(blocked).all() and np.all(blocked[data.empty] == 0)


def test_property_relative_attention_backends(backend):
    """The same property on every backend, fewer examples where each one compiles (JAX) or
    builds a graph of every block (Dask)."""
    slow = backend.is_jax or backend.module == "dask.array"

    @settings(max_examples=3 if slow else 15, database=None)
    @given(p=PROBLEMS)
    def check(p):
        case, data = _problem(p)
        dense, blocked = _call(backend, case, data, "float64", (None, case.blocks[0]))
        backend.assert_close(blocked, _host(backend, dense), "float64")
        backend.assert_close(blocked, data.expected, "float64")
        _check_rows(backend, blocked, data)

    check()
