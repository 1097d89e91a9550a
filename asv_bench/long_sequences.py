"""Long sequences: peak memory and time of blockwise relative attention against dense.

Causal Transformer-XL attention (``relative_attention`` with a causal-layout
table, per-head ``u`` and ``v``), B = 1, H = 8, d = 64, float32, self-attention
of length L. Three measurements, each printed as a markdown table and saved to
``asv_bench/long-sequences.json`` (read by the docs' memory plot):

``memory``
    One fresh process per (backend, path, L): inputs, one call to warm up
    (JAX compiles), then one timed call. Peak memory is the process's peak
    resident set (``VmHWM``: NumPy, PyTorch and JAX allocations alike)
    minus its resident set before the timed call, and, for the target, the
    peak itself. Dense stops where its scores would not fit in memory.
``speed``
    At L = 4096, side by side in one process: blockwise ÷ dense, and blockwise
    ÷ the three matrix products a dense call cannot avoid (``(q+u) kᵀ``,
    ``(q+v) Rᵀ``, ``P v``, each timed alone). With ``--before DIR`` (a
    directory holding an earlier ``relattn`` package, e.g. from
    ``git archive <commit> relattn | tar -x -C DIR``), also blockwise ÷ that
    release's dense path, imported beside the current one as ``relattn_before``.
``backward``
    One fresh process per (backend, path, L): peak resident memory and time of
    the forward and backward pass (the gradient of ``sum(out · g)`` for all of
    ``q``, ``k``, ``v``, the table, ``u`` and ``v``) on PyTorch and JAX.
``flex``
    PyTorch's FlexAttention (``torch.compile(flex_attention)``) with the
    Transformer-XL position term as a ``score_mod`` (``(q+v) Rᵀ`` gathered per
    distance) and a causal block mask, against relattn's blockwise path, time
    and peak memory, at L = 4096 and 16 384.

Usage (from the repository root)::

    python asv_bench/long_sequences.py memory --backend numpy --lengths 1024 4096 16384 65536
    python asv_bench/long_sequences.py speed --before /tmp/before
    python asv_bench/long_sequences.py backward --lengths 4096 16384
    python asv_bench/long_sequences.py flex
    python asv_bench/long_sequences.py all      # all three, the JSON and the tables
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "long-sequences.json"
HEADS, D_HEAD = 8, 64
BACKENDS = ("numpy", "torch", "jax")
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
#: Dense holds a few (H, L, L) float32 arrays: beyond this length it would not fit here.
DENSE_LIMIT = 8192


# -- one call, in whatever process runs it -----------------------------------------------------
def inputs(length: int, seed: int = 0) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> Any:
        return rng.standard_normal(shape, dtype=np.float32)

    return {
        "q": normal(1, HEADS, length, D_HEAD),
        "k": normal(1, HEADS, length, D_HEAD),
        "v": normal(1, HEADS, length, D_HEAD),
        "table": normal(HEADS, length, D_HEAD),  # the causal layout, W = Lk
        "u": normal(HEADS, 1, D_HEAD) * 0.1,
        "w": normal(HEADS, 1, D_HEAD) * 0.1,
    }


def relattn_call(backend: str, arrays: dict[str, Any], block_size: Any | None) -> Any:
    """A no-argument call of relattn on ``backend``'s copies of ``arrays`` (``jax.jit`` on JAX)."""
    import relattn
    from relattn.testing import target

    on = target(backend)
    a = {name: on.from_host(x) for name, x in arrays.items()}

    def call(q: Any, k: Any, v: Any, table: Any, u: Any, w: Any) -> Any:
        return relattn.relative_attention(
            q, k, v, table, content_bias=u, position_bias=w, block_size=block_size
        )

    fn = on.default_jit(call)
    return lambda: on.ready(fn(**a))


def measure_one(
    backend: str, path: str, length: int, block_size: Any, before: str | None = None
) -> dict[str, Any]:
    """Run in a fresh process: peak RSS and seconds of one call.

    ``path``: ``dense``, ``blockwise`` or ``before`` (the earlier release in
    directory ``before``, whose dense path held the whole ``(L, L)`` scores).
    """
    if backend == "torch":
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    if path == "dense":
        import relattn

        relattn.config.update("max_score_bytes", 1 << 62)  # dense whatever the size
    module = load_before(before) if path == "before" and before else None
    size = block_size if path == "blockwise" else None
    # One call only: the peak is the process's so far, so a warm-up call would hide
    # the measured one. JAX compiles ahead of the call (lower/compile).
    if backend == "jax":
        call = _compiled_ahead(length, size, module)
    elif module is not None:
        call = before_call(module, backend, inputs(length))
    else:
        call = relattn_call(backend, inputs(length), size)
    return _measured(call, backend=backend, path=path, length=length)


