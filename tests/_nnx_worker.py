"""Multi-device checks of :class:`relattn.nnx.RelativeAttention`, run in a fresh interpreter.

JAX fixes its device count when it is first imported, and the test session has imported
it long before: ``tests/test_nnx.py`` runs ``python tests/_nnx_worker.py OUT.json``, which
sets 4 host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``) and float64
before JAX is imported, and writes one JSON object per case.

For every scheme of :data:`relattn.layers.SCHEMES`, on a ``(2, 2)`` mesh of axes
``("data", "model")`` with the rule ``("heads", "model")``:

- ``eager``: the layer built under ``jax.set_mesh`` (Flax's eager sharding): each
  parameter's ``.sharding`` against its logical axes mapped to the mesh (``"heads"`` on
  ``"model"``, every other axis replicated), the number of distinct shards, and the
  forward of a batch sharded on ``"data"`` under ``nnx.jit`` against the unsharded layer
  built from the same seed;
- ``jit_init`` (one scheme): the other documented way, the layer built inside
  ``nnx.jit`` with Flax's eager sharding off and its state constrained to
  ``nnx.get_partition_spec`` under ``nnx.logical_axis_rules``;
- ``train_step``: one sharded Adam step (``nnx.Optimizer``) against the unsharded one.
"""

from __future__ import annotations

import sys

DEVICES = 4
if __name__ == "__main__":
    # Before JAX is imported; not on import (pytest's --doctest-modules imports this file
    # into the test session, whose environment it must leave alone).
    from _workers import use_host_devices

    use_host_devices(DEVICES)

import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

D_MODEL, HEADS, BATCH, LENGTH = 16, 2, 4, 6
RULES = (("heads", "model"),)


def _kwargs(scheme: str) -> dict[str, Any]:
    if scheme in ("swin", "decomposed"):
        return {"grid": (2, 3)}
    return {"causal": True}


def _max_diff(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _expected_spec(axes: tuple[str | None, ...]) -> tuple[str | None, ...]:
    rules = dict(RULES)
    return tuple(rules.get(a) if a is not None else None for a in axes)


def eager_case(scheme: str, mesh: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from relattn.nnx import RelativeAttention

    def build() -> RelativeAttention:
        return RelativeAttention(
            D_MODEL, HEADS, scheme, param_dtype=jnp.float64, initializer_range=0.3,
            rngs=nnx.Rngs(0), sharding_rules=RULES, **_kwargs(scheme),
        )  # fmt: skip

    plain = build()
    with jax.set_mesh(mesh):
        sharded = build()
    params: dict[str, Any] = {}
    for p in sharded.config.parameters():
        value = getattr(sharded, p.name)[...]
        expected = NamedSharding(mesh, P(*_expected_spec(p.axes)))
        params[p.name] = {
            "axes": list(p.axes),
            "spec": str(value.sharding.spec),
            "expected": str(expected.spec),
            "matches": bool(value.sharding.is_equivalent_to(expected, value.ndim)),
            "distinct_shards": len({str(s.index) for s in value.addressable_shards}),
            "expected_shards": 2 if "heads" in p.axes else 1,
            "value_diff": _max_diff(value, getattr(plain, p.name)[...]),
        }
    x = jax.random.normal(jax.random.key(1), (BATCH, LENGTH, D_MODEL), dtype=jnp.float64)
    forward = nnx.jit(lambda m, x: m(x))
    expected_out = forward(plain, x)
    with jax.set_mesh(mesh):
        out = forward(sharded, jax.device_put(x, NamedSharding(mesh, P("data"))))
    return {
        "params": params,
        "forward_diff": _max_diff(out, expected_out),
        "out_scale": float(np.max(np.abs(np.asarray(expected_out)))),
        "out_devices": len(out.sharding.device_set),
    }


def jit_init_case(mesh: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from relattn.nnx import RelativeAttention

    @nnx.jit
    def create() -> RelativeAttention:
        model = RelativeAttention(16, 2, "t5", param_dtype=jnp.float64, rngs=nnx.Rngs(0))
        state = nnx.state(model)
        nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
        return model

    rules = (("heads", "model"), ("embed", None), ("head_dim", None))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules), nnx.use_eager_sharding(False):
        model = create()
    return {
        name: str(getattr(model, name)[...].sharding.spec)
        for name in ("w_q", "w_o", "relative_attention_bias")
    }


def train_step_case(mesh: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from relattn.nnx import RelativeAttention

    def build() -> RelativeAttention:
        return RelativeAttention(
            16, 2, "transformer_xl", causal=True, param_dtype=jnp.float64,
            rngs=nnx.Rngs(0), sharding_rules=RULES,
        )  # fmt: skip

    @nnx.jit
    def step(model: RelativeAttention, optimizer: nnx.Optimizer, x: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    x = jax.random.normal(jax.random.key(2), (BATCH, LENGTH, 16), dtype=jnp.float64)
    plain = build()
    plain_loss = step(plain, nnx.Optimizer(plain, optax.adam(0.01), wrt=nnx.Param), x)
    with jax.set_mesh(mesh):
        sharded = build()
        loss = step(
            sharded,
            nnx.Optimizer(sharded, optax.adam(0.01), wrt=nnx.Param),
            jax.device_put(x, NamedSharding(mesh, P("data"))),
        )
    return {
        "loss_diff": abs(float(loss) - float(plain_loss)),
        "param_diff": max(
            _max_diff(getattr(sharded, p.name)[...], getattr(plain, p.name)[...])
            for p in plain.config.parameters()
        ),
        "w_q_spec": str(sharded.w_q[...].sharding.spec),
    }


def main(out: str) -> None:
    import jax
    from jax.sharding import AxisType

    from relattn.layers import SCHEMES

    report: dict[str, Any] = {"devices": jax.device_count()}
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    cases = [(f"eager/{s}", lambda s=s: eager_case(s, mesh)) for s in SCHEMES]
    cases += [
        ("jit_init", lambda: jit_init_case(mesh)),
        ("train_step", lambda: train_step_case(mesh)),
    ]
    for name, case in cases:
        start = time.perf_counter()
        try:
            report[name] = case()
        except Exception as error:  # reported by name, the other cases still run
            report[name] = {"error": f"{type(error).__name__}: {error}",
                            "traceback": traceback.format_exc()}  # fmt: skip
        report.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 2)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
