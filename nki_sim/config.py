"""Simulator switches: process-wide defaults plus per-thread ``configure`` overrides.

``nki_sim.config.<name>`` reads the calling thread's innermost ``configure(...)`` override,
else the process-wide default.  ``with configure(name=value): ...`` overrides a switch for
the calling thread only, until the block exits.  Assigning ``nki_sim.config.<name> = value``
changes the calling thread's override when an enclosing ``configure`` block of this thread
overrides that switch (undone when that block exits), else the process-wide default, which
every thread without its own override sees (nki_sim/README.md, "Threads").
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, fields

from .state import state
from .versions import parse as _parse_sdk


@dataclass
class Config:
    # "raise" (default): reading never-written memory raises UninitializedReadError;
    # "warn": RuntimeWarning; "ignore": poison values flow silently.
    uninitialized: str = "raise"
    # affine_range loop-carried dependency checker on/off.
    check_dependencies: bool = True
    # Tensors created inside an affine / sequential loop body may not be used after the loop
    # (err_local_variable_used_out_of_scope).
    check_scope: bool = True
    # Block dimensions (dims before par_dim): "auto" follows the simulated SDK (accepted up to
    # 2.22, warning from 2.23 on); "error" / "warn" / "allow" override it.
    block_dims: str = "auto"
    # nl.store directly from a PSUM tile is supported from Neuron SDK 2.26 only: below that,
    # False rejects it (copy to SBUF first with nl.copy / nisa.tensor_copy).
    allow_psum_store: bool = False
    # "off" (default): loop variables are plain ints. "warn" / "error": affine / sequential loop
    # variables are traced ints whose use in Python control flow (if / while / bool) warns or
    # raises, as legacy NKI traces those bodies once (nl.static_range stays plain).
    traced_loops: str = "off"
    # Simulated Neuron SDK release (legacy NKI generation): APIs / keywords added after it are
    # absent, as on the real toolchain. Env NKI_SIM_SDK (e.g. "2.26") sets the default.
    sdk: tuple = (2, 24)
    # Legacy (SDK 2.20) convention: outputs passed in as arguments and written in place.
    # When True, writes to non-annotated inputs are allowed and copied back to the caller.
    legacy_inplace_outputs: bool = False

    def __setattr__(self, name, value):
        object.__setattr__(self, name, _normalise(name, value))


def _normalise(name, value):
    if name == "sdk":
        return _parse_sdk(value)
    return value


defaults = Config()
"""The process-wide defaults (what a thread sees outside any ``configure`` block)."""
if os.environ.get("NKI_SIM_SDK", "").strip():
    defaults.sdk = os.environ["NKI_SIM_SDK"]
_NAMES = frozenset(f.name for f in fields(Config))
_CHOICES = {"uninitialized": ("raise", "warn", "ignore"), "block_dims": ("auto", "error", "warn", "allow"),
            "traced_loops": ("off", "warn", "error")}


class _ConfigView:
    """``nki_sim.config``: the switches as the calling thread sees them (module docstring)."""

    __slots__ = ()

    def __setattr__(self, name, value):
        if name not in _NAMES:
            raise AttributeError(f"nki_sim.config has no switch {name!r}; valid: {sorted(_NAMES)}")
        ov = state.overrides
        if name in ov:
            ov[name] = _normalise(name, value)
        else:
            setattr(defaults, name, value)

    def __repr__(self):
        return "nki_sim.config(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in sorted(_NAMES)) + ")"


def _reader(name):
    default = defaults.__dict__

    def get(self):
        ov = state.overrides
        if ov and name in ov:
            return ov[name]
        return default[name]
    return property(get, doc=f"effective value of the {name!r} switch in the calling thread")


for _n in _NAMES:
    setattr(_ConfigView, _n, _reader(_n))
del _n

config = _ConfigView()


@contextlib.contextmanager
def configure(**changes):
    """Temporarily change simulator switches for the calling thread:
    ``with configure(uninitialized="ignore"): ...``."""
    for k, v in changes.items():
        if k not in _NAMES:
            raise ValueError(f"configure: unknown switch {k!r}; valid: {sorted(_NAMES)}")
        if k in _CHOICES and v not in _CHOICES[k]:
            raise ValueError(f"configure: {k} must be one of {_CHOICES[k]}; got {v!r}")
    if "sdk" in changes:
        changes["sdk"] = _parse_sdk(changes["sdk"])      # validate before changing anything
    ov = state.overrides
    missing = object()
    old = {k: ov.get(k, missing) for k in changes}
    ov.update(changes)
    try:
        yield config
    finally:
        for k, v in old.items():
            if v is missing:
                ov.pop(k, None)
            else:
                ov[k] = v
