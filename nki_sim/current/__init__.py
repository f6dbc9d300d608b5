"""The current NKI front end (``import nki``: NKI 0.8 / Neuron SDK 2.34, switchable to 0.6 / 0.7).

    import nki_sim
    nki_sim.install()                      # registers nki* (and neuronxcc.nki*) when absent
    import nki, nki.language as nl, nki.isa as nisa

Tensors are view descriptors over the shared core's storage (:mod:`.tensor`, :mod:`.views`);
ISA instructions check their arguments and call the engine layer (:mod:`nki_sim.engines`).
See nki_sim/README.md, "The current nki front end".
"""

from __future__ import annotations

from .modules import modules  # noqa: F401
from .version import use_nki_version, set_default as set_nki_version  # noqa: F401
