"""Multi-device JAX checks for ``tests/test_devices.py``, run in a fresh interpreter.

JAX fixes its device count when it is first imported, and the test session has
imported it long before: so these checks run here, on 8 host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set below before JAX
is imported), in float64. ``python tests/_devices_worker.py GROUP OUT.json``
writes one JSON object of figures (max abs differences, HLO collective counts,
error types and messages, seconds per section) that the tests assert on. Each
case is caught on its own, so that one failure is reported by name and does not
hide the others.

Groups: ``ring`` (sequence parallelism: ring attention against one device, its
gradients, its HLO, bad meshes and axis names, NumPy operands), ``zigzag`` (the
load-balanced ring, ``sharding="zigzag"``, every scheme and packed documents) and ``sharded``
(batch and head sharding through ``jax.jit``, ``shard_map`` and ``vmap``).
"""

from __future__ import annotations

import sys

DEVICES = 8
if __name__ == "__main__":
    # Before JAX is imported (the ring's XLA compiles, unrolled n steps deep and tripled by
    # its gradient, dominate the run: use_host_devices turns LLVM's optimisations off).
    from _workers import use_host_devices

    use_host_devices(DEVICES)

import dataclasses  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from _workers import collectives, error_of, max_diff  # noqa: E402

import relattn  # noqa: E402

try:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
except ImportError:  # imported (by pytest's doctest collection) where JAX is not installed
    jax = jnp = Mesh = NamedSharding = P = None

B, H, D, DV = 2, 2, 4, 3  # batch, heads, d, d_v (d_v != d catches a swapped feature axis)
L = 16  # divisible by 2, 4 and 8
MEMORY = 8  # Transformer-XL memory: Lk = L + MEMORY = 24 keys, shards of Lk / n
RAGGED = 13  # divisible by none of 2, 4, 8
#: Rings of 2 (the smallest) and 8 devices (SPEC §5); a ring of 4 runs on the (2, 4) mesh of
#: ``_mesh_2d`` (forward and gradients) and in ``_ring_errors``.
DEVICE_COUNTS = (2, 8)


def permute_pairs(hlo: str) -> list[str]:
    """The ``source_target_pairs`` of each collective-permute of the HLO text."""
    return re.findall(r"collective-permute(?:-start)?\(.*?source_target_pairs=(\{[^ ]*\}),", hlo)


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.normal(size=shape)


def _seq_spec(ndim: int, axis: str = "seq") -> P:
    """Shard axis -2 (the sequence) of an ``ndim``-D array over ``axis``."""
    return P(*([None] * (ndim - 2)), axis, None)


def ring(
    mesh: Mesh,
    arrays: dict[str, Any],
    *,
    batch_axis: str | None = None,
    vmap: bool = False,
    closed: dict[str, Any] | None = None,
    sharding: str = "contiguous",
    **options: Any,
) -> Any:
    """``relattn.ring_attention`` in ``jax.shard_map``: q, k, v sharded over ``"seq"``.

    ``positions`` and ``segment_ids`` (the whole sequence's) are sharded likewise, along
    their last axis; every other array is replicated (the whole tables, biases and mask).
    ``sharding="zigzag"``: the sharded arrays and the output are in the zig-zag layout
    (``_laid_out`` puts them there, on the host, as a caller would).
    ``batch_axis`` also shards axis 0 of q, k, v (a 2-D mesh); ``vmap`` maps the
    ring over that batch axis instead of passing it as a leading dimension.
    ``closed`` arrays are not arguments of the mapped function but constants
    that it closes over (NumPy arrays stay NumPy arrays until relattn sees them).
    """
    options = {**options, **(closed or {}), "sharding": sharding}
    names = sorted(arrays)

    def spec(name: str) -> P:
        batched = arrays[name].ndim == arrays["q"].ndim and arrays[name].shape[0] > 1
        if name == "mask" and batch_axis is not None and batched:
            return P(batch_axis)  # a key-padding mask (B, 1, 1, Lk) goes with its batch
        if name in PER_TOKEN:
            return P(*([None] * (arrays[name].ndim - 1)), "seq")
        if name not in ("q", "k", "v"):
            return P()
        s = list(_seq_spec(arrays[name].ndim))
        if batch_axis is not None:
            s[0] = batch_axis
        return P(*s)

    def local(*xs: Any) -> Any:
        kw = dict(zip(names, xs, strict=True))
        q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
        if vmap:
            fn = jax.vmap(
                lambda q, k, v: relattn.ring_attention(q, k, v, axis_name="seq", **kw, **options)
            )
            return fn(q, k, v)
        return relattn.ring_attention(q, k, v, axis_name="seq", **kw, **options)

    mapped = jax.shard_map(
        local, mesh=mesh, in_specs=tuple(spec(name) for name in names), out_specs=spec("q")
    )
    return mapped(*(arrays[name] for name in names))


#: The per-token integer inputs, sharded along the sequence like q and k.
PER_TOKEN = ("positions", "segment_ids")


