"""Learned functions of the distance: FIRE and the dynamic position bias.

Both are small MLPs that the caller owns and passes in as arrays, one weight
matrix ``(in features, out features)`` and one bias vector per layer (the
transpose of ``torch.nn.Linear.weight``, as ``x @ W + b`` reads):

- FIRE (Li et al. 2023) evaluates an MLP at the distance normalised by the
  query's position, ``ψ(i - j) / ψ(max(L, i))``: a function of both positions,
  so it is a ``score_mod`` (:func:`fire_score_mod`, evaluated per block and
  lowered to FlexAttention on torch) or a dense bias (:func:`fire_bias`).
- The dynamic position bias (x-transformers' ``DynamicPositionBias``) evaluates
  an MLP at the distance itself, once per column of the relative layout
  (:func:`dynamic_position_bias`), for ``relative_bias=``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

from . import _checks
from ._activations import relu, silu
from ._namespace import device_of, is_array
from ._typing import Array

__all__ = ["dynamic_position_bias", "fire_bias", "fire_score_mod"]


# -------------------------------------------------------------------------------------------
# The MLP: checks and evaluation
# -------------------------------------------------------------------------------------------
def _mlp(
    weights: Any, biases: Any, others: dict[str, Any], learned: dict[str, Any]
) -> tuple[Any, Any, list[Any], list[Any]]:
    """Check an MLP ``1 → n_1 → … → H`` given as sequences of arrays; return ``xp``, the
    promoted dtype and the layers cast to it. ``others``: further arrays of the call,
    checked for their library; ``learned``: further parameters, where arrays, checked for
    their library and a real floating dtype, and counted in the dtype."""
    for name, layers in (("weights", weights), ("biases", biases)):
        if not isinstance(layers, (list, tuple)):
            raise TypeError(
                f"{name} must be a list or tuple of arrays, one per layer, "
                f"got {type(layers).__name__}"
            )
    if len(weights) == 0:
        raise ValueError("weights must hold at least one layer (1 → H), got an empty sequence")
    if len(biases) != len(weights):
        raise ValueError(
            f"biases must hold one array per layer of weights ({len(weights)} layers), "
            f"got {len(biases)}"
        )
    for name, layers in (("weights", weights), ("biases", biases)):
        for n, a in enumerate(layers):
            if not is_array(a):
                what = "None" if a is None else type(a).__name__
                raise TypeError(
                    f"{name} must be an array per layer: {name}[{n}] is not, got {what}"
                )
    # Layer 0 goes by the sequence's own name, so that a one-layer MLP's messages name
    # the argument as the caller wrote it.
    named = {("weights" if n == 0 else f"weights[{n}]"): w for n, w in enumerate(weights)}
    named.update({("biases" if n == 0 else f"biases[{n}]"): b for n, b in enumerate(biases)})
    scalars = {name: a for name, a in learned.items() if is_array(a)}
    xp = _checks.namespace(**named, **others, **scalars)
    for name, layers in (("weights", weights), ("biases", biases)):
        for n, a in enumerate(layers):
            if not _checks._is_real_floating(xp, a.dtype):
                raise TypeError(
                    f"{name} must have a real floating dtype: {name}[{n}] has dtype {a.dtype}"
                )
    dtype = _checks.floating(xp, **named, **scalars)
    width = 1
    for n, (w, b) in enumerate(zip(weights, biases, strict=True)):
        if w.ndim != 2 or w.shape[0] != width:
            raise ValueError(
                f"weights must chain 1 → n_1 → … → H, each (in features, out features): "
                f"weights[{n}] must have shape ({width}, n_out), got shape {tuple(w.shape)}"
            )
        width = w.shape[1]
        if tuple(b.shape) != (width,):
            raise ValueError(
                f"biases must match the layers: biases[{n}] must have shape ({width},), the "
                f"out features of weights[{n}], got shape {tuple(b.shape)}"
            )
    cast_w = [_checks.cast(xp, w, dtype) for w in weights]
    cast_b = [_checks.cast(xp, b, dtype) for b in biases]
    return xp, dtype, cast_w, cast_b


def _hidden(
    x: Any,
    weights: list[Any],
    biases: list[Any],
    activation: Any,
    xp: Any,
    norms: list[tuple[Any, Any]] | None = None,
) -> Any:
    """Every layer but the last at the scalar inputs ``x (...)``: ``(..., n_{K-1})``; with
    ``norms``, a LayerNorm ``(γ, β)`` after each of those layers, before the activation."""
    h = x[..., None]
    for n, (w, b) in enumerate(zip(weights[:-1], biases[:-1], strict=True)):
        h = xp.matmul(h, w) + b
        if norms is not None:
            h = _layer_norm(h, *norms[n], xp)
        h = activation(h, xp)
    return h


#: ``torch.nn.LayerNorm``'s default epsilon.
LAYER_NORM_EPS = 1e-5


def _layer_norm(h: Any, gamma: Any, beta: Any, xp: Any) -> Any:
    """LayerNorm over the last axis (biased variance, as ``torch.nn.LayerNorm``)."""
    centred = h - xp.mean(h, axis=-1, keepdims=True)
    variance = xp.mean(centred * centred, axis=-1, keepdims=True)
    return centred / xp.sqrt(variance + LAYER_NORM_EPS) * gamma + beta


def _norm_arrays(norms: Any, layers: int) -> dict[str, Any]:
    """The LayerNorms' ``(γ, β)`` pairs by name, one pair per hidden layer."""
    if norms is None:
        return {}
    if not isinstance(norms, (list, tuple)) or len(norms) != layers - 1:
        what = type(norms).__name__ if not isinstance(norms, (list, tuple)) else len(norms)
        raise TypeError(
            f"norms must be a list or tuple of (weight, bias) pairs, one per hidden layer "
            f"({layers - 1}), got {what}"
        )
    named = {}
    for n, pair in enumerate(norms):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"norms[{n}] must be a (weight, bias) pair of arrays, got {pair!r}")
        for part, a in zip(("weight", "bias"), pair, strict=True):
            if not is_array(a):
                what = "None" if a is None else type(a).__name__
                raise TypeError(f"norms[{n}] {part} must be an array, got {what}")
            named[f"norms[{n}] {part}"] = a
    return named


