"""Host peak memory of Shaw relative attention (SPEC §5, memory).

Three ways to compute one multi-head self-attention of length ``L`` on NumPy
float32 (``B = 1``, ``H = 8``, ``d_head = 64`` by default):

- ``shaw``: :func:`relattn.shaw.shaw_attention`, tables ``(2K+1, d_head)``;
- ``plain``: :func:`relattn.scaled_dot_product_attention` with a precomputed
  ``(L, L)`` bias, the floor any attention with a position term pays;
- ``materialised``: tensor2tensor's ``dot_product_attention_relative``, which
  gathers ``a^K_ij``, ``a^V_ij`` into ``(L, L, d_head)`` tensors (written below).

Each case runs in a fresh Python process so that peaks do not mix. Inputs are
built first; the number reported is the peak of the memory allocated after that:
``tracemalloc`` (it traces NumPy's buffers) and, as a check, the growth of the
process's ``ru_maxrss``. Not a test and not run by pytest::

    python asv_bench/shaw_memory.py              # L = 2048
    python asv_bench/shaw_memory.py --length 512
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tracemalloc

import numpy as np

CASES = ("shaw", "plain", "materialised")
MIB = 2**20


def build_inputs(case: str, length: int, heads: int, d_head: int, radius: int) -> dict:
    """float32 inputs of ``case``, drawn directly in float32 (no float64 temporaries)."""
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    arrays = {name: normal(1, heads, length, d_head) for name in ("q", "k", "v")}
    if case == "plain":
        arrays["bias"] = normal(length, length)
    else:
        arrays["key_table"] = normal(2 * radius + 1, d_head)
        arrays["value_table"] = normal(2 * radius + 1, d_head)
    return arrays


def _relative_embeddings(table: np.ndarray, length: int) -> np.ndarray:
    """tensor2tensor ``_generate_relative_positions_embeddings``: one row per pair, (L, L, d)."""
    radius = (table.shape[0] - 1) // 2
    positions = np.arange(length)
    distance = positions[None, :] - positions[:, None]  # j - i
    return table[np.clip(distance, -radius, radius) + radius]


def _relative_attention_inner(x, y, z, transpose):
    """tensor2tensor ``_relative_attention_inner``: x y(ᵀ) + x z(ᵀ) with z of shape (L, L, ·)."""
    batch, heads, length = x.shape[:3]
    xy = x @ (np.swapaxes(y, -1, -2) if transpose else y)
    x_t = np.transpose(x, (2, 0, 1, 3)).reshape(length, batch * heads, -1)
    xz = x_t @ (np.swapaxes(z, -1, -2) if transpose else z)
    xz = np.transpose(xz.reshape(length, batch, heads, -1), (1, 2, 0, 3))
    return xy + xz


def materialised_shaw(q, k, v, key_table, value_table):
    """tensor2tensor ``dot_product_attention_relative`` (Shaw et al. 2018, eq. (2)–(5))."""
    length = q.shape[-2]
    relations_keys = _relative_embeddings(key_table, length)  # (L, L, d): the cost
    relations_values = _relative_embeddings(value_table, length)
    q = q * np.float32(q.shape[-1] ** -0.5)
    logits = _relative_attention_inner(q, k, relations_keys, True)
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return _relative_attention_inner(weights, v, relations_values, False)


def compute(case: str, arrays: dict) -> np.ndarray:
    if case == "shaw":
        from relattn.shaw import shaw_attention

        return shaw_attention(*(arrays[n] for n in ("q", "k", "v", "key_table", "value_table")))
    if case == "plain":
        from relattn import scaled_dot_product_attention

        return scaled_dot_product_attention(**arrays)
    return materialised_shaw(**arrays)


def measure(case: str, length: int, heads: int, d_head: int, radius: int) -> dict:
    """Peak memory of one case in this process, over the inputs already built."""
    import relattn  # noqa: F401  (imports are not part of the peak)

    arrays = build_inputs(case, length, heads, d_head, radius)
    small = build_inputs(case, 8, heads, d_head, radius)
    compute(case, small)  # first-call caches (array-api-compat namespaces) off the books
    del small
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    out = compute(case, arrays)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert out.shape == (1, heads, length, d_head) and out.dtype == np.float32
    return {
        "case": case,
        "traced_mib": traced_peak / MIB,
        "rss_mib": max(rss_after - rss_before, 0) / 1024,
        "inputs_mib": sum(a.nbytes for a in arrays.values()) / MIB,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=2048, help="L = Lq = Lk (default 2048)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--radius", type=int, default=16, help="clipping K (Shaw et al.: 16)")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args(argv)
    sizes = (args.length, args.heads, args.d_head, args.radius)

    if args.case is not None:
        print(json.dumps(measure(args.case, *sizes)))
        return 0

    results = {}
    for case in CASES:
        cmd = [sys.executable, __file__, "--case", case, "--length", str(args.length)]
        cmd += ["--heads", str(args.heads), "--d-head", str(args.d_head)]
        cmd += ["--radius", str(args.radius)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[case] = json.loads(done.stdout.strip().splitlines()[-1])

    length, heads, d_head, radius = sizes
    scores = heads * length * length * 4 / MIB
    pair = length * length * d_head * 4 / MIB
    print(
        f"L = {length}, B = 1, H = {heads}, d_head = {d_head}, K = {radius}, float32, NumPy "
        f"{np.__version__}\none (B, H, L, L) score array = {scores:.0f} MiB; "
        f"one (L, L, d_head) tensor = {pair:.0f} MiB\n"
    )
    print(f"{'case':<14}{'traced peak MiB':>17}{'RSS growth MiB':>16}{'inputs MiB':>12}")
    for case in CASES:
        r = results[case]
        print(f"{case:<14}{r['traced_mib']:>17.1f}{r['rss_mib']:>16.1f}{r['inputs_mib']:>12.1f}")
    t = {case: results[case]["traced_mib"] for case in CASES}
    rss = {case: results[case]["rss_mib"] for case in CASES}
    print()
    print(
        f"shaw / plain:        {t['shaw'] / t['plain']:6.2f} (traced)  "
        f"{rss['shaw'] / max(rss['plain'], 1e-9):6.2f} (RSS)   target <= 1.25"
    )
    print(
        f"materialised / shaw: {t['materialised'] / t['shaw']:6.2f} (traced)  "
        f"{rss['materialised'] / max(rss['shaw'], 1e-9):6.2f} (RSS)   target >= 10"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