def _measured(call: Any, **labels: Any) -> dict[str, Any]:
    """``labels`` with the seconds of one ``call()``, the process's peak RSS and its increment."""
    before = _rss_bytes()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    peak = _peak_rss_bytes()
    return {
        **labels,
        "peak_bytes": peak,
        "increment_bytes": max(peak - before, 0),
        "seconds": seconds,
    }


def _compiled_ahead(length: int, block_size: Any, module: Any = None) -> Any:
    """JAX: the call (of ``module``, else relattn) compiled before it runs."""
    import jax
    import relattn

    a = {name: jax.numpy.asarray(x) for name, x in inputs(length).items()}
    keywords = {} if module is not None else {"block_size": block_size}
    function = (module or relattn).relative_attention

    def call(q: Any, k: Any, v: Any, table: Any, u: Any, w: Any) -> Any:
        return function(q, k, v, table, content_bias=u, position_bias=w, **keywords)

    compiled = jax.jit(call).lower(**a).compile()
    return lambda: jax.block_until_ready(compiled(**a))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    """This process's peak resident set (``VmHWM``; ``ru_maxrss`` can carry a forking parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _fresh_process(arguments: list[str]) -> dict[str, Any] | None:
    """This script run with ``arguments`` in a fresh interpreter: its JSON row, or ``None``
    (the failure printed) where it failed."""
    command = [sys.executable, __file__, *arguments]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        print(f"{' '.join(arguments)}: failed\n{done.stderr[-3000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sizes(block_size: Any) -> list[str]:
    """``--block-size``'s arguments for ``block_size`` (an integer or a pair)."""
    return [str(n) for n in (block_size if isinstance(block_size, tuple) else (block_size,))]


def sweep(
    worker: str,
    backends: list[str],
    lengths: list[int],
    block_size: Any,
    dense_limit: int,
    before: str | None = None,
    paths: tuple[str, ...] = ("dense", "blockwise", "before"),
) -> list[dict[str, Any]]:
    """``worker`` (``one`` or ``backward-one``) in a fresh process per (backend, path, L)."""
    rows = []
    for backend in backends:
        for path in [p for p in paths if p != "before" or before]:
            for length in lengths:
                if path != "blockwise" and length > dense_limit:
                    continue
                extra = ("--before", before) if before else ()
                arguments = [worker, backend, path, str(length),
                             "--block-size", *_sizes(block_size), *extra]  # fmt: skip
                row = _fresh_process(arguments)
                if row is None:
                    continue
                print(
                    f"{worker:12} {backend:6} {path:9} L={length:6}:"
                    f" peak {row['peak_bytes'] / 2**20:8.0f} MiB"
                    f"  call {row['increment_bytes'] / 2**20:8.0f} MiB  {row['seconds']:8.2f} s",
                    flush=True,
                )
                rows.append(row)
    return rows


def memory(
    backends: list[str], lengths: list[int], block_size: Any, before: str | None, paths: Any
) -> list[dict[str, Any]]:
    return sweep("one", backends, lengths, block_size, DENSE_LIMIT, before, tuple(paths))


def growth(
    rows: list[dict[str, Any]], key: str, shortest: int = 4096
) -> dict[tuple[str, str], float]:
    """Least-squares exponent of ``key`` against L >= ``shortest`` (log–log), per path."""
    import numpy as np

    out = {}
    for backend, path in {(r["backend"], r["path"]) for r in rows}:
        pts = sorted(
            (r["length"], r[key]) for r in rows if (r["backend"], r["path"]) == (backend, path)
        )
        pts = [(x, y) for x, y in pts if y > 0 and x >= shortest]
        if len(pts) >= 2:
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            out[backend, path] = float(np.polyfit(x, y, 1)[0])
    return out