def _units(x: Any, weights: list[Any], biases: list[Any], xp: Any) -> list[Any]:
    """:func:`_hidden` with ReLU unit by unit: a list of ``n_{K-1}`` arrays of ``x``'s
    shape, made of elementwise operations only (FlexAttention's compiled kernels lower a
    ``score_mod`` as a pointwise subgraph, where a product of matrices or a sum over an
    axis cannot be lowered)."""
    units = [x]
    for w, b in zip(weights[:-1], biases[:-1], strict=True):
        units = [relu(_dot(units, w, m) + b[m], xp) for m in range(w.shape[1])]
    return units


def _dot(units: list[Any], w: Any, m: int) -> Any:
    out = units[0] * w[0, m]
    for n in range(1, len(units)):
        out = out + units[n] * w[n, m]
    return out


def _heads_first(out: Any, xp: Any) -> Any:
    """``(..., H)`` → ``(H, ...)``."""
    n = out.ndim
    return xp.permute_dims(out, (n - 1, *range(n - 1)))


def _scalar(name: str, value: Any, xp: Any, dtype: Any, device: Any) -> Any:
    """A learned scalar: a 0-d real floating array (kept, so that it gets gradients) or a
    real number (made a 0-d array of ``dtype``)."""
    if is_array(value):
        if value.ndim != 0:
            raise ValueError(f"{name} must be a real number or a 0-d array, got shape "
                             f"{tuple(value.shape)}")  # fmt: skip
        return _checks.cast(xp, value, dtype)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        what = "None" if value is None else type(value).__name__
        raise TypeError(
            f"{name} must be an array (0-d, real floating) or a real number, got {what}"
        )
    return xp.asarray(float(value), dtype=dtype, device=device)


