"""The doctest run (``--doctest-modules`` over ``relattn``) imports every module; relattn's
kernel modules need their optional libraries, and are left out where those are missing."""

import importlib.util

collect_ignore = [
    path
    for path, library in (
        ("relattn/backends/_triton.py", "triton"),
        ("relattn/backends/_pallas.py", "jax"),
    )
    if importlib.util.find_spec(library) is None
]
