"""Rotary position embeddings over several position axes.

A token's position is a vector ``(p_0 … p_{A-1})``: an image patch's ``(row, col)``,
a video token's ``(t, row, col)``. The ``d/2`` feature pairs of a query or key
are rotated, as in :func:`relattn.rotary_position_embedding`, by angles that
read one axis (M-RoPE's frequency sections, axial 2-D RoPE's halves) or a learned
mix of all axes (RoPE-Mixed). The angle of pair ``j`` is linear in the
position, so the score of a rotated query and key depends on the position
difference per axis only. Positions carry a trailing axis ``A``:
``(..., L, A)``.

- :func:`multimodal_rotary_embedding`: Qwen2-VL's M-RoPE (Wang et al. 2024).
- :func:`rope_index`: Qwen2-VL's and Qwen2.5-VL's ``(t, h, w)`` position ids.
- :func:`axial_rotary_embedding`: RoPE-Axial (Heo et al. 2024), EVA-02, Qwen2-VL's
  vision tower.
- :func:`mixed_rotary_embedding`, :func:`mixed_rotary_frequencies`: RoPE-Mixed
  (Heo et al. 2024).

Patch positions ``(row, col)``, EVA-02's reference grid and Qwen2-VL's spatial-merge
order come from :func:`relattn.grid.grid_positions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _checks
from ._namespace import device_of, require_array
from ._typing import Array, Namespace
from .encodings import LAYOUTS, _check_base, _host_frequencies, _sin_cos, _working_dtype
from .rotary import _rotate_pairs

__all__ = [
    "axial_rotary_embedding",
    "mixed_rotary_embedding",
    "mixed_rotary_frequencies",
    "multimodal_rotary_embedding",
    "rope_index",
]


# ===============================================================================================
# shared: angles per section, the rotation
# ===============================================================================================


def _check_positions(
    xp: Any, positions: Any, lead: tuple[int, ...], length: int, axes: int | None, layout: str
) -> Any:
    """``positions`` of shape ``(..., length, A)`` with leading dims broadcasting to ``lead``."""
    shape = tuple(positions.shape)
    fits = (
        positions.ndim >= 2
        and shape[-2] == length
        and (axes is None or shape[-1] == axes)
        and _checks.broadcast_shapes(lead, shape[:-2]) == lead
    )
    if not fits:
        raise ValueError(
            f"positions must have shape {layout} with leading dims broadcasting to x's {lead}, "
            f"got shape {shape}"
        )
    if not xp.isdtype(positions.dtype, ("real floating", "integral")):
        raise TypeError(f"positions must be a real or integer array, got dtype {positions.dtype}")
    if _checks.converts(xp, positions):
        return xp.asarray(positions)
    return positions


def _section_angles(
    xp: Any,
    positions: Any,
    sections: list[tuple[int, tuple[float, ...] | Any]],
    work: Any,
    device: Any,
) -> tuple[Any, Any]:
    """``sin``, ``cos`` of shape ``(*positions.shape[:-1], n)``: section ``s`` reads axis
    ``a_s`` of ``positions`` and turns by its frequencies (host floats or an array)."""
    lead = tuple(positions.shape[:-1])
    sins, coss = [], []
    for axis, omega in sections:
        if isinstance(omega, tuple) and not omega:
            continue
        sin, cos = _sin_cos(xp.reshape(positions[..., axis], (-1,)), omega, work, xp, device)
        sins.append(sin)
        coss.append(cos)
    sin = sins[0] if len(sins) == 1 else xp.concat(sins, axis=-1)
    cos = coss[0] if len(coss) == 1 else xp.concat(coss, axis=-1)
    half = sin.shape[-1]
    return xp.reshape(sin, (*lead, half)), xp.reshape(cos, (*lead, half))


def _even_features(x: Any, multiple: int, what: str) -> int:
    d = x.shape[-1]
    if d % multiple or d == 0:
        raise ValueError(
            f"x must have a feature size d divisible by {multiple} ({what}), "
            f"got shape {tuple(x.shape)}"
        )
    return int(d)


# ===============================================================================================
# M-RoPE (Qwen2-VL)
# ===============================================================================================


def multimodal_rotary_embedding(
    x: Array,
    positions: Array,
    *,
    mrope_section: Sequence[int],
    base: float = 10000.0,
    frequencies: Array = None,
    layout: str = "concatenated",
) -> Array:
    r"""Multimodal rotary position embedding (M-RoPE): frequency sections per position axis.

    Parameters
    ----------
    x : array of shape (..., L, d), real floating
        Queries or keys (any leading batch and head dimensions); ``d`` even.
    positions : array of shape (..., L, A), integer or real floating
        Each token's position on the ``A = len(mrope_section)`` axes, in
        Qwen2-VL's order ``(t, h, w)`` (temporal, row, column); leading dims
        broadcast to ``x``'s. Text tokens have ``t = h = w``. Hugging Face's
        ``position_ids`` of shape ``(3, B, L)`` are
        ``moveaxis(position_ids, 0, -1)``, ``(B, L, 3)``, with a head axis
        for ``x`` of shape ``(B, H, L, d)``: ``positions[:, None]``.
        :func:`rope_index` computes them.
    mrope_section : sequence of A ints
        The number of frequency pairs of each axis, summing to ``d/2``
        (Hugging Face's ``rope_scaling["mrope_section"]``, ``rope_parameters`` in
        transformers 5: ``[16, 24, 24]``
        for Qwen2-VL's head dimension 128). Pair ``k`` (frequency
        ``θ_k``) turns with axis ``a`` when ``s_0 + … + s_{a-1} <= k < s_0 +
        … + s_a``.
    base : float, optional
        ``θ_k = base^(-2k/d)``, ``k = 0 … d/2 - 1``, one sequence over all
        sections (Hugging Face's ``rope_theta``; 1000000 in Qwen2-VL).
    frequencies : array of shape (d/2,), real floating, optional
        ``θ_k`` in radians per position, replacing ``base^(-2k/d)``
        (Hugging Face's ``inv_freq``, or :func:`rope_frequencies`' scaled ones).
    layout : {"concatenated", "interleaved"}, optional
        Which features form pair ``k``: ``(x_k, x_{k+d/2})`` (default: Hugging
        Face's ``rotate_half``, the layout of every Qwen2-VL and Qwen2.5-VL
        checkpoint) or ``(x_2k, x_2k+1)``; see
        :func:`rotary_position_embedding`.

    Returns
    -------
    array, shape and dtype of ``x``
        ``x`` with pair ``k`` of row ``i`` rotated by
        ``positions[i, a(k)]·θ_k``.

    Raises
    ------
    ValueError
        If ``d`` is odd or 0, ``mrope_section`` does not sum to ``d/2``,
        ``positions`` is not ``(..., L, A)`` broadcasting to ``x``'s leading
        dims, ``frequencies`` is not ``(d/2,)``, ``base`` is not positive, or
        ``layout`` is unknown.
    TypeError
        If ``x`` is not a real floating array, ``positions`` not a real or
        integer array, ``frequencies`` not a real floating array,
        ``mrope_section`` not a sequence of integers, or the arrays come from
        different libraries.

    See Also
    --------
    rope_index : Qwen2-VL's ``(t, h, w)`` positions of a text-and-vision sequence.
    rotary_position_embedding : The one-axis RoPE, which M-RoPE is for ``t = h = w``.
    axial_rotary_embedding : Equal frequency sets per axis (vision towers).

    Notes
    -----
    Wang et al. 2024, *Qwen2-VL: Enhancing vision-language model's perception
    of the world at any resolution*, §2.1 "Multimodal Rotary Position
    Embedding"; Bai et al. 2025, *Qwen2.5-VL technical report* (the same
    rotation, other positions). With the section ``a(k)`` of pair ``k``,

    .. math::

        (x_k, x_{k+d/2}) \mapsto R(p_{a(k)} θ_k)\,(x_k, x_{k+d/2}),
        \qquad θ_k = \mathrm{base}^{-2k/d},

    as Hugging Face's ``apply_multimodal_rotary_pos_emb`` (transformers 4.45
    to 4.5x) and ``Qwen2VLRotaryEmbedding.recomposition_frequencies``
    (transformers 5) build ``cos`` and ``sin``: the ``d/2`` frequencies are
    split by ``mrope_section`` and section ``a`` takes axis ``a``'s angles;
    the two halves share them. The score of a rotated query at ``p`` and key
    at ``p'`` depends on ``p' - p`` per axis only; with ``t = h = w = p``
    (text) this is :func:`rotary_position_embedding` with ``θ_k``. Angles are
    formed in float64 where the device has it, then cast to ``x``'s dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.rotary_axes import multimodal_rotary_embedding
    >>> x = np.ones((2, 6))                     # d = 6: three pairs, one per axis
    >>> p = np.asarray([[0, 0, 0], [1, 2, 3]])  # (t, h, w) of two tokens
    >>> y = multimodal_rotary_embedding(x, p, mrope_section=[1, 1, 1], base=1.0)
    >>> np.round(y[1], 4).tolist()  # pairs (0, 3), (1, 4), (2, 5) turned by 1, 2, 3 rad
    [-0.3012, -1.3254, -1.1311, 1.3818, 0.4932, -0.8489]
    """
    xp = _checks.namespace(x=x, positions=positions, optional={"frequencies": frequencies})
    _checks.floating(xp, x=x)
    x = _checks.cast(xp, x, x.dtype)
    _checks.ndim("x", x, 2, "(..., L, d)")
    _checks.choice("layout", layout, LAYOUTS)
    base = _check_base(base)
    d = _even_features(x, 2, "pairs of features")
    half = d // 2
    section = _section_sizes(mrope_section, half)
    axes = len(section)
    positions = _check_positions(
        xp,
        positions,
        tuple(x.shape[:-2]),
        x.shape[-2],
        axes,
        f"(..., L, A) = (..., {x.shape[-2]}, {axes})",
    )
    device = device_of(x)
    if frequencies is not None:
        _checks.floating(xp, frequencies=frequencies)
        _checks.exact_shape("frequencies", frequencies, (half,), "(d/2,)")
        frequencies = _checks.cast(xp, frequencies, frequencies.dtype)
    thetas = tuple(_host_frequencies(half, base, False))
    sections: list[tuple[int, Any]] = []
    start = 0
    for axis, size in enumerate(section):
        stop = start + size
        if size:
            omega = thetas[start:stop] if frequencies is None else frequencies[start:stop]
            sections.append((axis, omega))
        start = stop
    sin, cos = _section_angles(xp, positions, sections, _working_dtype(xp, device), device)
    sin, cos = xp.astype(sin, x.dtype), xp.astype(cos, x.dtype)
    return _rotate_pairs(x, sin, cos, layout, xp)


def _section_sizes(mrope_section: Any, half: int) -> list[int]:
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence):
        raise TypeError(
            f"mrope_section must be a sequence of integers (e.g. [16, 24, 24]), "
            f"got {type(mrope_section).__name__}"
        )
    sizes = [
        _checks.length(f"mrope_section[{i}]", s, minimum=0) for i, s in enumerate(mrope_section)
    ]
    if not sizes or sum(sizes) != half:
        raise ValueError(
            f"mrope_section must sum to d/2 = {half} (one frequency pair per entry), "
            f"got {list(mrope_section)} (sum {sum(sizes)})"
        )
    return sizes


# ===============================================================================================
# Qwen2-VL's position ids
# ===============================================================================================


def rope_index(
    input_ids: Array,
    *,
    image_token_id: int,
    video_token_id: int,
    image_grid_thw: Array = None,
    video_grid_thw: Array = None,
    spatial_merge_size: int = 2,
    attention_mask: Array = None,
    second_per_grid_ts: Array = None,
    tokens_per_second: float | None = None,
) -> tuple[Array, Array]:
    r"""Qwen2-VL's M-RoPE position ids ``(t, h, w)`` of a sequence of text and vision tokens.

    Parameters
    ----------
    input_ids : array of shape (B, L), int
        Token ids; each image (video) is a run of ``image_token_id``
        (``video_token_id``) placeholders, ``t·(h/m)·(w/m)`` of them for its
        grid, ``m = spatial_merge_size``.
    image_token_id, video_token_id : int
        The placeholder ids (Hugging Face's ``config.image_token_id``,
        ``config.video_token_id``).
    image_grid_thw, video_grid_thw : array of shape (N, 3), int, optional
        ``(t, h, w)`` patch grid of each image (video) in the order they occur,
        row after row of the batch (Hugging Face's processor outputs).
    spatial_merge_size : int, optional
        ``m``: the vision tower merges ``m × m`` patches into one token (2 in
        Qwen2-VL and Qwen2.5-VL).
    attention_mask : array of shape (B, L), bool or int, optional
        ``True`` (or 1) for tokens, ``False`` (0) for padding, which is left
        out of the count and gets position 1, as in Qwen's code.
    second_per_grid_ts : array of shape (N_videos,), real floating, optional
        Qwen2.5-VL: seconds per temporal grid step of each video; with
        ``tokens_per_second``, the temporal id of step ``i`` is
        ``⌊i·s·tokens_per_second⌋``, computed in this array's dtype as
        Qwen's code does (float32 from the processor). Default 1 s.
    tokens_per_second : float, optional
        Qwen2.5-VL's ``vision_config.tokens_per_second`` (2 in the released
        configs). ``None``: Qwen2-VL, temporal ids ``0, 1, …, t - 1``. When
        given, an image's temporal ids are 0 (Qwen2.5-VL).

    Returns
    -------
    positions : array of shape (B, L, 3), integer
        ``(t, h, w)`` of each token, for :func:`multimodal_rotary_embedding`
        (Hugging Face's ``(3, B, L)`` is ``moveaxis(positions, -1, 0)``).
    deltas : array of shape (B, 1), integer
        ``max position + 1 - L`` per row (Hugging Face's
        ``mrope_position_deltas``, ``rope_deltas``): decoding step ``n >= L``
        has ``t = h = w = n + delta``.

    Raises
    ------
    ValueError
        If ``input_ids`` or ``attention_mask`` is not ``(B, L)``, a grid array
        not ``(N, 3)``, a grid's ``h`` or ``w`` not a multiple of ``m``, there
        are fewer (more) grids than vision blocks, a block runs past the end of
        its row, or ``second_per_grid_ts`` has not one entry per video.
    TypeError
        If ``input_ids`` or a grid is not an integer array, a token id or
        ``spatial_merge_size`` not an integer, or the arrays come from
        different libraries.

    See Also
    --------
    multimodal_rotary_embedding : The rotation these positions drive.
    grid_positions : The vision tower's own 2-D positions.

    Notes
    -----
    Wang et al. 2024 (Qwen2-VL), §2.1: text tokens take consecutive ids on
    all three axes; a vision block starting after id ``s - 1`` takes
    ``(s + t_i, s + r, s + c)`` over its merged grid (``t``, ``h/m``,
    ``w/m``, row-major: ``t`` slowest, then rows, then columns); text after a
    block resumes at the block's largest id ``+ 1``. This follows the code
    Qwen released with the models (Hugging Face transformers 4.45 to 4.5x,
    ``Qwen2VLForConditionalGeneration.get_rope_index``; Qwen2.5-VL's, with
    the temporal scaling ``⌊i·s·tokens_per_second⌋``). Hugging Face
    transformers 5.24's ``get_rope_index`` resumes at
    ``s + max(h, w)/m`` instead: the same for images and for videos of at
    most ``max(h, w)/m`` temporal steps, smaller (ids repeat) for longer
    videos and Qwen2.5-VL's scaled time. ``deltas`` use the full row length
    ``L`` (padding included), as Qwen's code does.

    This is index bookkeeping on the host (NumPy), like Hugging Face's: the
    block sizes come from the values. The results are arrays of
    ``input_ids``' library and device.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.rotary_axes import rope_index
    >>> ids = np.asarray([[5, 7, 9, 9, 9, 9, 8, 5]])  # text, <start>, 2x2 image, <end>, text
    >>> p, delta = rope_index(ids, image_token_id=9, video_token_id=10,
    ...                       image_grid_thw=np.asarray([[1, 4, 4]]))
    >>> p[0].T.tolist()  # t, h, w rows
    [[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]]
    >>> delta.tolist()
    [[-2]]
    """
    xp = _checks.namespace(
        input_ids=input_ids,
        optional={
            "image_grid_thw": image_grid_thw,
            "video_grid_thw": video_grid_thw,
            "attention_mask": attention_mask,
            "second_per_grid_ts": second_per_grid_ts,
        },
    )
    from .testing import to_host

    image_token_id = _checks.length("image_token_id", image_token_id, minimum=0)
    video_token_id = _checks.length("video_token_id", video_token_id, minimum=0)
    m = _checks.length("spatial_merge_size", spatial_merge_size)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (B, L), got shape {tuple(input_ids.shape)}")
    if not _checks.is_integer_dtype(xp, input_ids.dtype):
        raise TypeError(f"input_ids must be an integer array, got dtype {input_ids.dtype}")
    ids = to_host(input_ids)
    batch, length = ids.shape
    grids = {}
    for name, grid in (("image_grid_thw", image_grid_thw), ("video_grid_thw", video_grid_thw)):
        if grid is None:
            grids[name] = np.zeros((0, 3), dtype=np.int64)
            continue
        if grid.ndim != 2 or grid.shape[1] != 3:
            raise ValueError(f"{name} must have shape (N, 3), got shape {tuple(grid.shape)}")
        if not _checks.is_integer_dtype(xp, grid.dtype):
            raise TypeError(f"{name} must be an integer array, got dtype {grid.dtype}")
        grids[name] = to_host(grid).astype(np.int64)
        bad = np.flatnonzero((grids[name][:, 1] % m != 0) | (grids[name][:, 2] % m != 0))
        if bad.size:
            raise ValueError(
                f"{name} must have h and w divisible by spatial_merge_size = {m}, "
                f"got {grids[name][bad[0]].tolist()} at row {bad[0]}"
            )
    videos = grids["video_grid_thw"].shape[0]
    if second_per_grid_ts is None:
        seconds = np.ones(videos, dtype=np.float32)
    else:
        if not xp.isdtype(second_per_grid_ts.dtype, "real floating"):
            raise TypeError(
                "second_per_grid_ts must be a real floating array, "
                f"got dtype {second_per_grid_ts.dtype}"
            )
        seconds = to_host(second_per_grid_ts)
        if seconds.shape != (videos,):
            raise ValueError(
                f"second_per_grid_ts must have shape (N_videos,) = ({videos},), "
                f"got shape {seconds.shape}"
            )
    if tokens_per_second is not None and (
        isinstance(tokens_per_second, bool) or not isinstance(tokens_per_second, (int, float))
    ):
        raise TypeError(
            f"tokens_per_second must be a number, got {type(tokens_per_second).__name__}"
        )
    if attention_mask is None:
        keep = np.ones((batch, length), dtype=bool)
    else:
        if tuple(attention_mask.shape) != (batch, length):
            raise ValueError(
                f"attention_mask must have the shape of input_ids, (B, L) = {(batch, length)}, "
                f"got shape {tuple(attention_mask.shape)}"
            )
        if not (
            attention_mask.dtype == xp.bool or _checks.is_integer_dtype(xp, attention_mask.dtype)
        ):
            raise TypeError(
                "attention_mask must be a boolean or integer array, "
                f"got dtype {attention_mask.dtype}"
            )
        keep = to_host(attention_mask) == 1

    positions = np.ones((batch, length, 3), dtype=np.int64)
    deltas = np.zeros((batch, 1), dtype=np.int64)
    used = {"image_grid_thw": 0, "video_grid_thw": 0}
    for b in range(batch):
        tokens = ids[b][keep[b]]
        vision = np.flatnonzero((tokens == image_token_id) | (tokens == video_token_id))
        pieces = []
        next_id = 0
        start = 0
        while True:
            later = vision[vision >= start]
            if later.size == 0:
                break
            at = int(later[0])
            name = "image_grid_thw" if tokens[at] == image_token_id else "video_grid_thw"
            if used[name] >= grids[name].shape[0]:
                raise ValueError(
                    f"{name} must have one row per {name[:5]} block, got {grids[name].shape[0]} "
                    f"rows for more blocks (row {b} of input_ids, token {at})"
                )
            t, h, w = (int(v) for v in grids[name][used[name]])
            gh, gw = h // m, w // m
            count = t * gh * gw
            if at + count > tokens.shape[0]:
                raise ValueError(
                    f"input_ids must hold t·(h/m)·(w/m) = {count} tokens for the {name[:5]} of "
                    f"grid {[t, h, w]} starting at token {at} of row {b}, got "
                    f"{tokens.shape[0] - at}"
                )
            text = at - start
            pieces.append(np.repeat(np.arange(next_id, next_id + text)[:, None], 3, axis=1))
            first = next_id + text
            steps = np.arange(t)
            if tokens_per_second is not None:
                if name == "image_grid_thw":
                    steps = np.zeros(t, dtype=np.int64)
                else:
                    s = seconds[used[name]]
                    kind = s.dtype.type
                    steps = (steps.astype(s.dtype) * s * kind(tokens_per_second)).astype(np.int64)
            grid = np.stack(np.meshgrid(steps, np.arange(gh), np.arange(gw), indexing="ij"), -1)
            block = grid.reshape(-1, 3) + first
            pieces.append(block)
            next_id = int(block.max()) + 1 if count else first
            used[name] += 1
            start = at + count
        pieces.append(
            np.repeat(np.arange(next_id, next_id + tokens.shape[0] - start)[:, None], 3, axis=1)
        )
        ids_b = np.concatenate(pieces, axis=0)
        positions[b, keep[b]] = ids_b
        deltas[b, 0] = (int(ids_b.max()) + 1 if ids_b.size else 0) - length
    for name, grid in grids.items():
        if used[name] != grid.shape[0]:
            raise ValueError(
                f"{name} must have one row per {name[:5]} block, got {grid.shape[0]} rows for "
                f"{used[name]} blocks"
            )
    device = device_of(input_ids)
    index = _checks.index_dtype(xp, device)
    return (
        xp.asarray(positions.astype(np.int64), dtype=index, device=device),
        xp.asarray(deltas, dtype=index, device=device),
    )


# ===============================================================================================
# Axial 2-D RoPE and RoPE-Mixed (Heo et al. 2024)
# ===============================================================================================


def _prefix(x: Any, prefix_tokens: Any) -> int:
    n = _checks.length("prefix_tokens", prefix_tokens, minimum=0)
    if n > x.shape[-2]:
        raise ValueError(f"prefix_tokens must be at most L = {x.shape[-2]}, got {n}")
    return n


def _with_prefix(xp: Any, x: Any, rotated: Any, n: int) -> Any:
    return rotated if n == 0 else xp.concat((x[..., :n, :], rotated), axis=-2)


def axial_rotary_embedding(
    x: Array,
    positions: Array,
    *,
    layout: str | None = None,
    base: float = 10000.0,
    frequencies: Array = None,
    prefix_tokens: int = 0,
) -> Array:
    r"""Axial multi-dimensional RoPE: the feature pairs split evenly between the position axes.

    Parameters
    ----------
    x : array of shape (..., L, d), real floating
        Queries or keys of an image (video) and its prefix tokens; ``d``
        divisible by ``2A``.
    positions : array of shape (..., L - prefix_tokens, A), integer or real floating
        Each patch's position per axis (:func:`grid_positions`); leading
        dims broadcast to ``x``'s.
    layout : {"concatenated", "interleaved"}
        Required, keyword-only: pair ``j`` is ``(x_2j, x_2j+1)``
        (``"interleaved"``: Heo et al.'s code, timm's EVA-02 and ``rope_axial``
        ViTs) or ``(x_j, x_{j+d/2})`` (``"concatenated"``: Qwen2-VL's and
        Qwen2.5-VL's vision towers).
    base : float, optional
        ``θ_k = base^(-k/n)``, ``k = 0 … n-1``, ``n = d/(2A)`` pairs per axis
        (``base^(-4k/d)`` for two axes): 10000 in EVA-02, timm and Qwen2-VL; 100
        in Heo et al.'s RoPE-Axial ViTs.
    frequencies : array of shape (n,) or (A, n), real floating, optional
        ``θ_k`` in radians per position unit, replacing ``base^(-k/n)``:
        shared by the axes or one row per axis.
    prefix_tokens : int, optional
        Rows ``0 … prefix_tokens-1`` of ``x`` (class, register tokens) pass
        unchanged, as in EVA-02.

    Returns
    -------
    array, shape and dtype of ``x``
        Pair ``j = a·n + k`` of patch ``i`` rotated by ``positions[i, a]·θ_k``.

    Raises
    ------
    ValueError
        If ``d`` is not a positive multiple of ``2A``, ``positions`` is not
        ``(..., L - prefix_tokens, A)``, ``frequencies`` is not ``(n,)`` or
        ``(A, n)``, ``prefix_tokens`` exceeds ``L``, ``base`` is not positive,
        or ``layout`` is unknown.
    TypeError
        If ``layout`` is missing, ``x`` is not a real floating array,
        ``positions`` not a real or integer array, ``frequencies`` not a real
        floating array, or the arrays come from different libraries.

    See Also
    --------
    grid_positions : ``(row, col)`` grids, EVA-02's reference grid, Qwen2-VL's order.
    mixed_rotary_embedding : Learned mixes of the axes (RoPE-Mixed).
    multimodal_rotary_embedding : Unequal sections (M-RoPE).

    Notes
    -----
    Heo et al. 2024, *Rotary position embedding for vision transformer*
    (ECCV), §3, "Axial frequency" (RoPE-Axial): the first half of the pairs turn
    with one axis, the second half with the other, each with the ``d/4``
    frequencies ``θ_k = 100^(-4k/d)``. The dims split: pairs
    ``a·n … (a+1)·n - 1`` take axis ``a``, ``n = d/(2A)``, in the order of
    ``positions``' last axis. Heo et al.'s code puts ``x`` (column) first:
    pass ``(col, row)``; timm's ``RotaryEmbeddingCat`` (EVA-02) and Hugging
    Face's ``Qwen2VLVisionRotaryEmbedding`` put the row first: ``(row, col)``.
    For an image row and column the score depends on ``(Δrow, Δcol)`` only.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.grid import grid_positions
    >>> from relattn.rotary_axes import axial_rotary_embedding
    >>> x = np.ones((1 + 4, 4))          # a class token and a 2x2 grid, d = 4
    >>> p = grid_positions(2, 2)         # (row, col)
    >>> y = axial_rotary_embedding(x, p, layout="interleaved", base=1.0, prefix_tokens=1)
    >>> np.round(y[[0, 4]], 4).tolist()  # class token unchanged; patch (1, 1) turned by 1 rad twice
    [[1.0, 1.0, 1.0, 1.0], [-0.3012, 1.3818, -0.3012, 1.3818]]
    """
    if layout is None:
        raise TypeError(
            "axial_rotary_embedding: layout is required: 'interleaved' (Heo et al., timm, "
            "EVA-02) or 'concatenated' (Qwen2-VL's vision tower, HF rotate_half)"
        )
    xp = _checks.namespace(x=x, positions=positions, optional={"frequencies": frequencies})
    _checks.floating(xp, x=x)
    x = _checks.cast(xp, x, x.dtype)
    _checks.ndim("x", x, 2, "(..., L, d)")
    _checks.choice("layout", layout, LAYOUTS)
    base = _check_base(base)
    n_prefix = _prefix(x, prefix_tokens)
    length = x.shape[-2] - n_prefix
    require_array("positions", positions)
    axes = positions.shape[-1] if positions.ndim >= 1 else 0
    if axes == 0:
        raise ValueError(
            f"positions must have shape (..., L - prefix_tokens, A) = (..., {length}, A), A >= 1, "
            f"got shape {tuple(positions.shape)}"
        )
    d = _even_features(x, 2 * axes, f"2A, A = {axes} axes of positions")
    n = d // (2 * axes)
    positions = _check_positions(
        xp,
        positions,
        tuple(x.shape[:-2]),
        length,
        axes,
        f"(..., L - prefix_tokens, A) = (..., {length}, {axes})",
    )
    device = device_of(x)
    if frequencies is not None:
        _checks.floating(xp, frequencies=frequencies)
        if tuple(frequencies.shape) not in ((n,), (axes, n)):
            raise ValueError(
                f"frequencies must have shape (n,) = ({n},) or (A, n) = ({axes}, {n}), "
                f"got shape {tuple(frequencies.shape)}"
            )
        frequencies = _checks.cast(xp, frequencies, frequencies.dtype)
    thetas = tuple(_host_frequencies(n, base, False))
    sections: list[tuple[int, Any]] = []
    for a in range(axes):
        if frequencies is None:
            sections.append((a, thetas))
        else:
            sections.append((a, frequencies if frequencies.ndim == 1 else frequencies[a, :]))
    sin, cos = _section_angles(xp, positions, sections, _working_dtype(xp, device), device)
    sin, cos = xp.astype(sin, x.dtype), xp.astype(cos, x.dtype)
    patches = x[..., n_prefix:, :] if n_prefix else x
    return _with_prefix(xp, x, _rotate_pairs(patches, sin, cos, layout, xp), n_prefix)


def mixed_rotary_frequencies(
    head_dim: int,
    num_heads: int,
    *,
    base: float = 10.0,
    angles: Sequence[float] | None = None,
    xp: Namespace = None,
    dtype: Any = None,
    device: Any = None,
) -> Array:
    r"""RoPE-Mixed's initial frequencies ``(f_x, f_y)`` per head: rotated axial frequencies.

    Parameters
    ----------
    head_dim : int
        ``d``, a positive multiple of 4.
    num_heads : int
        ``H``.
    base : float, optional
        Magnitudes ``μ_k = base^(-4k/d)``, ``k = 0 … d/4 - 1`` (10 in Heo et
        al. and timm).
    angles : sequence of H floats, optional
        Each head's rotation ``φ_h`` in radians (Heo et al. draw it uniformly
        in ``[0, 2π)``: pass your generator's draws); default 0, which gives
        RoPE-Axial's frequencies for ``(x, y)``.
    xp : module, optional
        Array library of the result (default NumPy).
    dtype : dtype, optional
        Real floating dtype of the result (default: the library's default).
    device : device, optional
        Device of the result.

    Returns
    -------
    array of shape (2, H, d/2)
        ``[f_x, f_y]``: the learnable ``frequencies`` of
        :func:`mixed_rotary_embedding` for positions ``(x, y)``.

    Raises
    ------
    ValueError
        If ``head_dim`` is not a positive multiple of 4, ``num_heads < 1``,
        ``angles`` has not ``H`` entries, or ``base`` is not positive.
    TypeError
        If a size is not an integer or ``dtype`` not a real floating dtype of
        the library.

    See Also
    --------
    mixed_rotary_embedding : The rotation by ``f_x·x + f_y·y``.

    Notes
    -----
    Heo et al. 2024, §3, "Mixed learnable frequency", and their released
    ``init_random_2d_freqs`` (timm's of the same name): for ``k < d/4``,
    ``f_x[h, k] = μ_k cos φ_h``, ``f_y[h, k] = μ_k sin φ_h`` and
    ``f_x[h, k + d/4] = μ_k cos(φ_h + π/2)``,
    ``f_y[h, k + d/4] = μ_k sin(φ_h + π/2)``.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.rotary_axes import mixed_rotary_frequencies
    >>> f = mixed_rotary_frequencies(8, 1, base=100.0)
    >>> np.round(f, 4).tolist()  # φ = 0: x turns the first half, y the second
    [[[1.0, 0.1, 0.0, 0.0]], [[0.0, 0.0, 1.0, 0.1]]]
    """
    xp = _checks.creation_namespace(xp)
    d = _checks.length("head_dim", head_dim)
    if d % 4:
        raise ValueError(f"head_dim must be a multiple of 4 (two axes of pairs), got {d}")
    heads = _checks.length("num_heads", num_heads)
    base = _check_base(base)
    if angles is None:
        phi = np.zeros(heads)
    else:
        phi = np.asarray(angles, dtype=np.float64)
        if phi.shape != (heads,):
            raise ValueError(f"angles must have num_heads = {heads} entries, got shape {phi.shape}")
    mag = np.asarray(_host_frequencies(d // 4, base, False))
    fx = np.concatenate((np.cos(phi)[:, None] * mag, np.cos(phi + np.pi / 2)[:, None] * mag), -1)
    fy = np.concatenate((np.sin(phi)[:, None] * mag, np.sin(phi + np.pi / 2)[:, None] * mag), -1)
    if dtype is None:
        dtype = xp.__array_namespace_info__().default_dtypes(device=device)["real floating"]
    else:
        _checks.dtype("dtype", dtype, xp)
    return xp.asarray(np.stack((fx, fy)), dtype=dtype, device=device)


def mixed_rotary_embedding(
    x: Array,
    positions: Array,
    frequencies: Array,
    *,
    layout: str | None = None,
    prefix_tokens: int = 0,
) -> Array:
    r"""RoPE-Mixed: pair ``j`` of head ``h`` turns by ``Σ_a p_a·f[a, h, j]``, learned frequencies.

    Parameters
    ----------
    x : array of shape (..., H, L, d), real floating
        Multi-head queries or keys; ``d`` even.
    positions : array of shape (..., L - prefix_tokens, A), integer or real floating
        Each patch's position per axis, ``(x, y) = (col, row)`` in Heo et
        al.'s and timm's order; leading dims broadcast to ``x``'s batch dims
        (those before ``H``).
    frequencies : array of shape (A, H, d/2), real floating
        ``f[a, h, j]`` in radians per position unit, learned per axis, head and
        pair (:func:`mixed_rotary_frequencies` initialises them); a model
        with one set per layer passes its layer's.
    layout : {"concatenated", "interleaved"}
        Required, keyword-only: pair ``j`` is ``(x_2j, x_2j+1)``
        (``"interleaved"``: Heo et al.'s code and timm) or
        ``(x_j, x_{j+d/2})``.
    prefix_tokens : int, optional
        Rows ``0 … prefix_tokens-1`` (class tokens) pass unchanged.

    Returns
    -------
    array, shape and dtype of ``x``
        Pair ``j`` of head ``h``, patch ``i`` rotated by
        ``Σ_a positions[i, a]·frequencies[a, h, j]``.

    Raises
    ------
    ValueError
        If ``x`` is not at least 3-D, ``d`` is odd or 0, ``positions`` is not
        ``(..., L - prefix_tokens, A)``, ``frequencies`` is not
        ``(A, H, d/2)``, ``prefix_tokens`` exceeds ``L``, or ``layout`` is
        unknown.
    TypeError
        If ``layout`` is missing, ``x`` or ``frequencies`` is not a real
        floating array, ``positions`` not a real or integer array, or the
        arrays come from different libraries.

    See Also
    --------
    mixed_rotary_frequencies : The initial frequencies.
    axial_rotary_embedding : The special case ``f`` fixed and axis-aligned.

    Notes
    -----
    Heo et al. 2024, §3, "Mixed learnable frequency" (RoPE-Mixed):
    ``R(n, t) = e^{i(θ^x_t p^x_n + θ^y_t p^y_n)}``, both frequencies learned
    per head (and layer); timm's ``RotaryEmbeddingMixed`` (``get_mixed_freqs``:
    ``t_x·f_x + t_y·f_y``, then ``apply_rot_embed_cat``). The score depends on
    the position difference ``(Δx, Δy)`` only. Angles are formed in the
    working precision (float64 where the device has it), then cast to ``x``'s
    dtype; gradients reach ``frequencies`` (and real ``positions``).

    Examples
    --------
    >>> import numpy as np
    >>> from relattn.rotary_axes import mixed_rotary_embedding
    >>> x = np.ones((1, 2, 2))                    # one head, two patches, d = 2
    >>> p = np.asarray([[0, 0], [1, 2]])          # (x, y)
    >>> f = np.asarray([[[0.5]], [[0.25]]])       # f_x = 0.5, f_y = 0.25
    >>> np.round(mixed_rotary_embedding(x, p, f, layout="interleaved"), 4).tolist()
    [[[1.0, 1.0], [-0.3012, 1.3818]]]
    """
    if layout is None:
        raise TypeError(
            "mixed_rotary_embedding: layout is required: 'interleaved' (Heo et al., timm) "
            "or 'concatenated' (HF rotate_half)"
        )
    xp = _checks.namespace(x=x, positions=positions, frequencies=frequencies)
    _checks.floating(xp, x=x, frequencies=frequencies)
    x = _checks.cast(xp, x, x.dtype)
    _checks.ndim("x", x, 3, "(..., H, L, d)")
    _checks.choice("layout", layout, LAYOUTS)
    n_prefix = _prefix(x, prefix_tokens)
    heads, length = x.shape[-3], x.shape[-2] - n_prefix
    d = _even_features(x, 2, "pairs of features")
    half = d // 2
    axes = positions.shape[-1] if positions.ndim >= 1 else 0
    if axes == 0:
        raise ValueError(
            f"positions must have shape (..., L - prefix_tokens, A) = (..., {length}, A), A >= 1, "
            f"got shape {tuple(positions.shape)}"
        )
    positions = _check_positions(
        xp,
        positions,
        tuple(x.shape[:-3]),
        length,
        axes,
        f"(..., L - prefix_tokens, A) = (..., {length}, {axes})",
    )
    _checks.exact_shape("frequencies", frequencies, (axes, heads, half), "(A, H, d/2)")
    frequencies = _checks.cast(xp, frequencies, frequencies.dtype)
    work = _working_dtype(xp, device_of(x))
    f = frequencies if frequencies.dtype == work else xp.astype(frequencies, work)
    p = positions if positions.dtype == work else xp.astype(positions, work)
    angle = None
    for a in range(axes):
        # (..., 1, L', 1) · (H, 1, d/2) -> (..., H, L', d/2)
        pa = xp.expand_dims(xp.expand_dims(p[..., a], axis=-2), axis=-1)
        term = pa * xp.expand_dims(f[a, ...], axis=-2)
        angle = term if angle is None else angle + term
    sin, cos = xp.astype(xp.sin(angle), x.dtype), xp.astype(xp.cos(angle), x.dtype)
    patches = x[..., n_prefix:, :] if n_prefix else x
    return _with_prefix(xp, x, _rotate_pairs(patches, sin, cos, layout, xp), n_prefix)
