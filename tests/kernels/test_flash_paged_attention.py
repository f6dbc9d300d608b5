"""flash_paged_attention on nki_sim vs the float64 reference: the configuration matrix.

Coverage at least as broad as vLLM's post-#13245 suite (block sizes 1..256, tiles 512..8192,
MHA / GQA / MQA, head sizes 8..128 incl. 48 and 96, prefill + decode mixes, mixed precision on
and off), selected pairwise-style so the default run stays fast: every block size, every tile
size, every head configuration and both targets appear, and each head configuration runs with
and without mixed precision. ``--run-slow`` adds the full block x tile x heads sweep.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nki_sim

pytestmark = pytest.mark.simulation

# (H, Hkv, d): GQA 2, GQA 4 with d=64, MHA d=128, MQA 8:1, GQA 3 with d=48, MQA d=96.
HEADS = {
    "gqa2_d8": (4, 2, 8),
    "gqa4_d64": (8, 2, 64),
    "mha_d128": (2, 2, 128),
    "mqa8_d32": (8, 1, 32),
    "gqa3_d48": (6, 2, 48),
    "mqa3_d96": (3, 1, 96),
}


def _lens(seed, n_prefill, n_decode, *, max_q, max_ctx):
    """Prefill sequences (q in [2, max_q], ctx in [0, max_ctx]) then decode ones (q = 1,
    ctx in [1, max_ctx]), shuffled together like a continuous batch."""
    rng = np.random.default_rng(seed)
    q = np.concatenate([rng.integers(2, max_q + 1, n_prefill), np.ones(n_decode, np.int64)])
    c = np.concatenate([rng.integers(0, max_ctx + 1, n_prefill), rng.integers(1, max_ctx + 1, n_decode)])
    order = rng.permutation(len(q))
    return q[order], c[order]


# id: block_size, LARGE_TILE_SZ, heads, (prefill, decode), mixed precision, target
CASES = [
    pytest.param(1, 512, "gqa2_d8", (1, 6), False, "trn2", id="b1_t512_gqa2_d8_fp32_trn2"),
    pytest.param(2, 1024, "mqa8_d32", (2, 3), True, "trn1", id="b2_t1024_mqa8_d32_mixed_trn1"),
    pytest.param(4, 1024, "mha_d128", (2, 4), False, "trn2", id="b4_t1024_mha_d128_fp32_trn2"),
    pytest.param(8, 2048, "gqa3_d48", (1, 3), True, "trn2", id="b8_t2048_gqa3_d48_mixed_trn2"),
    pytest.param(16, 2048, "gqa4_d64", (2, 2), True, "trn1", id="b16_t2048_gqa4_d64_mixed_trn1"),
    pytest.param(32, 4096, "mqa3_d96", (1, 4), False, "trn1", id="b32_t4096_mqa3_d96_fp32_trn1"),
    pytest.param(64, 8192, "gqa2_d8", (2, 3), True, "trn2", id="b64_t8192_gqa2_d8_mixed_trn2"),
    pytest.param(128, 512, "gqa3_d48", (1, 2), False, "trn1", id="b128_t512_gqa3_d48_fp32_trn1"),
    pytest.param(256, 2048, "mqa8_d32", (1, 2), False, "trn2", id="b256_t2048_mqa8_d32_fp32_trn2"),
    pytest.param(32, 2048, "mha_d128", (1, 2), True, "trn1", id="b32_t2048_mha_d128_mixed_trn1"),
    pytest.param(16, 8192, "mqa3_d96", (1, 2), True, "trn2", id="b16_t8192_mqa3_d96_mixed_trn2"),
    pytest.param(4, 4096, "gqa4_d64", (1, 2), False, "trn2", id="b4_t4096_gqa4_d64_fp32_trn2"),
]


@pytest.mark.parametrize("block_size, tile, heads, mix, mixed, target", CASES)
def test_matches_reference(block_size, tile, heads, mix, mixed, target, batch_factory,
                           check_reference):
    H, Hkv, d = HEADS[heads]
    q, c = _lens(block_size * 7 + tile, *mix, max_q=40, max_ctx=700)
    batch = batch_factory(block_size + tile, q, c, H=H, Hkv=Hkv, d=d, block_size=block_size)
    with nki_sim.use_target(target):
        check_reference(batch, mixed_precision=mixed, large_tile_size=tile)


def _sweep():
    for B, LT, heads in itertools.product([1, 4, 16, 32, 64, 128, 256], [512, 2048, 8192], HEADS):
        yield pytest.param(B, LT, heads, id=f"b{B}_t{LT}_{heads}")


@pytest.mark.slow
@pytest.mark.parametrize("block_size, tile, heads", list(_sweep()))
@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "fp32"])
def test_sweep_matches_reference(block_size, tile, heads, mixed, batch_factory, check_reference):
    H, Hkv, d = HEADS[heads]
    q, c = _lens(block_size + tile, 2, 6, max_q=64, max_ctx=1200)
    batch = batch_factory(block_size * 3 + tile, q, c, H=H, Hkv=Hkv, d=d, block_size=block_size)
    check_reference(batch, mixed_precision=mixed, large_tile_size=tile)
