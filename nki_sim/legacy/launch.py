"""Legacy kernel launch: ``nki.jit``, grid launch ``kernel[d0, d1](...)``, ``nki.simulate_kernel``.

A top-level call runs :func:`nki_sim.runtime.run_kernel` with legacy tensors
(:class:`~nki_sim.legacy.tensor.LegacyTensor`).  A jit function called while a kernel runs is
an ordinary inline call.  ``nki.baremetal`` / ``benchmark`` / ``profile`` kernels raise
"requires a Neuron device" when called (``simulate_kernel`` still runs them).
"""

from __future__ import annotations

import functools

from .. import errors as E
from ..runtime import run_kernel as _run
from ..state import state
from ..target import resolve_target
from .tensor import LegacyTensor

_DEVICE_MODES = ("baremetal", "benchmark", "profile")
_SIM_MODES = ("auto", "simulation", "trace")
_MODES = _SIM_MODES + _DEVICE_MODES + ("jax", "torchxla")


def run_kernel(func, grid, args, kwargs, platform_target=None):
    """Simulate ``func`` over ``grid`` with NumPy arguments (legacy tensors); NumPy outputs."""
    return _run(func, grid, args, kwargs, platform_target, tensor_type=LegacyTensor)


class Kernel:
    """Result of ``nki.jit`` (and of ``nki.baremetal`` / ``benchmark`` / ``profile``)."""

    def __init__(self, func, mode="auto", platform_target=None, **options):
        if mode not in _MODES:
            raise ValueError(f"nki.jit: mode must be one of {_MODES}; got {mode!r}")
        if platform_target is not None:
            resolve_target(platform_target)
        self.func = func
        self.mode = mode
        self.platform_target = platform_target
        self.options = options
        functools.update_wrapper(self, func)

    def _check_mode(self):
        if self.mode in _DEVICE_MODES:
            raise E.DeviceRequiredError(
                f"nki.{self.mode} requires a Neuron device (Trainium / Inferentia); none is available "
                "under nki_sim. Use nki.simulate_kernel(kernel, ...) or nki.jit(mode='simulation').")
        if self.mode in ("jax", "torchxla"):
            raise NotImplementedError(
                f"nki.jit(mode={self.mode!r}) needs the Neuron framework integration; call the kernel "
                "with NumPy arrays (simulation) instead")

    def __call__(self, *args, **kwargs):
        if state.kernel is not None:            # @nki.jit helper called inside a kernel: inline
            return self.func(*args, **kwargs)
        self._check_mode()
        return run_kernel(self.func, (), args, kwargs, self.platform_target)

    def __getitem__(self, grid):
        return GridLaunch(self, grid)

    def __repr__(self):
        return f"<nki_sim kernel {self.func.__name__} mode={self.mode}>"


class GridLaunch:
    """``kernel[d0, d1, ...]``: an SPMD launch configuration."""

    def __init__(self, kernel, grid):
        if not isinstance(grid, tuple):
            grid = (grid,)
        self.kernel = kernel
        # int values, keeping nl.nc / nl.spmd_dim(nl.nc(k), ..) markers (logical cores)
        self.grid = tuple(g if getattr(g, "nki_lnc", 0) else int(g) for g in grid)

    def __call__(self, *args, **kwargs):
        if state.kernel is not None:
            raise E.KernelSignatureError(
                "a grid-launched kernel cannot be called from inside another kernel "
                "(err_nested_kernel_with_spmd_grid)", code="err_nested_kernel_with_spmd_grid")
        self.kernel._check_mode()
        return run_kernel(self.kernel.func, self.grid, args, kwargs, self.kernel.platform_target)


def jit(func=None, mode="auto", platform_target=None, **kwargs):
    """``@nki.jit`` / ``nki.jit(func, mode=..., platform_target=...)``."""
    if func is None:
        return lambda f: Kernel(f, mode=mode, platform_target=platform_target, **kwargs)
    return Kernel(func, mode=mode, platform_target=platform_target, **kwargs)


def _device_decorator(mode):
    def deco(kernel=None, **kwargs):
        if kernel is None:
            return lambda f: Kernel(getattr(f, "func", f), mode=mode, **kwargs)
        return Kernel(getattr(kernel, "func", kernel), mode=mode, **kwargs)
    deco.__name__ = mode
    deco.__doc__ = f"nki.{mode}: needs a Neuron device (calling raises); simulate_kernel still works."
    return deco


baremetal = _device_decorator("baremetal")
benchmark = _device_decorator("benchmark")
profile = _device_decorator("profile")


def simulate_kernel(kernel, *args, **kwargs):
    """Run ``kernel`` (jit / baremetal kernel, ``kernel[grid]`` or plain function) on NumPy args."""
    if isinstance(kernel, GridLaunch):
        k = kernel.kernel
        return run_kernel(k.func, kernel.grid, args, kwargs, k.platform_target)
    if isinstance(kernel, Kernel):
        return run_kernel(kernel.func, (), args, kwargs, kernel.platform_target)
    if callable(kernel):
        return run_kernel(kernel, (), args, kwargs)
    raise TypeError(f"simulate_kernel: kernel must be an nki.jit kernel, kernel[grid] or a function; "
                    f"got {type(kernel).__name__}")
