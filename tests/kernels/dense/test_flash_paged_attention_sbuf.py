"""SBUF budget: the kernel's group sizing (nki_kernels.sbuf_plan) keeps the simulator's measured
peak SBUF per partition within each target's usable SBUF, and warns when it cannot."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from nki_kernels.sbuf_plan import SBUF_USABLE, SbufBudgetWarning, q_tiles_per_group, working_set_bytes

pytestmark = pytest.mark.simulation


def _plan(**over):
    kw = dict(nc_gen="gen2", n_q_tiles=16, heads_per_kv=8, large_tile=2048, head_size=128,
              tiled_block_size=16, kernel_itemsize=2, acc_itemsize=4, cache_itemsize=2,
              table_bytes=256, kernel="k")
    kw.update(over)
    return q_tiles_per_group(**kw)


def test_group_size_follows_the_target_capacity():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g1, g3 = _plan(nc_gen="gen2"), _plan(nc_gen="gen3")
        assert 1 <= g1 <= g3 <= 16
        assert _plan(n_q_tiles=1) == 1
        # a bigger tile leaves less room for state
        assert _plan(large_tile=8192, n_q_tiles=64) <= _plan(large_tile=2048, n_q_tiles=64)


def test_over_budget_configuration_warns_and_uses_one_q_tile():
    # fp32 kernel dtype with LARGE_TILE_SZ=8192 on trn1: K/V/mask double buffers alone take
    # 2 * (32 + 32 + 8) KiB.
    assert working_set_bytes(large_tile=8192, head_size=128, tiled_block_size=64,
                             kernel_itemsize=4, cache_itemsize=4) > SBUF_USABLE["gen2"] - 32 * 1024
    with pytest.warns(SbufBudgetWarning, match="use a smaller LARGE_TILE_SZ or mixed_precision=True"):
        assert _plan(large_tile=8192, kernel_itemsize=4, acc_itemsize=4, cache_itemsize=4,
                     tiled_block_size=64) == 1


@pytest.mark.parametrize("target, dtype, mixed, block_size, tile", [
    ("trn1", "bfloat16", True, 256, 8192),     # largest gathered rows (b' = 64) at the largest tile
    ("trn2", "float32", False, 32, 4096),      # fp32 kernel dtype
], ids=["trn1_bf16_b256_t8192", "trn2_fp32_b32_t4096"])
def test_measured_peak_sbuf_within_capacity(target, dtype, mixed, block_size, tile, batch_factory):
    # 10 Q tiles x 8 query heads per KV head, d = 128: the state alone would need ~60 KiB.
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    batch = batch_factory(0, [1279, 1], [4000, 4100], H=8, Hkv=1, d=128, block_size=block_size,
                          dtype=dt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SbufBudgetWarning)
        with nki_sim.use_target(target), nki_sim.tracing() as trace:
            paged_attention(*batch.args(), mixed_precision=mixed, large_tile_size=tile, backend="sim",
                            kernel="dense")
    s = trace.summary()
    assert not s["sbuf_over_capacity"], s["peak_sbuf_bytes_per_partition"]
    assert s["peak_sbuf_bytes_per_partition"] <= SBUF_USABLE["gen2" if target == "trn1" else "gen3"]
