"""Plans: the path relattn chooses for a call against the same call forced onto the fold.

For a few schemes of ``common.PLAN_SCHEMES`` (causal plain attention, ALiBi,
causal Transformer-XL), self-attention of ``L = 1024``, ``B = 1``, ``H = 8``,
``d = 64``, float32, on NumPy and PyTorch CPU: ``time_plan`` is relattn's call
as it comes (its plan, warm: ``common.plan_and_fold`` first calls it as often as
a plan that compiles a kernel after some calls of its signature needs, so the
plan timed is the one a loop settles on), ``time_fold`` the call under
``relattn.config.override(path="fold")``, and ``track_plan_over_fold`` the median
time of the first over the second's, alternating in one process: above 1, the
plan table chose a slower path than the fold. ``compare.py --only plans`` runs
every scheme on NumPy, PyTorch and JAX at two lengths. ``RELATTN_BENCH_QUICK``
runs the ratio with fewer repeats.
"""

from __future__ import annotations

from . import common

BACKENDS = ("numpy", "torch")
SCHEMES = ("causal", "alibi", "transformer-xl")
LENGTHS = (1024,)


class _Plans:
    params = [BACKENDS, SCHEMES, LENGTHS]
    param_names = ["backend", "scheme", "length"]
    timeout = 600

    def setup(self, backend, scheme, length):
        self.backend = common.get_backend(backend)
        arrays = common.on(self.backend, common.plan_inputs(scheme, length))
        self.plan, self.fold, self.chosen = common.plan_and_fold(scheme, self.backend, arrays)


class PlanOrFold(_Plans):
    """Speed of each side alone."""

    def time_plan(self, backend, scheme, length):
        common.ready(self.backend, self.plan())

    def time_fold(self, backend, scheme, length):
        common.ready(self.backend, self.fold())


class PlanOverFold(_Plans):
    """Median time of the plan over the forced fold's, alternating in one process."""

    unit = "plan/fold"

    def track_plan_over_fold(self, backend, scheme, length):
        return common.median_ratio(self.plan, self.fold, self.backend)[0]
