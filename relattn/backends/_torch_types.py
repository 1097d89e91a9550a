"""What relattn's PyTorch modules (:mod:`._torch`, :mod:`._flex`) both need to know of
torch's objects: whether a tensor is a DTensor, and a code object Dynamo compiles apart."""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Callable
from typing import Any


def is_dtensor(*xs: Any) -> bool:
    """Any of ``xs`` is a ``torch.distributed.tensor.DTensor``.

    Looked up in ``sys.modules``, not imported: importing
    ``torch.distributed.tensor`` takes seconds, and no DTensor exists before it
    has been imported.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and any(isinstance(x, module.DTensor) for x in xs)


def own_code(fn: Callable[..., Any]) -> types.CodeType:
    """A copy of ``fn``'s code object under a new name: Dynamo keeps compiled code, and
    counts recompiles against ``recompile_limit``, per code object, so a plan that
    compiles its own copy neither evicts nor is evicted by another plan's."""
    return fn.__code__.replace(co_name=f"{fn.__code__.co_name}_plan_{next(_COPIES)}")


_COPIES = itertools.count()
