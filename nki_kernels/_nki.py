"""The one place device code gets its NKI modules from.

Every kernel in ``nki_kernels`` does ``from nki_kernels._nki import nki, nl, nisa``
(plus ``nt``, the ``neuronxcc.nki.typing`` module, where it needs ``nt.mutable_tensor``)
and nothing else NKI-related, so the same kernel source runs on

* the real legacy toolchain (``neuronxcc.nki``, NKI "Beta 1"; ``nki.simulate_kernel``,
  ``nki.jit``, baremetal on trn1/trn2) when ``neuronx-cc`` is installed, and
* ``nki_sim``, this project's NumPy simulator of that API, everywhere else.

The choice is made here, once, at import time, from the environment variable
``NKI_PA_BACKEND``:

``auto`` (default)
    real ``neuronxcc.nki`` if importable, else ``nki_sim``.
``sim``
    always ``nki_sim`` (it is installed under the ``neuronxcc.nki`` names with
    ``force=True``), e.g. to compare the simulator against a real install.
``neuron``
    require the real package; ``ImportError`` if it is missing.

Kernels never branch on which backend is active.
"""

from __future__ import annotations

import os

_VALID = ("auto", "sim", "neuron")
BACKEND_REQUEST = os.environ.get("NKI_PA_BACKEND", "auto").strip().lower() or "auto"
if BACKEND_REQUEST not in _VALID:
    raise ValueError(
        f"NKI_PA_BACKEND must be one of {_VALID}; got {BACKEND_REQUEST!r}"
    )

if BACKEND_REQUEST == "neuron":
    SIMULATED = False
else:
    import nki_sim

    SIMULATED = nki_sim.install(force=(BACKEND_REQUEST == "sim")) or nki_sim.is_installed()

import neuronxcc.nki as nki  # noqa: E402  (resolved to real NKI or nki_sim above)
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402
import neuronxcc.nki.typing as nt  # noqa: E402  (nt.mutable_tensor for in-place kernel arguments)

__all__ = ["nki", "nl", "nisa", "nt", "SIMULATED", "BACKEND_REQUEST"]