# -- forward and backward -------------------------------------------------------
def backward_one(backend: str, path: str, length: int, block_size: Any) -> dict[str, Any]:
    """Run in a fresh process: peak RSS and seconds of one forward and backward pass."""
    import numpy as np
    import relattn

    size = None if path == "dense" else block_size
    if path == "dense":
        relattn.config.update("max_score_bytes", 1 << 62)
    arrays = inputs(length)
    names = ("q", "k", "v", "table", "u", "w")
    cotangent = np.random.default_rng(1).standard_normal(arrays["q"].shape, dtype=np.float32)

    def loss(q: Any, k: Any, v: Any, table: Any, u: Any, w: Any, g: Any) -> Any:
        out = relattn.relative_attention(
            q, k, v, table, content_bias=u, position_bias=w, block_size=size
        )
        return (out * g).sum()

    if backend == "torch":
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        leaves = [torch.from_numpy(arrays[n]).requires_grad_() for n in names]
        g = torch.from_numpy(cotangent)

        def call() -> Any:
            loss(*leaves, g).backward()
            return [x.grad for x in leaves]

    elif backend == "jax":
        import jax

        a = [jax.numpy.asarray(arrays[n]) for n in names]
        g = jax.numpy.asarray(cotangent)
        compiled = jax.jit(jax.grad(loss, argnums=tuple(range(6)))).lower(*a, g).compile()

        def call() -> Any:
            return jax.block_until_ready(compiled(*a, g))

    else:
        raise SystemExit(f"backward: no gradients on {backend}")
    return _measured(call, backend=backend, path=path, length=length)


