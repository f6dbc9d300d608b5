"""SBUF footprint of the scheduled kernel: the simulator's measured peak SBUF per partition
against each target's usable SBUF, for the largest per-item working sets (wide tiles, head
sizes above 128, prefill groups of 64 Q blocks). The plan (nki_kernels/scheduled/sched_plan.py) sizes
prefill groups to trn1's SBUF on the host; a tile that cannot fit at all still runs (the
compiler spills, as with the dense kernel) but warns (SbufBudgetWarning naming LARGE_TILE_SZ)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention

pytestmark = pytest.mark.simulation
BF16 = ml_dtypes.bfloat16


# (target, kind, d, LT, dtype): decode = one query (G=1); prefill64 = 8192 query rows of one
# sequence (G=64, q=128: one group of 64 Q blocks, the largest group the schedule builds)
CASES = [
    pytest.param("trn1", "decode", 128, 8192, BF16, id="trn1_decode_d128_bf16_t8192"),
    pytest.param("trn2", "decode", 512, 4096, BF16, id="trn2_decode_d512_bf16_t4096"),
    pytest.param("trn1", "prefill64", 128, 512, np.float32, id="trn1_prefill64_d128_fp32_t512"),
    pytest.param("trn1", "prefill64", 128, 4096, np.float32, id="trn1_prefill64_d128_fp32_t4096"),
    pytest.param("trn2", "prefill64", 256, 512, np.float32, id="trn2_prefill64_d256_fp32_t512"),
]
# Working sets no group size can fit: the kernel warns, naming the fix (and still computes).
TOO_BIG = [
    pytest.param("trn1", 256, 8192, np.float32, id="trn1_decode_d256_fp32_t8192"),
    pytest.param("trn1", 512, 8192, BF16, id="trn1_decode_d512_bf16_t8192"),
    pytest.param("trn2", 512, 8192, BF16, id="trn2_decode_d512_bf16_t8192"),
]


@pytest.mark.parametrize("target, d, LT, dtype", TOO_BIG)
def test_tiles_that_cannot_fit_warn(target, d, LT, dtype, batch_factory, tol):
    from host.reference import paged_attention_ref
    from nki_kernels.sbuf_plan import SbufBudgetWarning

    batch = batch_factory(d, [1], [100], H=1, Hkv=1, d=d, block_size=16, dtype=dtype)
    with nki_sim.use_target(target), pytest.warns(SbufBudgetWarning,
                                                  match="use a smaller LARGE_TILE_SZ"):
        out = paged_attention(*batch.args(), mixed_precision=True, large_tile_size=LT,
                              backend="sim")
    atol, _ = tol("mixed", dtype)
    assert np.abs(out.astype(np.float64) - paged_attention_ref(*batch.args())).max() <= atol


@pytest.mark.parametrize("target, kind, d, LT, dtype", CASES)
def test_measured_peak_sbuf_within_capacity(target, kind, d, LT, dtype, batch_factory):
    q, c, H = ([1], [100], 1) if kind == "decode" else ([128], [0], 64)
    batch = batch_factory(d, q, c, H=H, Hkv=1, d=d, block_size=16, dtype=dtype)
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        paged_attention(*batch.args(), mixed_precision=True, large_tile_size=LT, backend="sim")
    s = trace.summary()
    assert s["targets"] == [target]
    assert not s["sbuf_over_capacity"], (s["peak_sbuf_bytes_per_partition"],
                                         s["sbuf_capacity_bytes_per_partition"])