def _laid_out(case: Case, n: int) -> Case:
    """``case`` with its sharded inputs (q, k, v and the per-token ones) in the zig-zag
    layout of ``n`` devices (``zigzag_shard``, on the host)."""
    arrays = {
        name: relattn.zigzag_shard(a, n, axis=-1 if name in PER_TOKEN else -2)
        if name in ("q", "k", "v", *PER_TOKEN) else a
        for name, a in case.arrays.items()
    }  # fmt: skip
    return dataclasses.replace(case, arrays=arrays)


# -------------------------------------------------------------------------------------------
# Ring cases: each the same attention on one device and on the ring
# -------------------------------------------------------------------------------------------
@dataclass
class Case:
    """Inputs (NumPy), the single-device attention and the ring attention of one scheme.

    ``single(a)`` and ``on_ring(a, mesh)`` take a dict of JAX arrays (the
    floating ones are differentiated, the boolean ones are constants) and
    return the whole output.
    """

    arrays: dict[str, np.ndarray]
    single: Callable[[dict[str, Any]], Any]
    on_ring: Callable[[dict[str, Any], Mesh], Any]
    ragged: Ragged | None = None  # a length that the device count may not divide

    @property
    def params(self) -> dict[str, np.ndarray]:
        return {n: a for n, a in self.arrays.items() if a.dtype.kind == "f"}

    @property
    def constants(self) -> dict[str, np.ndarray]:
        return {n: a for n, a in self.arrays.items() if a.dtype.kind != "f"}


@dataclass(frozen=True)
class Ragged:
    """Ring attention of a length ``L`` that the device count ``n`` may not divide.

    ``Lq = Lk = L`` are padded alike to ``Lp``, the next multiple of ``n``:
    q, k, v with zero rows at the end; the relative-layout inputs with
    ``Lp - L`` columns before (the distances below ``-(L - 1)``) and, in the
    full layout, after (above ``L - 1``), so that each column keeps its
    distance; the key-padding mask with ``False`` for the padded keys. The
    padded queries' rows are dropped from the output (their cotangent is 0).
    The padded columns are read only by pairs with a padded key (masked) or a
    padded query (dropped). Padding and dropping happen outside the jitted
    ring, on the host, as a caller would prepare its shards.
    """

    length: int
    causal_layout: bool

    def widths(self, name: str, n: int) -> tuple[int, int, int] | None:
        """``(axis, before, after)``: how ``name`` is padded (``None``: it is not)."""
        extra = -self.length % n
        if name in ("q", "k", "v", "out"):
            return -2, 0, extra
        if name == "mask":
            return -1, 0, extra
        after = 0 if self.causal_layout else extra
        if name in ("position_table", "query_position_table", "value_table"):
            return -2, extra, after
        if name == "relative_bias":
            return -1, extra, after
        return None

    def pad(self, name: str, x: np.ndarray, n: int) -> np.ndarray:
        found = self.widths(name, n)
        if found is None:
            return x
        axis, before, after = found
        rows = [(0, 0)] * x.ndim
        rows[axis] = (before, after)
        return np.pad(x, rows, constant_values=False if x.dtype == np.bool_ else 0)

    def unpad(self, name: str, x: Any, n: int) -> np.ndarray:
        x = np.asarray(x)
        found = self.widths(name, n)
        if found is None:
            return x
        axis, before, after = found
        keep = slice(before, x.shape[axis] - after)
        return x[..., keep, :] if axis == -2 else x[..., keep]


