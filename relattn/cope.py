"""CoPE: contextual position encoding, positions counted by gates on the content."""

from __future__ import annotations

from typing import Any

from . import _checks
from ._activations import sigmoid
from ._namespace import device_of
from ._typing import Array
from .backends import backend_for
from .terms import gather_columns

__all__ = ["cope_bias"]


def cope_bias(
    q: Array,
    k: Array,
    embeddings: Array,
    *,
    scale: Any = None,
    mask: Array = None,
) -> Array:
    r"""CoPE's bias: ``q_i·e[p_ij]`` at the contextual position ``p_ij``, a sum of gates.

    Parameters
    ----------
    q : array of shape (..., Lq, d), real floating
        Queries. When ``Lq < Lk`` (a decode step after a cache), query ``i``
        sits at key position ``i + Lk - Lq``.
    k : array of shape (..., Lk, d), real floating
        Keys, the cache included.
    embeddings : array of shape (..., npos, d), real floating
        The learned position embeddings ``e[0] … e[npos - 1]`` (per head with
        leading dims ``(H, npos, d)``; the authors' ``pos_emb`` of shape
        ``(1, d, npos)`` transposed). Leading dims broadcast against ``q``'s
        and ``k``'s. Gradients reach them, ``q`` and ``k``.
    scale : float or 0-d array, optional
        Multiplies ``q_i·k_j`` inside the gate. Default ``1/√d``, as in the
        authors' code, whose gates take the scaled logits; ``1.0`` gives the
        paper's ``σ(q_iᵀ k_j)``.
    mask : array of bool, broadcastable to (..., Lq, Lk), optional
        Keys a query may see besides the causal rule (padding, documents):
        masked keys get gate 0 and so add no position.

    Returns
    -------
    array of shape (..., Lq, Lk), the promoted dtype of the inputs
        ``z_ij = (1 - w)·q_i·e[⌊p_ij⌋] + w·q_i·e[⌈p_ij⌉]``, ``w = p_ij - ⌊p_ij⌋``,
        to add to the scaled scores as ``bias=`` (with ``causal=True``). Keys
        after the query (``j > i + Lk - Lq``) get ``p = 0``: a causal mask must
        hide them.

    Raises
    ------
    ValueError
        If ``q``, ``k`` or ``embeddings`` has fewer than 2 dims, the feature
        sizes differ, ``npos < 1``, the leading dims do not broadcast, ``mask``
        does not broadcast to ``(..., Lq, Lk)``, or ``d = 0`` with the default
        scale.
    TypeError
        If an input is not a real floating array, ``mask`` not a boolean one,
        ``scale`` not a real number or 0-d array, or the arrays come from
        different libraries.

    See Also
    --------
    scaled_dot_product_attention : Takes the result as ``bias=``.
    fire_score_mod : A learned function of the positions (not of the content).

    Notes
    -----
    Golovneva et al. 2024, *Contextual Position Encoding: Learning to Count
    What's Important*, §3: the gates ``g_ij = σ(q_iᵀ k_j)``, the position of
    key ``j`` for query ``i`` the count ``p_ij = Σ_{t=j}^{i} g_it`` of the
    gates from it up to the query, clipped to ``npos - 1``, and

    .. math::

        z_i[p] = q_i^\top e[p], \qquad
        a_{ij} = \mathrm{softmax}\bigl(q_i^\top k_j + z_i[p_{ij}]\bigr),

    with ``z_i[p_ij]`` interpolated linearly between the integer positions
    ``⌊p_ij⌋`` and ``⌈p_ij⌉`` (the authors' code, with ``gather``). The gates
    of a row sum over every key up to the query, so the whole row of scores
    is needed: ``O(Lq·Lk)`` memory per head, like the scores themselves, and
    the bias cannot be formed block by block. ``O(Lq·npos·d)`` for the
    ``q_iᵀ e[p]`` and ``O(Lq·Lk·d)`` for the gates.

    Examples
    --------
    >>> import numpy as np
    >>> from relattn import cope_bias
    >>> q, k = np.zeros((1, 2)), np.zeros((3, 2))       # every gate σ(0) = 1/2
    >>> q[0, 0] = 1.0
    >>> e = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])   # q·e[p] = p
    >>> cope_bias(q, k, e)                               # p = 3/2, 1, 1/2
    array([[1.5, 1. , 0.5]])
    """
    xp = _checks.namespace(q=q, k=k, embeddings=embeddings, optional={"mask": mask})
    dtype = _checks.floating(xp, q=q, k=k, embeddings=embeddings)
    _checks.query_key(q, k)
    _checks.ndim("embeddings", embeddings, 2, "(..., npos, d)")
    d = q.shape[-1]
    if embeddings.shape[-1] != d:
        raise ValueError(
            f"embeddings must have the feature size of q, d = {d}, got embeddings of shape "
            f"{tuple(embeddings.shape)}"
        )
    npos = embeddings.shape[-2]
    if npos < 1:
        raise ValueError(
            f"embeddings must hold npos >= 1 positions, got shape {tuple(embeddings.shape)}"
        )
    lq, lk = q.shape[-2], k.shape[-2]
    lead = _checks.broadcast(
        q=tuple(q.shape[:-2]), k=tuple(k.shape[:-2]), embeddings=tuple(embeddings.shape[:-2])
    )
    if mask is not None:
        _checks.boolean("mask", mask, xp)
        _checks.broadcastable("mask", tuple(mask.shape), (*lead, lq, lk), "the scores' shape")
    s = _checks.scale(scale, d, xp)
    q = _checks.cast(xp, q, dtype)
    k = _checks.cast(xp, k, dtype)
    embeddings = _checks.cast(xp, embeddings, dtype)
    device = device_of(q)
    logits = xp.matmul(q, xp.matrix_transpose(k)) * s  # (..., Lq, Lk)
    index = _checks.index_dtype(xp, device)
    rows = xp.reshape(xp.arange(lq, dtype=index, device=device) + (lk - lq), (lq, 1))
    visible = xp.reshape(xp.arange(lk, dtype=index, device=device), (1, lk)) <= rows
    if mask is not None:
        visible = visible & _checks.cast_integer(xp, mask)
    zero = xp.zeros((), dtype=dtype, device=device)
    gates = xp.where(visible, sigmoid(logits, xp), zero)
    # p_ij = Σ_{t >= j} g_it: the gates of keys after the query are 0.
    cumulative_sum = backend_for(xp).cumulative_sum or xp.cumulative_sum
    counts = xp.flip(cumulative_sum(xp.flip(gates, axis=-1), axis=-1), axis=-1)
    p = xp.minimum(counts, xp.asarray(float(npos - 1), dtype=dtype, device=device))
    lower = xp.floor(p)
    weight = p - lower
    z = xp.matmul(q, xp.matrix_transpose(embeddings))  # (..., Lq, npos)
    below = gather_columns(z, xp.astype(lower, index), xp)
    above = gather_columns(z, xp.astype(xp.ceil(p), index), xp)
    return below * (1 - weight) + above * weight
