"""The scheduled kernel (host.paged_attention(kernel="scheduled")) on nki_sim vs the float64
reference: decode, spec-decode, prefill, mixed batches, empty contexts, every block and tile
size, head sizes 1..512, MHA / GQA / MQA, fp32 / bf16 / fp16, mixed precision on and off, trn1
and trn2, sliding windows; and a property test over random batches (fast and --run-slow)."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import nki_sim
from host.reference import paged_attention_ref

pytestmark = pytest.mark.simulation
SCHED = ("scheduled",)
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

# (query_lens, context_lens) per batch kind
MIXES = {
    "decode": ([1, 1, 1, 1, 1], [0, 1, 37, 600, 1500]),
    "specdecode": ([2, 3, 5, 8], [700, 0, 129, 33]),
    "prefill": ([150, 66], [0, 260]),
    "mixed": ([1, 40, 3, 140, 1], [1100, 0, 37, 300, 4]),
    "emptyctx": ([1, 7, 70], [0, 0, 0]),
}
# (H, Hkv, d): MHA, GQA 4, MQA 8:1, GQA 3 with d=48, MQA 3:1 with d=96, head size 1
HEADS = {"mha_d128": (2, 2, 128), "gqa4_d64": (8, 2, 64), "mqa8_d32": (8, 1, 32),
         "gqa3_d48": (6, 2, 48), "mqa3_d96": (3, 1, 96), "gqa2_d1": (4, 2, 1)}
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TILE_SIZES = [512, 1024, 2048, 4096, 8192]


def _matrix():
    """18 cases: every block size twice, every tile size, head configuration, batch kind,
    dtype, mixed-precision setting and target, cycled so the pairs below all occur."""
    heads, mixes, dts = list(HEADS), list(MIXES), list(DTYPES)
    for idx, B in enumerate(BLOCK_SIZES * 2):
        yield dict(B=B, LT=TILE_SIZES[idx % 5], heads=heads[idx % 6], mix=mixes[idx % 5],
                   dtype=dts[(idx // 2) % 3], mixed=bool((idx // 6) % 2),
                   target=("trn2", "trn1")[(idx // 3) % 2])


CASES = [pytest.param(c, id="_".join(str(c[k]) for k in ("mix", "B", "LT", "heads", "dtype"))
                      + ("_mixed_" if c["mixed"] else "_nomix_") + c["target"]) for c in _matrix()]


def test_matrix_covers_every_factor():
    cases = list(_matrix())
    got = lambda *keys: {tuple(c[k] for k in keys) for c in cases}  # noqa: E731
    assert got("B") == {(b,) for b in BLOCK_SIZES} and got("LT") == {(t,) for t in TILE_SIZES}
    assert got("mix") == {(m,) for m in MIXES} and got("heads") == {(h,) for h in HEADS}
    assert got("heads", "mixed") == set(itertools.product(HEADS, [True, False]))
    assert got("dtype", "mixed") == set(itertools.product(DTYPES, [True, False]))
    assert got("mixed", "target") == set(itertools.product([True, False], ["trn1", "trn2"]))
    assert got("mix", "mixed") == set(itertools.product(MIXES, [True, False]))


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case, batch_factory, check_reference):
    H, Hkv, d = HEADS[case["heads"]]
    q, c = MIXES[case["mix"]]
    batch = batch_factory(case["B"] + case["LT"], q, c, H=H, Hkv=Hkv, d=d, block_size=case["B"],
                          dtype=DTYPES[case["dtype"]])
    with nki_sim.use_target(case["target"]), nki_sim.tracing() as trace:
        check_reference(batch, mixed_precision=case["mixed"], large_tile_size=case["LT"],
                        kernels=SCHED)
    s = trace.summary()
    assert s["targets"] == [case["target"]]
    assert not s["sbuf_over_capacity"] and not s["psum_over_capacity"]


@pytest.mark.parametrize("LT", [512, 2048, 8192])
def test_decode_and_spec_decode_at_tile_edges(LT, batch_factory, check_reference):
    # q_len 1..8 with G=4 (4..32 query rows: the decode class); the new tokens start just
    # before, at and after a tile edge, so FULL / PARTIAL items split at every offset
    q = [1, 2, 3, 4, 5, 8, 6, 7]
    c = [LT - 1, LT, LT + 1, LT - 2, 2 * LT - 3, LT - 4, 0, 5]
    batch = batch_factory(LT, q, c, H=8, Hkv=2, d=16, block_size=32)
    check_reference(batch, mixed_precision=True, large_tile_size=LT, kernels=SCHED)


def test_boundary_between_decode_and_prefill_classes(batch_factory, check_reference):
    # G=4: q=16 -> 64 rows (the last decode size), q=17 -> 68 rows (prefill), q=33 -> 132 rows
    batch = batch_factory(3, [16, 17, 33, 1], [100, 0, 517, 2048], H=8, Hkv=2, d=32, block_size=16)
    check_reference(batch, mixed_precision=False, large_tile_size=512, kernels=SCHED)


def test_block_table_without_columns_when_no_context(batch_factory, check_reference):
    # no sequence has context: a (S, 0) block table is valid (the reference reads no entry)
    batch = batch_factory(8, [3, 70, 1], [0, 0, 0], H=4, Hkv=2, d=8, block_size=16)
    batch.block_tables = np.zeros((3, 0), np.int32)
    check_reference(batch, mixed_precision=False, large_tile_size=512)


def test_prefill_groups_with_full_items(batch_factory, check_reference):
    # G=2, q=200: one group of 4 Q blocks; c=1500 at LT=512: tiles 0, 1 FULL (state carried
    # from the partial phase into the full phase for all 4 blocks)
    batch = batch_factory(4, [200, 1], [1500, 3], H=4, Hkv=2, d=16, block_size=16)
    check_reference(batch, mixed_precision=True, large_tile_size=512, kernels=SCHED)


def test_many_items_across_metadata_chunks(batch_factory, check_reference):
    # 8 decode sequences x 16 tiles: 120 FULL items -> bucket 128 = two 64-item metadata chunks
    batch = batch_factory(5, [1] * 8, [8000] * 8, H=2, Hkv=1, d=8, block_size=64)
    check_reference(batch, mixed_precision=False, large_tile_size=512, kernels=SCHED)


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")])
def test_full_tiles_in_the_partial_phases_padding_slots(target, api, on_api, batch_factory,
                                                        check_reference, poison_unseen):
    # 9 decodes and 9 40-token chunks (G=2: 80 rows, the prefill class), each with one FULL and
    # one PARTIAL tile at LT 512: each class runs its last full tile in a padding slot of its
    # partial phase (host side: tests/host/scheduled/test_schedule.py); NaN in every cache slot
    # no query may see changes no output bit
    from host.attention import paged_attention
    from host.step_plan import plan_paged_attention
    b = batch_factory(17, [1] * 9 + [40] * 9, [700] * 18, H=4, Hkv=2, d=16, block_size=16)
    plan = plan_paged_attention(b.block_tables, b.query_lens, b.context_lens, num_heads=4,
                                num_kv_heads=2, head_size=16, block_size=16, dtype=b.query.dtype,
                                num_blocks=b.kv_cache.shape[1], large_tile_size=512)
    counts = [(p.schedule.classes[0].full.items, p.schedule.classes[0].partial.real_items,
               p.schedule.classes[0].partial.items) for p in plan.parts]
    assert counts == [(8, 10, 10), (8, 10, 10)]
    with on_api(api, target):
        out, _ = check_reference(b, mixed_precision=True, large_tile_size=512, kernels=SCHED)
        dirty = paged_attention(b.query, b.key, b.value, poison_unseen(b), b.block_tables,
                                b.query_lens, b.context_lens, backend="sim",
                                large_tile_size=512)
    assert dirty.tobytes() == out.tobytes()


def test_a_sequence_split_into_two_q_groups(batch_factory, check_reference):
    # MQA G=64, q=130: 8320 rows = 65 Q blocks -> groups of 64 and 1 blocks, both with FULL
    # items (c=1024 at LT=512)
    batch = batch_factory(6, [130], [1024], H=64, Hkv=1, d=4, block_size=16)
    check_reference(batch, mixed_precision=True, large_tile_size=512, kernels=SCHED)


@pytest.mark.slow
def test_causally_pruned_second_q_group(batch_factory, check_reference):
    # G=8, q=1100, c=1024: groups of positions 1024..2047 and 2048..2123; the first never
    # loads tile 4 (keys >= 2048), host side: tests/host/scheduled/test_schedule.py
    batch = batch_factory(7, [1100], [1024], H=8, Hkv=1, d=4, block_size=16)
    check_reference(batch, mixed_precision=True, large_tile_size=512, kernels=SCHED)


# ------------------------------------------------------------------------- head sizes > 128
@pytest.mark.parametrize("H, Hkv, d", [(2, 1, 160), (2, 1, 192), (4, 4, 256), (3, 1, 200),
                                     (4, 2, 320), (2, 2, 512)])
@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "nomix"])
def test_head_sizes_above_128(H, Hkv, d, mixed, batch_factory, check_reference):
    # the kernel folds QK^T over ceil(d/128) channel slices (d <= 512)
    batch = batch_factory(d, [1, 3, 70], [300, 20, 40], H=H, Hkv=Hkv, d=d, block_size=16)
    check_reference(batch, mixed_precision=mixed, large_tile_size=512, kernels=SCHED)


# ------------------------------------------------------------------------- sliding window
@pytest.mark.parametrize("window", [1, 7, 300, 513, 5000])
def test_sliding_window(window, batch_factory, check_reference):
    batch = batch_factory(window, [1, 4, 90, 1], [1300, 20, 700, 0], H=4, Hkv=2, d=16,
                          block_size=16)
    _, ref = check_reference(batch, mixed_precision=False, large_tile_size=512, kernels=SCHED,
                             sliding_window=window)
    plain = paged_attention_ref(*batch.args())
    if window >= 2000:                                   # wider than every sequence: no window
        assert np.abs(ref - plain).max() < 1e-12
    else:                                                # must-fail: the window really applies
        assert np.abs(ref - plain).max() > 0.05


# ------------------------------------------------------------------------- property tests
_LENS = st.lists(st.tuples(st.integers(1, 48), st.integers(0, 1100)), min_size=1, max_size=4)
_GIVEN = dict(B=st.sampled_from(BLOCK_SIZES), LT=st.sampled_from(TILE_SIZES),
              heads=st.sampled_from([(1, 1), (2, 1), (3, 3), (6, 2), (8, 1), (4, 2)]),
              d=st.integers(1, 128), lens=_LENS, mixed=st.booleans(),
              dtype=st.sampled_from(list(DTYPES)), target=st.sampled_from(["trn1", "trn2"]),
              seed=st.integers(0, 2**16))


def _random_batch_matches(B, LT, heads, d, lens, mixed, dtype, target, seed, batch_factory,
                          check_reference):
    q, c = zip(*lens)
    batch = batch_factory(seed, q, c, H=heads[0], Hkv=heads[1], d=d, block_size=B,
                          dtype=DTYPES[dtype])
    with nki_sim.use_target(target):
        check_reference(batch, mixed_precision=mixed, large_tile_size=LT, kernels=SCHED)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])   # fixtures are stateless
@given(**_GIVEN)
def test_random_batches_match_reference(B, LT, heads, d, lens, mixed, dtype, target, seed,
                                        batch_factory, check_reference):
    _random_batch_matches(B, LT, heads, d, lens, mixed, dtype, target, seed, batch_factory,
                          check_reference)


@pytest.mark.slow
@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(**_GIVEN)
def test_random_batches_match_reference_sweep(B, LT, heads, d, lens, mixed, dtype, target, seed,
                                              batch_factory, check_reference):
    _random_batch_matches(B, LT, heads, d, lens, mixed, dtype, target, seed, batch_factory,
                          check_reference)


@pytest.mark.parametrize("ltp", [512, 1024, 2048, "auto"])
@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_every_partial_tile_size_matches_reference(ltp, target, batch_factory, tol):
    # decodes ending just past a tile edge, a spec decode, a prefill chunk on a long context and
    # one from scratch, with a sliding window on one pass: the partial phase in every geometry
    from host.attention import paged_attention
    batch = batch_factory(21, [1, 1, 4, 150, 70], [2049, 4500, 1030, 2100, 0], H=4, Hkv=2,
                          d=32, block_size=16)
    ref = paged_attention_ref(*batch.args())
    with nki_sim.use_target(target):
        out = paged_attention(*batch.args(), backend="sim", large_tile_size=2048,
                              partial_tile_size=ltp)
    atol, _ = tol("mixed", batch.query.dtype)
    assert np.abs(out.astype(np.float64) - ref).max() <= atol
    win = paged_attention_ref(*batch.args(), sliding_window=600)
    with nki_sim.use_target(target):
        out = paged_attention(*batch.args(), backend="sim", large_tile_size=2048,
                              partial_tile_size=ltp, sliding_window=600)
    assert np.abs(out.astype(np.float64) - win).max() <= atol


@pytest.mark.parametrize("bad", [256, 1000, 4096, "small", None, 512.0])
def test_partial_tile_size_is_validated_before_any_kernel_runs(bad, batch_factory):
    from host.attention import paged_attention
    batch = batch_factory(1, [1], [10], H=2, Hkv=1, d=8, block_size=16)
    with nki_sim.tracing() as trace, pytest.raises(ValueError, match="partial_tile_size"):
        paged_attention(*batch.args(), backend="sim", large_tile_size=2048, partial_tile_size=bad)
    assert not trace.events


def test_partial_tile_size_is_for_the_scheduled_kernel(batch_factory):
    from host.attention import paged_attention
    batch = batch_factory(1, [1], [10], H=2, Hkv=1, d=8, block_size=16)
    with pytest.raises(NotImplementedError, match="kernel='dense'"):
        paged_attention(*batch.args(), backend="sim", kernel="dense", partial_tile_size=512)
