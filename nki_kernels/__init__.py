"""Device code: NKI kernels for Trainium (trn1 = gen2, trn2 = gen3), one source per family.

Every kernel family -- scheduled and dense (vLLM-interface) paged attention, MLA attention, the
cache kernels -- runs on both NKI API generations through the project op layer
(:mod:`nki_kernels.ops`: the legacy ``neuronxcc.nki`` for trn1, the current ``nki`` for trn2 /
trn3); :mod:`nki_kernels.toolchain` chooses the API and package (``resolve_api``). Only the
benchmarks' baselines (:mod:`nki_kernels.baselines`) are legacy-API code. Host-kernel contract
values live in :mod:`nki_kernels.contract`.
"""