def _positions(name: str, positions: Any, xp: Any) -> None:
    if positions.ndim < 1:
        raise ValueError(f"{name} must have shape (..., L), got shape ()")
    if not xp.isdtype(positions.dtype, ("real floating", "integral")):
        raise TypeError(f"{name} must be a real or integer array, got dtype {positions.dtype}")


# -------------------------------------------------------------------------------------------
# FIRE
# -------------------------------------------------------------------------------------------
def _fire_input(qp: Any, kp: Any, c: Any, threshold: Any, eps: float, xp: Any, dtype: Any) -> Any:
    """``ψ(i - j) / (ψ(max(i, |L|)) + eps)``, ``ψ(x) = log(|c·x| + 1)``, broadcast."""
    i = xp.astype(qp, dtype)
    j = xp.astype(kp, dtype)
    distance = xp.log1p(xp.abs(c * (i - j)))
    normaliser = xp.log1p(xp.abs(c * xp.maximum(i, xp.abs(threshold)))) + eps
    return distance / normaliser


def _fire_parameters(
    weights: Any, biases: Any, c: Any, threshold: Any, eps: Any
) -> tuple[Any, Any, list[Any], list[Any], Any, Any, float]:
    xp, dtype, ws, bs = _mlp(weights, biases, {}, {"c": c, "threshold": threshold})
    device = device_of(ws[0])
    c = _scalar("c", c, xp, dtype, device)
    threshold = _scalar("threshold", threshold, xp, dtype, device)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not float(eps) >= 0:
        raise ValueError(f"eps must be a real number >= 0, got {eps!r}")
    return xp, dtype, ws, bs, c, threshold, float(eps)