def ring_cases(rng: np.random.Generator) -> dict[str, Case]:
    """The schemes on the ring, several options per case (each case is compiled n steps deep)."""
    f = lambda *shape: _normal(rng, *shape)  # noqa: E731
    qkv = {"q": f(B, H, L, D), "k": f(B, H, L, D), "v": f(B, H, L, DV)}
    full, causal = 2 * L - 1, L
    u, pv = f(H, 1, D), f(H, 1, D)  # Transformer-XL's u and v, per head
    slopes = relattn.alibi_slopes(H)
    cases: dict[str, Case] = {}

    def sdpa(**options: Any) -> Callable[[dict[str, Any]], Any]:
        def single(a: dict[str, Any]) -> Any:
            extra = {n: a[n] for n in ("relative_bias", "mask") if n in a}
            return relattn.scaled_dot_product_attention(a["q"], a["k"], a["v"], **extra, **options)

        return single

    def relative(**options: Any) -> Callable[[dict[str, Any]], Any]:
        def single(a: dict[str, Any]) -> Any:
            names = ("content_bias", "position_bias", "value_table", "relative_bias", "mask")
            extra = {n: a[n] for n in names if n in a}
            return relattn.relative_attention(
                a["q"], a["k"], a["v"], a.get("position_table"), **extra, **options
            )

        return single

    def deberta(**options: Any) -> Callable[[dict[str, Any]], Any]:
        def single(a: dict[str, Any]) -> Any:
            return relattn.disentangled_attention(
                a["q"],
                a["k"],
                a["v"],
                a["position_table"],
                a["query_position_table"],
                mask=a.get("mask"),
                **options,
            )

        return single

    # Plain attention: full with a key-padding mask (B, 1, 1, Lk), causal by the flag.
    padding = relattn.padding_mask(np.array([L, 11]), L)[:, None, None, :]
    cases["sdpa[key_padding]"] = Case(
        {**qkv, "mask": padding}, sdpa(), lambda a, mesh, **z: ring(mesh, a, **z)
    )
    cases["sdpa[causal]"] = Case(
        dict(qkv), sdpa(causal=True), lambda a, mesh, **z: ring(mesh, a, **z, causal=True)
    )
    # ALiBi: m_h·δ over the causal layout (which implies causal).
    alibi = slopes[:, None] * relattn.relative_distances(L, L, causal=True)
    cases["alibi"] = Case(
        {**qkv, "relative_bias": alibi}, sdpa(), lambda a, mesh, **z: ring(mesh, a, **z)
    )

    # Transformer-XL: a per-head table in the causal layout (implies causal), u and v.
    txl = {**qkv, "position_table": f(H, causal, D), "content_bias": u, "position_bias": pv}
    cases["transformer_xl[causal]"] = Case(txl, relative(), lambda a, mesh, **z: ring(mesh, a, **z))
    # XLNet / Conformer full layout, with T5's bucketed bias (H, W), Shaw's value table and
    # a (Lq, Lk) mask with a fully masked row (3) and a row with a single key (5).
    buckets = relattn.relative_position_bucket(
        relattn.relative_distances(L, L), num_buckets=8, max_distance=16
    )
    rows = rng.random((L, L)) < 0.7
    rows[3, :] = False
    rows[5, :] = False
    rows[5, 9] = True
    xlnet = {
        **qkv,
        "position_table": f(full, D),
        "content_bias": u,
        "position_bias": pv,
        "relative_bias": f(8, H)[buckets].T.copy(),
        "value_table": f(full, DV),
        "mask": rows,
    }
    cases["xlnet[full,t5,value_table,masked_rows]"] = Case(
        xlnet, relative(), lambda a, mesh, **z: ring(mesh, a, **z)
    )
    # Transformer-XL with memory: Lk = L + M keys, k/v shards of Lk / n, query i at key i + M.
    lk = L + MEMORY
    memory = {
        "q": f(B, H, L, D),
        "k": f(B, H, lk, D),
        "v": f(B, H, lk, DV),
        "position_table": f(lk, D),
        "content_bias": u,
        "position_bias": pv,
    }
    cases["transformer_xl[memory]"] = Case(
        memory, relative(), lambda a, mesh, **z: ring(mesh, a, **z)
    )
    memory_full = {
        **memory,
        "position_table": f(L + lk - 1, D),
        "value_table": f(L + lk - 1, DV),
        "relative_bias": f(H, L + lk - 1),
    }
    cases["memory[full,value_table,relative_bias]"] = Case(
        memory_full, relative(), lambda a, mesh, **z: ring(mesh, a, **z)
    )

    # DeBERTa: c2p and p2c tables gathered at φ = clip(bucket(-δ) + k, 0, 2k - 1).
    k_buckets = 4
    phi = relattn.log_bucket_position(
        -relattn.relative_distances(L, L), bucket_size=k_buckets, max_position=16
    )
    phi = np.clip(phi + k_buckets, 0, 2 * k_buckets - 1)
    scale = 1.0 / np.sqrt(3 * D)  # DeBERTa's; the ring's default is 1/√d
    tables = {
        "position_table": f(2 * k_buckets, D)[phi],
        "query_position_table": f(2 * k_buckets, D)[phi],
    }
    cases["deberta"] = Case(
        {**qkv, **tables},
        deberta(scale=scale),
        lambda a, mesh, **z: ring(mesh, a, **z, scale=scale),
    )

    # Shaw et al.: clipped key and value tables (K = 3) expanded to the full layout; causal
    # by the flag over the full layout too.
    radius = 3
    shaw = {**qkv, "key_table": f(2 * radius + 1, D), "value_table": f(2 * radius + 1, DV)}
    for name, is_causal in (("shaw", False), ("shaw[causal]", True)):

        def shaw_ring(a: dict[str, Any], mesh: Mesh, c: bool = is_causal, **z: Any) -> Any:
            b = {
                "q": a["q"],
                "k": a["k"],
                "v": a["v"],
                "position_table": relattn.relative_table(a["key_table"], L, L),
                "value_table": relattn.relative_table(a["value_table"], L, L),
            }
            return ring(mesh, b, causal=c, **z)

        cases[name] = Case(
            dict(shaw),
            lambda a, c=is_causal: relattn.shaw_attention(
                a["q"], a["k"], a["v"], a["key_table"], a["value_table"], causal=c
            ),
            shaw_ring,
        )

    # vmap over the batch inside shard_map: the ring on (H, L, d) per example.
    cases["vmap_inside_shard_map"] = Case(
        dict(txl), relative(), lambda a, mesh, **z: ring(mesh, a, **z, vmap=True)
    )
    # NumPy table and biases closed over by the jitted ring (relattn converts them).
    np_table, np_u, np_pv = f(full, D), f(H, 1, D), f(H, 1, D)
    cases["numpy_operands"] = Case(
        dict(qkv),
        lambda a: relattn.relative_attention(
            a["q"],
            a["k"],
            a["v"],
            jnp.asarray(np_table),
            content_bias=jnp.asarray(np_u),
            position_bias=jnp.asarray(np_pv),
            causal=True,
        ),
        lambda a, mesh: ring(
            mesh,
            a,
            closed={"position_table": np_table, "content_bias": np_u, "position_bias": np_pv},
            causal=True,
        ),
    )

    # Lengths that the device count does not divide (see Ragged).
    r = RAGGED
    ragged = {"q": f(B, H, r, D), "k": f(B, H, r, D), "v": f(B, H, r, DV)}
    everything = {
        **ragged,
        "position_table": f(2 * r - 1, D),
        "value_table": f(2 * r - 1, DV),
        "relative_bias": f(H, 2 * r - 1),
        "content_bias": u,
        "position_bias": pv,
        "mask": relattn.padding_mask(np.array([r, 9]), r)[:, None, None, :],
    }
    cases["ragged[full]"] = Case(
        everything, relative(), lambda a, mesh, **z: ring(mesh, a, **z), ragged=Ragged(r, False)
    )
    causal_layout = {
        **ragged,
        "position_table": f(r, D),
        "content_bias": u,
        "position_bias": pv,
        "relative_bias": slopes[:, None] * relattn.relative_distances(r, r, causal=True),
        "mask": np.ones((1, r), dtype=bool),
    }
    cases["ragged[causal]"] = Case(
        causal_layout, relative(), lambda a, mesh, **z: ring(mesh, a, **z), ragged=Ragged(r, True)
    )
    disentangled = {
        **ragged,
        "position_table": f(2 * r - 1, D),
        "query_position_table": f(2 * r - 1, D),
        "mask": np.ones((1, r), dtype=bool),
    }
    cases["ragged[deberta,causal]"] = Case(
        disentangled,
        deberta(causal=True, scale=scale),
        lambda a, mesh, **z: ring(mesh, a, **z, causal=True, scale=scale),
        ragged=Ragged(r, False),
    )
    return cases


