"""What a launch would run on here, and why: a report for users and the ``nki-pa env`` command.

A Trainium user's first question when a kernel does not run where expected: which NKI API a
launch resolves to (``nki_kernels.toolchain.resolve_api``), whether that package is the real one
or the embedded simulator, the LNC a launch would use (``Api.lnc``: the argument, else
``NEURON_LOGICAL_NC_CONFIG``, else the ``--lnc`` of ``NEURON_CC_FLAGS``, else the platform's), and
whether the torch ops' XLA device path is available (``host.serving.torch_neuron.toolchain_status``).
:func:`environment_report` gathers that as a dict (JSON-serializable); every probe that raises is
reported with its message instead of stopping the report. Nothing is launched.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

__all__ = ["PACKAGES", "environment_report"]

PACKAGES = ("nki-paged-attention", "numpy", "ml_dtypes", "torch", "transformers",
            "torch-neuronx", "torch-xla", "neuronx-cc", "nki")


def _probe(fn):
    """``fn()``, or ``{"error": "<Type>: <message>"}`` when it raises."""
    try:
        return fn()
    except Exception as err:        # a report, not a launch: every failure is a finding
        return {"error": f"{type(err).__name__}: {err}"}


def _installed() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _api(name: str | None) -> dict[str, Any]:
    from nki_kernels import toolchain

    api = toolchain.resolve_api(name)
    row: dict[str, Any] = {"api": api.name, "simulated": api.simulated}
    if api.simulated:
        row["target"] = api.target
    row["lnc"] = _probe(lambda: api.lnc(None))
    return row


def _torch_device_path() -> dict[str, Any]:
    from host.serving import torch_neuron

    ok, why = torch_neuron.toolchain_status()
    return {"available": ok, "reason": why}


def environment_report() -> dict[str, Any]:
    """The report: ``packages`` (installed versions, None = absent), ``environment`` (the
    variables that steer a launch), ``compiler_lnc`` (the ``--lnc`` of ``NEURON_CC_FLAGS``),
    ``legacy_namespace`` (what ``neuronxcc.nki`` is here), ``apis`` (each api= choice: "auto" =
    the automatic one, "legacy", "nki" -- the API it resolves to, whether simulated, and a
    launch's LNC with ``lnc`` unset, for an even Hkv) and ``torch_device_path``."""
    from nki_kernels import toolchain

    env = {k: os.environ.get(k) for k in ("NKI_PA_BACKEND", toolchain.API_ENV, toolchain.LNC_ENV,
                                          toolchain.CC_FLAGS_ENV, "NEURON_PLATFORM_TARGET_OVERRIDE")}
    return {
        "python": platform.python_version(),
        "packages": _installed(),
        "environment": env,
        "compiler_lnc": toolchain.compiler_lnc(),
        "legacy_namespace": ("nki_sim" if toolchain.SIMULATED else "neuronxcc.nki")
        if toolchain.LEGACY_IMPORT_ERROR is None else {"error": toolchain.LEGACY_IMPORT_ERROR},
        "apis": {name: _probe(lambda name=name: _api(None if name == "auto" else name))
                 for name in ("auto", toolchain.LEGACY, toolchain.CURRENT)},
        "torch_device_path": _probe(_torch_device_path),
    }
