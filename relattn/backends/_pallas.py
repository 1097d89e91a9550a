"""relattn's fused relative-position attention for JAX: Pallas kernels (forward and backward).

One program per ``(batch·head, query tile)`` streams the key tiles with an online softmax
(FlashAttention's layout, as ``jax.experimental.pallas.ops.gpu.attention`` lays it out:
the program's query tile as its block, the whole per-``(b, h)`` keys, values and tables as
blocks read with ``pl.ds`` slices in a ``lax.fori_loop``). The per-distance terms of a tile
pair are one tile product with the window of table rows the pair's distances span, moved
to key columns inside the tile by a one-hot select (the relative shift of Transformer-XL's
appendix B, without a gather: Pallas's Triton lowering has none). With positions given as
data, each cell's table row comes from them and a pair loops over the windows its visible
cells' rows span. The backward recomputes the scores tile by tile (FlashAttention-2): one
kernel for ``dq`` and ``dqp``, one for ``dk``, ``dv`` and ``dks``; the tables' gradients
come from one program per tile diagonal, whose partial windows are overlap-added outside
(deterministic, no atomics), or with positions from atomic adds per window in the ``dq``
kernel.

One code path: on a CPU the kernels run in Pallas's interpreter (slow: for tests); on a GPU
they are compiled through Pallas's Triton lowering, which ``interpret=False`` also reaches
from a CPU when a program is only lowered for CUDA (``jax.jit(f).trace(...).lower(
lowering_platforms=("cuda",))``).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from ._kernel_limits import MAX_HEAD_DIM

__all__ = ["relative_attention_kernel"]

#: The smallest tile (and padded feature size) the kernels use: Triton's ``tl.dot`` takes
#: no operand dimension below 16; the interpreter takes tiles of 8 too.
MIN_TILE_COMPILED = 16
MIN_TILE = 8
DEFAULT_TILE = 64
DTYPES = ("float16", "bfloat16", "float32", "float64")


class _Inputs(NamedTuple):
    """The kernels' operands, padded to whole tiles and to ``T`` table rows (by
    :func:`relative_attention_kernel`); ``None`` where absent."""

    q: Any  # (B, H, Lq', dp)
    k: Any  # (B, H, Lk', dp)
    v: Any  # (B, H, Lk', dvp)
    qp: Any  # (B, H, Lq', dp), with key_table
    key_table: Any  # (B or 1, H or 1, T, dp)
    ks: Any  # (B, H, Lk', dp), with query_table
    query_table: Any  # (B or 1, H or 1, T, dp)
    relative_bias: Any  # (B or 1, H or 1, T)
    grid_rows: Any  # (B or 1, H or 1, Lq', KHp), with grid_cols: q_i·Rʸ per key-grid row
    grid_cols: Any  # (B or 1, H or 1, Lq', KWp): q_i·Rˣ per key-grid column
    query_segments: Any  # (B or 1, H or 1, Lq'), int32 or int64, with key_segments
    key_segments: Any  # (B or 1, H or 1, Lk')
    key_mask: Any  # (B or 1, H or 1, Lk'), int32: 1 where the key may be seen, 0 padded
    query_positions: Any  # (B or 1, H or 1, Lq'), int32 or int64, with key_positions
    key_positions: Any  # (B or 1, H or 1, Lk')


#: The :class:`_Inputs` fields of the tables, in order.
TABLES = ("key_table", "query_table", "relative_bias")


@dataclasses.dataclass(frozen=True)
class _Config:
    """The static facts of a call: true and padded lengths, tiles, terms."""

    heads: int
    lq: int
    lk: int
    lq_pad: int
    lk_pad: int
    block_q: int
    block_k: int
    causal: bool
    interpret: bool
    #: Per :class:`_Inputs` field, whether it is given (its ref is in the kernels' operands).
    present: tuple[bool, ...]
    #: ``kw``, the key grid's width, with ``grid_rows`` and ``grid_cols`` (0 without).
    grid_width: int = 0

    def has(self, field: str) -> bool:
        return self.present[_Inputs._fields.index(field)]

    @property
    def has_key_table(self) -> bool:
        return self.has("key_table")

    @property
    def has_query_table(self) -> bool:
        return self.has("query_table")

    @property
    def has_bias(self) -> bool:
        return self.has("relative_bias")

    @property
    def has_tables(self) -> bool:
        return any(self.has(name) for name in TABLES)

    @property
    def has_grid(self) -> bool:
        return self.has("grid_rows")

    @property
    def has_positions(self) -> bool:
        return self.has("query_positions")

    @property
    def atomic_tables(self) -> tuple[str, ...]:
        """The tables whose gradients the ``dq`` kernel adds atomically: with positions,
        every given table; none without (the tile-diagonal kernel's)."""
        return tuple(name for name in TABLES if self.has_positions and self.has(name))

    @property
    def block_t(self) -> int:
        """The square tile of the tables' gradient kernel (one window per tile diagonal)."""
        return min(self.block_q, self.block_k)


def _window(bm: int, bn: int) -> int:
    """Rows of table a ``(bm, bn)`` tile pair reads: its ``bm + bn - 1`` distances, padded to
    a power of two (Triton's tensors)."""
    return pl.next_power_of_2(bm + bn - 1)


def _table_rows(lq_pad: int, lk_pad: int, bm: int, bn: int, positions: bool) -> int:
    """Rows of a padded table, enough for every window of every kernel.

    A pair's window starts at padded row ``j0 - i0 - bm + Lq'`` (see :func:`_scores`); the
    last forward window ends before ``Lq' + Lk' - bm - bn + window``, the last tile
    diagonal's (square tiles, window ``2·bt``) before ``Lq' + Lk'``. With ``positions`` a
    window starts at a visible cell's padded row, at most ``Lq' + Lk - 2`` (see
    :func:`_cell_rows`), and reads ``window`` rows.
    """
    window = _window(bm, bn)
    if positions:
        return lq_pad + lk_pad + window
    return lq_pad + lk_pad + max(0, window - bm - bn)


def _acc_dtype(dtype: Any) -> Any:
    """float64 stays float64 (the interpreter with ``jax_enable_x64``); the rest accumulate in
    float32."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _dot(a: Any, b: Any, contract: tuple[int, int], acc: Any) -> Any:
    """``a`` times ``b`` over axis ``contract[0]`` of ``a`` and ``contract[1]`` of ``b``:
    ``(1, 1)`` is ``a @ bᵀ``, ``(1, 0)`` ``a @ b``, ``(0, 0)`` ``aᵀ @ b``. IEEE float32 on
    GPUs too (not TF32)."""
    return lax.dot_general(
        a, b, (((contract[0],), (contract[1],)), ((), ())),
        precision=lax.Precision.HIGHEST, preferred_element_type=acc,
    )  # fmt: skip


def _iota(shape: tuple[int, ...], axis: int) -> Any:
    return lax.broadcasted_iota(jnp.int32, shape, axis)


# ------------------------------------------------------------------------------------------
# Table rows to key columns inside a tile: one-hot selects, and their transposes
#
# No gathers: jax 0.10's Pallas Triton lowering has no rule for ``lax.gather_p``
# (jax/_src/pallas/triton/lowering.py). Each cell ``(r, c)`` of a ``(bm, bn)`` tile reads
# window row ``w(r, c)``; its value is picked out of the window layout by comparing every
# window row with ``w(r, c)`` and summing, a ``(bm, bn, window)`` broadcast, and the
# transposes sum each window row's cells the same way. The interpreter runs the same code.
# Exact (one term of each sum is nonzero), and a select: a NaN elsewhere in the window stays
# out.
# ------------------------------------------------------------------------------------------
def _shift_index(bm: int, bn: int) -> Any:
    """``w(r, c) = c - r + bm - 1``: the window row of the tile's cell ``(r, c)`` with
    contiguous positions.

    The pair's window starts at its smallest distance, that of cell ``(bm - 1, 0)``; each
    step right adds one to the distance, each step down takes one off.
    """
    return _iota((bm, bn), 1) - _iota((bm, bn), 0) + (bm - 1)


def _onehot(index: Any, window: int) -> Any:
    """``(bm, bn, window)`` bools: whether cell ``(r, c)`` reads window row ``w``, ``index[r,
    c] == w``; an index outside ``[0, window)`` reads none."""
    return index[:, :, None] == _iota((*index.shape, window), 2)


def _select_rows(x: Any, onehot: Any) -> Any:
    """``x (bm, window)`` (or ``(1, window)``, the same for every query) in the window layout
    to key columns: ``out[r, c] = x[r, w(r, c)]``, 0 where the cell reads no row."""
    return jnp.sum(jnp.where(onehot, x[:, None, :], 0), axis=2)


def _select_cols(x: Any, onehot: Any) -> Any:
    """``x (window, bn)`` (window rows by keys) to ``(bm, bn)``: ``out[r, c] = x[w(r, c),
    c]``, 0 where the cell reads no row."""
    return jnp.sum(jnp.where(onehot, x.T[None, :, :], 0), axis=2)


def _select_rows_t(ds: Any, onehot: Any) -> Any:
    """Transpose of :func:`_select_rows`: ``ds (bm, bn)`` to ``(bm, window)``, ``out[r, w] =
    Σ_c [w(r, c) = w] ds[r, c]``."""
    return jnp.sum(jnp.where(onehot, ds[:, :, None], 0), axis=1)


def _select_cols_t(ds: Any, onehot: Any) -> Any:
    """Transpose of :func:`_select_cols`: ``ds (bm, bn)`` to ``(window, bn)``, ``out[w, c] =
    Σ_r [w(r, c) = w] ds[r, c]``."""
    return jnp.sum(jnp.where(onehot, ds[:, :, None], 0), axis=0).T


def _reached(onehot: Any) -> Any:
    """``(window,)`` bools: whether any cell reads window row ``w`` (an int32 max: Pallas's
    Triton lowering has no ``any``)."""
    return jnp.max(onehot.astype(jnp.int32), axis=(0, 1)) > 0


def _window_rows(table: Any, start: Any, window: int, reached: Any = None) -> Any:
    """Rows ``[start, start + window)`` of a table ref; with ``reached``, zeros in the rows no
    cell reads (in a product, ``0 · NaN`` would carry a NaN row into a gradient)."""
    rows = table[pl.ds(start, window), :]
    return rows if reached is None else jnp.where(reached[:, None], rows, 0)


def _atomic_add_rows(ref: Any, start: Any, value: Any) -> None:
    """``ref[start : start + len(value)] += value``, atomically (the programs of a ``(b, h)``
    all add to its table gradient)."""
    # int32 starts throughout (the interpreter's dynamic slices take one index dtype).
    index = (pl.ds(start, value.shape[0]), *(pl.ds(jnp.int32(0), n) for n in value.shape[1:]))
    plt.atomic_add(ref, index, value)


# ------------------------------------------------------------------------------------------
# One tile pair's scores, shared by every kernel
# ------------------------------------------------------------------------------------------
class _Rows(NamedTuple):
    """A query tile's values (``None`` where absent); the backward's also ``dO``, the
    rows' logsumexp and ``D = rowsum(dO ⊙ O)``."""

    q: Any
    qp: Any
    segments: Any
    positions: Any
    grid_rows: Any = None
    grid_cols: Any = None
    do: Any = None
    lse: Any = None
    delta: Any = None


class _Cols(NamedTuple):
    """A key tile's values (``None`` where absent), the rows of ``k``, ``v`` and ``ks`` of
    masked keys zeroed; ``keep``: the key mask as bools."""

    k: Any
    v: Any
    ks: Any
    segments: Any
    keep: Any
    positions: Any


class _Pair(NamedTuple):
    """What a tile pair's backward reuses from its scores (``None`` where absent): where its
    cells read the tables, and the key tile's one-hots of its key-grid rows ``(KHp, bn)``
    and columns ``(KWp, bn)``.

    Contiguous positions: the pair's one window, its first padded row ``start`` and its
    cells' one-hots ``(bm, bn, window)``. With positions: ``table_rows``, each visible
    cell's padded table row, -1 where hidden (see :func:`_for_windows`).
    """

    start: Any = None
    onehot: Any = None
    table_rows: Any = None
    grid_rows: Any = None
    grid_cols: Any = None


def _at(ref: Any, index: Any = None) -> Any:
    """Rows ``index`` (a ``pl.ds`` along the ref's first axis; ``None``: all of it) of
    ``ref``, or ``None`` for an absent operand."""
    if ref is None:
        return None
    if index is None:
        return ref[...]
    return ref[(index,) + (slice(None),) * (len(ref.shape) - 1)]


def _rows(x: _Inputs, index: Any = None, stats: tuple[Any, ...] | None = None) -> _Rows:
    """The query tile ``index`` of the operand refs ``x`` (and of the backward's ``stats``
    refs ``dO``, logsumexp, ``D``)."""
    rows = _Rows(
        q=_at(x.q, index), qp=_at(x.qp, index), segments=_at(x.query_segments, index),
        positions=_at(x.query_positions, index), grid_rows=_at(x.grid_rows, index),
        grid_cols=_at(x.grid_cols, index),
    )  # fmt: skip
    if stats is None:
        return rows
    do, lse, delta = (_at(ref, index) for ref in stats)
    return rows._replace(do=do, lse=lse, delta=delta)


def _cols(x: _Inputs, index: Any = None) -> _Cols:
    """The key tile ``index`` of the operand refs ``x``.

    A masked key's ``k``, ``v`` and ``ks`` rows are zeroed here, before any product: its
    scores are masked to ``-inf`` anyway, but ``0 · NaN`` in ``P v``, ``dS k`` or
    ``dSᵀ…`` would carry an unfilled cache slot's NaN into the output or a gradient.
    """
    k, v, ks = _at(x.k, index), _at(x.v, index), _at(x.ks, index)
    keep = None
    if x.key_mask is not None:
        keep = _at(x.key_mask, index) != 0
        k, v = jnp.where(keep[:, None], k, 0), jnp.where(keep[:, None], v, 0)
        if ks is not None:
            ks = jnp.where(keep[:, None], ks, 0)
    return _Cols(
        k, v, ks, _at(x.key_segments, index), keep, _at(x.key_positions, index)
    )  # fmt: skip


def _grid_onehots(cfg: _Config, j0: Any, rows: _Rows, bn: int, acc: Any) -> tuple[Any, Any]:
    """The one-hots of keys ``j = j0 + [0, bn)`` on the ``kh × kw`` key grid:
    ``(KHp, bn)`` with ``[a == j // kw]`` and ``(KWp, bn)`` with ``[b == j % kw]``.

    Products with them stand in for gathers (no gather in Pallas's Triton lowering): the
    decomposed term is ``grid_rows @ rows_onehot + grid_cols @ cols_onehot``, and its
    gradient ``dS @ onehotᵀ``. A padded key's row may be ``>= KHp``: an all-zero column
    (the key is masked anyway).
    """
    kh_pad, kw_pad = rows.grid_rows.shape[-1], rows.grid_cols.shape[-1]
    kw = cfg.grid_width
    j = j0 + _iota((kh_pad, bn), 1)
    row = lax.div(j, jnp.full_like(j, kw))  # j >= 0: truncation is floor
    rows_onehot = (_iota((kh_pad, bn), 0) == row).astype(acc)
    j = j0 + _iota((kw_pad, bn), 1)
    col = j - lax.div(j, jnp.full_like(j, kw)) * kw
    cols_onehot = (_iota((kw_pad, bn), 0) == col).astype(acc)
    return rows_onehot, cols_onehot


def _visible(cfg: _Config, i0: Any, j0: Any, rows: _Rows, cols: _Cols, distance: Any) -> Any:
    """``(bm, bn)`` bools: which pairs of queries ``i0 + [0, bm)`` and keys ``j0 + [0, bn)``
    are visible. A true key (``j < Lk``), with ``causal`` ``δ <= 0`` (``distance``, the
    positions' ``δ``, or the index rule ``j - i <= Lk - Lq``), with segments the query's
    document, with a key mask an unmasked key; with positions also a true query."""
    bm, bn = rows.q.shape[0], cols.k.shape[0]
    i = i0 + _iota((bm, bn), 0)
    j = j0 + _iota((bm, bn), 1)
    # Padded keys are masked. Padded query rows are computed and sliced off by the wrapper
    # (their output gradient is zero, so they add nothing to any gradient); with positions
    # they are masked too, since their (zero) positions would widen the pair's windows.
    visible = j < cfg.lk
    if distance is not None:
        visible &= i < cfg.lq
        if cfg.causal:
            visible &= distance <= 0
    elif cfg.causal:
        visible &= j - i <= cfg.lk - cfg.lq  # δ = j - i - (Lk - Lq) <= 0
    if rows.segments is not None:
        visible &= rows.segments[:, None] == cols.segments[None, :]
    if cols.keep is not None:
        visible &= cols.keep[None, :]
    return visible


def _cell_rows(cfg: _Config, distance: Any, visible: Any) -> Any:
    """Each visible cell's padded table row, -1 (no window's) where hidden.

    ``m = δ + Lk - 1`` clipped to ``[0, Lq + Lk - 2]``, the full layout's rows, then moved
    past the ``Lq' - Lq`` zero rows in front (see :func:`relative_attention_kernel`). The
    clip holds for the causal layout too (``W = Lk``): it comes with ``causal``, under
    which a visible cell's ``δ <= 0``, so ``m <= Lk - 1``.
    """
    m = jnp.clip(distance + (cfg.lk - 1), 0, cfg.lq + cfg.lk - 2).astype(jnp.int32)
    return jnp.where(visible, m + (cfg.lq_pad - cfg.lq), -1)


def _for_windows(cfg: _Config, pair: _Pair, body: Callable[..., Any], carry: Any) -> Any:
    """``carry = body(start, onehot, carry)`` over the windows of table rows a tile pair's
    cells read: ``start`` a window's first padded row, ``onehot`` its cells' one-hots
    (see :func:`_onehot`).

    Contiguous positions: the pair's one window. With positions: windows of ``window`` rows
    from the smallest visible cell's row, stepping ``window``, up to the largest (none where
    no cell is visible; one for positions contiguous within the pair); each visible cell
    reads its row in exactly one of them, the hidden cells in none.
    """
    if not cfg.has_positions:
        return body(pair.start, pair.onehot, carry)
    cells = pair.table_rows
    window = _window(cfg.block_q, cfg.block_k)
    last = jnp.max(cells)  # -1 where no cell is visible
    first = jnp.min(jnp.where(cells >= 0, cells, last))
    count = jnp.where(last >= 0, _div(last - first, window) + 1, 0)

    def step(t: Any, carry: Any) -> Any:
        start = first + t * window
        return body(start, _onehot(cells - start, window), carry)

    return lax.fori_loop(0, count, step, carry)


def _window_scores(x: _Inputs, rows: _Rows, cols: _Cols, start: Any, onehot: Any, s: Any) -> Any:
    """``s`` plus the table terms of the cells that read window ``[start, start + window)``:
    ``qp_i·Kʳ[m] + b[m]`` selected from the query side's ``(bm, window)`` product,
    ``ks_j·Qʳ[m]`` from the key side's ``(window, bn)`` one."""
    acc, window = s.dtype, onehot.shape[2]
    by_query = None  # (bm, window), or (1, window) with the bias alone
    if x.key_table is not None:
        by_query = _dot(rows.qp, x.key_table[pl.ds(start, window), :], (1, 1), acc)
    if x.relative_bias is not None:
        bias = x.relative_bias[pl.ds(start, window)].astype(acc)[None, :]
        by_query = bias if by_query is None else by_query + bias
    if by_query is not None:
        s += _select_rows(by_query, onehot)
    if x.query_table is not None:
        by_key = _dot(x.query_table[pl.ds(start, window), :], cols.ks, (1, 1), acc)
        s += _select_cols(by_key, onehot)
    return s


def _scores(
    cfg: _Config, i0: Any, j0: Any, rows: _Rows, cols: _Cols, x: _Inputs
) -> tuple[Any, _Pair]:
    """The scores of queries ``i0 + [0, bm)`` against keys ``j0 + [0, bn)``, ``-inf`` where
    the pair is not visible (see :func:`_visible`).

    ``s[r, c] = q·k + qp·Kʳ[m] + ks·Qʳ[m] + b[m] + grid_rows[i, j // kw] + grid_cols[i, j %
    kw]`` (Dai et al. 2019, eq. (3); He et al. 2021, eq. (2)-(4); Li et al. 2022, eq. (4))
    with ``m = j - i + Lq - 1``, or with positions ``m`` from ``δ = key_positions[j] -
    query_positions[i]`` (see :func:`_cell_rows`); each table term over the pair's windows
    of the table refs in ``x``, the decomposed term by one-hot products.
    """
    q, k = rows.q, cols.k
    bm, bn = q.shape[0], k.shape[0]
    acc = _acc_dtype(q.dtype)
    s = _dot(q, k, (1, 1), acc)
    pair = _Pair()
    if rows.grid_rows is not None:
        # (bm, KHp) @ (KHp, bn) + (bm, KWp) @ (KWp, bn): each cell picks its key's row and
        # column of the decomposed terms, exactly (one nonzero product per cell).
        grid_rows, grid_cols = _grid_onehots(cfg, j0, rows, bn, acc)
        s += _dot(rows.grid_rows.astype(acc), grid_rows, (1, 0), acc)
        s += _dot(rows.grid_cols.astype(acc), grid_cols, (1, 0), acc)
        pair = pair._replace(grid_rows=grid_rows, grid_cols=grid_cols)
    distance = None
    if cfg.has_positions:
        distance = cols.positions[None, :] - rows.positions[:, None]
    visible = _visible(cfg, i0, j0, rows, cols, distance)
    if cfg.has_tables:
        if cfg.has_positions:
            pair = pair._replace(table_rows=_cell_rows(cfg, distance, visible))
        else:
            # Column of the cell (bm - 1, 0): m0 = j0 - (i0 + bm - 1) + Lq - 1; the tables
            # carry Lq' - Lq rows of zeros in front, so its padded row is m0 + Lq' - Lq (>= 0:
            # i0 <= Lq' - bm).
            onehot = _onehot(_shift_index(bm, bn), _window(bm, bn))
            pair = pair._replace(start=j0 - i0 - bm + cfg.lq_pad, onehot=onehot)
        s = _for_windows(cfg, pair, functools.partial(_window_scores, x, rows, cols), s)
    # A select, not arithmetic: whatever a masked cell's score is, it is -inf.
    return jnp.where(visible, s, -jnp.inf), pair


def _div(x: Any, n: int) -> Any:
    """``x // n`` for a traced ``x >= 0`` (truncating division, in ``x``'s integer dtype)."""
    return lax.div(x, jnp.asarray(n, x.dtype))


def _key_tiles_end(cfg: _Config, i0: Any, bm: int, bn: int) -> Any:
    """Key tiles ``[0, end)`` with a visible cell for queries ``i0 + [0, bm)``: all of them,
    or with ``causal`` (and no positions) those up to the last row's diagonal, ``j <= i0 +
    bm - 1 + Lk - Lq``."""
    tiles = cfg.lk_pad // bn
    if not cfg.causal or cfg.has_positions:
        return tiles
    visible = jnp.maximum(i0 + bm + cfg.lk - cfg.lq, 0)  # keys the last row sees
    return jnp.minimum(_div(visible + bn - 1, bn), tiles)


def _query_tiles_start(cfg: _Config, j0: Any, bm: int) -> Any:
    """The first query tile with a visible cell for keys from ``j0``: 0, or with ``causal``
    (and no positions) the tile of row ``j0 - (Lk - Lq)`` (the first that sees key ``j0``)."""
    if not cfg.causal or cfg.has_positions:
        return 0
    return _div(jnp.maximum(j0 - (cfg.lk - cfg.lq), 0), bm)


def _split(cfg: _Config, refs: Sequence[Any]) -> _Inputs:
    """A kernel's operand refs (the present ones, in :class:`_Inputs` order) as
    :class:`_Inputs`, ``None`` where absent."""
    given = iter(refs)
    return _Inputs(*(next(given) if present else None for present in cfg.present))


def _zeros(present: bool, shape: tuple[int, ...], dtype: Any) -> Any:
    """An accumulator of zeros, or ``None`` (no carry) for an absent term."""
    return jnp.zeros(shape, dtype) if present else None


# ------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------
def _forward_kernel(cfg: _Config, n_in: int, *refs: Any) -> None:
    """Queries of one tile against every visible key tile: online softmax (FlashAttention-2,
    algorithm 1). Writes the output tile and each row's logsumexp (0 for a row that sees
    no key, whose output is 0)."""
    x = _split(cfg, refs[:n_in])
    out_ref, lse_ref = refs[n_in:]
    bm, bn = cfg.block_q, cfg.block_k
    i0 = pl.program_id(1) * bm
    rows = _rows(x)
    acc = _acc_dtype(rows.q.dtype)

    def step(t: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        out, m, norm = carry
        cols = _cols(x, pl.ds(t * bn, bn))
        s, _ = _scores(cfg, i0, t * bn, rows, cols, x)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        # A row that has seen no key yet keeps m = -inf: subtract 0 there, not -inf.
        m_safe = jnp.where(m_new == -jnp.inf, 0, m_new)
        p = jnp.exp(s - m_safe[:, None])
        rescale = jnp.exp(m - m_safe)
        out = out * rescale[:, None] + _dot(p.astype(cols.v.dtype), cols.v, (1, 0), acc)
        return out, m_new, norm * rescale + jnp.sum(p, axis=1)

    start = (
        jnp.zeros((bm, x.v.shape[-1]), acc),
        jnp.full((bm,), -jnp.inf, acc),
        jnp.zeros((bm,), acc),
    )
    out, m, norm = lax.fori_loop(0, _key_tiles_end(cfg, i0, bm, bn), step, start)
    # A row with no visible key (causal above the diagonal, another document's keys, a
    # masked key) has norm = 0: output 0 and logsumexp 0, never NaN.
    seen = norm > 0
    norm = jnp.where(seen, norm, 1)
    out_ref[...] = (out / norm[:, None]).astype(out_ref.dtype)
    lse_ref[...] = jnp.where(seen, m, 0) + jnp.log(norm)


def _backward_tile(
    cfg: _Config, i0: Any, j0: Any, rows: _Rows, cols: _Cols, x: _Inputs
) -> tuple[Any, Any, _Pair]:
    """``P`` and ``dS = P ⊙ (dO vᵀ - D)`` of one tile pair (FlashAttention-2, algorithm 2)
    and what its scores leave for the backward."""
    s, pair = _scores(cfg, i0, j0, rows, cols, x)
    p = jnp.exp(s - rows.lse[:, None])  # 0 at masked cells (s = -inf), lse finite
    ds = p * (_dot(rows.do, cols.v, (1, 1), p.dtype) - rows.delta[:, None])
    return p, ds, pair


def _dq_kernel(cfg: _Config, n_in: int, *refs: Any) -> None:
    """``dq = dS k``, ``dqp_i = Σ_j dS_ij Kʳ[m(i, j)]`` and the decomposed terms' gradients
    ``d grid_rows[i, a] = Σ_{j // kw = a} dS_ij``, ``d grid_cols[i, b] = Σ_{j % kw = b}
    dS_ij`` for one query tile (the program that owns the rows). With positions also the
    tables' gradients ``dKʳ[m] = Σ_{m(i, j) = m} dS_ij qp_i``, ``dQʳ[m] = Σ dS_ij ks_j``,
    ``db[m] = Σ dS_ij``, added atomically per window to the whole-table outputs (zeros on
    entry, aliased to the last inputs)."""
    x = _split(cfg, refs[:n_in])
    stats = refs[n_in : n_in + 3]
    n_atomic = len(cfg.atomic_tables)
    outs = refs[n_in + 3 + n_atomic :]  # after the aliased zeros, which the outputs are
    dq_ref, *out_refs = outs[: len(outs) - n_atomic]
    table_refs = dict(zip(cfg.atomic_tables, outs[len(outs) - n_atomic :], strict=True))
    bm, bn = cfg.block_q, cfg.block_k
    i0 = pl.program_id(1) * bm
    rows = _rows(x, None, stats)
    dtype, acc = x.q.dtype, _acc_dtype(x.q.dtype)

    def step(t: Any, carry: tuple[Any, Any, Any, Any]) -> tuple[Any, Any, Any, Any]:
        dq, dqp, d_rows, d_cols = carry
        cols = _cols(x, pl.ds(t * bn, bn))
        _, ds, pair = _backward_tile(cfg, i0, t * bn, rows, cols, x)
        dq += _dot(ds.astype(dtype), cols.k, (1, 0), acc)

        def window(start: Any, onehot: Any, dqp: Any) -> Any:
            if cfg.has_key_table or "relative_bias" in table_refs:
                ds_rows = _select_rows_t(ds, onehot)  # (bm, window): each query's dS by row
                if cfg.has_key_table:
                    # With positions, rows no visible cell reads are zeroed (reached).
                    reached = _reached(onehot) if cfg.has_positions else None
                    key_window = _window_rows(x.key_table, start, onehot.shape[2], reached)
                    dqp += _dot(ds_rows.astype(dtype), key_window, (1, 0), acc)
                if "key_table" in table_refs:
                    grad = _dot(ds_rows.astype(dtype), rows.qp, (0, 0), acc)
                    _atomic_add_rows(table_refs["key_table"], start, grad)
                if "relative_bias" in table_refs:
                    _atomic_add_rows(table_refs["relative_bias"], start, jnp.sum(ds_rows, axis=0))
            if "query_table" in table_refs:
                ds_cols = _select_cols_t(ds, onehot).astype(dtype)  # (window, bn)
                grad = _dot(ds_cols, cols.ks, (1, 0), acc)
                _atomic_add_rows(table_refs["query_table"], start, grad)
            return dqp

        if cfg.has_key_table or table_refs:
            dqp = _for_windows(cfg, pair, window, dqp)
        if cfg.has_grid:
            # dS (bm, bn) @ onehotᵀ (bn, KHp): each key's dS to its grid row (column).
            d_rows += _dot(ds, pair.grid_rows, (1, 1), acc)
            d_cols += _dot(ds, pair.grid_cols, (1, 1), acc)
        return dq, dqp, d_rows, d_cols

    start = (
        _zeros(True, x.q.shape, acc), _zeros(cfg.has_key_table, x.q.shape, acc),
        _zeros(cfg.has_grid, rows.grid_rows.shape if cfg.has_grid else (), acc),
        _zeros(cfg.has_grid, rows.grid_cols.shape if cfg.has_grid else (), acc),
    )  # fmt: skip
    dq, *rest = lax.fori_loop(0, _key_tiles_end(cfg, i0, bm, bn), step, start)
    dq_ref[...] = dq.astype(dtype)
    # dqp in q's dtype; the grid gradients in the accumulator's (summed over broadcast
    # leading dims outside, then cast).
    for out_ref, value in zip(out_refs, (r for r in rest if r is not None), strict=True):
        out_ref[...] = value.astype(out_ref.dtype)


def _dkv_kernel(cfg: _Config, n_in: int, *refs: Any) -> None:
    """``dk = dSᵀ q``, ``dv = Pᵀ dO`` and ``dks_j = Σ_i dS_ij Qʳ[m(i, j)]`` for one key tile."""
    x = _split(cfg, refs[:n_in])
    stats = refs[n_in : n_in + 3]
    dk_ref, dv_ref, *dks_ref = refs[n_in + 3 :]
    bm, bn = cfg.block_q, cfg.block_k
    j0 = pl.program_id(1) * bn
    cols = _cols(x)
    dtype, acc = x.q.dtype, _acc_dtype(x.q.dtype)

    def step(t: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        dk, dv, dks = carry
        rows = _rows(x, pl.ds(t * bm, bm), stats)
        p, ds, pair = _backward_tile(cfg, t * bm, j0, rows, cols, x)
        dk += _dot(ds.astype(dtype), rows.q, (0, 0), acc)
        dv += _dot(p.astype(dtype), rows.do, (0, 0), acc)

        def window(start: Any, onehot: Any, dks: Any) -> Any:
            # dS in the window layout of the key side: Σ_i dS_ij Qʳ[m(i, j)].
            reached = _reached(onehot) if cfg.has_positions else None
            query_window = _window_rows(x.query_table, start, onehot.shape[2], reached)
            ds_cols = _select_cols_t(ds, onehot).astype(dtype)
            return dks + _dot(ds_cols, query_window, (0, 0), acc)

        if cfg.has_query_table:
            dks = _for_windows(cfg, pair, window, dks)
        return dk, dv, dks

    start = (
        _zeros(True, x.k.shape, acc), _zeros(True, x.v.shape, acc),
        _zeros(cfg.has_query_table, x.k.shape, acc),
    )  # fmt: skip
    first = _query_tiles_start(cfg, j0, bm)
    dk, dv, dks = lax.fori_loop(first, cfg.lq_pad // bm, step, start)
    dk_ref[...] = dk.astype(dtype)
    dv_ref[...] = dv.astype(dtype)
    if dks_ref:
        dks_ref[0][...] = dks.astype(dtype)


def _tables_kernel(cfg: _Config, n_in: int, *refs: Any) -> None:
    """The tables' gradients of one tile diagonal, as ``(2·bt, ·)`` windows (contiguous
    positions).

    Square tiles of ``bt``: every pair of diagonal ``t`` (key tile minus query tile
    ``t - (nq - 1)``) reads the same window of table rows, padded rows ``[t·bt, t·bt +
    2·bt)``, so the diagonal accumulates one window of ``dKʳ[m] = Σ dS_ij qp_i``,
    ``dQʳ[m] = Σ dS_ij ks_j`` and ``db[m] = Σ dS_ij`` over ``m(i, j) = m``.
    """
    x = _split(cfg, refs[:n_in])
    stats = refs[n_in : n_in + 3]
    outs = refs[n_in + 3 :]
    bt = cfg.block_t
    win = 2 * bt  # _window(bt, bt): 2·bt - 1 distances, padded to a power of two
    onehot = _onehot(_shift_index(bt, bt), win)
    nq, nk = cfg.lq_pad // bt, cfg.lk_pad // bt
    t = pl.program_id(1)
    offset = t - (nq - 1)  # key tile minus query tile
    first, end = jnp.maximum(0, -offset), jnp.minimum(nq, nk - offset)
    if cfg.causal:
        # The whole diagonal is masked when its smallest key exceeds its largest query's
        # last visible key: j0 > i0 + bt - 1 + Lk - Lq with j0 - i0 = offset·bt.
        end = jnp.where(offset * bt > bt - 1 + cfg.lk - cfg.lq, first, end)
    dtype, acc = x.q.dtype, _acc_dtype(x.q.dtype)

    def step(i: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        dkt, dqt, db = carry
        rows = _rows(x, pl.ds(i * bt, bt), stats)
        cols = _cols(x, pl.ds((i + offset) * bt, bt))
        _, ds, _ = _backward_tile(cfg, i * bt, (i + offset) * bt, rows, cols, x)
        if cfg.has_key_table or cfg.has_bias:
            ds_rows = _select_rows_t(ds, onehot)  # (bt, win): each query's distances
            if cfg.has_key_table:
                dkt += _dot(ds_rows.astype(dtype), rows.qp, (0, 0), acc)
            if cfg.has_bias:
                db += jnp.sum(ds_rows, axis=0)
        if cfg.has_query_table:
            dqt += _dot(_select_cols_t(ds, onehot).astype(dtype), cols.ks, (1, 0), acc)
        return dkt, dqt, db

    window = (win, x.q.shape[-1])
    start = (
        _zeros(cfg.has_key_table, window, acc), _zeros(cfg.has_query_table, window, acc),
        _zeros(cfg.has_bias, (win,), acc),
    )  # fmt: skip
    results = lax.fori_loop(first, end, step, start)
    for out_ref, value in zip(outs, (r for r in results if r is not None), strict=True):
        out_ref[...] = value


# ------------------------------------------------------------------------------------------
# The pallas_calls
# ------------------------------------------------------------------------------------------
def _block(cfg: _Config, x: Any, rows: int | None = None) -> pl.BlockSpec:
    """The block of ``x (B or 1, H or 1, L, ...)`` a program of grid ``(B·H, n)`` reads:
    ``rows`` rows of tile ``n`` along axis 2, or all of axis 2 (``rows=None``). A leading
    dim of 1 is broadcast (every program reads its one entry)."""
    heads, tail = cfg.heads, x.shape[3:]
    batch_of = (lambda bh: _div(bh, heads)) if x.shape[0] > 1 else (lambda bh: 0)
    head_of = (lambda bh: bh - _div(bh, heads) * heads) if x.shape[1] > 1 else (lambda bh: 0)
    zeros = (0,) * len(tail)
    if rows is None:
        return pl.BlockSpec(
            (None, None, x.shape[2], *tail), lambda bh, n: (batch_of(bh), head_of(bh), 0, *zeros)
        )
    return pl.BlockSpec(
        (None, None, rows, *tail), lambda bh, n: (batch_of(bh), head_of(bh), n, *zeros)
    )


#: The :class:`_Inputs` fields along the queries' and along the keys' axis.
QUERY_SIDE = ("q", "qp", "query_segments", "query_positions", "grid_rows", "grid_cols")
KEY_SIDE = ("k", "v", "ks", "key_segments", "key_mask", "key_positions")


def _tiled(x: _Inputs, query_rows: int | None, key_rows: int | None) -> list[Any]:
    """``x``'s operands (the present ones, in order) with their tile rows: ``query_rows``
    for the query-side arrays, ``key_rows`` for the key-side ones, the tables whole."""
    rows = dict.fromkeys(QUERY_SIDE, query_rows) | dict.fromkeys(KEY_SIDE, key_rows)
    return [(a, rows.get(name)) for name, a in zip(x._fields, x, strict=True) if a is not None]


def _compiler_params() -> Any:
    """Pallas's Triton compiler parameters (its defaults): they make ``pallas_call`` lower
    through Triton on a GPU, and for CUDA from a CPU."""
    # Older JAX names them TritonCompilerParams.
    params = getattr(plt, "CompilerParams", None) or getattr(plt, "TritonCompilerParams")  # noqa: B009
    return params()


def _call(
    cfg: _Config,
    kernel: Any,
    grid: tuple[int, int],
    operands: Sequence[tuple[Any, int | None]],
    outputs: Sequence[tuple[tuple[int, ...], Any, int | None]],
    n_in: int,
    name: str,
    aliases: dict[int, int] | None = None,
) -> Any:
    """``pl.pallas_call`` of ``kernel(cfg, n_in, *refs)`` over ``grid``: ``n_in`` operands of
    :class:`_Inputs` then the rest of ``operands``, ``outputs`` as (shape, dtype); each with
    its tile rows (``None``: the whole axis); ``aliases`` maps operands to the outputs that
    start as them."""
    shapes = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, _ in outputs]
    return pl.pallas_call(
        functools.partial(kernel, cfg, n_in),
        grid=grid,
        in_specs=[_block(cfg, a, rows) for a, rows in operands],
        out_specs=[_block(cfg, s, rows) for s, (_, _, rows) in zip(shapes, outputs, strict=True)],
        out_shape=shapes,
        input_output_aliases=aliases or {},
        interpret=cfg.interpret,
        compiler_params=None if cfg.interpret else _compiler_params(),
        name=name,
    )(*(a for a, _ in operands))


def _forward(cfg: _Config, x: _Inputs) -> tuple[Any, Any]:
    batch, heads = x.q.shape[:2]
    bm = cfg.block_q
    operands = _tiled(x, bm, None)
    out, lse = _call(
        cfg, _forward_kernel, (batch * heads, cfg.lq_pad // bm), operands,
        [((batch, heads, cfg.lq_pad, x.v.shape[-1]), x.q.dtype, bm),
         ((batch, heads, cfg.lq_pad), _acc_dtype(x.q.dtype), bm)],
        len(operands), "relattn_relative_attention_forward",
    )  # fmt: skip
    return out, lse


def _backward(cfg: _Config, x: _Inputs, out: Any, lse: Any, dout: Any) -> _Inputs:
    """The operands' gradients, in :class:`_Inputs` layout (FlashAttention-2, algorithm 2)."""
    batch, heads, lq_pad, dp = x.q.shape
    lk_pad, grid = cfg.lk_pad, batch * heads
    dtype, acc = x.q.dtype, _acc_dtype(x.q.dtype)
    bm, bn, bt = cfg.block_q, cfg.block_k, cfg.block_t
    delta = jnp.sum(out.astype(acc) * dout.astype(acc), axis=-1)  # D_i = rowsum(dO ⊙ O)

    operands = _tiled(x, bm, None)
    grads = [((batch, heads, lq_pad, dp), dtype, bm)] * (1 + cfg.has_key_table)
    grid_tables = [x.grid_rows, x.grid_cols] if cfg.has_grid else []
    grads += [((batch, heads, lq_pad, t.shape[-1]), acc, bm) for t in grid_tables]
    # With positions the tables' gradients too: whole tables in the accumulator's dtype, in
    # the tables' (broadcast) shapes, zeros that the kernel adds to atomically.
    zeros = [jnp.zeros(getattr(x, name).shape, acc) for name in cfg.atomic_tables]
    n_operands, n_grads = len(operands) + 3, len(grads)
    dq, *rest_q = _call(
        cfg, _dq_kernel, (grid, lq_pad // bm),
        [*operands, (dout, bm), (lse, bm), (delta, bm), *((z, None) for z in zeros)],
        grads + [(z.shape, acc, None) for z in zeros], len(operands),
        "relattn_relative_attention_dq",
        aliases={n_operands + i: n_grads + i for i in range(len(zeros))},
    )  # fmt: skip
    dqp = rest_q[: cfg.has_key_table]
    d_grid = [
        _unbroadcast(g, t)
        for g, t in zip(rest_q[cfg.has_key_table : n_grads - 1], grid_tables, strict=True)
    ]
    table_grads = {
        name: _unbroadcast(g, getattr(x, name))
        for name, g in zip(cfg.atomic_tables, rest_q[n_grads - 1 :], strict=True)
    }

    operands = _tiled(x, None, bn)
    stats = [(dout, None), (lse, None), (delta, None)]
    grads = [((batch, heads, lk_pad, dp), dtype, bn), (x.v.shape, dtype, bn)]
    grads += [((batch, heads, lk_pad, dp), dtype, bn)] * cfg.has_query_table
    dk, dv, *dks = _call(
        cfg, _dkv_kernel, (grid, lk_pad // bn), operands + stats, grads, len(operands),
        "relattn_relative_attention_dkv",
    )  # fmt: skip

    tables = [name for name in TABLES if cfg.has(name) and name not in table_grads]
    if tables:
        # Contiguous positions: one window of 2·bt rows per tile diagonal, stacked along
        # axis 2.
        operands = _tiled(x, None, None)
        diagonals = (lq_pad + lk_pad) // bt - 1
        grads = [
            ((batch, heads, diagonals * 2 * bt, *getattr(x, name).shape[3:]), acc, 2 * bt)
            for name in tables
        ]
        windows = _call(
            cfg, _tables_kernel, (grid, diagonals), operands + stats, grads, len(operands),
            "relattn_relative_attention_tables",
        )  # fmt: skip
        for name, w in zip(tables, windows, strict=True):
            table_grads[name] = _overlap_add(w, getattr(x, name), bt)
    return _Inputs(
        q=dq, k=dk, v=dv,
        qp=dqp[0] if dqp else None, key_table=table_grads.get("key_table"),
        ks=dks[0] if dks else None, query_table=table_grads.get("query_table"),
        relative_bias=table_grads.get("relative_bias"),
        grid_rows=d_grid[0] if d_grid else None, grid_cols=d_grid[1] if d_grid else None,
        # The segment ids, the key mask and the positions: integers, no cotangent.
        query_segments=None, key_segments=None, key_mask=None, query_positions=None,
        key_positions=None,
    )  # fmt: skip


def _unbroadcast(grad: Any, like: Any) -> Any:
    """``grad (B, H, ...)`` summed over the leading dims ``like`` broadcasts (size 1), in
    ``like``'s dtype."""
    broadcast = tuple(axis for axis in (0, 1) if like.shape[axis] == 1)
    return jnp.sum(grad, axis=broadcast, keepdims=True).astype(like.dtype)


def _overlap_add(windows: Any, table: Any, bt: int) -> Any:
    """The table's gradient from its windows ``(B, H, diagonals·2·bt, ...)``.

    Diagonal ``t``'s window covers padded rows ``[t·bt, (t + 2)·bt)``: the sum is the
    windows' first halves plus their second halves one tile lower, ``O(T·d)``. Then summed
    over the table's broadcast leading dims, in its dtype.
    """
    batch, heads, rows = windows.shape[:3]
    tail = windows.shape[3:]
    halves = windows.reshape(batch, heads, rows // (2 * bt), 2, bt, *tail)
    first = halves[:, :, :, 0].reshape(batch, heads, rows // 2, *tail)
    second = halves[:, :, :, 1].reshape(batch, heads, rows // 2, *tail)
    features = [(0, 0)] * len(tail)
    # (diagonals + 1)·bt = Lq' + Lk' rows; the table has T >= that, the rest zeros.
    after = table.shape[2] - rows // 2
    total = jnp.pad(first, [(0, 0), (0, 0), (0, after), *features]) + jnp.pad(
        second, [(0, 0), (0, 0), (bt, after - bt), *features]
    )
    return _unbroadcast(total, table)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(cfg: _Config, x: _Inputs) -> Any:
    return _forward(cfg, x)[0]


def _fused_forward(cfg: _Config, x: _Inputs) -> tuple[Any, tuple[_Inputs, Any, Any]]:
    out, lse = _forward(cfg, x)
    return out, (x, out, lse)


def _fused_backward(cfg: _Config, saved: tuple[_Inputs, Any, Any], dout: Any) -> tuple[_Inputs]:
    x, out, lse = saved
    return (_backward(cfg, x, out, lse, dout),)


_fused.defvjp(_fused_forward, _fused_backward)


# ------------------------------------------------------------------------------------------
# The entry point
# ------------------------------------------------------------------------------------------
def _on_cpu(arrays: list[Any]) -> bool:
    """Whether the call runs on a CPU: the devices of the first array with values, else
    (every array traced, under ``jax.jit``) JAX's default backend."""
    for a in arrays:
        if not isinstance(a, jax.core.Tracer):
            return all(device.platform == "cpu" for device in a.devices())
    return jax.default_backend() == "cpu"


def _shape_error(name: str, expected: str, given: Any) -> ValueError:
    return ValueError(f"{name} must have shape {expected}, got shape {tuple(given.shape)}")


def _leading(name: str, x: Any, trailing: int, expected: str, batch: int, heads: int) -> Any:
    """``x``'s leading dims, at most two broadcasting to ``(B, H)``, made ``(B or 1, H or
    1)`` (one leading dim is the heads')."""
    if not trailing <= x.ndim <= trailing + 2:
        raise _shape_error(name, f"{expected} with at most 2 leading dims", x)
    lead = (1,) * (trailing + 2 - x.ndim) + tuple(x.shape[: x.ndim - trailing])
    if lead[0] not in (1, batch) or lead[1] not in (1, heads):
        raise ValueError(
            f"{name}'s leading dims {tuple(x.shape[: x.ndim - trailing])} must broadcast to "
            f"(B, H) = ({batch}, {heads})"
        )
    return x.reshape(*lead, *x.shape[x.ndim - trailing :])


def _check_table(
    name: str, x: Any, trailing: int, batch: int, heads: int, widths: tuple[int, ...], d: int
) -> Any:
    """``x`` with its leading dims made ``(B or 1, H or 1)``, after the checks."""
    expected = "(..., W, d)" if trailing == 2 else "(..., W)"
    x = _leading(name, x, trailing, expected, batch, heads)
    width = x.shape[x.ndim - trailing]
    if width not in widths:
        layouts = f"W = Lq + Lk - 1 = {widths[0]} (full layout)"
        if len(widths) > 1:
            layouts += f" or W = Lk = {widths[1]} (causal layout)"
        raise ValueError(f"{name} must have width {layouts}, got W = {width}")
    if trailing == 2 and x.shape[-1] != d:
        raise ValueError(f"{name} must have d = {d} features (q's), got {x.shape[-1]}")
    return x


def _check_per_row(
    name: str, x: Any, axis: str, length: int, batch: int, heads: int, kind: str
) -> Any:
    """A per-query or per-key array ``(..., L)`` (``kind``: ``"bool"`` for a mask, else what
    its integers are, ``"document ids"`` or ``"positions"``), its leading dims made ``(B or
    1, H or 1)``, after the checks."""
    x = jnp.asarray(x)
    if kind == "bool":
        if x.dtype != jnp.bool_:
            raise TypeError(f"{name} must be bool (True: the key may be seen), got {x.dtype}")
    elif not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype ({kind}), got {x.dtype}")
    expected = f"(..., {axis}) = (..., {length})"
    x = _leading(name, x, 1, expected, batch, heads)
    if x.shape[-1] != length:
        raise ValueError(f"{name} must have shape {expected}, got {axis} = {x.shape[-1]}")
    return x


def _both_or_neither(names: tuple[str, str], a: Any, b: Any) -> bool:
    """Whether the pair ``a``, ``b`` (named ``names``) is given; one alone is an error."""
    if (a is None) != (b is None):
        have, lack = names if b is None else names[::-1]
        raise ValueError(f"{have} needs {lack}: give both or neither")
    return a is not None


def _integer_pair(names: tuple[str, str], a: Any, b: Any) -> tuple[Any, Any]:
    """Two integer arrays (the queries' and the keys' segment ids or positions) in one
    signed dtype, int32 or for 8-byte dtypes int64: two dtypes are first promoted, keeping
    values; the cast within one width then only wraps, which keeps equality, and keeps
    differences modulo ``2³²`` (``2⁶⁴``), so exactly where they are below ``2³¹`` (``2⁶³``)
    in magnitude."""
    if a.dtype != b.dtype:
        common = jax.dtypes.canonicalize_dtype(jnp.promote_types(a.dtype, b.dtype))
        if not jnp.issubdtype(common, jnp.integer):  # uint64 with a signed dtype
            raise TypeError(
                f"{names[0]} ({a.dtype}) and {names[1]} ({b.dtype}) must promote to an "
                f"integer dtype, got {common}"
            )
        a, b = a.astype(common), b.astype(common)
    signed = jnp.int64 if a.dtype.itemsize == 8 else jnp.int32
    return a.astype(signed), b.astype(signed)


def _check_grid(
    given: dict[str, Any], grid_width: Any, lq: int, lk: int, batch: int, heads: int
) -> tuple[dict[str, Any], int]:
    """The decomposed terms ``grid_rows``, ``grid_cols`` (in ``given`` where given) with
    their leading dims made ``(B or 1, H or 1)``, and ``kw`` (0 without them), after the
    checks."""
    if not _both_or_neither(("grid_rows", "grid_cols"), given.get("grid_rows"),
                            given.get("grid_cols")):  # fmt: skip
        if grid_width is not None:
            raise ValueError("grid_width needs grid_rows and grid_cols")
        return {}, 0
    rows, cols = given["grid_rows"], given["grid_cols"]
    if grid_width is None:
        if cols.ndim < 2:
            raise _shape_error("grid_cols", "(..., Lq, kw) with at most 2 leading dims", cols)
        grid_width = cols.shape[-1]
    if not isinstance(grid_width, numbers.Integral) or isinstance(grid_width, bool):
        raise TypeError(f"grid_width must be an int, got {type(grid_width).__name__}")
    grid_width = int(grid_width)
    if grid_width < 1 or lk % grid_width:
        raise ValueError(
            f"grid_width must be a width kw >= 1 of the key grid (Lk = kh·kw = {lk}), "
            f"got {grid_width}"
        )
    kh = lk // grid_width
    grid = {}
    for name, x, size, axis in (
        ("grid_rows", rows, kh, "kh"),
        ("grid_cols", cols, grid_width, "kw"),
    ):
        expected = f"(..., Lq, {axis}) = (..., {lq}, {size})"
        shaped = _leading(name, x, 2, expected, batch, heads)
        if shaped.shape[2:] != (lq, size):
            raise _shape_error(name, expected, x)
        grid[name] = shaped
    return grid, grid_width


def _check_block(name: str, block: Any, length: int, minimum: int) -> int:
    if block is None:
        return max(minimum, min(DEFAULT_TILE, pl.next_power_of_2(length)))
    if not isinstance(block, int) or isinstance(block, bool):
        raise TypeError(f"{name} must be an int, got {type(block).__name__}")
    if block < minimum or block & (block - 1):
        raise ValueError(f"{name} must be a power of two >= {minimum}, got {block}")
    return block


def _pad(x: Any, rows: tuple[int, int], features: int | None) -> Any:
    """``x`` with ``rows`` zero rows (before, after) on axis 2 and, for ``features``, its
    last axis zero-padded to that size."""
    if x is None:
        return None
    widths = [(0, 0), (0, 0), rows]
    if features is not None:
        widths.append((0, features - x.shape[-1]))
    return jnp.pad(x, widths)


def relative_attention_kernel(
    q: Any,
    k: Any,
    v: Any,
    *,
    qp: Any = None,
    key_table: Any = None,
    ks: Any = None,
    query_table: Any = None,
    relative_bias: Any = None,
    query_segments: Any = None,
    key_segments: Any = None,
    key_mask: Any = None,
    query_positions: Any = None,
    key_positions: Any = None,
    grid_rows: Any = None,
    grid_cols: Any = None,
    grid_width: int | None = None,
    causal: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    interpret: bool | None = None,
) -> Any:
    """Attention with relative-position terms formed inside the tiles of a Pallas kernel.

    Parameters
    ----------
    q : jax.Array of shape (B, H, Lq, d)
        Content queries, already ``(q + u) · scale`` (``u`` the content bias).
    k : jax.Array of shape (B, H, Lk, d)
        Keys.
    v : jax.Array of shape (B, H, Lk, d_v)
        Values.
    qp : jax.Array of shape (B, H, Lq, d), optional
        Position queries, already ``(q + v_bias) · scale``; given exactly when
        ``key_table`` is.
    key_table : jax.Array of shape (..., W, d), optional
        ``Kʳ``: row ``m`` encodes distance ``δ = m - (Lk - 1)``; adds
        ``qp_i · Kʳ[m(i, j)]`` with ``m(i, j) = j - i + Lq - 1`` (with positions, see
        below). Up to two leading dims, broadcasting to ``(B, H)``.
    ks : jax.Array of shape (B, H, Lk, d), optional
        Keys times ``scale``; given exactly when ``query_table`` is.
    query_table : jax.Array of shape (..., W, d), optional
        ``Qʳ`` (DeBERTa's position-to-content table): adds ``ks_j · Qʳ[m(i, j)]``.
    relative_bias : jax.Array of shape (..., W), optional
        One value per distance (ALiBi, T5): adds ``b[m(i, j)]``.
    query_segments, key_segments : jax.Array of shape (..., Lq) and (..., Lk), optional
        Document ids of any integer dtype (packed documents): query ``i`` sees key ``j``
        only where ``query_segments[i] == key_segments[j]``. Both or neither; up to two
        leading dims, broadcasting to ``(B, H)`` (one is the heads').
    key_mask : jax.Array of shape (..., Lk), bool, optional
        ``True`` where the key may be seen (key padding, a cache's unfilled slots); leading
        dims as for the segments. A masked key's ``k``, ``v`` and ``ks`` rows never reach
        the output or a gradient, even where they are NaN or infinite.
    query_positions, key_positions : jax.Array of shape (..., Lq) and (..., Lk), optional
        Positions as data (relattn SPEC §2.15), of any integer dtype: the pair's distance
        is ``δ = key_positions[j] - query_positions[i]``, its table row ``m = δ + Lk - 1``
        clipped to ``[0, W - 1]``, and with ``causal`` a key with ``δ > 0`` is masked. Both
        or neither; leading dims as for the segments. 8-byte dtypes are taken as int64, the
        rest as int32 (wrapping: differences must be below ``2³¹`` in magnitude). By
        default query ``i`` is at ``i + Lk - Lq`` and key ``j`` at ``j`` (``m = j - i + Lq
        - 1``), on a faster path.
    grid_rows, grid_cols : jax.Array of shape (..., Lq, kh) and (..., Lq, kw), optional
        The decomposed 2-D relative terms of MViTv2 / ViTDet / SAM for keys on a ``kh × kw``
        grid flattened row-major (``Lk = kh·kw``, key ``j`` at row ``j // kw``, column
        ``j % kw``): adds ``grid_rows[i, j // kw] + grid_cols[i, j % kw]`` (``q_i·Rʸ[Δy]``
        and ``q_i·Rˣ[Δx]``, formed outside, e.g. by
        :func:`relattn.decomposed.decomposed_relative_terms`). Both or neither; q's dtype;
        leading dims as for the tables; gradients come back in the given shapes. The
        queries need not lie on a grid (nor on the keys').
    grid_width : int, optional
        ``kw``, the key grid's width; by default ``grid_cols.shape[-1]``. Only with the grid
        terms.
    causal : bool, optional
        Mask keys with ``δ > 0`` (``δ = j - i - (Lk - Lq)`` without positions).
    block_q, block_k : int, optional
        Query and key tile sizes: powers of two, at least 8 (16 compiled, Triton's
        smallest ``dot``); by default ``min(64, Lq)`` (``Lk``) rounded up to a power of
        two, at least that minimum.
    interpret : bool, optional
        Run the kernels in Pallas's interpreter. By default: where the arrays are on a
        CPU (under ``jax.jit``, where JAX's default backend is the CPU). ``False`` compiles
        them through Pallas's Triton lowering, for a GPU; from a CPU a program may be
        lowered so for CUDA (``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))``)
        but not run (JAX's ``ValueError``).

    Returns
    -------
    jax.Array of shape (B, H, Lq, d_v), dtype of ``q``
        ``softmax_j(s_ij) v`` over the visible keys, ``s_ij = q_i·k_j + qp_i·Kʳ[m] +
        ks_j·Qʳ[m] + b[m] + grid_rows[i, j // kw] + grid_cols[i, j % kw]`` (each term where
        given); key ``j`` is visible to query ``i``
        where the causal rule, the segments and the key mask all allow it. A query that
        sees no key (``causal`` with ``Lq > Lk``: the first ``Lq - Lk``; a document whose
        keys are all masked; with ``causal`` and positions, a query before every key)
        gives a zero row, with zero gradients.

    Raises
    ------
    ValueError
        If ``q``, ``k``, ``v``, ``qp`` or ``ks`` do not have the shapes above (``Lq``,
        ``Lk``, ``d``, ``d_v`` at least 1), ``d`` or ``d_v`` exceeds 256, ``qp`` comes
        without ``key_table`` or ``ks`` without ``query_table`` (or the other way
        round), a table's or ``relative_bias``'s width is neither ``Lq + Lk - 1`` nor,
        with ``causal``, ``Lk``, its leading dims do not broadcast to ``(B, H)``, its
        feature size differs from ``d``, only one of ``query_segments`` and
        ``key_segments`` is given, the segments or ``key_mask`` do not end in ``Lq``
        (``Lk``) or their leading dims do not broadcast to ``(B, H)``, only one of
        ``grid_rows`` and ``grid_cols`` is given (or ``grid_width`` without them),
        ``grid_width`` is below 1 or does not divide ``Lk``, the grid terms are not
        ``(..., Lq, Lk // kw)`` and ``(..., Lq, kw)`` with leading dims broadcasting to
        ``(B, H)``, only one of ``query_positions`` and ``key_positions`` is given or they
        do not end in ``Lq`` (``Lk``) with leading dims broadcasting to ``(B, H)``, or a
        tile size is not a power of two at least its minimum.
    TypeError
        If the arrays' dtypes differ or are not float16, bfloat16, float32 or float64,
        the segments or the positions are not integers (or promote to none together),
        ``key_mask`` is not bool, ``causal`` or
        ``interpret`` is not a bool, or a tile size or ``grid_width`` is not an int.

    Notes
    -----
    The scores are Transformer-XL's (Dai et al. 2019, eq. (3)) with DeBERTa's
    position-to-content term (He et al. 2021, eq. (2)-(4)) and a per-distance bias.
    A pair of a query tile at ``i0`` and a key tile at ``j0`` spans the distances of
    table rows ``m0 = j0 - i0 - (bm - 1) + Lq - 1`` to ``m0 + bm + bn - 2``: its
    content-to-position term is one product of the query tile with that window,
    ``R = qp Wᵀ`` of shape ``(bm, window)``, shifted inside the tile,
    ``term[r, c] = R[r, c - r + bm - 1]`` (Dai et al. 2019, appendix B); the
    position-to-content term likewise from the keys' side, and the bias is added to ``R``
    before the shift. The shift is a one-hot select, ``term[r, c] = Σ_w [w = c - r + bm -
    1] R[r, w]`` over a ``(bm, bn, window)`` broadcast, not a gather (Pallas's Triton
    lowering has no rule for one): the same code in the interpreter and compiled. No
    ``(Lq, Lk, d)`` or ``(Lq, W)`` array exists. The forward is FlashAttention's online
    softmax; the backward recomputes the tiles from the saved logsumexp (Dao 2023,
    FlashAttention-2, algorithm 2), and each table's gradient is accumulated per tile
    diagonal (where all pairs share a window) and overlap-added, deterministically.
    Accumulation is in float32 (float64 for float64 inputs). Sequence axes are padded to
    whole tiles (the padded keys masked) and ``d``, ``d_v`` with zeros to powers of two,
    at least 16. Segments and the key mask are per-cell selects of the scores to
    ``-inf``; the masked keys' rows of ``k``, ``v``, ``ks`` are zeroed in each tile before
    its products (``0 · NaN`` is NaN). Every key tile is still visited (no tile skipping
    by segment ranges). The decomposed term of a tile pair is two products with one-hots
    of its keys' grid rows and columns, ``grid_rows (bm, KHp) @ onehot(j // kw) (KHp,
    bn)``, its gradient ``dS @ onehotᵀ`` accumulated by the program that owns the query
    rows; no ``(Lq, Lk)`` array. ``kh`` and ``kw`` are padded to powers of two, at least
    16. As a product, a NaN or infinity anywhere in a query's row of ``grid_rows``
    (``grid_cols``) reaches all of that query's scores.

    Positions as data take a second path, chosen when they are given: each cell's table
    row comes from the tiles' positions, the visible cells' rows span ``[lo, hi]``, and
    the pair loops over windows of ``window`` rows from ``lo`` (one where the positions
    are contiguous within the pair): one product per window, then the one-hot select of
    the cells whose row lies in it. No tile is skipped by the causal rule. The tables'
    gradients (a pair's distances are arbitrary: no tile diagonal shares a window) are
    added by the ``dq`` kernel, window by window, with atomic adds (float32, or float64)
    into whole-table outputs: on a GPU their order of summation, so their last bits, may
    vary from run to run; the interpreter's is fixed. In the backward the window rows
    that no visible cell reads are zeroed before the products with them: a NaN or
    infinity in a table row that only hidden pairs reach stays out of every gradient.

    Compiled, the kernels are checked to lower through Pallas's Triton lowering (the
    tests lower them for CUDA from a CPU), not run on a GPU. Each select holds a ``(bm,
    bn, window)`` array, ``64 × 64 × 128`` at the default tiles: smaller tiles may compile
    to faster code.
    """
    arrays = {
        "q": q, "k": k, "v": v, "qp": qp, "key_table": key_table, "ks": ks,
        "query_table": query_table, "relative_bias": relative_bias, "grid_rows": grid_rows,
        "grid_cols": grid_cols,
    }  # fmt: skip
    given = {name: jnp.asarray(a) for name, a in arrays.items() if a is not None}
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if interpret is None:
        interpret = _on_cpu(list(given.values()))
    elif not isinstance(interpret, bool):
        raise TypeError(f"interpret must be a bool or None, got {type(interpret).__name__}")
    dtype = given["q"].dtype
    for name, a in given.items():
        if str(a.dtype) not in DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {a.dtype}")
        if a.dtype != dtype:
            raise TypeError(f"{name} must have q's dtype {dtype}, got {a.dtype}")
    q, k, v = given["q"], given["k"], given["v"]
    if q.ndim != 4:
        raise _shape_error("q", "(B, H, Lq, d)", q)
    batch, heads, lq, d = q.shape
    if k.ndim != 4 or k.shape[:2] != (batch, heads) or k.shape[3] != d:
        raise _shape_error("k", f"(B, H, Lk, d) = ({batch}, {heads}, Lk, {d})", k)
    lk = k.shape[2]
    if v.ndim != 4 or v.shape[:3] != k.shape[:3]:
        raise _shape_error("v", f"(B, H, Lk, d_v) = ({batch}, {heads}, {lk}, d_v)", v)
    dv = v.shape[3]
    if min(q.shape + v.shape) < 1:
        raise ValueError(f"every axis of q, k, v must be at least 1, got {q.shape}, {v.shape}")
    if max(d, dv) > MAX_HEAD_DIM:
        raise ValueError(f"d and d_v must be at most {MAX_HEAD_DIM}, got d = {d}, d_v = {dv}")
    for pair in (("qp", "key_table"), ("ks", "query_table")):
        _both_or_neither(pair, given.get(pair[0]), given.get(pair[1]))
    if "qp" in given and given["qp"].shape != q.shape:
        raise _shape_error("qp", f"q's {q.shape}", given["qp"])
    if "ks" in given and given["ks"].shape != k.shape:
        raise _shape_error("ks", f"k's {k.shape}", given["ks"])
    widths = (lq + lk - 1, lk) if causal else (lq + lk - 1,)
    tables = {
        name: _check_table(name, given[name], trailing, batch, heads, widths, d)
        for name, trailing in (("key_table", 2), ("query_table", 2), ("relative_bias", 1))
        if name in given
    }
    if _both_or_neither(("query_segments", "key_segments"), query_segments, key_segments):
        query_segments, key_segments = _integer_pair(
            ("query_segments", "key_segments"),
            _check_per_row(
                "query_segments", query_segments, "Lq", lq, batch, heads, "document ids"
            ),
            _check_per_row("key_segments", key_segments, "Lk", lk, batch, heads, "document ids"),
        )
    if _both_or_neither(("query_positions", "key_positions"), query_positions, key_positions):
        query_positions, key_positions = _integer_pair(
            ("query_positions", "key_positions"),
            _check_per_row("query_positions", query_positions, "Lq", lq, batch, heads, "positions"),
            _check_per_row("key_positions", key_positions, "Lk", lk, batch, heads, "positions"),
        )
    if key_mask is not None:
        # int32 in the kernels (Triton's loads of bools are bytes); padded keys get 0.
        key_mask = _check_per_row("key_mask", key_mask, "Lk", lk, batch, heads, "bool")
        key_mask = key_mask.astype(jnp.int32)
    grid, grid_width = _check_grid(given, grid_width, lq, lk, batch, heads)
    minimum = MIN_TILE if interpret else MIN_TILE_COMPILED
    bm = _check_block("block_q", block_q, lq, minimum)
    bn = _check_block("block_k", block_k, lk, minimum)

    lq_pad, lk_pad = pl.cdiv(lq, bm) * bm, pl.cdiv(lk, bn) * bn
    dp = max(MIN_TILE_COMPILED, pl.next_power_of_2(d))
    dvp = max(MIN_TILE_COMPILED, pl.next_power_of_2(dv))
    total = _table_rows(lq_pad, lk_pad, bm, bn, query_positions is not None)

    def table_rows(name: str) -> Any:
        # Lq' - Lq zero rows in front put true row m at padded row m + Lq' - Lq (see
        # _scores); zeros after fill every window up to row T.
        if name not in tables:
            return None
        t = tables[name]
        front = lq_pad - lq
        rows = (front, total - front - t.shape[2])
        return _pad(t, rows, dp if name != "relative_bias" else None)

    def grid_term(name: str) -> Any:
        # Padded query rows and grid rows (columns) of zeros; kh, kw to a power of two >= 16.
        if name not in grid:
            return None
        t = grid[name]
        return _pad(t, (0, lq_pad - lq), max(MIN_TILE_COMPILED, pl.next_power_of_2(t.shape[-1])))

    x = _Inputs(
        q=_pad(q, (0, lq_pad - lq), dp), k=_pad(k, (0, lk_pad - lk), dp),
        v=_pad(v, (0, lk_pad - lk), dvp), qp=_pad(given.get("qp"), (0, lq_pad - lq), dp),
        key_table=table_rows("key_table"), ks=_pad(given.get("ks"), (0, lk_pad - lk), dp),
        query_table=table_rows("query_table"), relative_bias=table_rows("relative_bias"),
        grid_rows=grid_term("grid_rows"), grid_cols=grid_term("grid_cols"),
        query_segments=_pad(query_segments, (0, lq_pad - lq), None),
        key_segments=_pad(key_segments, (0, lk_pad - lk), None),
        key_mask=_pad(key_mask, (0, lk_pad - lk), None),
        query_positions=_pad(query_positions, (0, lq_pad - lq), None),
        key_positions=_pad(key_positions, (0, lk_pad - lk), None),
    )  # fmt: skip
    cfg = _Config(
        heads=heads, lq=lq, lk=lk, lq_pad=lq_pad, lk_pad=lk_pad, block_q=bm, block_k=bn,
        causal=causal, interpret=interpret, present=tuple(a is not None for a in x),
        grid_width=grid_width,
    )  # fmt: skip
    return _fused(cfg, x)[:, :, :lq, :dv]
