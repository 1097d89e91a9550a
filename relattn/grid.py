"""Two-dimensional positions of image patches: Swin's and BEiT's relative position bias, windows.

A ``height × width`` grid of patches is flattened row-major, token ``t = row·width +
col``, as every vision transformer does (:func:`grid_positions`, which also gives
EVA-02's positions scaled onto a reference grid and Qwen2-VL's spatial-merge order, for
the rotary embeddings of :mod:`relattn.rotary_axes`). The distance of a pair is then a
vector ``(Δrow, Δcol)``; Swin (Liu et al. 2021, §3.2) and BEiT (Bao et
al. 2022, §2.5) learn one bias per head for each of the ``(2h-1)(2w-1)`` vectors
(BEiT three more for its class token). :func:`grid_relative_index` numbers the vectors
as Swin's and timm's tables do, :func:`grid_relative_bias` gathers a table into the
dense ``(H, L, L)`` bias of a window, and :func:`grid_bias_mod` is the same bias as a
``score_mod`` for attention over a whole image, evaluated per block, with no
``(L, L)`` array. :func:`window_partition`, :func:`window_merge` and
:func:`shifted_window_mask` are Swin's (shifted) windows; Swin V2's continuous
position bias (Liu et al. 2022, §3.3) is :func:`continuous_position_coordinates` (the
meta-network's input) and :func:`continuous_position_bias` (its output gathered).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import array_api_extra as xpx

from . import _checks
from ._namespace import device_of
from ._typing import Array, Namespace

__all__ = [
    "continuous_position_bias",
    "continuous_position_coordinates",
    "grid_bias_mod",
    "grid_positions",
    "grid_relative_bias",
    "grid_relative_index",
    "shifted_window_mask",
    "window_merge",
    "window_partition",
]

#: Entries BEiT appends to the table for its class token: cls -> token, token -> cls, cls -> cls.
_CLASS_ENTRIES = 3


def _pair(name: str, value: Any, *, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints, each ``>= minimum``, as ``(rows, cols)``."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(
                f"{name} must be an integer or a pair (rows, cols), got {len(value)} values"
            )
        first = _checks.length(name, value[0], minimum=minimum)
        second = _checks.length(name, value[1], minimum=minimum)
        return first, second
    n = _checks.length(name, value, minimum=minimum)
    return n, n


def _table_size(height: int, width: int, class_token: bool) -> int:
    return (2 * height - 1) * (2 * width - 1) + (_CLASS_ENTRIES if class_token else 0)


def _index(xp: Any, height: int, width: int, class_token: bool, device: Any) -> Any:
    """The ``(L, L)`` (or ``(L + 1, L + 1)``) table index, in ``xp``'s default integer dtype."""
    tokens = xp.arange(height * width, device=device)  # the default integer dtype
    dtype = tokens.dtype
    rows, cols = tokens // width, tokens % width
    index = (rows[:, None] - rows[None, :] + (height - 1)) * (2 * width - 1) + (
        cols[:, None] - cols[None, :] + (width - 1)
    )
    if not class_token:
        return index
    size = _table_size(height, width, True)
    length = height * width
    top = xp.concat(
        [
            xp.full((1, 1), size - 1, dtype=dtype, device=device),
            xp.full((1, length), size - 3, dtype=dtype, device=device),
        ],
        axis=1,
    )
    body = xp.concat([xp.full((length, 1), size - 2, dtype=dtype, device=device), index], axis=1)
    return xp.concat([top, body], axis=0)


