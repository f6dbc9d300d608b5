"""The legacy front end: ``neuronxcc.nki`` (NKI "Beta 1", Neuron SDK 2.21-2.27) on nki_sim's core.

``nki_api`` is ``neuronxcc.nki`` (jit, simulate_kernel, ...), ``language`` is
``neuronxcc.nki.language``, ``isa`` is ``neuronxcc.nki.isa``, ``nki_typing`` /
``compiler`` are ``neuronxcc.nki.typing`` / ``.compiler``; ``nki_sim.install()`` registers
them under those names.  ``compute`` / ``dma`` hold the legacy instruction plumbing (ops that
return fresh result tiles), ``kernel_scope`` the kernel-level statement checks.
See nki_sim/README.md, "Architecture".
"""