#: Device counts at which a case's gradients are checked as well (its forward: at every
#: count). The ring's gradient compiles to about three forwards, n steps deep: the cases
#: that carry every kind of input (tables of both layouts, u and v, per-distance biases,
#: value tables, masks, padding, DeBERTa's p2c term under causal skipping) are
#: differentiated at every count, the others on 8 devices (SPEC §5's configuration).
GRADIENTS = {
    "transformer_xl[causal]": DEVICE_COUNTS,
    "xlnet[full,t5,value_table,masked_rows]": DEVICE_COUNTS,
    "ragged[deberta,causal]": DEVICE_COUNTS,
    "transformer_xl[memory]": (8,),
    "deberta": (8,),
    "shaw[causal]": (8,),
}


def _run(case: Case, run: Callable[[Case, dict[str, Any]], Any], grads: bool) -> Callable:
    """The case's output (and its gradient w.r.t. every floating input) as one function."""

    def outputs(params: dict[str, Any], constants: dict[str, Any], cotangent: Any) -> Any:
        def forward(params: dict[str, Any]) -> Any:
            return run(case, {**params, **constants})

        if not grads:
            return forward(params), None
        out, vjp = jax.vjp(forward, params)
        return out, vjp(cotangent)[0]

    return outputs


def _on_device(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: jnp.asarray(a) for k, a in arrays.items()}


def _evaluate(
    case: Case,
    run: Callable[[Case, dict[str, Any]], Any],
    cotangent: np.ndarray,
    n: int | None,
    *,
    grads: bool,
) -> tuple[np.ndarray, dict[str, np.ndarray] | None, str]:
    """``run`` of one case, compiled: its output, gradients (or ``None``) and HLO text.

    ``n``: the device count the inputs are padded for (a ragged case), or
    ``None`` (no padding: the single device); the output and gradients come
    back unpadded. One program per case: XLA compiles several small programs
    faster than their union.
    """
    ragged = None if n is None else case.ragged
    pad = (lambda k, x: x) if ragged is None else (lambda k, x: ragged.pad(k, x, n))
    unpad = (lambda k, x: np.asarray(x)) if ragged is None else (
        lambda k, x: ragged.unpad(k, x, n)
    )  # fmt: skip
    params = _on_device({k: pad(k, a) for k, a in case.params.items()})
    constants = _on_device({k: pad(k, a) for k, a in case.constants.items()})
    args = (params, constants, jnp.asarray(pad("out", cotangent)))
    compiled = jax.jit(_run(case, run, grads)).lower(*args).compile()
    out, grad = compiled(*args)
    grad = None if grad is None else {k: unpad(k, g) for k, g in grad.items()}
    return unpad("out", out), grad, compiled.as_text()


