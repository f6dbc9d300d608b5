"""Kernel launch on the chosen backend: the one place the host calls an ``@nki.jit`` kernel.

Backends (``backend=``): ``"sim"`` runs ``nki.simulate_kernel`` (the project's ``nki_sim``, or
the real toolchain's CPU simulator when neuronx-cc is installed); ``"neuron"`` runs the kernel
on a Trainium device (requires the real ``neuronxcc.nki``; ``nki.jit`` with NumPy arguments is
baremetal); ``"auto"`` is ``"neuron"`` when the real toolchain is active, else ``"sim"``.
Which NKI package is active is decided once by ``nki_kernels._nki`` (env ``NKI_PA_BACKEND``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host.validation import fail

__all__ = ["BACKENDS", "check_backend", "launch_kernel"]

BACKENDS = ("auto", "sim", "neuron")


def check_backend(backend: Any) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else the standard ValueError."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        fail("backend", f"be one of {BACKENDS}", repr(backend))
    return backend


def launch_kernel(kernel: Any, args: tuple, kwargs: dict, *, grid_heads: int,
                  backend: str) -> np.ndarray:
    """Run ``kernel`` on grid ``[1, grid_heads]`` on ``backend`` (already checked); returns its
    output as NumPy.

    Raises:
        RuntimeError: ``backend="neuron"`` while the simulator is the active NKI package.
    """
    from nki_kernels import _nki

    on_device = backend == "neuron" or (backend == "auto" and not _nki.SIMULATED)
    if on_device:
        if _nki.SIMULATED:
            raise RuntimeError("backend='neuron' needs the real Neuron toolchain (neuronx-cc) and a "
                               "Trainium device, but nki_sim is active (NKI_PA_BACKEND="
                               f"{_nki.BACKEND_REQUEST!r}); use backend='sim' or 'auto'")
        return np.asarray(kernel[1, grid_heads](*args, **kwargs))
    return np.asarray(_nki.nki.simulate_kernel(kernel[1, grid_heads], *args, **kwargs))
