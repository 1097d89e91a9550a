"""Blockwise against dense: causal Transformer-XL attention at long lengths (issue 11).

``relative_attention`` with a causal-layout table ``(H, L, d)`` and per-head
``u``, ``v``, self-attention ``Lq = Lk = L``, ``B = 1``, ``H = 8``, ``d = 64``,
float32: the inputs of ``asv_bench/long_sequences.py`` (``inputs``). ``path``
``"blockwise"`` passes ``block_size=512``; ``"dense"`` passes ``block_size=None``
with ``relattn.config.max_score_bytes`` set far above any score array, so that
relattn's automatic choice stays dense at every length. NumPy, PyTorch CPU and
JAX (``jax.jit``), ``L`` = 1024 and 4096 (1024 with ``RELATTN_BENCH_QUICK``).

FlexAttention against the blockwise path is ``baselines.FlexAttentionVsBlockwise``
(native code); the memory curve over ``L`` up to 65 536 is ``long_sequences.py``'s.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from pathlib import Path
from typing import TYPE_CHECKING

from . import common

if TYPE_CHECKING:
    from relattn.testing import Target

BACKENDS = ("numpy", "torch", "jax")
LENGTHS = (1024,) if common.QUICK else (1024, 4096)
PATHS = ("blockwise", "dense")
BLOCK_SIZE = 512
#: ``relattn.config.max_score_bytes`` of the dense path: no score array reaches it.
DENSE_BUDGET = 1 << 62


@functools.cache
def long_sequences():
    """``asv_bench/long_sequences.py``, which sits beside the benchmark package."""
    path = Path(__file__).resolve().parents[1] / "long_sequences.py"
    spec = importlib.util.spec_from_file_location("long_sequences", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require_block_size() -> None:
    """``NotImplementedError`` (a skip) where ``relative_attention`` has no ``block_size``."""
    import relattn

    if "block_size" not in inspect.signature(relattn.relative_attention).parameters:
        raise NotImplementedError(f"relattn {relattn.__version__} has no block_size")


def long_call(backend: Target, arrays: dict, block_size: int | None):
    """relattn's causal Transformer-XL call on ``arrays`` (``long_sequences.inputs``)."""
    fn = common.relattn_function("relative_attention", backend, block_size=block_size)
    q, k, v, table, u, w = (arrays[n] for n in ("q", "k", "v", "table", "u", "w"))
    return functools.partial(fn, q, k, v, table, content_bias=u, position_bias=w)


class _DenseBudget:
    """Sets ``relattn.config.max_score_bytes`` for dense calls (``setup``), restores it
    (``teardown``)."""

    def force_dense(self) -> None:
        import relattn

        self._budget = relattn.config.max_score_bytes
        relattn.config.update("max_score_bytes", DENSE_BUDGET)

    def teardown(self, *params) -> None:
        import relattn

        if hasattr(self, "_budget"):
            relattn.config.update("max_score_bytes", self._budget)


class Blockwise(_DenseBudget, common._Speed):
    """Speed and host peak memory (``peakmem_*``: the process's) of each path."""

    params = [BACKENDS, LENGTHS, PATHS]
    param_names = ["backend", "length", "path"]
    timeout = 600

    def setup(self, backend, length, path):
        require_block_size()
        if path == "dense":
            self.force_dense()
        super().setup(backend, length, path)

    def inputs(self, backend, length, path):
        return common.on(backend, long_sequences().inputs(length))

    def call(self, backend, arrays, length, path):
        return long_call(backend, arrays, BLOCK_SIZE if path == "blockwise" else None)


class BlockwiseOverDense(_DenseBudget):
    """Median time of the blockwise path over the dense path's, alternating in one process."""

    params = [BACKENDS, LENGTHS]
    param_names = ["backend", "length"]
    timeout = 900
    unit = "blockwise/dense"

    def setup(self, backend, length):
        require_block_size()
        self.force_dense()
        self.backend = common.get_backend(backend)
        arrays = common.on(self.backend, long_sequences().inputs(length))
        self.blockwise = long_call(self.backend, arrays, BLOCK_SIZE)
        self.dense = long_call(self.backend, arrays, None)

    def track_blockwise_over_dense(self, backend, length):
        return common.median_ratio(self.blockwise, self.dense, self.backend)[0]
