"""nki_sim: a NumPy simulator of the NKI programming model, with two front ends: the legacy
``neuronxcc.nki`` ("Beta 1") and the current ``nki`` (NKI 0.8, switchable to 0.6 / 0.7).

    import nki_sim
    nki_sim.install()                      # registers neuronxcc.nki* and nki* where absent
    import neuronxcc.nki as nki, neuronxcc.nki.language as nl
    with nki_sim.tracing() as trace:
        out = nki.simulate_kernel(kernel[1, 8], a, b)
    trace.summary()
    with nki_sim.use_nki_version("0.6"):  # the current front end's simulated NKI release
        ...

See nki_sim/README.md for what is emulated and how it differs from hardware.
"""

from __future__ import annotations

from . import errors  # noqa: F401
from .config import config, configure  # noqa: F401
from .install import install, is_installed, real_nki_available, uninstall  # noqa: F401
from .legacy.launch import jit, simulate_kernel  # noqa: F401
from .target import TARGETS, Target, get_target, use_target  # noqa: F401
from .trace import Event, Trace, tracing  # noqa: F401
from .current.version import set_default as set_nki_version, use_nki_version  # noqa: F401

__all__ = ["install", "is_installed", "uninstall", "real_nki_available", "TARGETS", "Target",
           "get_target", "use_target", "tracing", "Trace", "Event", "config", "configure",
           "errors", "jit", "simulate_kernel", "use_nki_version", "set_nki_version"]
