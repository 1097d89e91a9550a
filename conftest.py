"""Collection at the repository root: the doctests of ``relattn.nnx``, ``relattn.equinox``
and ``relattn.keras`` import their framework, so they are collected only where it is
installed (the README's test command installs all three), and Keras's on its JAX backend."""

import importlib.util
import os

# Keras picks its backend when first imported, TensorFlow by default (not installed here):
# the doctests of relattn.keras run on its JAX backend unless the caller chose one.
os.environ.setdefault("KERAS_BACKEND", "jax")

collect_ignore = [
    f"relattn/{module}.py"
    for module, framework in (("nnx", "flax"), ("equinox", "equinox"), ("keras", "keras"))
    if importlib.util.find_spec(framework) is None
]
