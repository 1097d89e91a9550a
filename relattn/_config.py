"""relattn's settings: the dense path's memory budget and the choice of path.

One object, :data:`config`, as ``jax.config`` is one: read a setting as an
attribute, change it with :meth:`Config.update`, or for a ``with`` block with
:meth:`Config.override`. The settings are the process's, as
``torch.nn.attention.sdpa_kernel``'s are (a plain attribute, which
``torch.compile`` reads and guards on; a ``contextvars`` variable it cannot
trace). The budget starts from
the environment variable ``RELATTN_MAX_SCORE_BYTES``, read once, when relattn
is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["PATHS", "Config", "Settings", "config"]

#: The paths a plan can take (:mod:`relattn.plan`), the names ``path=`` accepts.
PATHS = ("fused", "flex", "triton", "pallas", "dense", "fold")


@dataclass(frozen=True)
class Settings:
    """The values of :data:`config` at one moment (hashable: plans are kept per settings).

    Attributes
    ----------
    max_score_bytes : int or None
        The dense path's budget: the bytes its temporaries may take at their peak
        (about three score-sized arrays for plain attention, seven for Shaw's key
        and value terms; :func:`relattn.plan.dense_peak_bytes`). A problem whose
        dense peak exceeds it runs blockwise in ``O(L)`` memory. ``None``: from
        the device, :data:`relattn.plan.CPU_BUDGET` on a CPU and a quarter of the
        free memory on a GPU (:func:`relattn.plan.device_budget`).
    path : str or None
        Force one path for every call (``"fused"``: the library's attention
        kernel; ``"flex"``: FlexAttention; ``"triton"``, ``"pallas"``: relattn's
        relative-position kernels, in their interpreters on a CPU; ``"dense"``;
        ``"fold"``: the block fold), as ``torch.nn.attention.sdpa_kernel``
        forces a backend: a call that path cannot compute raises ``ValueError``
        saying why. ``None``: the plan chooses.
    compile : bool or None
        Whether paths that compile on their first call of each shape
        (FlexAttention, the fold's compiled block step) may be chosen.
        ``None``: where a compile pays for itself: on GPUs; on a CPU,
        FlexAttention from a signature's 16th call on where its scores are
        large and masked by causality, segments or ``mask_mod``
        (:data:`relattn.plan.CPU_COMPILE_AFTER`; its compile takes 9–12 s on
        a 2-core CPU). ``True``: wherever they compute the call. ``False``:
        never.
    """

    max_score_bytes: int | None = None
    path: str | None = None
    compile: bool | None = None


def _checked(name: str, value: Any) -> Any:
    """``value`` for setting ``name``, or ``ValueError``/``TypeError`` naming it."""
    if name == "max_score_bytes":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"max_score_bytes must be a positive integer (bytes) or None, got "
                f"{type(value).__name__}"
            )
        if value < 1:
            raise ValueError(f"max_score_bytes must be a positive integer (bytes), got {value}")
        return value
    if name == "path":
        if value is not None and value not in PATHS:
            raise ValueError(f"path must be None or one of {PATHS}, got {value!r}")
        return value
    if name == "compile":
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"compile must be True, False or None, got {type(value).__name__}")
        return value
    names = ", ".join(f.name for f in dataclasses.fields(Settings))
    raise ValueError(f"relattn.config has no setting {name!r}; the settings are {names}")


def _from_environment() -> Settings:
    """The settings at import: ``RELATTN_MAX_SCORE_BYTES`` when set."""
    given = os.environ.get("RELATTN_MAX_SCORE_BYTES")
    if given is None or given == "":
        return Settings()
    try:
        budget = int(given)
    except ValueError:
        budget = 0
    if budget < 1:
        raise ValueError(
            f"RELATTN_MAX_SCORE_BYTES must be a positive integer (bytes), got {given!r}"
        )
    return Settings(max_score_bytes=budget)


class Config:
    """The settings of relattn, one :class:`Settings` at a time.

    Read them as attributes, set one with :meth:`update`, or several for a
    ``with`` block with :meth:`override`.

    Examples
    --------
    >>> import relattn
    >>> with relattn.config.override(max_score_bytes=1 << 20):
    ...     relattn.config.max_score_bytes
    1048576
    >>> relattn.config.path is None
    True
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @property
    def settings(self) -> Settings:
        """The current :class:`Settings`."""
        return self._settings

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in Settings.__dataclass_fields__:
            return getattr(self._settings, name)
        raise AttributeError(f"relattn.config has no setting {name!r}")

    def update(self, name: str, value: Any) -> None:
        """Set one setting from now on."""
        self._settings = dataclasses.replace(self._settings, **{name: _checked(name, value)})

    @contextlib.contextmanager
    def override(self, **values: Any) -> Iterator[Settings]:
        """Settings changed for a ``with`` block, restored after it (even on an error)."""
        checked = {name: _checked(name, value) for name, value in values.items()}
        saved = self._settings
        self._settings = dataclasses.replace(saved, **checked)
        try:
            yield self._settings
        finally:
            self._settings = saved

    def __repr__(self) -> str:
        return f"relattn.config: {self.settings}"


#: relattn's settings.
config = Config(_from_environment())
