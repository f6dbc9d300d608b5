"""Simulator switches (module-level, mutable; use :func:`configure` as a context manager)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, fields


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
    # 2.22, warning in 2.23-2.24, error from 2.25); "error" / "warn" / "allow" override it.
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
        if name == "sdk":                       # keep nl / nisa module contents in step
            from .sdk import parse, sync
            object.__setattr__(self, name, parse(value))
            sync()
        else:
            object.__setattr__(self, name, value)


config = Config()
if os.environ.get("NKI_SIM_SDK", "").strip():
    config.sdk = os.environ["NKI_SIM_SDK"]
_CHOICES = {"uninitialized": ("raise", "warn", "ignore"), "block_dims": ("auto", "error", "warn", "allow"),
            "traced_loops": ("off", "warn", "error")}


@contextlib.contextmanager
def configure(**changes):
    """Temporarily change simulator switches: ``with configure(uninitialized="ignore"): ...``."""
    names = {f.name for f in fields(Config)}
    for k, v in changes.items():
        if k not in names:
            raise ValueError(f"configure: unknown switch {k!r}; valid: {sorted(names)}")
        if k in _CHOICES and v not in _CHOICES[k]:
            raise ValueError(f"configure: {k} must be one of {_CHOICES[k]}; got {v!r}")
    if "sdk" in changes:
        from .sdk import parse
        changes["sdk"] = parse(changes["sdk"])      # validate before changing anything
    old = {k: getattr(config, k) for k in changes}
    for k, v in changes.items():
        setattr(config, k, v)
    try:
        yield config
    finally:
        for k, v in old.items():
            setattr(config, k, v)
