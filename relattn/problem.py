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

__all__ = ["Problem", "check"]


@dataclass(frozen=True)
class Problem:
    """A checked, cast attention problem (the terms of :mod:`relattn.core`).

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

    @property
    def has_terms(self) -> bool:
        """A per-distance score term (``Kʳ``, ``Qʳ`` or ``b``) is present."""
        return not (
            self.key_table is None and self.query_table is None and self.relative_bias is None
        )

    @property
    def masks_itself(self) -> bool:
        """With static offsets, a causal term whose absent cells are ``-inf`` is the causal mask."""
        return self.causal and (self.key_table is not None or self.relative_bias is not None)

    def arrays(self) -> tuple[Any, ...]:
        """The arrays of the problem, in the order of :data:`ARRAYS` (for a checkpoint)."""
        return tuple(getattr(self, name) for name in ARRAYS)

    def with_arrays(self, arrays: tuple[Any, ...]) -> Problem:
        """The problem with its arrays replaced (as :meth:`arrays` lists them)."""
        return dataclasses.replace(self, **dict(zip(ARRAYS, arrays, strict=True)))


#: The array fields of a :class:`Problem`.
ARRAYS = (
    "q", "k", "v", "key_table", "query_table", "value_table", "relative_bias", "qp", "ks",
    "bias", "mask",
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
    keywords have in the caller's signature, for messages.

    Raises
    ------
    TypeError, ValueError
        As documented by the public functions, naming the argument.
    """
    relative = {
        "position_table": position_table,
        "query_position_table": query_position_table,
        "value_table": value_table,
    }
    optional = {
        **relative, "content_bias": content_bias, "position_bias": position_bias,
        "relative_bias": relative_bias, "bias": bias, **(others or {}),
    }  # fmt: skip
    xp = _checks.namespace(q=q, k=k, v=v, optional={**optional, "mask": mask})
    dtype = _checks.floating(xp, q=q, k=k, v=v, **optional)
    bq, bk, d = check_qkv(q, k, v)
    lq, lk = (bq, bk) if lengths is None else lengths
    causal = _checks.flag("causal", causal)
    if scale is None and default_scale is not None and d > 0:
        scale = default_scale(d)
    scale = _checks.scale(scale, d, xp)
    block_size = check_block_size(block_size)
    if expand is not None:
        relative.update(expand(xp, dtype, causal, lq, lk))
    names = names or {}
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
    if mask is not None:
        _checks.boolean("mask", mask, xp)
        _checks.broadcastable("mask", mask.shape, scores, what)
    if bias is not None:
        _checks.broadcastable("bias", bias.shape, scores, what)
    if relative_bias is not None:
        _checks.ndim("relative_bias", relative_bias, 1, "(..., W)")
        relative_width("relative_bias", relative_bias.shape[-1], lq, lk)
        _checks.broadcastable(
            "relative_bias", (*relative_bias.shape[:-1], 1, 1), (*lead, 1, 1),
            "(..., W) with leading dims",
        )  # fmt: skip

    def cast(a: Any) -> Any:
        return a if a is None else _checks.cast(xp, a, dtype)

    q, k, v = cast(q), cast(k), cast(v)
    key_table, query_table = (
        cast(relative["position_table"]),
        cast(relative["query_position_table"]),
    )
    value_table, relative_bias = cast(relative["value_table"]), cast(relative_bias)
    full = lq + lk - 1
    widths = [t.shape[-2] for t in (key_table, query_table, value_table) if t is not None]
    if relative_bias is not None:
        widths.append(relative_bias.shape[-1])
    causal = causal or any(w != full for w in widths)
    content = q if content_bias is None else q + cast(content_bias)
    qp = None
    if key_table is not None:
        qp = (q if position_bias is None else q + cast(position_bias)) * scale
    return Problem(
        xp, dtype, content * scale, k, v, lq, lk, lead, causal, key_table, query_table,
        value_table, relative_bias, qp, k * scale if query_table is not None else None,
        cast(bias), mask, block_size, scale,
    )  # fmt: skip


def check_qkv(q: Any, k: Any, v: Any) -> tuple[int, int, int]:
    """``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, d_v)``; return ``Lq, Lk, d``."""
    _checks.query_key(q, k)
    _checks.ndim("v", v, 2, "(..., Lk, d_v)")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have one row per key, Lk = {k.shape[-2]}, got v of shape {tuple(v.shape)}"
        )
    return q.shape[-2], k.shape[-2], q.shape[-1]


def check_mask(mask: Any, scores_shape: tuple[int, ...], xp: Any) -> None:
    """``mask`` is boolean and broadcasts to the scores ``(..., Lq, Lk)``."""
    if mask is not None:
        _checks.boolean("mask", mask, xp)
        _checks.broadcastable("mask", mask.shape, scores_shape, "the scores (..., Lq, Lk)")


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