def fire_bias(
    query_positions: Array,
    key_positions: Array,
    weights: Sequence[Array],
    biases: Sequence[Array],
    c: Any,
    threshold: Any,
    *,
    eps: float = 1e-6,
) -> Array:
    r"""FIRE's learned bias of every query–key pair: an MLP of the normalised distance.

    Parameters
    ----------
    query_positions : array of shape (..., Lq), integer or real floating
        Position ``i`` of each query, in tokens from the start of the
        sequence. A decode step of ``Lq`` queries after a cache of ``n``
        keys passes ``n + arange(Lq)``: the query ``r`` sits at ``r + Lk - Lq``.
    key_positions : array of shape (..., Lk), integer or real floating
        Position ``j`` of each key (``arange(Lk)``). Leading dims broadcast
        against those of ``query_positions``.
    weights : list or tuple of arrays, real floating
        The MLP's weight matrices, ``(in features, out features)`` each
        (``torch.nn.Linear.weight`` transposed): ``(1, n_1), (n_1, n_2), …,
        (n_{K-1}, H)``. FIRE's is ``(1, hidden), (hidden, H)``.
    biases : list or tuple of arrays, real floating
        One bias vector per layer: ``(n_1,), …, (H,)``.
    c : 0-d real floating array or float
        The learned scale of ``ψ(x) = log(|c·x| + 1)`` (``c > 0``).
    threshold : 0-d real floating array or float
        The learned threshold ``L``: the normaliser is ``ψ(max(i, |L|))``. The
        authors' code learns ``L = L_multiplier · init_L``; pass that product.
    eps : float, optional
        Added to the normaliser (``1e-6`` in the authors' code): keeps ``i = 0``
        with ``L = 0`` finite.

    Returns
    -------
    array of shape (..., H, Lq, Lk), the promoted dtype of the parameters
        ``b[h, r, s] = f_θ(ψ(i_r - j_s) / (ψ(max(i_r, |L|)) + eps))[h]``,
        ready for ``bias=`` with ``causal=True``. Pairs with ``j > i`` (future
        keys) get the value of ``|i - j|``, as in the authors' code; a causal
        model masks them.

    Raises
    ------
    ValueError
        If a position array is 0-d, the leading dims do not broadcast, the
        layers' shapes do not chain ``1 → … → H``, ``c`` or ``threshold`` is
        not 0-d, or ``eps`` is negative.
    TypeError
        If ``weights`` or ``biases`` is not a list or tuple of real floating
        arrays, a position array is neither real nor integer, ``c`` or
        ``threshold`` is neither a number nor an array, or the arrays come from
        different libraries.

    See Also
    --------
    fire_score_mod : The same bias as a ``score_mod``, evaluated per block (O(L) memory).
    dynamic_position_bias : An MLP of the distance alone, for ``relative_bias=``.
    kerple_bias : Kerple's parametric bias of the distance.

    Notes
    -----
    Li et al. 2023, *Functional Interpolation for Relative Positions Improves
    Long Context Transformers* (ICLR 2024), §3.2–3.3:

    .. math::

        b(i, j) = f_θ\left(\frac{ψ(i - j)}{ψ(\max(L, i))}\right), \qquad
        ψ(x) = \log(c x + 1),

    with ``f_θ`` an MLP with ReLU (one hidden layer in the paper), ``c`` and
    ``L`` learned. As the authors' reference code, the log is taken of
    ``|c·x|`` and ``|L|``, and ``eps`` is added to the normaliser. The
    normaliser depends on the query's position, not only on ``i - j``: the
    bias is not a function of the distance alone, and costs
    ``O(H·Lq·Lk·hidden)``. :func:`fire_score_mod` computes the same values per
    block without storing them.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import fire_bias
    >>> w = [np.array([[1.0]]), np.array([[1.0, -1.0]])]   # 1 → 1 → 2 heads, ReLU
    >>> b = [np.array([0.0]), np.array([0.0, 0.0])]
    >>> out = fire_bias(np.array([3]), np.arange(4), w, b, np.e - 1, 0.0, eps=0.0)
    >>> out.shape
    (2, 1, 4)
    >>> out[0].round(4)                   # log(1 + (e-1)·(3 - j)) / log(1 + (e-1)·3)
    array([[1.    , 0.8199, 0.5503, 0.    ]])
    """
    xp, dtype, ws, bs, c, threshold, eps = _fire_parameters(weights, biases, c, threshold, eps)
    found = _checks.namespace(
        query_positions=query_positions, key_positions=key_positions, weights=ws[0]
    )
    _positions("query_positions", query_positions, found)
    _positions("key_positions", key_positions, found)
    lead = _checks.broadcast(
        query_positions=tuple(query_positions.shape[:-1]),
        key_positions=tuple(key_positions.shape[:-1]),
    )
    qp = _checks.cast_integer(xp, query_positions)[..., :, None]
    kp = _checks.cast_integer(xp, key_positions)[..., None, :]
    x = _fire_input(qp, kp, c, threshold, eps, xp, dtype)
    out = xp.matmul(_hidden(x, ws, bs, relu, xp), ws[-1]) + bs[-1]  # (..., Lq, Lk, H)
    n = len(lead)
    return xp.permute_dims(out, (*range(n), n + 2, n, n + 1))


