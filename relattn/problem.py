"""One attention problem, checked once: the record that every attention function builds.

:func:`check` is the one argument checker of :func:`relattn.relative_attention`,
:func:`relattn.shaw_attention`, :func:`relattn.disentangled_attention`,
:func:`relattn.scaled_dot_product_attention`, :func:`relattn.attention_block`
and :func:`relattn.ring_attention`: each maps its paper's parameters onto the
terms of the core (the table of ``docs/names.md``) and calls it once. It reads
metadata only (type, dtype, shape), so it runs unchanged under ``jax.jit`` and
``torch.compile``, and it returns a :class:`Problem`: the inputs cast to one
dtype, the queries scaled, every relative input in its layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from . import _checks
from ._namespace import known_namespace
from .backends import backend_for

__all__ = ["Problem", "check"]


@dataclass(unsafe_hash=True)
class Problem:
    """A checked, cast attention problem (the terms of :mod:`relattn.core`).

    Read, never written: a changed problem is a new one (``dataclasses.replace``).
    Not frozen only because a frozen dataclass sets each of its 25 fields through
    ``object.__setattr__``, 5 µs of a decode step's call; hashable (by its fields)
    for ``Backend.staged``.

    ``q`` are the content queries ``(q + u) · scale``; ``qp`` the position
    queries ``(q + v) · scale`` (with a ``key_table``, else ``None``); ``ks`` the
    keys times ``scale`` (with a ``query_table``, else ``None``). ``key_table``
    ``Kʳ (..., W, d)``, ``query_table`` ``Qʳ (..., W, d)``, ``value_table``
    ``Vʳ (..., W, d_v)`` and ``relative_bias`` ``b (..., W)`` are the **whole**
    problem's, in the full (``W = Lq + Lk - 1``) or causal (``W = Lk``) layout;
    ``lq``, ``lk`` the whole problem's lengths, of which ``q`` and ``k`` may be
    one block. ``mask`` and ``bias`` broadcast to the scores of ``q`` and ``k``
    and are sliced per block, never expanded. ``lead`` is the broadcast leading
    shape of the scores and the output. ``causal``: ``δ > 0`` is masked (the
    flag, or a relative input in the causal layout). ``block_size``: the
    caller's request (``None``: relattn chooses). ``scale``: the factor already
    applied to ``q``, ``qp`` and ``ks`` (for keys scaled later: the ring's).

    Positions as data (SPEC §2.15–2.16): ``query_positions (..., bq)`` and
    ``key_positions (..., bk)`` are integer positions of the rows of ``q`` and
    ``k`` (``None``: contiguous, query ``i`` at key position ``i + Lk - Lq``);
    ``δ = key_position - query_position`` then indexes every relative input
    (clipped to its edge columns) and ``causal``. ``query_segments`` and
    ``key_segments`` are document ids (a query sees keys of its own document
    only); ``score_mod(score, batch, head, q_pos, kv_pos)`` and
    ``mask_mod(batch, head, q_pos, kv_pos)`` are the caller's functions,
    evaluated per block.

    The decomposed 2-D terms (MViTv2, ViTDet, SAM; SPEC §2.18): the keys lie on a
    ``kh × kw`` grid, key ``j`` at row ``j // kw`` and column ``j % kw``, and
    ``grid_rows (..., Lq, kh)`` and ``grid_cols (..., Lq, kw)`` are each query's
    content-to-position term per key row and per key column, ``q_i·Rʸ[Δy]`` and
    ``q_i·Rˣ[Δx]``, added to the scaled scores as ``grid_rows[i, j // kw] +
    grid_cols[i, j % kw]``: ``O(Lq·(kh + kw))``, formed per block
    (:func:`relattn.terms.grid_term`). Set by the public functions that have them
    (:func:`relattn.decomposed.decomposed_relative_attention`) after the check.
    """

    xp: ModuleType
    dtype: Any
    q: Any
    k: Any
    v: Any
    lq: int
    lk: int
    lead: tuple[int, ...]
    causal: bool = False
    key_table: Any = None
    query_table: Any = None
    value_table: Any = None
    relative_bias: Any = None
    qp: Any = None
    ks: Any = None
    bias: Any = None
    mask: Any = None
    block_size: tuple[int, int] | None = None
    scale: Any = 1.0
    query_positions: Any = None
    key_positions: Any = None
    query_segments: Any = None
    key_segments: Any = None
    score_mod: Callable[..., Any] | None = None
    mask_mod: Callable[..., Any] | None = None
    grid_rows: Any = None
    grid_cols: Any = None

    @property
    def has_positions(self) -> bool:
        """Explicit positions: the terms gather their columns instead of shifting a slice."""
        return self.query_positions is not None

    @property
    def programmable(self) -> bool:
        """Positions, segments or the caller's functions: the problem runs through the fold,
        a block at a time, where they are evaluated."""
        return not (
            self.query_positions is None and self.query_segments is None
            and self.score_mod is None and self.mask_mod is None
        )  # fmt: skip

    @property
    def has_terms(self) -> bool:
        """A relative score term (``Kʳ``, ``Qʳ``, ``b`` or the grid's) is present."""
        return not (
            self.key_table is None and self.query_table is None and self.relative_bias is None
            and self.grid_rows is None
        )  # fmt: skip

    def arrays(self) -> tuple[Any, ...]:
        """The arrays of the problem, in the order of :data:`ARRAYS` (for a checkpoint)."""
        return tuple(getattr(self, name) for name in ARRAYS)

    def with_arrays(self, arrays: tuple[Any, ...]) -> Problem:
        """The problem with its arrays replaced (as :meth:`arrays` lists them)."""
        return dataclasses.replace(self, **dict(zip(ARRAYS, arrays, strict=True)))


#: The array fields of a :class:`Problem`.
ARRAYS = (
    "q", "k", "v", "key_table", "query_table", "value_table", "relative_bias", "qp", "ks",
    "bias", "mask", "query_positions", "key_positions", "query_segments", "key_segments",
    "grid_rows", "grid_cols",
)  # fmt: skip


def check(
    q: Any,
    k: Any,
    v: Any,
    *,
    position_table: Any = None,
    query_position_table: Any = None,
    value_table: Any = None,
    content_bias: Any = None,
    position_bias: Any = None,
    relative_bias: Any = None,
    bias: Any = None,
    mask: Any = None,
    causal: Any = False,
    scale: Any = None,
    block_size: Any = None,
    positions: Any = None,
    segment_ids: Any = None,
    score_mod: Any = None,
    mask_mod: Any = None,
    lengths: tuple[int, int] | None = None,
    block_scores: bool = False,
    default_scale: Callable[[int], float] | None = None,
    others: dict[str, Any] | None = None,
    expand: Callable[..., dict[str, Any]] | None = None,
    names: dict[str, str] | None = None,
) -> Problem:
    """Check one call's arguments and build its :class:`Problem`.

    The keywords are those of the public functions (``docs/names.md``).
    ``lengths``: the whole problem's ``(Lq, Lk)`` when ``q`` and ``k`` are one
    block or shard of it (default: their own lengths). ``block_scores``:
    ``mask`` and ``bias`` broadcast to the scores of ``q`` and ``k`` themselves
    rather than to the whole ``(…, Lq, Lk)``. ``default_scale(d)``: the scale
    for ``scale=None`` (default ``1/√d``). ``others``: further arrays of the
    call, checked for their library and real floating dtype only (Shaw's
    clipped embeddings). ``expand(xp, dtype, causal, lq, lk)`` returns more
    relative inputs by keyword (Shaw's tables expanded to the relative layout),
    computed after the options are checked; ``names`` gives the names those
    keywords have in the caller's signature, for messages. ``positions`` and
    ``segment_ids``: one integer array ``(..., L)`` (``Lq = Lk``) or a pair
    ``(queries (..., Lq), keys (..., Lk))``, leading dims broadcasting to the
    scores' (SPEC §2.15); ``score_mod`` and ``mask_mod``: callables (§2.16).

    The checks of the arrays read their library, dtype and shape only, so an
    eager call whose arrays have the library, dtypes and shapes of an earlier
    call that passed (a decode loop, a training step) reuses that call's
    :class:`Layout` instead of checking them again. Traced calls (``jax.jit``,
    ``torch.compile``) always check: they run this code once per compilation.

    Raises
    ------
    TypeError, ValueError
        As documented by the public functions, naming the argument.
    """
    causal = _checks.flag("causal", causal)
    for name, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function, got {type(fn).__name__}")
    integers = {
        **_pair("positions", positions, "query_positions", "key_positions"),
        **_pair("segment_ids", segment_ids, "query_segment_ids", "key_segment_ids"),
    }
    relative = {
        "position_table": position_table,
        "query_position_table": query_position_table,
        "value_table": value_table,
    }
    key = None
    known = known_namespace(q)  # None until a call has resolved q's type
    if known is not None and backend_for(known).has_values(q):
        arrays = (
            q, k, v, mask, position_table, query_position_table, value_table, content_bias,
            position_bias, relative_bias, bias, *(others or {}).values(), *integers.values(),
        )  # fmt: skip
        # expand: a closure per call (Shaw's), keyed by its code; it runs on every call.
        shape_of = getattr(expand, "__code__", expand)
        options = (
            causal, lengths, block_scores, shape_of, *(others or ()), *integers,
            score_mod is None, mask_mod is None,
        )  # fmt: skip
        key = _signature(arrays, options)
    layout = None if key is None else _LAYOUTS.get(key)
    if layout is None:
        optional = {
            **relative, "content_bias": content_bias, "position_bias": position_bias,
            "relative_bias": relative_bias, "bias": bias, **(others or {}),
        }  # fmt: skip
        xp = _checks.namespace(q=q, k=k, v=v, optional={**optional, "mask": mask, **integers})
        layout, relative = _layout(
            xp, q, k, v, relative, optional, content_bias, position_bias, relative_bias, bias,
            mask, causal, lengths, block_scores, expand, names or {}, integers,
            score_mod is not None or mask_mod is not None,
        )  # fmt: skip
        if key is not None:
            # The same types, dtypes, shapes and options pass the same checks: a later
            # call with this key reuses the layout (its namespace included).
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[key] = layout
    else:
        xp = layout.xp
        if expand is not None:
            relative.update(expand(xp, layout.dtype, causal, layout.lq, layout.lk))
    d = q.shape[-1]
    if scale is None and default_scale is not None and d > 0:
        scale = default_scale(d)
    scale = _checks.scale(scale, d, xp)
    block_size = check_block_size(block_size)
    dtype = layout.dtype

    def cast(a: Any) -> Any:
        return a if a is None else _checks.cast(xp, a, dtype)

    if layout.exact:  # every array is of xp and dtype already: nothing to cast
        cast = _as_given
    q, k, v = cast(q), cast(k), cast(v)
    key_table, query_table = (
        cast(relative["position_table"]),
        cast(relative["query_position_table"]),
    )
    value_table, relative_bias = cast(relative["value_table"]), cast(relative_bias)
    content = q if content_bias is None else q + cast(content_bias)
    qp = None
    if key_table is not None:
        qp = (q if position_bias is None else q + cast(position_bias)) * scale
    query_positions = key_positions = query_segments = key_segments = None
    if integers:
        query_positions, key_positions, query_segments, key_segments = (
            _checks.cast_integer(xp, integers.get(name))
            for name in ("query_positions", "key_positions", "query_segment_ids",
                         "key_segment_ids")
        )  # fmt: skip
    return Problem(
        xp, dtype, content * scale, k, v, layout.lq, layout.lk, layout.lead, layout.causal,
        key_table, query_table, value_table, relative_bias, qp,
        k * scale if query_table is not None else None, cast(bias), mask, block_size, scale,
        query_positions, key_positions, query_segments, key_segments, score_mod, mask_mod,
    )  # fmt: skip


def _as_given(a: Any) -> Any:
    return a


def _pair(name: str, value: Any, first: str, second: str) -> dict[str, Any]:
    """``positions`` or ``segment_ids``: ``{}``, or the query and key arrays by name (one
    array serves both: self-attention)."""
    if value is None:
        return {}
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise TypeError(
                f"{name} must be one integer array (..., L) or a pair (queries (..., Lq), "
                f"keys (..., Lk)), got a {type(value).__name__} of {len(value)}"
            )
        return {first: value[0], second: value[1]}
    return {first: value, second: value}


@dataclass(frozen=True)
class Layout:
    """What :func:`check` learns from the arrays' metadata: their namespace, promoted
    dtype, the whole problem's lengths, the scores' leading shape, and ``causal`` (the
    flag, or a relative input in the causal layout)."""

    xp: ModuleType
    dtype: Any
    lq: int
    lk: int
    lead: tuple[int, ...]
    causal: bool
    #: Every array of the call is of ``xp`` and (if floating) ``dtype``: nothing to cast.
    exact: bool


#: Signature of an eager call that passed the checks -> its :class:`Layout`.
_LAYOUTS: dict[tuple[Any, ...], Layout] = {}
#: Signatures kept at most (a loop over many shapes starts again from empty).
_MAX_LAYOUTS = 256


def _signature(arrays: tuple[Any, ...], options: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The type, dtype and shape of each array (``None`` for an absent one) and the
    options, as a hashable key; ``None`` where one is not hashable."""
    try:
        key = (*[None if a is None else (type(a), a.dtype, a.shape) for a in arrays], *options)
        hash(key)
    except (AttributeError, TypeError):  # not an array (the checks will say), or unhashable
        return None
    return key


def _layout(
    xp: ModuleType,
    q: Any,
    k: Any,
    v: Any,
    relative: dict[str, Any],
    optional: dict[str, Any],
    content_bias: Any,
    position_bias: Any,
    relative_bias: Any,
    bias: Any,
    mask: Any,
    causal: bool,
    lengths: tuple[int, int] | None,
    block_scores: bool,
    expand: Callable[..., dict[str, Any]] | None,
    names: dict[str, str],
    integers: dict[str, Any],
    mods: bool,
) -> tuple[Layout, dict[str, Any]]:
    """The metadata checks of :func:`check`; the layout and the relative inputs (expanded)."""
    dtype = _checks.floating(xp, q=q, k=k, v=v, **optional)
    bq, bk, d = check_qkv(q, k, v)
    lq, lk = (bq, bk) if lengths is None else lengths
    given, relative = relative, dict(relative)  # the caller's tables; with those expanded
    if expand is not None:
        relative.update(expand(xp, dtype, causal, lq, lk))
    leads = {"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]}
    d_v = v.shape[-1]
    for name, table in relative.items():
        if table is not None:
            shown = names.get(name, name)
            features = (d_v, "d_v") if name == "value_table" else (d, "d")
            check_table(shown, table, lq, lk, *features)
            leads[shown] = table.shape[:-2]
    lead = _checks.broadcast(**leads)
    if position_bias is not None and relative["position_table"] is None:
        raise ValueError("position_bias needs a position_table: it is added to q before q Rᵀ")
    for name, b in (("content_bias", content_bias), ("position_bias", position_bias)):
        if b is not None:
            _checks.broadcastable(name, b.shape, tuple(q.shape), "q")
    scores = (*lead, bq, bk) if block_scores or lengths is None else (*lead, lq, lk)
    what = "the block's scores (..., bq, bk)" if block_scores else "the scores (..., Lq, Lk)"
    check_mask(mask, scores, xp, what)
    if bias is not None:
        _checks.broadcastable("bias", bias.shape, scores, what)
    widths = [t.shape[-2] for t in relative.values() if t is not None]
    if relative_bias is not None:
        _checks.ndim("relative_bias", relative_bias, 1, "(..., W)")
        widths.append(relative_width("relative_bias", relative_bias.shape[-1], lq, lk))
        _checks.broadcastable(
            "relative_bias", (*relative_bias.shape[:-1], 1, 1), (*lead, 1, 1),
            "(..., W) with leading dims",
        )  # fmt: skip
    for name, a in integers.items():
        _check_integers(name, a, bq if name.startswith("query") else bk, lead, xp)
    if mods and len(lead) > 2:
        raise ValueError(
            "score_mod and mask_mod take the scores' (batch, head) indices: q, k and v must "
            f"have at most two leading dims (B, H, L, d), got leading dims {lead}"
        )
    causal = causal or any(w != lq + lk - 1 for w in widths)
    exact = not any(
        a is not None and (_checks.converts(xp, a) or a.dtype != dtype)
        for a in (q, k, v, *given.values(), content_bias, position_bias, relative_bias, bias)
    ) and not any(_checks.converts(xp, a) for a in integers.values())  # fmt: skip
    return Layout(xp, dtype, lq, lk, lead, causal, exact), relative


def _check_integers(name: str, a: Any, length: int, lead: tuple[int, ...], xp: Any) -> None:
    """``a (..., length)`` of integers whose leading dims broadcast to the scores' ``lead``."""
    what = "Lq" if name.startswith("query") else "Lk"
    shown = {
        "query_positions": "positions (queries)", "key_positions": "positions (keys)",
        "query_segment_ids": "segment_ids (queries)", "key_segment_ids": "segment_ids (keys)",
    }[name]  # fmt: skip
    if not _checks.is_integer_dtype(xp, a.dtype):
        raise TypeError(f"{shown} must have an integer dtype, got {a.dtype}")
    if a.ndim < 1 or a.shape[-1] != length:
        raise ValueError(
            f"{shown} must have shape (..., {what}) = (..., {length}), got shape {tuple(a.shape)}"
            + (" (one array serves queries and keys only when Lq = Lk; pass a pair)"
               if a.ndim >= 1 else "")
        )  # fmt: skip
    if _checks.broadcast_shapes(a.shape[:-1], lead) != tuple(lead):
        raise ValueError(
            f"{shown} must have leading dims that broadcast to the scores' {tuple(lead)} (one "
            f"row per batch row of (B, H, L, d) inputs: shape (B, 1, {what})), got shape "
            f"{tuple(a.shape)}"
        )


def check_qkv(q: Any, k: Any, v: Any) -> tuple[int, int, int]:
    """``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, d_v)``; return ``Lq, Lk, d``."""
    _checks.query_key(q, k)
    _checks.ndim("v", v, 2, "(..., Lk, d_v)")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have one row per key, Lk = {k.shape[-2]}, got v of shape {tuple(v.shape)}"
        )
    return q.shape[-2], k.shape[-2], q.shape[-1]


def check_mask(
    mask: Any, scores_shape: tuple[int, ...], xp: Any, what: str = "the scores (..., Lq, Lk)"
) -> None:
    """``mask`` is boolean and broadcasts to the scores (``what`` names them)."""
    if mask is not None:
        _checks.boolean("mask", mask, xp)
        _checks.broadcastable("mask", mask.shape, scores_shape, what)


def relative_width(name: str, width: int, lq: int, lk: int) -> int:
    """``width`` is ``Lk`` (causal layout) or ``Lq + Lk - 1`` (full layout)."""
    if width not in (lk, lq + lk - 1):
        raise ValueError(
            f"{name} must have W = Lk = {lk} rows (causal layout) or W = Lq + Lk - 1 = "
            f"{lq + lk - 1} rows (full layout), got W = {width}"
        )
    return width


def check_table(name: str, table: Any, lq: int, lk: int, d: int, feature: str = "d") -> int:
    """``table`` is ``(..., W, d)`` in the causal or full layout; return ``W``."""
    _checks.ndim(name, table, 2, f"(..., W, {feature})")
    width, table_d = table.shape[-2:]
    relative_width(name, width, lq, lk)
    if table_d != d:
        what = "the feature size of q" if feature == "d" else "the feature size of v"
        raise ValueError(
            f"{name} must have {what}, {feature} = {d}, got shape {tuple(table.shape)}"
        )
    return width


def check_block_size(block_size: Any) -> tuple[int, int] | None:
    """``None``, or ``(query_block, key_block)`` from an integer or a pair of integers."""
    if block_size is None:
        return None
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise ValueError(
                "block_size must be an integer or a pair (query block, key block),"
                f" got a {type(block_size).__name__} of {len(block_size)}"
            )
        return (
            _checks.length("block_size[0]", block_size[0]),
            _checks.length("block_size[1]", block_size[1]),
        )
    size = _checks.length("block_size", block_size)
    return size, size