def _compare(
    cases: dict[str, Case],
    n: int,
    mesh: Mesh,
    expected: dict[str, Any],
    gradients: dict[str, tuple[int, ...]] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Every case on the ring of ``mesh`` (with ``options``, e.g. its sharding): figures
    against ``expected`` and collectives; the gradients too at the device counts of
    ``gradients`` (default :data:`GRADIENTS`)."""
    results: dict[str, Any] = {}
    gradients = GRADIENTS if gradients is None else gradients
    for name, case in cases.items():
        grads = n in gradients.get(name, ())
        ref = expected[name]
        zigzag = options.get("sharding") == "zigzag"
        try:
            given, cotangent = case, ref["cotangent"]
            if zigzag:  # inputs and cotangent laid out on the host, outside the program
                given = _laid_out(case, n)
                cotangent = relattn.zigzag_shard(cotangent, n, axis=-2)
            out, grad, hlo = _evaluate(
                given, lambda case, a: case.on_ring(a, mesh, **options), cotangent, n,
                grads=grads,
            )  # fmt: skip
            if zigzag:
                out = relattn.zigzag_unshard(out, n, axis=-2)
                grad = grad and {
                    k: relattn.zigzag_unshard(g, n, axis=-2) if k in "qkv" else g
                    for k, g in grad.items()
                }  # fmt: skip
        except Exception as exc:
            results[name] = {"error": f"{error_of(exc)}\n{traceback.format_exc()}"}
            continue
        result = results[name] = {
            "forward": max_diff(out, ref["out"]),
            "scale": float(np.max(np.abs(ref["out"]))),
            "collectives": collectives(hlo),
            "permutes": sorted(set(permute_pairs(hlo))),
            "with_gradients": grads,
        }
        if grad is not None:
            result["grads"] = {k: max_diff(g, ref["grads"][k]) for k, g in grad.items()}
            result["grad_scale"] = max(float(np.max(np.abs(g))) for g in ref["grads"].values())
        if "masked_rows" in name:  # row 3 has no key: exactly 0 on every device
            result["masked_row"] = float(np.max(np.abs(out[..., 3, :])))
    return results


def _expected(
    cases: dict[str, Case], rng: np.random.Generator, gradients: dict[str, Any]
) -> dict[str, Any]:
    """The single-device reference of each case, on one device: its output, a cotangent,
    and the gradients where ``gradients`` names the case."""
    expected: dict[str, Any] = {}
    for name, case in cases.items():
        cotangent = rng.normal(size=jax.eval_shape(case.single, case.arrays).shape)
        out, grad, _ = _evaluate(
            case, lambda case, a: case.single(a), cotangent, None, grads=name in gradients
        )
        expected[name] = {"out": out, "grads": grad, "cotangent": cotangent}
    return expected


def ring_group() -> dict[str, Any]:
    report: dict[str, Any] = {"devices": len(jax.devices()), "x64": bool(jax.config.x64_enabled)}
    rng = np.random.default_rng(12)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    cases = ring_cases(rng)
    expected = _expected(cases, rng, GRADIENTS)
    timings["single_device"] = time.perf_counter() - t

    report["cases"] = {}
    for n in DEVICE_COUNTS:
        t = time.perf_counter()
        mesh = Mesh(np.array(jax.devices()[:n]), ("seq",))
        report["cases"][str(n)] = _compare(cases, n, mesh, expected)
        timings[f"ring_{n}"] = time.perf_counter() - t

    t = time.perf_counter()
    report["mesh_2d"] = {
        name: _mesh_2d(cases[name], expected[name], causal=causal)
        for name, causal in (("xlnet[full,t5,value_table,masked_rows]", False),
                             ("transformer_xl[causal]", True))
    }  # fmt: skip
    timings["mesh_2d"] = time.perf_counter() - t
    t = time.perf_counter()
    report["errors"] = _ring_errors(rng)
    timings["errors"] = time.perf_counter() - t
    report["timings"] = timings
    return report


#: The zig-zag ring's cases (every scheme of :func:`ring_cases` but the padded and vmapped
#: variants, and packed documents): the device counts each runs at, and those at which its
#: gradients are checked too. The memory cases' 24 keys make two chunks per device on 2
#: devices, not on 8.
ZIGZAG = {
    "sdpa[causal]": ((2, 8), ()),
    "alibi": ((2, 8), (2,)),
    "transformer_xl[causal]": ((2, 8), (2, 8)),
    "xlnet[full,t5,value_table,masked_rows]": ((2, 8), (8,)),
    "transformer_xl[memory]": ((2,), (2,)),
    "memory[full,value_table,relative_bias]": ((2,), ()),
    "deberta": ((2, 8), (8,)),
    "shaw[causal]": ((2,), (2,)),
    "packed[positions,segments]": ((2, 8), (2,)),
}


def zigzag_group() -> dict[str, Any]:
    """The zig-zag ring (``sharding="zigzag"``) against one device, on 2 and 8 devices."""
    rng = np.random.default_rng(13)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    every = ring_cases(rng)
    cases = {name: every[name] for name in ZIGZAG if name in every}
    cases["packed[positions,segments]"] = _packed_case(rng)
    gradients = {name: grads for name, (_, grads) in ZIGZAG.items()}
    expected = _expected(cases, rng, gradients)
    timings["single_device"] = time.perf_counter() - t
    report: dict[str, Any] = {"cases": {}}
    for n in DEVICE_COUNTS:
        t = time.perf_counter()
        mesh = Mesh(np.array(jax.devices()[:n]), ("seq",))
        here = {name: case for name, case in cases.items() if n in ZIGZAG[name][0]}
        report["cases"][str(n)] = _compare(here, n, mesh, expected, gradients, sharding="zigzag")
        timings[f"ring_{n}"] = time.perf_counter() - t
    report["timings"] = timings
    return report


def _packed_case(rng: np.random.Generator) -> Case:
    """Packed documents: ids and positions restarting in each document (the whole
    sequence's, sharded like q), a Transformer-XL table and a T5 bias, causal."""
    f = lambda *shape: _normal(rng, *shape)  # noqa: E731
    documents = np.repeat(np.arange(3), (5, 7, 4))
    positions = np.concatenate([np.arange(5), np.arange(7), np.arange(4)])
    arrays = {
        "q": f(B, H, L, D), "k": f(B, H, L, D), "v": f(B, H, L, DV),
        "position_table": f(2 * L - 1, D), "relative_bias": f(H, 2 * L - 1),
        "positions": positions, "segment_ids": documents,
    }  # fmt: skip

    def single(a: dict[str, Any]) -> Any:
        return relattn.relative_attention(
            a["q"], a["k"], a["v"], a["position_table"], relative_bias=a["relative_bias"],
            positions=a["positions"], segment_ids=a["segment_ids"], causal=True,
        )  # fmt: skip

    return Case(arrays, single, lambda a, mesh, **z: ring(mesh, a, causal=True, **z))


def _mesh_2d(case: Case, expected: dict[str, Any], *, causal: bool) -> dict[str, Any]:
    """A (2, 4) mesh: batch sharded over "batch", the sequence over a ring of 4 on "seq"."""
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("batch", "seq"))
    cot = jnp.asarray(expected["cotangent"])
    constants = _on_device(case.constants)

    def both(params: dict[str, Any]) -> Any:
        out, vjp = jax.vjp(lambda p: ring(mesh, {**p, **constants}, batch_axis="batch"), params)
        return out, vjp(cot)[0]

    try:
        compiled = jax.jit(both).lower(_on_device(case.params)).compile()
        out, grads = compiled(_on_device(case.params))
    except Exception as exc:
        return {"error": f"{error_of(exc)}\n{traceback.format_exc()}", "causal": causal}
    return {
        "forward": max_diff(out, expected["out"]),
        "grads": {k: max_diff(g, expected["grads"][k]) for k, g in grads.items()},
        "grad_scale": max(float(np.max(np.abs(g))) for g in expected["grads"].values()),
        "collectives": collectives(compiled.as_text()),
        "causal": causal,
    }


def _ring_errors(rng: np.random.Generator) -> dict[str, str | None]:
    """What bad meshes, axis names and whole-problem shapes raise (traced only, not run)."""
    n = 4
    mesh = Mesh(np.array(jax.devices()[:n]), ("seq",))
    f = lambda *shape: jnp.asarray(_normal(rng, *shape))  # noqa: E731
    qkv = {"q": f(B, H, L, D), "k": f(B, H, L, D), "v": f(B, H, L, DV)}
    local = L // n
    bad: dict[str, Callable[[], Any]] = {
        "unknown_axis_name": lambda: jax.shard_map(
            lambda q, k, v: relattn.ring_attention(q, k, v, axis_name="sequence"),
            mesh=mesh,
            in_specs=(_seq_spec(4),) * 3,
            out_specs=_seq_spec(4),
        )(qkv["q"], qkv["k"], qkv["v"]),
        "outside_shard_map": lambda: jax.jit(
            lambda q, k, v: relattn.ring_attention(q, k, v, axis_name="seq")
        )(qkv["q"], qkv["k"], qkv["v"]),
        # The tables of a shard (as if the ring were one device of L / n), not of the whole.
        "position_table_of_a_shard": lambda: ring(
            mesh, {**qkv, "position_table": f(2 * local - 1, D)}
        ),
        "query_position_table_too_wide": lambda: ring(
            mesh, {**qkv, "query_position_table": f(2 * L, D)}
        ),
        "value_table_of_a_shard": lambda: ring(mesh, {**qkv, "value_table": f(local, DV)}),
        "relative_bias_of_a_shard": lambda: ring(mesh, {**qkv, "relative_bias": f(H, local)}),
        # A mask of the shard's scores, not the whole problem's.
        "mask_of_a_shard": lambda: ring(mesh, {**qkv, "mask": jnp.ones((local, local), bool)}),
        # k and v replicated instead of sharded: each device sees n·L keys, not L.
        "keys_not_sharded": lambda: jax.shard_map(
            lambda q, k, v, t: relattn.ring_attention(q, k, v, t, axis_name="seq"),
            mesh=mesh,
            in_specs=(_seq_spec(4), P(), P(), P()),
            out_specs=_seq_spec(4),
        )(qkv["q"], qkv["k"], qkv["v"], f(2 * L - 1, D)),
    }
    found: dict[str, str | None] = {}
    for name, call in bad.items():
        try:
            jax.eval_shape(call)
        except Exception as exc:
            found[name] = error_of(exc)
        else:
            found[name] = None
    return found


# -------------------------------------------------------------------------------------------
# Batch and head sharding (the caller's), through jax.jit, shard_map and vmap
# -------------------------------------------------------------------------------------------
def _attention_calls(block_size: int | None) -> dict[str, Callable[..., Any]]:
    """name -> f(a): every attention function on a dict of inputs (q, k, v, tables, ...)."""
    bs = {"block_size": block_size}
    return {
        "scaled_dot_product_attention": lambda a: relattn.scaled_dot_product_attention(
            a["q"], a["k"], a["v"], mask=a["mask"], relative_bias=a["alibi"], **bs
        ),
        "relative_attention_causal": lambda a: relattn.relative_attention(
            a["q"],
            a["k"],
            a["v"],
            a["causal_table"],
            content_bias=a["u"],
            position_bias=a["pv"],
            mask=a["mask"],
            **bs,
        ),
        "relative_attention_full": lambda a: relattn.relative_attention(
            a["q"],
            a["k"],
            a["v"],
            a["full_table"],
            relative_bias=a["t5"],
            value_table=a["value_table"],
            mask=a["mask"],
            **bs,
        ),
        "shaw_attention": lambda a: relattn.shaw_attention(
            a["q"], a["k"], a["v"], a["shaw_keys"], a["shaw_values"], mask=a["mask"], **bs
        ),
        "disentangled_attention": lambda a: relattn.disentangled_attention(
            a["q"], a["k"], a["v"], a["full_table"], a["query_table"], mask=a["mask"], **bs
        ),
    }


def _sharded_inputs(
    rng: np.random.Generator, axis: str
) -> tuple[dict[str, np.ndarray], dict[str, P]]:
    """Inputs with 8 batch entries (axis "batch") or 8 heads ("heads"), and their specs.

    q, k, v and the key-padding mask are sharded along that axis; on the heads
    mesh so are the per-head tables, u, v and the per-head biases; every other
    input is replicated.
    """
    b, h = (DEVICES, 2) if axis == "batch" else (2, DEVICES)
    f = lambda *shape: _normal(rng, *shape)  # noqa: E731
    lengths = rng.integers(L // 2, L + 1, size=b)
    if axis == "batch":
        lengths[0] = 0  # an example with no key at all: zero rows on its device
    arrays = {
        "q": f(b, h, L, D),
        "k": f(b, h, L, D),
        "v": f(b, h, L, DV),
        "mask": relattn.padding_mask(lengths, L)[:, None, None, :],
        "causal_table": f(h, L, D),
        "u": f(h, 1, D),
        "pv": f(h, 1, D),
        "full_table": f(2 * L - 1, D),
        "query_table": f(2 * L - 1, D),
        "value_table": f(h, 2 * L - 1, DV),
        "t5": f(h, 2 * L - 1),
        "alibi": relattn.alibi_slopes(h)[:, None] * relattn.relative_distances(L, L, causal=True),
        "shaw_keys": f(7, D),
        "shaw_values": f(7, DV),
    }
    sharded = P("batch") if axis == "batch" else P(None, "heads")
    per_head = {"causal_table", "u", "pv", "value_table", "t5", "alibi"}
    specs = {}
    for name in arrays:
        if name in ("q", "k", "v") or (name == "mask" and axis == "batch"):
            specs[name] = sharded
        elif name in per_head and axis == "heads":
            specs[name] = P("heads")
        else:
            specs[name] = P()
    return arrays, specs


def _calls(block_sizes: tuple[int | None, ...] = (None, 4)) -> dict[str, Callable[..., Any]]:
    """Every attention function, dense and blockwise, by name."""
    return {
        name if block_size is None else f"{name}[block_size={block_size}]": call
        for block_size in block_sizes
        for name, call in _attention_calls(block_size).items()
    }


def sharded_group() -> dict[str, Any]:
    report: dict[str, Any] = {"devices": len(jax.devices())}
    rng = np.random.default_rng(3)
    timings: dict[str, float] = {}
    calls = _calls()
    inputs, expected = {}, {}
    for axis in ("batch", "heads"):
        t = time.perf_counter()
        inputs[axis] = _sharded_inputs(rng, axis)
        # The unsharded results: every function under one jit, on one device.
        everything = jax.jit(lambda a: {name: call(a) for name, call in calls.items()})
        expected[axis] = {
            k: np.asarray(x) for k, x in everything(_on_device(inputs[axis][0])).items()
        }
        timings[f"unsharded_{axis}"] = time.perf_counter() - t

    report["jit"] = {}
    for axis in ("batch", "heads"):
        t = time.perf_counter()
        mesh = Mesh(np.array(jax.devices()[:DEVICES]), (axis,))
        arrays, specs = inputs[axis]
        placed = {n: jax.device_put(a, NamedSharding(mesh, specs[n])) for n, a in arrays.items()}
        like_input = NamedSharding(mesh, P("batch") if axis == "batch" else P(None, "heads"))
        results: dict[str, Any] = {}
        for key, call in calls.items():
            try:
                compiled = jax.jit(call).lower(placed).compile()
                out = compiled(placed)
                results[key] = {
                    "diff": max_diff(out, expected[axis][key]),
                    "collectives": collectives(compiled.as_text()),
                    "spec": str(out.sharding.spec),
                    "sharded_like_input": bool(out.sharding.is_equivalent_to(like_input, out.ndim)),
                    "shard_shape": list(out.sharding.shard_shape(out.shape)),
                }
            except Exception as exc:
                results[key] = {"error": f"{error_of(exc)}\n{traceback.format_exc()}"}
        report["jit"][axis] = results
        timings[f"jit_{axis}"] = time.perf_counter() - t

    t = time.perf_counter()
    report["shard_map"] = _shard_map_batch(inputs["batch"][0], expected["batch"])
    timings["shard_map"] = time.perf_counter() - t
    t = time.perf_counter()
    report["vmap"] = _vmap(rng, inputs["batch"][0], expected["batch"])
    timings["vmap"] = time.perf_counter() - t
    report["timings"] = timings
    return report


def _shard_map_batch(arrays: dict[str, np.ndarray], expected: dict[str, Any]) -> dict[str, Any]:
    """relattn inside shard_map over the batch axis: no collective, the unsharded result."""
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("batch",))
    names = sorted(arrays)
    args = [jnp.asarray(arrays[n]) for n in names]
    specs = tuple(P("batch") if n in ("q", "k", "v", "mask") else P() for n in names)
    calls = {key: (call, key, None) for key, call in _calls().items()}
    # block_size=None goes blockwise by itself beyond relattn's memory budget: a small
    # budget (relattn.config.max_score_bytes) stands in for a long sequence.
    automatic = "relative_attention_causal[block_size=None, over the memory budget]"
    calls[automatic] = (
        _calls((None,))["relative_attention_causal"],
        "relative_attention_causal",
        1024,
    )
    results: dict[str, Any] = {}
    for key, (call, reference, budget) in calls.items():

        def local(*xs: Any, call: Callable = call) -> Any:
            return call(dict(zip(names, xs, strict=True)))

        fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P("batch")))
        try:
            with relattn.config.override(max_score_bytes=budget):
                compiled = fn.lower(*args).compile()
            results[key] = {
                "diff": max_diff(compiled(*args), expected[reference]),
                "collectives": collectives(compiled.as_text()),
            }
        except Exception as exc:
            results[key] = {"error": f"{error_of(exc)}\n{traceback.format_exc()}"}
    return results