def backward(backends: list[str], lengths: list[int], block_size: Any) -> list[dict[str, Any]]:
    with_grads = [b for b in backends if b != "numpy"]
    return sweep("backward-one", with_grads, lengths, block_size, DENSE_LIMIT // 2)


# -- speed at L = 4096 -----------------------------------------------------------------------------
def median_time(fn: Any, repeats: int) -> float:
    """Median seconds of ``repeats`` calls (at least one), after one untimed call if ``repeats``."""
    if repeats:
        fn()
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_before(directory: str) -> Any:
    """The ``relattn`` package under ``directory``, imported as ``relattn_before``."""
    import importlib.util

    init = Path(directory) / "relattn" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "relattn_before", init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["relattn_before"] = module
    spec.loader.exec_module(module)
    return module


def before_call(module: Any, backend: str, arrays: dict[str, Any]) -> Any:
    """The earlier release's (dense) ``relative_attention`` on the same inputs."""
    from relattn.testing import target

    on = target(backend)
    a = {name: on.from_host(x) for name, x in arrays.items()}

    def call(q: Any, k: Any, v: Any, table: Any, u: Any, w: Any) -> Any:
        return module.relative_attention(q, k, v, table, content_bias=u, position_bias=w)

    fn = on.default_jit(call)
    return lambda: on.ready(fn(**a))


def speed(
    backends: list[str], length: int, block_size: Any, repeats: int, before: str | None
) -> list[dict[str, Any]]:
    rows = []
    arrays = inputs(length)
    import relattn

    relattn.config.update("max_score_bytes", 1 << 62)  # dense means dense here
    earlier = load_before(before) if before else None
    for backend in backends:
        calls = {
            "dense": relattn_call(backend, arrays, None),
            "blockwise": relattn_call(backend, arrays, block_size),
            "products": matmuls(backend, arrays),
        }
        if earlier is not None:
            calls["before"] = before_call(earlier, backend, arrays)
        for fn in calls.values():
            fn()
        # alternate the calls, so that drifts hit them alike
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(repeats):
            for name, fn in calls.items():
                times[name].append(median_time(fn, 0))
        row: dict[str, Any] = {"backend": backend, "length": length, "block_size": block_size}
        row.update({name: statistics.median(t) for name, t in times.items()})
        b = row["blockwise"]
        text = " ".join(f" {name} {row[name] * 1e3:8.1f} ms" for name in calls)
        ratios = " ".join(
            f" blockwise/{name} {b / row[name]:5.2f}" for name in calls if name != "blockwise"
        )
        print(f"{backend:6} L={length}:{text} {ratios}", flush=True)
        rows.append(row)
    return rows


def matmuls(backend: str, arrays: dict[str, Any]) -> Any:
    """The three products of a dense causal call, each over the whole (L, L) scores."""
    from relattn.testing import target

    on = target(backend)
    lib = on.lib
    a = {name: on.from_host(x) for name, x in arrays.items()}
    q, k, v, table, u, w = (a[n] for n in ("q", "k", "v", "table", "u", "w"))

    def transpose(x: Any) -> Any:
        return lib.swapaxes(x, -1, -2) if hasattr(lib, "swapaxes") else x.mT

    def products(q: Any, k: Any, v: Any, table: Any, u: Any, w: Any) -> Any:
        scores = (q + u) @ transpose(k)
        position = (q + w) @ transpose(table)
        return scores, position, scores @ v

    fn = on.default_jit(products)
    return lambda: on.ready(fn(q, k, v, table, u, w))


# -- FlexAttention ---------------------------------------------------------------------------------
def flex(lengths: list[int], block_size: Any, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for length in lengths:
        for who in ("flex", "relattn"):
            arguments = ["flex-one", who, str(length), "--block-size", *_sizes(block_size),
                         "--repeats", str(repeats)]  # fmt: skip
            row = _fresh_process(arguments)
            if row is None:
                continue
            print(
                f"{who:8} L={length:6}: {row['seconds'] * 1e3:9.1f} ms"
                f"  peak {row['peak_bytes'] / 2**20:7.0f} MiB"
                f"  call {row['increment_bytes'] / 2**20:7.0f} MiB"
                f"  (compile {row['compile_seconds']:.0f} s)",
                flush=True,
            )
            rows.append(row)
    return rows


def flex_one(who: str, length: int, block_size: Any, repeats: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    arrays = {n: torch.from_numpy(x) for n, x in inputs(length).items()}
    q, k, v, table, u, w = (arrays[n] for n in ("q", "k", "v", "table", "u", "w"))
    scale = D_HEAD**-0.5
    if who == "flex":
        sys.path.insert(0, str(HERE))
        from benchmarks.native import torch_flex_transformer_xl

        start = time.perf_counter()
        call = torch_flex_transformer_xl(q, k, v, table, u, w, scale)
        call()
        compile_seconds = time.perf_counter() - start
    else:
        import relattn

        start = time.perf_counter()

        def call() -> Any:
            return relattn.relative_attention(
                q, k, v, table, content_bias=u, position_bias=w, block_size=block_size
            )

        call()
        compile_seconds = time.perf_counter() - start
    before = _rss_bytes()
    seconds = statistics.median(_timed(call) for _ in range(repeats))
    peak = _peak_rss_bytes()
    return {
        "who": who,
        "length": length,
        "seconds": seconds,
        "peak_bytes": peak,
        "increment_bytes": max(peak - before, 0),
        "compile_seconds": compile_seconds,
    }


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- the saved results as markdown ----------------------------------------------
def report(saved: dict[str, Any]) -> str:
    """Markdown tables of ``saved`` (``long-sequences.json``): memory, speed, backward, flex."""
    mib = 2**20
    out = [f"`{saved.get('command', '')}`; {saved.get('environment', '')}", ""]
    rows = saved.get("rows", [])
    if rows:
        lengths = sorted({r["length"] for r in rows})
        keys = sorted({(r["backend"], r["path"]) for r in rows})
        out += ["Peak resident memory of the process, MiB (seconds of the call):", ""]
        out += ["| backend | path | " + " | ".join(f"L={n}" for n in lengths) + " |"]
        out += ["|---|---|" + "---|" * len(lengths)]
        for backend, path in keys:
            cells = {r["length"]: r for r in rows if (r["backend"], r["path"]) == (backend, path)}
            out.append(
                f"| {backend} | {path} | "
                + " | ".join(
                    f"{cells[n]['peak_bytes'] / mib:.0f} ({cells[n]['seconds']:.2f} s)"
                    if n in cells
                    else "–"
                    for n in lengths
                )
                + " |"
            )
        out += ["", "Growth with L >= 4096 (least squares on log–log; memory: the call's", ""]
        out[-2] += " increment over the process's resident set before it):"
        peak, seconds = growth(rows, "increment_bytes"), growth(rows, "seconds")
        for key in sorted(peak):
            out.append(f"- {key[0]} {key[1]}: memory L^{peak[key]:.2f}, time L^{seconds[key]:.2f}")
        out.append("")
    for row in saved.get("speed", []):
        b = row["blockwise"]
        ratios = ", ".join(
            f"blockwise/{name} {b / row[name]:.2f}"
            for name in ("dense", "products", "before")
            if name in row
        )
        out.append(f"- speed {row['backend']} L={row['length']}: {ratios}")
    for row in saved.get("backward", []):
        out.append(
            f"- forward+backward {row['backend']} {row['path']} L={row['length']}:"
            f" peak {row['peak_bytes'] / mib:.0f} MiB, {row['seconds']:.2f} s"
        )
    for row in saved.get("flex", []):
        out.append(
            f"- {row['who']} L={row['length']}: {row['seconds'] * 1e3:.0f} ms,"
            f" peak {row['peak_bytes'] / mib:.0f} MiB"
        )
    return "\n".join(out)


# -- the command line ------------------------------------------------------------
def environment() -> str:
    import numpy as np

    parts = [platform.machine(), f"{os.cpu_count()} CPUs", f"numpy {np.__version__}"]
    for name in ("torch", "jax"):
        try:
            module = __import__(name)
            parts.append(f"{name} {module.__version__}")
        except ImportError:
            pass
    return ", ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("report", help="the saved results as markdown")
    for name in ("memory", "speed", "backward", "flex", "all"):
        p = sub.add_parser(name)
        p.add_argument("--backend", action="append", choices=BACKENDS)
        p.add_argument("--lengths", type=int, nargs="+")
        p.add_argument("--block-size", type=int, nargs="+", default=[256, 512])
        p.add_argument("--repeats", type=int, default=5)
        p.add_argument("--before", help="directory of an earlier relattn package")
        p.add_argument("--paths", nargs="+", default=["dense", "blockwise", "before"])
        p.add_argument("--no-save", action="store_true")
    one = sub.add_parser("one")
    one.add_argument("backend")
    one.add_argument("path")
    one.add_argument("length", type=int)
    one.add_argument("--block-size", type=int, nargs="+", default=[256, 512])
    one.add_argument("--before")
    back = sub.add_parser("backward-one")
    back.add_argument("backend")
    back.add_argument("path")
    back.add_argument("length", type=int)
    back.add_argument("--block-size", type=int, nargs="+", default=[256, 512])
    flex_parser = sub.add_parser("flex-one")
    flex_parser.add_argument("who")
    flex_parser.add_argument("length", type=int)
    flex_parser.add_argument("--block-size", type=int, nargs="+", default=[256, 512])
    flex_parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # one size for both blocks, or (query block, key block)
    sizes = getattr(args, "block_size", [0])
    args.block_size = sizes[0] if len(sizes) == 1 else tuple(sizes)

    if args.command == "one":
        row = measure_one(args.backend, args.path, args.length, args.block_size, args.before)
        print(json.dumps(row))
        return 0
    if args.command == "backward-one":
        row = backward_one(args.backend, args.path, args.length, args.block_size)
        print(json.dumps(row))
        return 0
    if args.command == "flex-one":
        print(json.dumps(flex_one(args.who, args.length, args.block_size, args.repeats)))
        return 0
    if args.command == "report":
        print(report(json.loads(RESULTS.read_text())))
        return 0
    backends = args.backend or list(BACKENDS)
    saved = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    saved.update({"command": "python asv_bench/" + " ".join([Path(__file__).name, *sys.argv[1:]]),
                  "environment": environment()})  # fmt: skip
    if args.command in ("memory", "all"):
        lengths = args.lengths or list(LENGTHS)
        rows = memory(backends, lengths, args.block_size, args.before, args.paths)
        # Rows of paths not run now are kept from the saved results.
        kept = [r for r in saved.get("rows", []) if r["path"] not in args.paths]
        saved["rows"] = kept + rows
        for key in ("increment_bytes", "seconds"):
            for (backend, path), exponent in sorted(growth(saved["rows"], key).items()):
                print(f"growth of {key} with L, {backend} {path}: L^{exponent:.2f}")
    if args.command in ("speed", "all"):
        saved["speed"] = [
            row
            for length in (args.lengths if args.command == "speed" and args.lengths else [4096])
            for row in speed(backends, length, args.block_size, args.repeats, args.before)
        ]
    if args.command in ("backward", "all"):
        lengths = args.lengths or [2048, 4096, 16384]
        saved["backward"] = backward(backends, lengths, args.block_size)
    if args.command in ("flex", "all"):
        saved["flex"] = flex(args.lengths or [4096, 16384], args.block_size, args.repeats)
    if not args.no_save:
        RESULTS.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