def _rows_cols(xp: Any, height: int, width: int, merge: int, device: Any) -> tuple[Any, Any]:
    """Row and column of each token, in ``xp``'s default integer dtype: row-major, or
    Qwen2-VL's order of ``merge × merge`` blocks (blocks row-major, then row-major inside)."""
    tokens = xp.arange(height * width, device=device)
    if merge == 1:
        return tokens // max(width, 1), tokens % max(width, 1)
    per_block = merge * merge
    blocks_per_row = max(width // merge, 1)
    block, inner = tokens // per_block, tokens % per_block
    rows = (block // blocks_per_row) * merge + inner // merge
    cols = (block % blocks_per_row) * merge + inner % merge
    return rows, cols


def _reference(value: Any) -> tuple[int, int]:
    """EVA-02's reference grid ``(H_pt, W_pt)``, both ``>= 1``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"reference_shape must be a pair (H_pt, W_pt), got {value!r}")
    return (
        _checks.length("reference_shape[0]", value[0]),
        _checks.length("reference_shape[1]", value[1]),
    )


def grid_positions(
    height: int,
    width: int,
    *,
    reference_shape: tuple[int, int] | None = None,
    merge_size: int = 1,
    xp: Namespace = None,
    dtype: Any = None,
    device: Any = None,
) -> Array:
    """The ``(row, col)`` of each patch of a grid, in row-major token order.

    Parameters
    ----------
    height, width : int
        The grid's rows and columns, both ``>= 0``.
    reference_shape : (int, int), optional
        EVA-02's reference grid ``(H_pt, W_pt)``, both ``>= 1``: positions
        are scaled by ``H_pt/height`` and ``W_pt/width`` so that a fine-tuning
        grid spans the pretraining one (timm's ``ref_feat_shape``). The
        positions are then fractional, and the result floating. Default:
        unscaled integer positions.
    merge_size : int, default 1
        ``m``: Qwen2-VL's vision-tower order, each ``m × m`` block of
        neighbouring patches contiguous (blocks row-major, then patches
        row-major inside a block); ``height`` and ``width`` multiples of
        ``m``. 1: row-major.
    xp : module, optional
        Array library of the result (default NumPy).
    dtype : dtype, optional
        Dtype of the result. Default: the library's default integer dtype,
        or its default real floating dtype with ``reference_shape``. Without
        ``reference_shape`` any integer or real floating dtype (the exact
        integers, cast); with it a real floating dtype.
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (height·width, 2)
        Without options ``out[t] = (t // width, t % width)``: token ``t =
        row·width + col``, the order in which vision transformers flatten
        their patches. With ``merge_size = m`` token ``t`` is patch ``u`` of
        block ``b``, ``t = b·m² + u``, at ``(row, col) = ((b // (width/m))·m +
        u // m, (b % (width/m))·m + u % m)``. With ``reference_shape``,
        ``(row·H_pt/height, col·W_pt/width)``, computed in float64 and cast once.
        These are the ``positions`` of :func:`axial_rotary_embedding` and
        :func:`mixed_rotary_embedding` (pass ``out[:, ::-1]`` where a model
        reads ``(x, y) = (col, row)``, as Heo et al.'s code does).

    Raises
    ------
    ValueError
        If a size is negative, ``merge_size`` or an entry of
        ``reference_shape`` is below 1, or ``height`` or ``width`` is not a
        multiple of ``merge_size``.
    TypeError
        If a size is not an integer, ``reference_shape`` not a pair, or
        ``dtype`` not a dtype of the library of the kind above.

    See Also
    --------
    grid_relative_index : The table index of each pair of these positions.
    axial_rotary_embedding : Rotations by these positions.

    Notes
    -----
    Dosovitskiy et al. 2021 (ViT), §3.1, flatten the patches row by row;
    Swin (Liu et al. 2021), §3.2, and BEiT (Bao et al. 2022), §2.5, compute
    relative coordinates from this order. EVA-02 (Fang et al. 2024, *EVA-02:
    A visual representation for neon genesis*; timm's
    ``build_rotary_pos_embed(ref_feat_shape=)``) scales ``p·(r/s)`` per axis,
    ``s`` the grid, ``r`` the reference, in float32; relattn in float64, then
    casts. Qwen2-VL's order (Wang et al. 2024, §2.1) is Hugging Face's
    ``Qwen2VisionTransformerPretrainedModel.rot_pos_emb``
    (``get_vision_position_ids``): the patch merger then folds each block
    into one token.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import grid_positions
    >>> grid_positions(2, 3, xp=xp)
    array([[0, 0],
           [0, 1],
           [0, 2],
           [1, 0],
           [1, 1],
           [1, 2]])
    >>> grid_positions(2, 4, merge_size=2, xp=xp)[:, 1].tolist()  # columns, 2x2 blocks first
    [0, 1, 0, 1, 2, 3, 2, 3]
    >>> grid_positions(2, 2, reference_shape=(4, 4), xp=xp).tolist()
    [[0.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 2.0]]
    """
    xp = _checks.creation_namespace(xp)
    h = _checks.length("height", height, minimum=0)
    w = _checks.length("width", width, minimum=0)
    m = _checks.length("merge_size", merge_size)
    if h % m or w % m:
        raise ValueError(f"height and width must be multiples of merge_size = {m}, got {h} x {w}")
    if reference_shape is not None:
        rh, rw = _reference(reference_shape)
        if dtype is None:
            dtype = xp.__array_namespace_info__().default_dtypes(device=device)["real floating"]
        else:
            _checks.dtype("dtype", dtype, xp)
        # Each axis's h (w) values in Python's float64, rounded once to dtype, then gathered
        # by the integer rows and columns on the device.
        row_values = xp.asarray([r * (rh / h) for r in range(h)], dtype=dtype, device=device)
        col_values = xp.asarray([c * (rw / w) for c in range(w)], dtype=dtype, device=device)
        rows, cols = _rows_cols(xp, h, w, m, device)
        return xp.stack([xp.take(row_values, rows), xp.take(col_values, cols)], axis=-1)
    if dtype is not None:
        _checks.dtype("dtype", dtype, xp, "numeric")
        if xp.isdtype(dtype, "complex floating"):
            raise TypeError(f"dtype must be an integer or real floating dtype, got {dtype}")
    rows, cols = _rows_cols(xp, h, w, m, device)
    positions = xp.stack([rows, cols], axis=-1)
    if dtype is None or positions.dtype == dtype:
        return positions
    return xp.astype(positions, dtype)


def grid_relative_index(
    height: int,
    width: int,
    *,
    class_token: bool = False,
    xp: Namespace = None,
    device: Any = None,
) -> Array:
    """Swin's and BEiT's relative position index: the table entry of each pair of patches.

    Parameters
    ----------
    height, width : int
        The grid (a Swin window, or BEiT's whole image) in patches, both ``>= 1``.
    class_token : bool, default False
        Put BEiT's class token first: the result is ``(L + 1, L + 1)`` and
        indexes a table of ``(2h-1)(2w-1) + 3`` entries.
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (L, L) or (L + 1, L + 1), the library's default integer dtype
        ``L = height·width``. For query patch ``i`` at ``(r_i, c_i)`` and key
        patch ``j`` at ``(r_j, c_j)`` (row-major, :func:`grid_positions`):
        ``(Δrow + h - 1)·(2w - 1) + (Δcol + w - 1)`` with ``Δ = query - key``,
        in ``[0, (2h-1)(2w-1))``. Swin and timm take the query minus the key,
        so this encodes ``-δ`` in relattn's convention ``δ = key - query``.
        With ``class_token``, row 0 (the class token as query) holds
        ``T - 3`` (cls -> token), column 0 holds ``T - 2`` (token -> cls) and
        ``[0, 0]`` holds ``T - 1`` (cls -> cls), ``T`` the table size, as BEiT.

    Raises
    ------
    ValueError
        If a size is ``< 1``.
    TypeError
        If a size is not an integer or ``class_token`` not a bool.

    See Also
    --------
    grid_relative_bias : Gathers a table at this index.
    grid_bias_mod : The same look-up per block, for a whole image.
    grid_positions : The ``(row, col)`` of each token.

    Notes
    -----
    Liu et al. 2021 (Swin), §3.2 "Relative position bias": "the relative
    position along each axis lies in the range ``[-M + 1, M - 1]``, we
    parameterize a smaller-sized bias matrix ``B̂ ∈ R^{(2M-1)×(2M-1)}``"; the
    authors' code (and timm's, HF's) shifts ``Δrow``, ``Δcol`` to start at 0
    and numbers the table row-major over ``(Δrow, Δcol)``. Bao et al. 2022
    (BEiT), §2.5, add the three class-token entries at the end of the table.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import grid_relative_index
    >>> grid_relative_index(1, 2, xp=xp)           # Δcol = 0, -1 | 1, 0: entries 1 + Δcol
    array([[1, 0],
           [2, 1]])
    >>> grid_relative_index(1, 2, class_token=True, xp=xp)
    array([[5, 3, 3],
           [4, 1, 0],
           [4, 2, 1]])
    """
    xp = _checks.creation_namespace(xp)
    h = _checks.length("height", height)
    w = _checks.length("width", width)
    cls = _checks.flag("class_token", class_token)
    return _index(xp, h, w, cls, device)


def _table(name: str, table: Any, height: Any, width: Any, class_token: Any) -> tuple[Any, ...]:
    """Check a bias table ``(..., T)`` against the grid; returns ``xp, h, w, cls``."""
    xp = _checks.namespace(**{name: table})
    _checks.floating(xp, **{name: table})
    h = _checks.length("height", height)
    w = _checks.length("width", width)
    cls = _checks.flag("class_token", class_token)
    _checks.ndim(name, table, 1, "(..., T)")
    size = _table_size(h, w, cls)
    if table.shape[-1] != size:
        what = " + 3 (class token)" if cls else ""
        raise ValueError(
            f"{name} must have (2·height - 1)·(2·width - 1){what} = {size} entries on its last "
            f"axis for a {h}×{w} grid, got shape {tuple(table.shape)}"
        )
    return xp, h, w, cls


def grid_relative_bias(
    table: Array, height: int, width: int, *, class_token: bool = False
) -> Array:
    """Swin's and BEiT's relative position bias: a learned table gathered to every pair.

    Parameters
    ----------
    table : array of shape (..., T), real floating
        One value per relative position ``(Δrow, Δcol)``, numbered as
        :func:`grid_relative_index` numbers them: ``T = (2h-1)(2w-1)``, plus 3
        with ``class_token``. Leading dimensions (heads: ``(H, T)``) are kept.
        timm and HF transformers store the table as ``(T, H)``: pass its
        transpose. Gradients reach it.
    height, width : int
        The grid (a window) in patches, both ``>= 1``.
    class_token : bool, default False
        BEiT's class token first, with its three entries at the table's end.

    Returns
    -------
    array of shape (..., L, L) or (..., L + 1, L + 1), dtype of ``table``
        ``out[..., i, j] = table[..., index[i, j]]``, ``index`` of
        :func:`grid_relative_index` (``L = height·width``): the bias added to the
        scaled scores of one window (``bias=`` of
        :func:`scaled_dot_product_attention`).

    Raises
    ------
    ValueError
        If ``table``'s last axis is not ``T`` or a size is ``< 1``.
    TypeError
        If ``table`` is not a real floating array, a size not an integer, or
        ``class_token`` not a bool.

    See Also
    --------
    grid_relative_index : The index gathered here.
    grid_bias_mod : The same bias per block, for attention over a whole image.
    window_partition : Swin's windows, whose attention takes this bias.

    Notes
    -----
    Liu et al. 2021 (Swin), §3.2, eq. (4): ``Attention(Q, K, V) =
    SoftMax(QKᵀ/√d + B)V`` with ``B`` taken from ``B̂``. The dense bias is
    right for windows (Swin's 7×7: ``L = 49``); for a whole image use
    :func:`grid_bias_mod`, which never forms it.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import grid_relative_bias
    >>> table = xp.asarray([[-1.0, 0.0, 1.0]])     # one head: Δcol = -1, 0, 1
    >>> grid_relative_bias(table, 1, 2)
    array([[[ 0., -1.],
            [ 1.,  0.]]])
    """
    xp, h, w, cls = _table("table", table, height, width, class_token)
    index = _index(xp, h, w, cls, device_of(table))
    side = index.shape[0]
    flat = xp.take(table, xp.reshape(index, (-1,)), axis=table.ndim - 1)
    return xp.reshape(flat, (*table.shape[:-1], side, side))


def grid_bias_mod(
    table: Array, height: int, width: int, *, class_token: bool = False
) -> Callable[..., Any]:
    """Swin's and BEiT's relative position bias as a ``score_mod``: a whole image, blockwise.

    Parameters
    ----------
    table : array of shape (H, T) or (T,), real floating
        One value per head and relative position, numbered as
        :func:`grid_relative_index` numbers them (``T = (2h-1)(2w-1)``, plus 3
        with ``class_token``); ``(T,)`` is shared by every head. Gradients reach
        it through the attention.
    height, width : int
        The image in patches, both ``>= 1``.
    class_token : bool, default False
        The sequence is BEiT's: the class token at position 0, patch ``t`` at
        position ``t + 1``.

    Returns
    -------
    callable ``score_mod(score, batch, head, q_pos, kv_pos)``
        FlexAttention's signature (SPEC §2.16): returns ``score +
        table[head, index]`` with ``index`` the entry of :func:`grid_relative_index`
        for the query and key positions, decoded as ``(row, col) =
        divmod(pos, width)`` (``pos - 1`` with ``class_token``); the added value
        is cast to ``score``'s dtype. Positions beyond the grid are clipped to
        the table's range (no error under a jit), and give meaningless values.

    Raises
    ------
    ValueError
        If ``table`` is not ``(H, T)`` or ``(T,)`` for this grid, or a size is
        ``< 1``.
    TypeError
        If ``table`` is not a real floating array, a size not an integer, or
        ``class_token`` not a bool.

    See Also
    --------
    grid_relative_bias : The dense ``(H, L, L)`` bias, for small windows.
    scaled_dot_product_attention : Runs the ``score_mod`` per block.

    Notes
    -----
    Liu et al. 2021 (Swin), §3.2; Bao et al. 2022 (BEiT), §2.5. Each block of
    the scores reads its entries by one ``take`` on the flattened table
    (``head·T + index``), so no ``(L, L)`` index or bias exists: memory stays
    ``O(L)`` with ``block_size=``, and on PyTorch the same function runs in
    FlexAttention (which calls it with 0-d tensors).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn import scaled_dot_product_attention
    >>> from relattn.grid import grid_bias_mod, grid_relative_bias
    >>> table = xp.asarray([[0.5, -1.0, 0.25, 2.0, 0.0, -0.5, 1.0, 1.5, -2.0]])
    >>> q = k = v = xp.reshape(xp.arange(32, dtype=xp.float64) / 32, (1, 1, 4, 8))
    >>> blockwise = scaled_dot_product_attention(
    ...     q, k, v, score_mod=grid_bias_mod(table, 2, 2), block_size=2)
    >>> dense = scaled_dot_product_attention(q, k, v, bias=grid_relative_bias(table, 2, 2))
    >>> bool(xp.max(xp.abs(blockwise - dense)) < 1e-12)
    True
    """
    xp, h, w, cls = _table("table", table, height, width, class_token)
    if table.ndim > 2:
        raise ValueError(f"table must have shape (H, T) or (T,), got shape {tuple(table.shape)}")
    size = table.shape[-1]
    flat_table = xp.reshape(table, (-1,))
    per_head = table.ndim == 2
    first = 1 if cls else 0

    def score_mod(score: Any, batch: Any, head: Any, q_pos: Any, kv_pos: Any) -> Any:
        q = q_pos - first
        k = kv_pos - first
        q_in = xp.clip(q, 0, h * w - 1)
        k_in = xp.clip(k, 0, h * w - 1)
        index = (q_in // w - k_in // w + (h - 1)) * (2 * w - 1) + (q_in % w - k_in % w + (w - 1))
        if cls:
            # cls -> token, token -> cls, cls -> cls: BEiT's last three entries
            index = xp.where(q < 0, size - 3, index)
            index = xp.where(k < 0, size - 2, index)
            index = xp.where((q < 0) & (k < 0), size - 1, index)
        if per_head:
            index = head * size + index
        values = xp.take(flat_table, xp.reshape(index, (-1,)), axis=0)
        return score + xp.astype(xp.reshape(values, index.shape), score.dtype)

    return score_mod


def _grid_window(height: Any, width: Any, window: Any) -> tuple[int, int, int, int]:
    h = _checks.length("height", height, minimum=0)
    w = _checks.length("width", width, minimum=0)
    wh, ww = _pair("window", window)
    if h % wh or w % ww:
        raise ValueError(
            f"window must divide the grid: a {h}×{w} grid (height × width) into windows of "
            f"{wh}×{ww}, got remainders {h % wh} and {w % ww} (pad the feature map first)"
        )
    return h, w, wh, ww


def window_partition(x: Array, window: int | tuple[int, int]) -> Array:
    """Swin's non-overlapping windows: a feature map cut into sequences of patches.

    Parameters
    ----------
    x : array of shape (B, height, width, C)
        A feature map, channels last (Swin's layout).
    window : int or (int, int)
        The window ``(wh, ww)`` in patches (an int: square); it must divide
        ``height`` and ``width``.

    Returns
    -------
    array of shape (B·nW, wh·ww, C), dtype of ``x``
        ``nW = (height / wh)·(width / ww)`` windows per image, ordered by
        image, then window row, then window column; the patches of a window in
        row-major order (the order of :func:`grid_relative_index`).

    Raises
    ------
    ValueError
        If ``x`` is not 4-D or ``window`` does not divide its grid or is
        ``< 1``.
    TypeError
        If ``x`` is not an array or ``window`` not an integer or a pair.

    See Also
    --------
    window_merge : The inverse.
    shifted_window_mask : The mask of the shifted windows.
    grid_relative_bias : The bias each window's attention adds.

    Notes
    -----
    Liu et al. 2021 (Swin), §3.2 "Self-attention in non-overlapped windows":
    the image is partitioned "in a non-overlapping manner" into ``M × M``
    windows; the authors' ``window_partition``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import window_partition
    >>> x = xp.reshape(xp.arange(16), (1, 4, 4, 1))
    >>> window_partition(x, 2)[..., 0]
    array([[ 0,  1,  4,  5],
           [ 2,  3,  6,  7],
           [ 8,  9, 12, 13],
           [10, 11, 14, 15]])
    """
    xp = _checks.namespace(x=x)
    if x.ndim != 4:
        raise ValueError(f"x must have shape (B, height, width, C), got shape {tuple(x.shape)}")
    b, height, width, c = x.shape
    h, w, wh, ww = _grid_window(height, width, window)
    blocks = xp.reshape(x, (b, h // wh, wh, w // ww, ww, c))
    blocks = xp.permute_dims(blocks, (0, 1, 3, 2, 4, 5))
    return xp.reshape(blocks, (b * (h // wh) * (w // ww), wh * ww, c))


def window_merge(windows: Array, window: int | tuple[int, int], height: int, width: int) -> Array:
    """The inverse of :func:`window_partition`: windows put back into feature maps.

    Parameters
    ----------
    windows : array of shape (B·nW, wh·ww, C)
        Windows in :func:`window_partition`'s order.
    window : int or (int, int)
        The window ``(wh, ww)`` in patches (an int: square).
    height, width : int
        The feature map's grid, ``>= 1``, divisible by the window.

    Returns
    -------
    array of shape (B, height, width, C), dtype of ``windows``
        ``window_merge(window_partition(x, window), window, height, width)``
        is ``x``.

    Raises
    ------
    ValueError
        If ``windows`` is not 3-D, its axes do not fit the window and grid, or
        the window does not divide the grid.
    TypeError
        If ``windows`` is not an array or a size not an integer.

    See Also
    --------
    window_partition : The windows this merges.

    Notes
    -----
    Liu et al. 2021 (Swin), §3.2; the authors' ``window_reverse``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import window_merge, window_partition
    >>> x = xp.reshape(xp.arange(24), (1, 2, 4, 3))
    >>> bool(xp.all(window_merge(window_partition(x, (2, 2)), (2, 2), 2, 4) == x))
    True
    """
    xp = _checks.namespace(windows=windows)
    # at least one window per image: the batch is windows.shape[0] / nW
    _checks.length("height", height)
    _checks.length("width", width)
    h, w, wh, ww = _grid_window(height, width, window)
    count = (h // wh) * (w // ww)
    if windows.ndim != 3 or windows.shape[1] != wh * ww or windows.shape[0] % count:
        raise ValueError(
            f"windows must have shape (B·nW, wh·ww, C) with nW = {count} windows of "
            f"{wh}×{ww} = {wh * ww} patches for a {h}×{w} grid, got shape {tuple(windows.shape)}"
        )
    b = windows.shape[0] // count
    c = windows.shape[2]
    blocks = xp.reshape(windows, (b, h // wh, w // ww, wh, ww, c))
    blocks = xp.permute_dims(blocks, (0, 1, 3, 2, 4, 5))
    return xp.reshape(blocks, (b, h, w, c))


def shifted_window_mask(
    height: int,
    width: int,
    window: int | tuple[int, int],
    shift: int | tuple[int, int],
    *,
    xp: Namespace = None,
    device: Any = None,
) -> Array:
    """Swin's shifted-window mask: which patches of a cyclically shifted window may attend.

    Parameters
    ----------
    height, width : int
        The feature map's grid in patches, ``>= 0``, divisible by the window.
    window : int or (int, int)
        The window ``(wh, ww)`` (an int: square).
    shift : int or (int, int)
        The shift ``(sh, sw)``, ``0 <= shift < window`` on each axis (Swin:
        ``window // 2``).
    xp : module, optional
        Array library of the result (default NumPy).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (nW, wh·ww, wh·ww), bool
        ``True`` = may attend (relattn's polarity, where Swin adds ``-100``
        to the others): query and key come from the same region of the
        unshifted map. Each axis is split into Swin's three slices ``[0,
        -window)``, ``[-window, -shift)``, ``[-shift, None)``; a patch's region
        is its pair of slices. ``nW = (height/wh)·(width/ww)`` windows, in
        :func:`window_partition`'s order. With ``shift = 0`` every entry is
        ``True``.

    Raises
    ------
    ValueError
        If the window does not divide the grid, a window size is ``< 1``, a
        grid size negative, or a shift negative or not smaller than the window.
    TypeError
        If a size is not an integer.

    See Also
    --------
    window_partition : The windows the mask applies to.
    grid_relative_bias : The bias added beside the mask.

    Notes
    -----
    Liu et al. 2021 (Swin), §3.2 "Efficient batch computation for shifted
    configuration": the feature map is rolled by ``(-sh, -sw)``
    (``xp.roll(x, shift=(-sh, -sw), axis=(1, 2))``) before
    :func:`window_partition`, so that a window may gather patches that were
    not adjacent; this mask keeps each within its own sub-window; the output
    is rolled back by ``(sh, sw)`` after :func:`window_merge`. Pass it as
    ``mask=``, broadcast against ``(B, nW, H, wh·ww, wh·ww)`` scores (e.g.
    ``mask[:, None]`` with queries reshaped to ``(B, nW, H, wh·ww, d)``).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import shifted_window_mask
    >>> m = shifted_window_mask(4, 4, 2, 1, xp=xp)
    >>> m.shape, bool(xp.all(m[0])), m[3].astype(int)    # the last window mixes 4 regions
    ((4, 4, 4), True, array([[1, 0, 0, 0],
           [0, 1, 0, 0],
           [0, 0, 1, 0],
           [0, 0, 0, 1]]))
    """
    xp = _checks.creation_namespace(xp)
    h, w, wh, ww = _grid_window(height, width, window)
    sh, sw = _pair("shift", shift, minimum=0)
    if sh >= wh or sw >= ww:
        raise ValueError(
            f"shift must be smaller than the window on each axis, {wh}×{ww}, got ({sh}, {sw})"
        )

    def regions(n: int, size: int, s: int) -> Any:
        i = xp.arange(n, device=device)
        return xp.astype(i >= n - size, i.dtype) + xp.astype(i >= n - s, i.dtype)

    ids = regions(h, wh, sh)[:, None] * 3 + regions(w, ww, sw)[None, :]
    ids = xp.reshape(ids, (h // wh, wh, w // ww, ww))
    ids = xp.reshape(xp.permute_dims(ids, (0, 2, 1, 3)), ((h // wh) * (w // ww), wh * ww))
    return ids[:, :, None] == ids[:, None, :]


def continuous_position_coordinates(
    window: int | tuple[int, int],
    *,
    pretrained_window: int | tuple[int, int] | None = None,
    xp: Namespace = None,
    dtype: Any = None,
    device: Any = None,
) -> Array:
    """Swin V2's log-spaced relative coordinates: the input of the continuous-bias meta-network.

    Parameters
    ----------
    window : int or (int, int)
        The window ``(wh, ww)`` in patches (an int: square), each ``>= 1``.
    pretrained_window : int or (int, int), optional
        The window the model was pre-trained with: coordinates are normalised
        by it (Swin V2's transfer across window sizes). Default: ``window``.
    xp : module, optional
        Array library of the result (default NumPy).
    dtype : dtype, optional
        Real floating dtype of the result (default: the library's default).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape ((2wh-1)·(2ww-1), 2)
        For each ``(Δrow, Δcol)``, row-major over ``Δrow, Δcol ∈ [-(w-1),
        w-1]`` (the order of :func:`grid_relative_index`'s table):
        ``x̂ = sign(x)·log2(1 + |x|)/log2(8)`` with ``x = 8·Δ/(p - 1)`` per
        axis, ``p`` the (pretrained) window along it. An axis with ``p = 1``
        is not divided.

    Raises
    ------
    ValueError
        If a window size is ``< 1``.
    TypeError
        If a size is not an integer or ``dtype`` not a real floating dtype.

    See Also
    --------
    continuous_position_bias : Gathers the meta-network's output.

    Notes
    -----
    Liu et al. 2022 (Swin Transformer V2), §3.3, eq. (4): ``Δx̂ =
    sign(Δx)·log(1 + |Δx|)``; the authors' code (and HF's ``Swinv2``) first
    scales the coordinates to ``[-8, 8]`` and divides the logarithm by
    ``log2(8)``. A meta-network (a 2-layer MLP, the caller's: relattn owns no
    layers) maps each row to one value per head. HF transformers normalises
    neither axis when ``wh = 1`` and ``pretrained_window`` is not given; the
    values are computed in float64 (Python) and cast, where HF computes them
    in float32.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import continuous_position_coordinates
    >>> continuous_position_coordinates((1, 2), xp=xp).round(6)  # x = -8, 0, 8: ±log2(9)/3
    array([[ 0.      , -1.056642],
           [ 0.      ,  0.      ],
           [ 0.      ,  1.056642]])
    """
    xp = _checks.creation_namespace(xp)
    wh, ww = _pair("window", window)
    ph, pw = (
        (wh, ww) if pretrained_window is None else _pair("pretrained_window", pretrained_window)
    )
    dtype = (
        xpx.default_dtype(xp, device=device) if dtype is None else _checks.dtype("dtype", dtype, xp)
    )

    def log_spaced(delta: int, p: int) -> float:
        x = 8.0 * delta / (p - 1 if p > 1 else 1)
        return math.copysign(math.log2(1.0 + abs(x)) / 3.0, x) if x else 0.0

    rows = [log_spaced(d, ph) for d in range(-(wh - 1), wh)]
    cols = [log_spaced(d, pw) for d in range(-(ww - 1), ww)]
    values = [[r, c] for r in rows for c in cols]
    return xp.asarray(values, dtype=dtype, device=device)


def continuous_position_bias(values: Array, height: int, width: int) -> Array:
    """Swin V2's continuous position bias: ``16·sigmoid`` of the meta-network's output, gathered.

    Parameters
    ----------
    values : array of shape (..., T), real floating
        The meta-network's output for each row of
        :func:`continuous_position_coordinates` with heads leading, as
        :func:`grid_relative_bias` takes a table: ``T = (2h-1)(2w-1)``. An
        MLP returns ``(T, H)``: pass its transpose. Gradients reach it.
    height, width : int
        The window in patches, both ``>= 1``.

    Returns
    -------
    array of shape (..., L, L), dtype of ``values``
        ``16·sigmoid(values[..., index[i, j]])``, ``index`` of
        :func:`grid_relative_index`, ``L = height·width``: the bias added to
        the window's (cosine) scores.

    Raises
    ------
    ValueError
        If ``values``' last axis is not ``T`` or a size is ``< 1``.
    TypeError
        If ``values`` is not a real floating array or a size not an integer.

    See Also
    --------
    continuous_position_coordinates : The meta-network's input.
    grid_relative_bias : The same gather without the sigmoid (Swin V1).

    Notes
    -----
    Liu et al. 2022 (Swin Transformer V2), §3.3: ``B(Δx, Δy) = G(Δx, Δy)``,
    ``G`` a small meta-network; the authors' code (and HF's ``Swinv2``)
    bounds it by ``16·sigmoid``. The sigmoid is taken on the ``T`` values
    before the gather.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from relattn.grid import continuous_position_bias
    >>> continuous_position_bias(xp.asarray([[-50.0, 0.0, 50.0]]), 1, 2).round(6)
    array([[[ 8.,  0.],
            [16.,  8.]]])
    """
    xp, h, w, _ = _table("values", values, height, width, False)
    # the sigmoid without overflow: e = exp(-|x|) <= 1 on both sides
    e = xp.exp(-xp.abs(values))
    bounded = 16.0 * xp.where(values >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return grid_relative_bias(bounded, h, w)
