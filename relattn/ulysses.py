"""Sequence-parallel relative attention by head redistribution: DeepSpeed Ulysses."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _checks
from ._namespace import device_of
from ._typing import Array
from .attention import relative_attention
from .problem import check_qkv
from .ring import collective_for

__all__ = ["ulysses_attention"]


def ulysses_attention(
    q: Array,
    k: Array,
    v: Array,
    position_table: Array = None,
    *,
    axis_name: Any = None,
    group: Any = None,
    content_bias: Array = None,
    position_bias: Array = None,
    query_position_table: Array = None,
    value_table: Array = None,
    mask: Array = None,
    bias: Array = None,
    relative_bias: Array = None,
    causal: bool = False,
    scale: Any = None,
    block_size: Any = None,
    positions: Array = None,
    segment_ids: Array = None,
    score_mod: Any = None,
    mask_mod: Any = None,
) -> Array:
    """Relative attention over a sequence sharded across devices, heads redistributed by all-to-all.

    Each device (a JAX device inside ``jax.shard_map``, or a rank of a
    ``torch.distributed`` process group) holds a shard of the sequence's queries, keys
    and values, every head of it. One all-to-all per array turns the sequence shards
    into head shards: device ``p`` of ``n`` then holds heads
    ``[p·H/n, (p+1)·H/n)`` of the **whole** sequence, computes their attention alone
    (:func:`relative_attention`, every relative term of the whole sequence at hand),
    and a last all-to-all turns its heads' output back into its sequence shard of every
    head. The result equals the single-device attention of the whole sequence.

    Per-head inputs are sliced to the device's heads: the tables ``(..., H, W, d)``,
    ``content_bias`` and ``position_bias`` ``(..., H, 1, d)``, ``relative_bias``
    ``(..., H, W)``, and ``mask``, ``bias`` ``(..., H, Lq, Lk)``; inputs whose head axis
    has size 1, or that have none (one table ``(W, d)`` for every head, a key-padding
    mask ``(B, 1, 1, Lk)``), are used whole. ``score_mod`` and ``mask_mod`` receive the
    global head indices.

    Parameters
    ----------
    q : array of shape (..., H, bq, d), real floating
        This device's query shard, every head; the whole sequence has ``Lq = n·bq``
        queries. ``H`` must be a multiple of ``n``. JAX arrays or torch tensors.
    k : array of shape (..., H or 1, bk, d), real floating
        This device's key shard, ``Lk = n·bk`` (``Lk != Lq``: a memory of past keys,
        or cross-attention). One head (multi-query attention) is sent to every device.
    v : array of shape (..., H or 1, bk, d_v), real floating
        Its values.
    position_table : array of shape (..., W, d), real floating, optional
        The **whole** sequence's content-to-position table (Transformer-XL, XLNet,
        TENER, Shaw keys, DeBERTa c2p), replicated on every device: ``W = Lk`` (causal
        layout) or ``Lq + Lk - 1`` (full). One per head ``(H, W, d)``, or one for all.
    axis_name : hashable, optional
        JAX: the mesh axis the sequence is sharded over (as in ``shard_map``); required
        for JAX arrays, not given for torch tensors.
    group : torch.distributed.ProcessGroup, optional
        The torch process group whose ranks hold the shards, in rank order (``None``:
        the default group). Not given for JAX arrays.
    content_bias, position_bias : array, real floating, optional
        Transformer-XL's ``u`` and ``v``, broadcastable to ``q`` with a sequence axis of
        size 1 (per head: ``(H, 1, d)``).
    query_position_table : array of shape (..., W, d), real floating, optional
        The whole sequence's position-to-content table (DeBERTa's p2c).
    value_table : array of shape (..., W, d_v), real floating, optional
        The whole sequence's value table (Shaw et al.).
    mask : array, bool, optional
        ``True`` = may attend, broadcastable to the **whole** scores
        ``(..., H, Lq, Lk)`` (e.g. a key-padding mask ``(B, 1, 1, Lk)``), replicated.
    bias : array, real floating, optional
        Added to the scaled scores; broadcastable to the **whole** scores, replicated.
    relative_bias : array of shape (..., W), real floating, optional
        The whole sequence's per-distance bias (T5, ALiBi: ``(H, W)``).
    causal : bool, optional
        Mask ``δ > 0``.
    scale : float or 0-d array, optional
        Score scale, ``1/√d`` by default.
    block_size : int or (int, int), optional
        Passed on to the local :func:`relative_attention`: blockwise over the whole
        sequence with this block (default: relattn chooses).
    positions, segment_ids : array of int, or a pair of them, optional
        Positions as data and document ids (:func:`scaled_dot_product_attention`), as
        this device's shards like ``q`` and ``k``: one array ``(..., bq)`` (``Lq = Lk``)
        or a pair ``(queries (..., bq), keys (..., bk))``. Each device gathers the whole
        sequence's (integers: no gradient).
    score_mod, mask_mod : callable, optional
        The caller's score and mask functions (:func:`scaled_dot_product_attention`);
        their ``head`` argument holds global head indices ``0 … H - 1``.

    Returns
    -------
    array of shape (..., H, bq, d_v)
        This device's rows of the whole sequence's attention output, every head, in the
        promoted input dtype; queries with no allowed key give zero rows. Gradients: on
        JAX, ``shard_map`` sums the replicated inputs' (tables, biases, ``u``, ``v``)
        over the devices; on torch each rank's gradient of a replicated input is
        **partial**, its own heads' share: sum them over the group
        (``torch.distributed.all_reduce``), as for any parameter under sequence
        parallelism. The gradients of ``q``, ``k`` and ``v`` return by the inverse
        all-to-all to the rank that holds each shard.

    Raises
    ------
    TypeError
        If the arrays are neither JAX arrays nor torch tensors, come from different
        libraries, ``group`` is not a process group, an input is not real floating, or
        ``mask`` is not boolean.
    ValueError
        If ``q``, ``k`` or ``v`` has fewer than three dimensions ``(..., H, L, d)``,
        their head counts differ (other than 1), ``n`` does not divide ``H``; shapes
        that :func:`relative_attention` refuses for the whole sequence (table widths
        for ``Lq = n·bq``, ``Lk = n·bk``, a mask that does not broadcast to the whole
        scores); an unknown ``axis_name``, a missing one for JAX or one given for torch
        (``group`` likewise), or no initialized ``torch.distributed``.

    See Also
    --------
    relative_attention : The same attention on one device, which each device runs on its
        heads.
    ring_attention : Sequence parallelism that keeps the heads and passes key blocks round
        a ring: no limit on ``n`` from the head count.

    Notes
    -----
    Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
    Extreme Long Sequence Transformer Models": an all-to-all before attention trades the
    sequence sharding for a head sharding, and one after it trades back, so attention
    itself runs unchanged on whole sequences. Relative terms stay exact because each
    device sees every position of its heads: the tables, per-distance biases, ``u`` and
    ``v`` of its heads are sliced from the replicated whole (SPEC §2.19), positions and
    document ids are gathered. Communication: four all-to-alls (``q``, ``k``, ``v``,
    the output; their inverses in the backward), each device sending and receiving
    ``O(B·H·L·d / n)`` elements in each, constant when ``L`` and ``n`` grow together
    (the paper's argument); memory per device: the whole sequence for ``H/n`` heads,
    ``O(B·(H/n)·(L·d + Lq·Lk))`` dense or ``O(B·(H/n)·L·d)`` blockwise. The head
    count limits the number of devices (``n`` divides ``H``); :func:`ring_attention`
    has no such limit. Lengths that ``n`` does not divide: pad as for
    :func:`ring_attention`.

    On torch the all-to-alls are ``torch.distributed.all_to_all_single`` in a
    ``torch.autograd.Function`` whose backward is the inverse all-to-all. Every rank
    must call it with the same shapes and options.

    Examples
    --------
    This example needs JAX, an optional extra: ``pip install "relattn[jax]"``.

    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> from relattn import relative_attention
    >>> from relattn.ulysses import ulysses_attention
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    >>> x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 4)), dtype=jnp.float32)
    >>> table = jnp.asarray(np.random.default_rng(1).normal(size=(2, 8, 4)), dtype=jnp.float32)
    >>> spec = P(None, "seq")  # (H, L, d): the sequence axis sharded
    >>> ulysses = jax.shard_map(
    ...     lambda q, k, v, t: ulysses_attention(q, k, v, t, axis_name="seq"),
    ...     mesh=mesh, in_specs=(spec, spec, spec, P()), out_specs=spec)
    >>> out = ulysses(x, x, x, table)
    >>> bool(jnp.allclose(out, relative_attention(x, x, x, table), atol=1e-6))
    True

    On torch, each rank of an initialized process group calls it on its shards
    (here a group of one, gloo on the loopback interface):

    >>> import tempfile, torch, torch.distributed as dist
    >>> store = f"file://{tempfile.NamedTemporaryFile().name}"  # a free name, for gloo's store
    >>> dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    >>> t = torch.tensor(np.asarray(x))
    >>> out = ulysses_attention(t, t, t, causal=True)
    >>> bool(torch.allclose(out, relative_attention(t, t, t, None, causal=True), atol=1e-6))
    True
    >>> dist.destroy_process_group()
    """
    optional = {
        "position_table": position_table, "content_bias": content_bias,
        "position_bias": position_bias, "query_position_table": query_position_table,
        "value_table": value_table, "mask": mask, "bias": bias, "relative_bias": relative_bias,
    }  # fmt: skip
    xp = _checks.namespace(q=q, k=k, v=v, optional=optional)
    collective, axis = collective_for(xp, axis_name, group, "ulysses_attention")
    check_qkv(q, k, v)
    heads = _head_count(q, k, v)
    devices = collective.axis_size(axis)
    if heads % devices:
        raise ValueError(
            f"q: ulysses_attention splits the heads (axis -3) over the devices; the number "
            f"of heads H must be divisible by the number of devices n, got H = {heads} and "
            f"n = {devices} (q of shape {tuple(q.shape)})"
        )
    local = heads // devices
    me = collective.axis_index(axis)
    mine = _Heads(xp, heads, devices, me, device_of(q))

    def to_heads(x: Any) -> Any:
        """``(..., H or 1, L/n, e)`` sequence shard -> ``(..., H/n or 1, L, e)`` heads."""
        if x.shape[-3] == 1 and devices > 1:
            # One head for every query head (multi-query attention): each device gets it.
            x = xp.broadcast_to(x, (*x.shape[:-3], devices, *x.shape[-2:]))
        return collective.all_to_all(x, -3, -2, axis)

    def gather(ids: Any) -> Any:
        """Positions or document ids, this device's shard -> the whole sequence's, sliced
        to this device's heads where they have a head axis."""
        if ids is None:
            return None
        if isinstance(ids, (tuple, list)):
            return type(ids)(gather(part) for part in ids)
        if getattr(ids, "ndim", 1) < 1:
            return ids  # a 0-d array: relative_attention names it
        return mine(collective.all_gather(ids, -1, axis), -2)

    options = {
        "content_bias": mine(content_bias, -3), "position_bias": mine(position_bias, -3),
        "query_position_table": mine(query_position_table, -3),
        "value_table": mine(value_table, -3), "mask": mine(mask, -3), "bias": mine(bias, -3),
        "relative_bias": mine(relative_bias, -2), "positions": gather(positions),
        "segment_ids": gather(segment_ids),
    }  # fmt: skip
    if devices > 1 and score_mod is not None:
        score_mod = _GlobalHeads(score_mod, me * local, 2)
    if devices > 1 and mask_mod is not None:
        mask_mod = _GlobalHeads(mask_mod, me * local, 1)
    out = relative_attention(
        to_heads(q), to_heads(k), to_heads(v), mine(position_table, -3), causal=causal,
        scale=scale, block_size=block_size, score_mod=score_mod, mask_mod=mask_mod, **options,
    )  # fmt: skip
    return collective.all_to_all(out, -2, -3, axis)


