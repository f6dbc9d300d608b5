"""flash_paged_attention on nki_sim vs the float64 reference: the configuration matrix.

Coverage at least as broad as vLLM's post-#13245 suite (block sizes 1..256, tiles 512..8192,
MHA / GQA / MQA, head sizes 8..128 incl. 48 and 96, prefill + decode mixes, mixed precision on
and off), selected pairwise-style so the default run stays fast: every block size, every tile
size, every head configuration and both targets appear, and each head configuration runs with
and without mixed precision. ``--run-slow`` adds the full block x tile x heads sweep.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import nki_sim

pytestmark = pytest.mark.simulation
BF16 = ml_dtypes.bfloat16

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


BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TILE_SIZES = [512, 1024, 2048, 4096, 8192]
MIXES = [(1, 6), (2, 3), (3, 1), (1, 2)]      # (prefill sequences, decode sequences)


def _matrix():
    """Every (block_size, LARGE_TILE_SZ) pair once; the other factors cycle so that every pair
    of (heads, mixed precision, target) values occurs (checked by test_matrix_is_pairwise)."""
    heads = list(HEADS)
    for idx, (B, LT) in enumerate(itertools.product(BLOCK_SIZES, TILE_SIZES)):
        yield dict(block_size=B, tile=LT, heads=heads[idx % len(heads)],
                   mix=MIXES[idx % len(MIXES)], mixed=bool((idx // 6) % 2),
                   target=("trn2", "trn1")[(idx // 12) % 2],
                   dtype="bfloat16" if idx % 7 == 3 else "float32")


CASES = [pytest.param(c, id=f"b{c['block_size']}_t{c['tile']}_{c['heads']}_"
                            f"{'mixed' if c['mixed'] else 'nomix'}_{c['dtype']}_{c['target']}")
         for c in _matrix()]


def test_matrix_is_pairwise():
    cases = list(_matrix())
    got = lambda *keys: {tuple(c[k] for k in keys) for c in cases}  # noqa: E731
    assert got("block_size", "tile") == set(itertools.product(BLOCK_SIZES, TILE_SIZES))
    assert got("heads", "mixed") == set(itertools.product(HEADS, [True, False]))
    assert got("heads", "target") == set(itertools.product(HEADS, ["trn1", "trn2"]))
    assert got("mixed", "target") == set(itertools.product([True, False], ["trn1", "trn2"]))
    assert got("dtype", "mixed") == set(itertools.product(["float32", "bfloat16"], [True, False]))
    assert {d for _, _, d in HEADS.values()} >= {8, 32, 48, 64, 96, 128}


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case, batch_factory, check_reference):
    H, Hkv, d = HEADS[case["heads"]]
    B, LT = case["block_size"], case["tile"]
    q, c = _lens(B * 7 + LT, *case["mix"], max_q=120, max_ctx=1500)
    dtype = BF16 if case["dtype"] == "bfloat16" else np.float32
    batch = batch_factory(B + LT, q, c, H=H, Hkv=Hkv, d=d, block_size=B, dtype=dtype)
    with nki_sim.use_target(case["target"]):
        check_reference(batch, mixed_precision=case["mixed"], large_tile_size=LT)


SWEEP_BLOCKS, SWEEP_TILES = [1, 4, 16, 32, 64, 128, 256], [512, 2048, 8192]


def _sweep():
    """Every (block size, tile) pair in both compute modes; the head configuration rotates over
    the pairs (offset by half a turn between the modes), so each head configuration meets every
    tile size and both modes. (The pairwise matrix above covers the remaining combinations.)"""
    keys = list(HEADS)
    for i, (B, LT) in enumerate(itertools.product(SWEEP_BLOCKS, SWEEP_TILES)):
        for mixed, shift, tag in ((True, 0, "mixed"), (False, len(keys) // 2, "fp32")):
            heads = keys[(i + i // len(SWEEP_TILES) + shift) % len(keys)]
            yield pytest.param(B, LT, heads, mixed, id=f"b{B}_t{LT}_{heads}_{tag}")


def test_sweep_covers_every_pair_and_head_configuration():
    cases = [p.values for p in _sweep()]
    assert {(b, t, m) for b, t, _, m in cases} == set(
        itertools.product(SWEEP_BLOCKS, SWEEP_TILES, [True, False]))
    assert {(h, t) for _, t, h, _ in cases} == set(itertools.product(HEADS, SWEEP_TILES))
    assert {(h, m) for _, _, h, m in cases} == set(itertools.product(HEADS, [True, False]))


@pytest.mark.slow
@pytest.mark.parametrize("block_size, tile, heads, mixed", list(_sweep()))
def test_sweep_matches_reference(block_size, tile, heads, mixed, batch_factory, check_reference):
    H, Hkv, d = HEADS[heads]
    q, c = _lens(block_size + tile, 2, 6, max_q=64, max_ctx=1200)
    batch = batch_factory(block_size * 3 + tile, q, c, H=H, Hkv=Hkv, d=d, block_size=block_size)
    check_reference(batch, mixed_precision=mixed, large_tile_size=tile)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])   # fixtures are stateless
@given(B=st.sampled_from(BLOCK_SIZES), LT=st.sampled_from(TILE_SIZES),
       heads=st.sampled_from([(1, 1), (2, 1), (3, 3), (6, 2), (5, 1)]), d=st.integers(1, 128),
       lens=st.lists(st.tuples(st.integers(1, 70), st.integers(0, 1300)), min_size=1, max_size=5),
       mixed=st.booleans(), seed=st.integers(0, 2**16))
def test_random_batches_match_reference(B, LT, heads, d, lens, mixed, seed, batch_factory,
                                        check_reference):
    # Property test over arbitrary shapes: any head size, head ratio, block/tile size and mix.
    q, c = zip(*lens)
    batch = batch_factory(seed, q, c, H=heads[0], Hkv=heads[1], d=d, block_size=B)
    check_reference(batch, mixed_precision=mixed, large_tile_size=LT)
