"""Kernel launch on the chosen backend: the one place the host calls an ``@nki.jit`` kernel.

Backends (``backend=``): ``"sim"`` runs ``nki.simulate_kernel`` (the project's ``nki_sim``, or
the real toolchain's CPU simulator when neuronx-cc is installed); ``"neuron"`` runs the kernel
on a Trainium device (requires the real ``neuronxcc.nki``; ``nki.jit`` with NumPy arguments is
baremetal); ``"auto"`` is ``"neuron"`` when the real toolchain is active, else ``"sim"``.
Which NKI package is active is decided once by ``nki_kernels.toolchain`` (env ``NKI_PA_BACKEND``).
APIs (``api=``): the product kernels have one source for both NKI generations and run on the
legacy ``neuronxcc.nki`` or the current ``nki`` as ``nki_kernels.toolchain.resolve_api`` decides
(env ``NKI_PA_API``); the benchmarks' legacy-only baseline kernels run on the legacy API.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host.validation import fail

__all__ = ["BACKENDS", "APIS", "check_backend", "check_api", "launch_kernel"]

BACKENDS = ("auto", "sim", "neuron")
APIS = ("auto", "legacy", "nki")


def check_backend(backend: Any) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else the standard ValueError."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        fail("backend", f"be one of {BACKENDS}", repr(backend))
    return backend


def check_api(api: Any) -> str | None:
    """The ``api=`` option of a launcher: None / "auto" (``NKI_PA_API`` or the automatic choice
    of ``nki_kernels.toolchain.resolve_api``), "legacy" or "nki"; returned as None, "legacy" or
    "nki". Every product kernel has one source for both APIs, so the choice is resolved now: a
    combination the installed toolchain cannot run fails before any work.

    Raises:
        ValueError: not one of the values (named).
        RuntimeError / NotImplementedError: from ``resolve_api`` (what to install or use).
    """
    if api is not None and not (isinstance(api, str) and api in APIS):
        fail("api", f"be one of {APIS}", repr(api))
    api = None if api == "auto" else api
    from nki_kernels import toolchain

    toolchain.resolve_api(api)
    return api


def check_lnc(api: str | None, lnc: Any, num_kv_heads: int) -> None:
    """Validate a dense-kernel launch's ``lnc`` (``nki_kernels.toolchain.Api.lnc`` with the
    dense kernel's ``odd_heads``: any Hkv on both APIs, an odd one split by query tiles)
    before any work: ValueError for a value other than 1 / 2, NotImplementedError for 2 where
    it cannot run, naming what to use instead."""
    from nki_kernels import toolchain
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention

    toolchain.resolve_api(api).lnc(lnc, num_kv_heads, odd_heads=flash_paged_attention.odd_heads)


def item_parts_for(api: str | None, lnc: Any, num_kv_heads: int) -> int:
    """The item parts of a schedule-driven launch (scheduled and MLA kernels; docs/layouts.md
    §16.3): the launch's cores (``nki_kernels.toolchain.Api.lnc``, which validates ``lnc`` and
    raises before any work) when they cannot split the KV heads evenly, else 1 (one core, or
    the cores split the heads)."""
    from nki_kernels import toolchain

    cores = toolchain.resolve_api(api).lnc(lnc, num_kv_heads, item_split=True)
    return cores if cores is not None and cores > 1 and num_kv_heads % cores else 1


def launch_kernel(kernel: Any, args: tuple, kwargs: dict, *, grid_heads: int,
                  backend: str, api: str | None = None, lnc: int | None = None,
                  item_parts: int = 1) -> Any:
    """Run ``kernel`` over ``grid_heads`` KV heads on ``backend`` (already checked); returns its
    output as NumPy. A kernel with both APIs (``nki_kernels.ops.KernelFamily``) runs on
    ``nki_kernels.toolchain.resolve_api(api)`` (legacy: grid ``[1, grid_heads]``; current: one launch
    that loops over the heads) on ``lnc`` physical cores (``Api.lnc``); a legacy-only kernel on
    grid ``[1, grid_heads]``. ``item_parts``: the parts (one per core) a scheduled-kernel
    schedule was cut in (``Api.launch``). A kernel returning several outputs gives a tuple
    of NumPy arrays.

    Raises:
        RuntimeError: ``backend="neuron"`` while the simulator is the active NKI package.
    """
    from nki_kernels import toolchain
    from nki_kernels.ops import KernelFamily

    if isinstance(kernel, KernelFamily):
        chosen = toolchain.resolve_api(api)
        device = backend == "neuron" or (backend == "auto" and not chosen.simulated)
        if device and chosen.simulated:
            raise RuntimeError(f"backend='neuron' needs the real Neuron toolchain (the {chosen.name!r} "
                               "NKI package) and a Trainium device, but nki_sim is active "
                               f"(NKI_PA_BACKEND={toolchain.BACKEND_REQUEST!r}); use backend='sim' or "
                               "'auto'")
        return _as_numpy(chosen.launch(kernel, args, kwargs, num_kv_heads=grid_heads,
                                       device=device, lnc=lnc, item_parts=item_parts))

    on_device = backend == "neuron" or (backend == "auto" and not toolchain.SIMULATED)
    if on_device:
        if toolchain.SIMULATED:
            raise RuntimeError("backend='neuron' needs the real Neuron toolchain (neuronx-cc) and a "
                               "Trainium device, but nki_sim is active (NKI_PA_BACKEND="
                               f"{toolchain.BACKEND_REQUEST!r}); use backend='sim' or 'auto'")
        return _as_numpy(kernel[1, grid_heads](*args, **kwargs))
    return _as_numpy(toolchain.nki.simulate_kernel(kernel[1, grid_heads], *args, **kwargs))


def _as_numpy(out: Any) -> Any:
    """A kernel's output as NumPy: an array, or a tuple of arrays for a kernel with several."""
    return tuple(np.asarray(x) for x in out) if isinstance(out, tuple) else np.asarray(out)
