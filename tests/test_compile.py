"""``torch.compile`` with Inductor, the default backend, on the attention functions.

``tests/test_transforms.py`` compiles every public function with
``fullgraph=True`` and the ``aot_eager`` backend (Dynamo's capture and
AOTAutograd). Here the generated code itself runs: forward and backward of the
attention functions, compiled once each, against eager PyTorch. Inductor builds
C++ on the CPU in worker processes, so these tests are slow (marked ``subprocess``).
"""

from __future__ import annotations

import numpy as np
import pytest

import relattn

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

LQ, LK, D = 4, 7, 8


def _inputs(torch_backend, rng, width):
    shapes = {
        "q": (2, 3, LQ, D),
        "k": (2, 3, LK, D),
        "v": (2, 3, LK, D),
        "table": (width, D),
        "u": (3, 1, D),
    }
    return {
        name: torch_backend.asarray(rng.normal(size=s), "float64").requires_grad_(True)
        for name, s in shapes.items()
    }


#: name -> (table width, call(inputs, xp, device)).
CALLS = {
    "relative_attention[causal]": (
        LK,
        lambda a, xp, device: relattn.relative_attention(
            a["q"], a["k"], a["v"], a["table"], content_bias=a["u"], position_bias=a["u"]
        ),
    ),
    "relative_attention[full]": (
        LQ + LK - 1,
        lambda a, xp, device: relattn.relative_attention(
            a["q"], a["k"], a["v"], a["table"], content_bias=a["u"], position_bias=a["u"]
        ),
    ),
    "scaled_dot_product_attention": (
        LK,
        lambda a, xp, device: relattn.scaled_dot_product_attention(
            a["q"], a["k"], a["v"], mask=relattn.causal_mask(LQ, LK, xp=xp, device=device)
        ),
    ),
    "shaw_attention": (
        5,  # distances -2 … 2
        lambda a, xp, device: relattn.shaw_attention(
            a["q"], a["k"], a["v"], a["table"], a["table"]
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_inductor_equals_eager(torch_backend, name):
    width, call = CALLS[name]
    compiled = torch_backend.compile(call)  # torch.compile(fullgraph=True), Inductor
    to_host = torch_backend.to_host
    results = []
    for fn in (call, compiled):
        inputs = _inputs(torch_backend, np.random.default_rng(7), width)
        out = fn(inputs, torch_backend.lib, torch_backend.device)
        out.pow(2).sum().backward()
        grads = [None if t.grad is None else to_host(t.grad) for t in inputs.values()]
        results.append((to_host(out), grads))
    (eager, eager_grads), (got, got_grads) = results
    np.testing.assert_allclose(got, eager, rtol=1e-10, atol=1e-12)
    assert [g is None for g in got_grads] == [e is None for e in eager_grads]
    for g, e in zip(got_grads, eager_grads, strict=True):
        if e is None:
            continue
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-11)
