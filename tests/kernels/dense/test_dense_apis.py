"""The dense vLLM-interface kernel on both NKI APIs (one source, ``nki_kernels.ops``): on trn2
the current API and the legacy API give results that match the float64 reference (bit for bit
with mixed precision, where the two layers issue the same arithmetic), stay clean with NaN in
every cache slot no query may see, and the vLLM-named wrapper takes ``api=`` (two physical
cores: test_dense_lnc.py)."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from host.attention import flash_attn_varlen_nkifunc, paged_attention
from host.reference import paged_attention_ref

pytestmark = pytest.mark.simulation

CASES = [  # (name, dtype, mixed, block, LT, d, H, Hkv, query_lens, context_lens)
    ("bf16-mixed", "bfloat16", True, 16, 2048, 64, 4, 2, [130, 3, 1], [1500, 700, 40]),
    ("fp32", "float32", False, 32, 1024, 32, 2, 1, [5, 2], [900, 33]),
    ("fp16-b256", "float16", False, 256, 2048, 16, 4, 2, [20, 1], [300, 600]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_current_api_matches_the_reference_and_the_legacy_api(case, batch_factory, tol,
                                                              poison_unseen):
    import ml_dtypes

    name, dt, mixed, B, LT, d, H, Hkv, ql, cl = case
    dtype = np.dtype(ml_dtypes.bfloat16) if dt == "bfloat16" else np.dtype(dt)
    batch = batch_factory(41, ql, cl, H=H, Hkv=Hkv, d=d, block_size=B, dtype=dtype)
    ref = paged_attention_ref(*batch.args())
    atol, rtol = tol("mixed" if mixed else "fp32", dtype)
    outs = {}
    with nki_sim.use_target("trn2"):
        for api in ("legacy", "nki"):
            outs[api] = paged_attention(*batch.args(), kernel="dense", mixed_precision=mixed,
                                        large_tile_size=LT, backend="sim", api=api)
            err = np.abs(outs[api].astype(np.float64) - ref)
            assert np.all(err <= atol + rtol * np.abs(ref)), (api, float(err.max()))
        args = list(batch.args())
        args[3] = poison_unseen(batch)
        dirty = paged_attention(*args, kernel="dense", mixed_precision=mixed,
                                large_tile_size=LT, backend="sim", api="nki")
    np.testing.assert_array_equal(dirty, outs["nki"])       # NaN in unseen slots never leaks
    if mixed:
        np.testing.assert_array_equal(outs["nki"], outs["legacy"])


def test_vllm_wrapper_takes_the_api(batch_factory, build_kernel_inputs):
    import ml_dtypes

    batch = batch_factory(42, [3, 1], [600, 70], H=4, Hkv=2, d=32, block_size=16,
                          dtype=ml_dtypes.bfloat16)
    _, inputs = build_kernel_inputs(batch, large_tile_size=512)
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        cur = flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, backend="sim", api="nki")
    # the current API: P transposed by one 4-D DMA transpose per step (the legacy API: one per
    # 128-key block)
    steps = [e for e in trace.events if e.op == "activation_reduce"]
    assert len([e for e in trace.events if e.op == "dma_transpose"]) == len(steps) > 0
    with nki_sim.use_target("trn2"):
        leg = flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, backend="sim", api="legacy")
    np.testing.assert_array_equal(cur, leg)
    with pytest.raises(ValueError, match=r"^api must be one of \('auto', 'legacy', 'nki'\); "
                                         r"got 'cuda'"):
        flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, backend="sim", api="cuda")
