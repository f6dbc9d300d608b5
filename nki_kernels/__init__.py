"""Device code: legacy-NKI ("Beta 1") kernels for Trainium (trn1 = gen2, trn2 = gen3).

Kernels import NKI only through :mod:`nki_kernels._nki`; see that module for how the
backend (real ``neuronxcc.nki`` or the ``nki_sim`` simulator) is chosen.
"""