def fire_score_mod(
    weights: Sequence[Array],
    biases: Sequence[Array],
    c: Any,
    threshold: Any,
    *,
    eps: float = 1e-6,
) -> Callable[..., Array]:
    """FIRE's bias as a ``score_mod``: the same values as :func:`fire_bias`, per block.

    Parameters
    ----------
    weights, biases : list or tuple of arrays, real floating
        As in :func:`fire_bias`; the last layer has one output per attention
        head ``H``.
    c, threshold : 0-d real floating array or float
        As in :func:`fire_bias`.
    eps : float, optional
        As in :func:`fire_bias`.

    Returns
    -------
    callable
        ``score_mod(score, batch, head, q_pos, kv_pos)`` (FlexAttention's
        signature) returning ``score + b[head](q_pos, kv_pos)``: relattn's
        blocks pass the positions of the block's queries and keys (query ``r``
        at ``r + Lk - Lq`` by default, or ``positions=``), so a decode step over
        a cache gets the query's own normaliser. It closes over the arrays
        given, which get gradients through it. The MLP is evaluated per
        element, one hidden unit at a time: ``O(B·H·bq·bk·hidden)`` memory per
        block at most, never ``(Lq, Lk)``.

    Raises
    ------
    ValueError, TypeError
        As :func:`fire_bias`, when it is made.

    See Also
    --------
    fire_bias : The dense ``(H, Lq, Lk)`` bias.
    scaled_dot_product_attention : Takes it as ``score_mod=`` (use ``causal=True``).

    Notes
    -----
    Li et al. 2023, §3.2–3.3; see :func:`fire_bias`. On torch, relattn may
    hand the function to FlexAttention, which calls it with 0-d tensors under
    ``vmap``. It is written with elementwise operations only (the hidden units
    as a Python list, each layer's weights read one by one, the head's row
    taken with ``xp.take``): FlexAttention's compiled kernels lower a
    ``score_mod`` as a pointwise subgraph, where a matrix product or a sum over
    an axis cannot be lowered. Both FlexAttention's eager reference and its
    kernel compiled by ``torch.compile`` on the CPU run it.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import fire_score_mod, scaled_dot_product_attention
    >>> rng = np.random.default_rng(0)
    >>> w = [rng.normal(size=(1, 8)), rng.normal(size=(8, 2))]
    >>> b = [rng.normal(size=8), rng.normal(size=2)]
    >>> q, k, v = rng.normal(size=(3, 1, 2, 4, 4))
    >>> mod = fire_score_mod(w, b, 1.0, 2.0)
    >>> scaled_dot_product_attention(q, k, v, score_mod=mod, causal=True).shape
    (1, 2, 4, 4)
    """
    xp, dtype, ws, bs, c, threshold, eps = _fire_parameters(weights, biases, c, threshold, eps)
    last = xp.permute_dims(ws[-1], (1, 0))  # (H, n): one row per head
    last_b = bs[-1]
    width = last.shape[1]

    def score_mod(score: Any, batch: Any, head: Any, q_pos: Any, kv_pos: Any) -> Any:
        x = _fire_input(q_pos, kv_pos, c, threshold, eps, xp, dtype)
        units = _units(x, ws, bs, xp)
        heads = xp.reshape(head, (-1,))
        w_h = xp.reshape(xp.take(last, heads, axis=0), (*head.shape, width))
        bias = xp.reshape(xp.take(last_b, heads, axis=0), head.shape)
        for n, unit in enumerate(units):
            bias = bias + unit * w_h[..., n]
        return score + xp.astype(bias, score.dtype)

    return score_mod


