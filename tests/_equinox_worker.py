"""Multi-device checks of :mod:`relattn.equinox` for ``tests/test_equinox.py``, in a new process.

JAX fixes its device count when it is first imported, and the test session has
imported it long before: so these checks run here, on 4 host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``, set below before JAX
is imported), in float64, on a ``("data", "model")`` mesh of ``2 × 2``. For
every scheme, the layer's parameters are laid out by their logical axes
(:func:`relattn.equinox.named_shardings` with ``{"heads": "model"}``: the
projections split by heads, the per-head tables too, the rest replicated) and
the input is split by batch over ``"data"``; the forward and the gradients
under ``eqx.filter_jit`` are compared with the same call on one device, and the
parameters' and gradients' shardings are read back. One optax step on the
sharded model checks that the updated parameters keep their shardings.
``python tests/_equinox_worker.py OUT.json`` writes one JSON object that the
tests assert on; each scheme is caught on its own, so that one failure is
reported by name.
"""

from __future__ import annotations

import os
import sys

DEVICES = 4
if __name__ == "__main__":
    # Before JAX is imported; not on import (pytest's --doctest-modules imports this file
    # into the test session, whose environment it must leave alone). LLVM's optimisations
    # and the fusion emitters off, as in tests/conftest.py: compiles dominate the run
    # (RELATTN_PLAIN_XLA=1 leaves XLA's defaults, for an XLA that lacks these flags).
    from _workers import use_host_devices

    use_host_devices(DEVICES)

import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

RULES = {"heads": "model"}
GRID = (2, 3)


def run() -> dict[str, Any]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from relattn.equinox import RelativeAttention, named_shardings, partition_specs
    from relattn.layers import SCHEMES

    devices = jax.devices()
    assert len(devices) == DEVICES, devices
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    data = NamedSharding(mesh, P("data"))

    @eqx.filter_jit
    def forward_and_grads(model, x, target):
        def loss(m):
            out = m(x)
            return jnp.sum(out * target), out

        (_, out), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model)
        return out, grads

    def max_diff(a, b) -> float:
        return max(
            (
                float(jnp.max(jnp.abs(u - v)))
                for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
            ),
            default=0.0,
        )

    def shardings_match(tree, specs) -> bool:
        return all(
            leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim)
            for leaf, spec in zip(jax.tree.leaves(tree), jax.tree.leaves(specs), strict=True)
        )

    result: dict[str, Any] = {"devices": len(devices), "schemes": {}}
    for number, scheme in enumerate(SCHEMES):
        started = time.perf_counter()
        try:
            grid = GRID if scheme in ("swin", "decomposed") else None
            length = 6 if grid else 7
            model = RelativeAttention(
                16, 2, scheme, causal=scheme in ("transformer_xl", "t5", "alibi", "rope"),
                grid=grid, param_dtype=jnp.float64, key=jax.random.key(number),
            )  # fmt: skip
            keys = jax.random.split(jax.random.key(100 + number))
            x = jax.random.normal(keys[0], (4, length, 16), dtype=jnp.float64)
            target = jax.random.normal(keys[1], (4, length, 16), dtype=jnp.float64)
            out, grads = forward_and_grads(model, x, target)

            specs = partition_specs(model, RULES)
            sharded = eqx.filter_shard(model, named_shardings(model, mesh, RULES))
            x_sharded = jax.device_put(x, data)
            out_s, grads_s = forward_and_grads(sharded, x_sharded, jax.device_put(target, data))
            # Eagerly too (no jit): the arrays relattn makes for sharded inputs (distances,
            # bucket indices) stay uncommitted, so JAX places them with the inputs.
            out_eager = sharded(x_sharded)
            result["schemes"][scheme] = {
                "forward": max_diff(out, out_s),
                "eager_forward": max_diff(out, out_eager),
                "grads": max_diff(grads, grads_s),
                "params_sharded": shardings_match(sharded, specs),
                "grads_sharded_like_params": shardings_match(grads_s, specs),
                "sharded_params": sorted(
                    name for name, spec in specs.params.items() if "model" in tuple(spec)
                ),
                "out_batch_sharded": out_s.sharding.is_equivalent_to(data, 3),
                "seconds": time.perf_counter() - started,
            }
        except Exception as exc:  # reported by name: the test fails on it
            result["schemes"][scheme] = {
                "error": traceback.format_exc(),
                "type": type(exc).__name__,
            }

    # One Adam step on the sharded T5 layer: the updated parameters keep their layout.
    try:
        model = RelativeAttention(16, 2, "t5", causal=True, param_dtype=jnp.float64,
                                  key=jax.random.key(7))  # fmt: skip
        shardings = named_shardings(model, mesh, RULES)
        model = eqx.filter_shard(model, shardings)
        optimizer = optax.adam(1e-2)
        state = optimizer.init(eqx.filter(model, eqx.is_array))
        x = jax.device_put(jax.random.normal(jax.random.key(8), (4, 7, 16)), data)

        @eqx.filter_jit
        def step(model, state, x):
            loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
            updates, state = optimizer.update(grads, state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), state, loss

        before = model
        model, state, loss = step(model, state, x)
        specs = partition_specs(model, RULES)
        result["step"] = {
            "params_sharded": shardings_match(model, specs),
            "changed": max_diff(model, before),
            "loss": float(loss),
        }
    except Exception as exc:
        result["step"] = {"error": traceback.format_exc(), "type": type(exc).__name__}
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    report = run()
    with open(sys.argv[-1], "w", encoding="utf-8") as out:
        json.dump(report, out, indent=1)