def _head_count(q: Any, k: Any, v: Any) -> int:
    """``H``: the head axis (-3) of ``q``, ``k`` and ``v``, one size or 1."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.ndim(name, x, 3, "(..., H, L/n, d): heads on axis -3, this device's shard")
    sizes = {int(x.shape[-3]) for x in (q, k, v)} - {1}
    if len(sizes) > 1:
        shapes = ", ".join(f"{n} {tuple(x.shape)}" for n, x in (("q", q), ("k", k), ("v", v)))
        raise ValueError(
            f"q, k and v must have the same number of heads on axis -3 (or 1, broadcast), "
            f"got {shapes}"
        )
    return sizes.pop() if sizes else 1


class _Heads:
    """``mine(x, axis)``: this device's ``H/n`` heads of ``x`` along ``axis`` where that
    axis has all ``H`` heads; ``x`` itself where it is ``None``, has no such axis, or the
    axis broadcasts. Array-API ``take`` with indices built from the collective's device
    index (traced on JAX, an int on torch)."""

    def __init__(self, xp: Any, heads: int, devices: int, me: Any, device: Any) -> None:
        self.xp, self.heads, self.devices, self.me = xp, heads, devices, me
        self.device = device

    def __call__(self, x: Any, axis: int) -> Any:
        if x is None or self.devices == 1 or getattr(x, "ndim", 0) < -axis:
            return x
        if x.shape[axis] != self.heads:
            return x
        xp, local, device = self.xp, self.heads // self.devices, self.device
        dtype = _checks.index_dtype(xp, device)
        first = xp.asarray(self.me * local, dtype=dtype, device=device)
        index = first + xp.arange(local, dtype=dtype, device=device)
        return xp.take(x, index, axis=x.ndim + axis)


@dataclasses.dataclass(frozen=True)
class _GlobalHeads:
    """The caller's ``score_mod`` (``head`` its argument 2) or ``mask_mod`` (argument 1)
    called with global head indices: the local ones plus this device's first head."""

    fn: Any
    offset: Any
    position: int

    def __call__(self, *args: Any) -> Any:
        shifted = list(args)
        shifted[self.position] = shifted[self.position] + self.offset
        return self.fn(*shifted)