# -------------------------------------------------------------------------------------------
# Dynamic position bias
# -------------------------------------------------------------------------------------------
def dynamic_position_bias(
    distances: Array,
    weights: Sequence[Array],
    biases: Sequence[Array],
    *,
    log_distance: bool = False,
    norms: Sequence[tuple[Array, Array]] | None = None,
) -> Array:
    """The dynamic position bias: an MLP with SiLU of each distance, one value per head.

    Parameters
    ----------
    distances : array, integer dtype
        ``δ = key position - query position``, any shape ``(...)``; e.g.
        :func:`relative_distances` for one value per column of the relative
        layout (the MLP runs once per distance: ``O(W·hidden²)``). The MLP
        sees the values as given: x-transformers feeds it query minus key,
        ``-δ``; pass ``-distances`` to reuse its weights.
    weights : list or tuple of arrays, real floating
        The weight matrices, ``(in features, out features)`` each
        (``torch.nn.Linear.weight`` transposed): ``(1, dim), (dim, dim) …,
        (dim, H)``; x-transformers' ``depth`` is ``len(weights) - 1``.
    biases : list or tuple of arrays, real floating
        One bias vector per layer: ``(dim,), …, (H,)``.
    log_distance : bool, optional
        Feed ``sign(δ)·log(|δ| + 1)`` instead of ``δ`` (x-transformers'
        ``log_distance=True``).
    norms : list or tuple of (weight, bias) pairs of arrays, optional
        The LayerNorms of x-transformers' ``norm=True``: one after each hidden layer,
        before its SiLU, one pair ``(γ (n,), β (n,))`` per hidden layer
        (``len(weights) - 1`` pairs), ε = 1e-5 as ``torch.nn.LayerNorm``.
        Gradients reach them.

    Returns
    -------
    array of shape (H, ...), the promoted dtype of the layers
        ``out[h, ...] = f(x)[h]`` with ``f(x) = W_K·σ(… σ(W_1 x + b_1) …) + b_K``
        and ``σ`` = SiLU, ready for ``relative_bias=``.

    Raises
    ------
    ValueError
        If the layers' shapes do not chain ``1 → … → H``, or a LayerNorm's
        arrays do not have the width of its layer.
    TypeError
        If ``distances`` is not an integer array, ``weights`` or ``biases`` is
        not a list or tuple of real floating arrays, ``norms`` not one pair per
        hidden layer, ``log_distance`` not a bool, or the arrays come from
        different libraries.

    See Also
    --------
    fire_bias : An MLP of the distance normalised by the query's position.
    relative_distances : ``δ`` of each column of the relative layout.
    scaled_dot_product_attention : Takes the values as ``relative_bias=``.

    Notes
    -----
    x-transformers' ``DynamicPositionBias`` (Wang, after the continuous
    position bias of Liu et al. 2022, SwinV2, §3.3, and the dynamic position
    bias of CrossFormer, Wang et al. 2022): ``Linear(1, dim)``, SiLU, then
    ``depth - 1`` times ``Linear(dim, dim)``, SiLU, and ``Linear(dim, heads)``,
    evaluated at the ``2L - 1`` distances and gathered per pair; with
    ``norm=True`` a LayerNorm before each SiLU (``norms=``).

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import dynamic_position_bias, relative_distances
    >>> d = relative_distances(1, 4, causal=True, xp=np)        # [-3, -2, -1, 0]
    >>> w = [np.array([[1.0]]), np.array([[2.0]])]              # 1 → 1 → 1 head
    >>> b = [np.array([0.0]), np.array([0.5])]
    >>> dynamic_position_bias(d, w, b).round(4)                 # 2·SiLU(δ) + 0.5
    array([[ 0.2154,  0.0232, -0.0379,  0.5   ]])
    """
    named_norms = _norm_arrays(norms, len(weights) if isinstance(weights, (list, tuple)) else 0)
    xp, dtype, ws, bs = _mlp(weights, biases, {"distances": distances}, named_norms)
    if not _checks.is_integer_dtype(xp, distances.dtype):
        raise TypeError(
            f"distances must be an integer array (relative positions), got dtype {distances.dtype}"
        )
    log_distance = _checks.flag("log_distance", log_distance)
    cast_norms = None
    if norms is not None:
        cast_norms = []
        for n, pair in enumerate(norms):
            width = ws[n].shape[1]
            for part, a in zip(("weight", "bias"), pair, strict=True):
                if tuple(a.shape) != (width,):
                    raise ValueError(
                        f"norms[{n}] {part} must have shape ({width},), the out features of "
                        f"weights[{n}], got shape {tuple(a.shape)}"
                    )
            cast_norms.append((_checks.cast(xp, pair[0], dtype), _checks.cast(xp, pair[1], dtype)))
    x = xp.astype(_checks.cast_integer(xp, distances), dtype)
    if log_distance:
        x = xp.sign(x) * xp.log1p(xp.abs(x))
    out = xp.matmul(_hidden(x, ws, bs, silu, xp, cast_norms), ws[-1]) + bs[-1]
    return _heads_first(out, xp)