def _vmap(
    rng: np.random.Generator, arrays: dict[str, np.ndarray], expected: dict[str, Any]
) -> dict[str, Any]:
    """jax.vmap of relattn over the batch axis under jit (and over per-example tables)."""
    a = _on_device(arrays)
    batched = ("q", "k", "v", "mask")
    calls = {}
    for key, call in _calls().items():

        def one(q: Any, k: Any, v: Any, mask: Any, call: Callable = call) -> Any:
            return call({**a, "q": q, "k": k, "v": v, "mask": mask})

        calls[key] = (jax.vmap(one), [a[n] for n in batched], expected[key])
    # Per-example tables: vmap over the table as well as q, k, v.
    tables = jnp.asarray(_normal(rng, DEVICES, 2, L, D))
    reference = np.asarray(relattn.relative_attention(a["q"], a["k"], a["v"], tables))
    for block_size in (None, 4):
        key = f"relative_attention_per_example_table[block_size={block_size}]"

        def per_example(q: Any, k: Any, v: Any, table: Any, bs: Any = block_size) -> Any:
            return relattn.relative_attention(q, k, v, table, block_size=bs)

        calls[key] = (jax.vmap(per_example), [a["q"], a["k"], a["v"], tables], reference)
    results: dict[str, Any] = {}
    try:
        outs = jax.jit(lambda: {k: fn(*args) for k, (fn, args, _) in calls.items()})()
        return {k: {"diff": max_diff(outs[k], ref)} for k, (_, _, ref) in calls.items()}
    except Exception:
        pass
    for key, (fn, args, ref) in calls.items():
        try:
            results[key] = {"diff": max_diff(jax.jit(fn)(*args), ref)}
        except Exception as exc:
            results[key] = {"error": f"{error_of(exc)}\n{traceback.format_exc()}"}
    return results


GROUPS = {"ring": ring_group, "zigzag": zigzag_group, "sharded": sharded_group}


def main(argv: list[str]) -> int:
    group, path = argv[1], argv[2]
    t = time.perf_counter()
    report = GROUPS[group]()
    report["seconds"] = time.perf_counter() - t
    with open(path, "w", encoding="utf-8") as out:
        json.dump(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
