"""Device code: NKI kernels for Trainium (trn1 = gen2, trn2 = gen3), one source per family.

The scheduled paged-attention family runs on both NKI API generations through the project op
layer (:mod:`nki_kernels.ops`: the legacy ``neuronxcc.nki`` for trn1, the current ``nki`` for
trn2 / trn3); :mod:`nki_kernels.toolchain` chooses the API and package (``resolve_api``). The dense
vLLM-interface kernel (``flash_paged_attention``), the cache kernels and MLA attention are
legacy-API kernels (``from nki_kernels.toolchain import nki, nl, nisa``). Host-kernel contract
values live in :mod:`nki_kernels.contract`.
"""
