"""One launch for a mixed batch's two classes (``nki_kernels.scheduled.scheduled_pair``): the
segment and interleave arithmetic, the plan's choice (``host.step_plan.FUSE_CLASSES``, ``pair_fits``), and
the pair launch against the float64 reference and, to the bit, against the same classes run
as two launches -- on both APIs, one and two cores, with NaN in every cache slot no query may
see. The trace shows one launch whose decode gathers run between the prefill items."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import host.step_plan as step_plan
import nki_sim
from host.attention import paged_attention
from host.reference import paged_attention_ref
from host.step_plan import plan_paged_attention
from nki_kernels.contract import MAX_CHUNK
from nki_kernels.scheduled.scheduled_pair import interleave, segments, step_chunks

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

# three decodes (one with a 2-token query) beside two prefill chunks, one on a long context
QLENS, CLENS = [1, 200, 1, 2, 90], [900, 300, 40, 1300, 0]


@pytest.mark.parametrize("n_a, n_b", [(40, 1), (64, 16), (32, 3), (3, 32), (7, 7), (0, 5),
                                      (5, 0), (0, 0), (1, 1), (130, 2)])
def test_interleave_covers_every_item_once(n_a, n_b):
    steps, k_a, k_b, rest_a, rest_b = interleave(n_a, n_b)
    assert steps * k_a + rest_a == n_a and steps * k_b + rest_b == n_b
    if n_a and n_b:
        assert steps == min(n_a, n_b) and 1 in (k_a, k_b) and 0 in (rest_a, rest_b)
        assert rest_a < steps and rest_b < steps       # the rest is less than one more step
    else:
        assert steps == 0


def test_interleave_refuses_negative_counts():
    with pytest.raises(ValueError, match="must be >= 0; got -1, 3"):
        interleave(-1, 3)


@settings(max_examples=300, deadline=None)
@given(st.tuples(st.integers(0, 90), st.integers(0, 90)),
       st.tuples(st.integers(0, 90), st.integers(0, 90)))
def test_segments_run_each_stream_in_order_once(counts_a, counts_b):
    segs = segments(counts_a, counts_b)
    assert 1 <= len(segs) <= 3
    for c, counts in enumerate((counts_a, counts_b)):
        seen = [(ph, first + i) for seg in segs for ph, first, n in [seg[c]] for i in range(n)]
        # every item once, the full phase's before the partial phase's, each in order
        assert seen == [(0, i) for i in range(counts[0])] + [(1, i) for i in range(counts[1])]


def test_segments_spread_both_streams_over_the_launch():
    # 4 x 512 + 60 decodes, one KV head: 40 + 64 decode items, 1 + 16 prefill items -- the
    # decode class's full items are split where the prefill class turns to its partial items
    assert segments((40, 64), (1, 16)) == [((0, 0, 6), (0, 0, 1)), ((0, 6, 34), (1, 0, 6)),
                                           ((1, 0, 64), (1, 6, 10))]
    assert segments((0, 32), (1, 3)) == [((1, 0, 8), (0, 0, 1)), ((1, 8, 24), (1, 0, 3))]


@pytest.mark.parametrize("k", [1, 5, 40, 64, 65, 96, 130, 67, 480])
def test_step_chunks_preload_a_step_within_the_chunk_limit(k):
    m, chunk = step_chunks(k)
    assert m == -(-k // MAX_CHUNK) and 1 <= chunk <= MAX_CHUNK
    assert 0 <= k - m * chunk < m                  # fewer than m items left to the phase's end


def test_step_chunks_refuses_an_empty_step():
    with pytest.raises(ValueError, match="k must be >= 1; got 0"):
        step_chunks(0)


@pytest.mark.simulation
def test_a_step_of_more_than_a_chunk_runs_every_item(on_api, batch_factory, tol):
    """70 decodes beside a 9-token prefill chunk (one prefill item per segment): a step of
    more than MAX_CHUNK decode items, preloaded in two chunks, checked against the float64
    reference."""
    b = batch_factory(69, [1] * 70 + [9], [600] * 70 + [300], H=8, Hkv=1, d=16, block_size=16)
    plan = _plan(b, large_tile_size=512)
    counts = [(p.launch.cls.full.items, p.launch.cls.partial.items) for p in plan.parts]
    steps = [interleave(a[2], c[2]) for a, c in segments(*counts)]
    assert plan.fused and max(k_a for _, k_a, _, _, _ in steps) > MAX_CHUNK
    with on_api("nki"):
        out = _run(b, b.kv_cache, 1)
    atol, rtol = tol("mixed", b.query.dtype)
    ref = paged_attention_ref(*b.args())
    assert np.all(np.abs(out.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))


def _plan(b, **kw):
    return plan_paged_attention(b.block_tables, b.query_lens, b.context_lens,
                                num_heads=b.query.shape[1], num_kv_heads=b.kv_cache.shape[2],
                                head_size=b.query.shape[2], block_size=b.kv_cache.shape[3],
                                num_blocks=b.kv_cache.shape[1], dtype=b.query.dtype, **kw)


def test_the_plan_fuses_two_classes_and_keeps_one_class_alone(batch_factory, monkeypatch):
    b = batch_factory(61, QLENS, CLENS, H=8, Hkv=2, d=32, block_size=16)
    plan = _plan(b)
    assert [p.launch.cls.kind for p in plan.parts] == ["decode", "prefill"] and plan.fused
    # fused: the prefill class shares DMA queues and GpSimd, so it does not offload to them
    assert not any(p.kernel_kwargs["options"].prefill_only for p in plan.parts)
    assert not _plan(batch_factory(62, [1, 1], [300, 50], H=8, Hkv=2, d=32,
                                   block_size=16)).fused
    monkeypatch.setattr(step_plan, "FUSE_CLASSES", False)
    alone = _plan(b)
    assert not alone.fused
    assert [p.kernel_kwargs["options"].prefill_only for p in alone.parts] == [False, True]


def test_a_pair_that_does_not_fit_runs_as_two_launches(batch_factory, monkeypatch):
    # the plan asks pair_fits; where the two working sets do not fit together, each class is a
    # launch of its own and the prefill class offloads as it does alone
    b = batch_factory(68, QLENS, CLENS, H=8, Hkv=2, d=32, block_size=16)
    monkeypatch.setattr(step_plan, "pair_fits", lambda *a, **k: False)
    plan = _plan(b)
    assert not plan.fused
    assert [p.kernel_kwargs["options"].prefill_only for p in plan.parts] == [False, True]


def test_pair_fits_must_pass_and_must_fail(batch_factory):
    plan = _plan(batch_factory(63, QLENS, CLENS, H=8, Hkv=2, d=32, block_size=16))
    classes = [p.launch.cls for p in plan.parts]
    kw = dict(block_size=16, head_size=32, query_itemsize=4, cache_itemsize=4, kernel_itemsize=2)
    assert step_plan.pair_fits(classes, [512, 512], **kw)
    # 8192-key tiles of float32 K and V rows at d = 512 for both classes: far past the SBUF
    assert not step_plan.pair_fits(classes, [8192, 8192], **dict(kw, head_size=512))


def _run(b, kv_cache, lnc, **kw):
    return paged_attention(b.query, b.key, b.value, kv_cache, b.block_tables, b.query_lens,
                           b.context_lens, backend="sim", large_tile_size=512, lnc=lnc, **kw)


@pytest.mark.simulation
@pytest.mark.parametrize("api", ["nki", "legacy"])
@pytest.mark.parametrize("hkv, lnc", [(2, 1), (2, 2), (3, 2)], ids=["lnc1", "lnc2-heads",
                                                                      "lnc2-items"])
def test_pair_launch_matches_reference_and_two_launches(api, hkv, lnc, on_api, batch_factory,
                                                        poison_unseen, tol, monkeypatch):
    b = batch_factory(64, QLENS, CLENS, H=4 * hkv, Hkv=hkv, d=32, block_size=16)
    poisoned = poison_unseen(b)
    with on_api(api), nki_sim.tracing() as trace:
        fused = _run(b, poisoned, lnc)
    atol, rtol = tol("mixed", b.query.dtype)
    ref = paged_attention_ref(*b.args())
    assert np.all(np.abs(fused.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))
    assert len(trace.launches()) == 1
    monkeypatch.setattr(step_plan, "FUSE_CLASSES", False)
    monkeypatch.setattr(step_plan, "PREFILL_CLASS_OFFLOAD", False)    # the same options
    with on_api(api), nki_sim.tracing() as two:
        apart = _run(b, poisoned, lnc)
    assert len(two.launches()) == 2
    np.testing.assert_array_equal(fused.view(np.uint32), apart.view(np.uint32))


@pytest.mark.simulation
def test_one_sequences_nan_stays_in_that_sequence(on_api, batch_factory):
    """NaN in a prefill sequence's own context reaches that sequence's rows only; the decodes
    interleaved with its items keep their values."""
    b = batch_factory(65, QLENS, CLENS, H=8, Hkv=2, d=32, block_size=16)
    cache = b.kv_cache.copy()
    blk = b.block_tables[1, 0]                 # sequence 1 (200 new tokens): its first block
    cache[0, blk, :, 0, :] = np.nan
    with on_api("nki"):
        out = _run(b, cache, 1)
    start = np.concatenate(([0], np.cumsum(b.query_lens)))
    bad = np.isnan(out).any(axis=(1, 2))
    assert bad[start[1]:start[2]].all()
    assert not bad[:start[1]].any() and not bad[start[2]:].any()


@pytest.mark.simulation
def test_the_decode_gathers_run_between_the_prefill_items(on_api, batch_factory):
    """Read from the trace: the launch's metadata chunks (int32 loads, one per interleaved step
    and class; the classes' widths differ) alternate between the two classes, so no class runs
    all its items of a phase before the other starts."""
    b = batch_factory(66, [1] * 12 + [40] * 4, [700] * 12 + [600, 300, 900, 50], H=8, Hkv=1,
                      d=32, block_size=16)
    plan = _plan(b, large_tile_size=512)
    assert plan.fused
    with on_api("nki"), nki_sim.tracing() as trace:
        _run(b, b.kv_cache, 1)
    rows = [p.launch.cls.rows for p in plan.parts]
    loads = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "direct"
             and e.src_buffer == "hbm" and e.dst_buffer == "sbuf" and e.out_dtype == "int32"]
    assert loads, "no metadata loads in the trace"
    widths = [e.out_shape[-1] for e in loads]
    switches = sum(1 for x, y in zip(widths, widths[1:]) if x != y)
    # the partial phases: 12 decode items and 4 prefill groups' items -> 4 steps of 3 + 1
    assert switches >= 7, (rows, widths)


@pytest.mark.simulation
def test_the_pair_sbuf_check_warns_only_when_the_two_do_not_fit(on_api, batch_factory,
                                                               monkeypatch):
    """Must pass: the test batch's two working sets fit; must fail: a target whose usable SBUF
    holds each class alone but not both (NeuronCore-v3's lowered to that) warns, naming the two
    working sets."""
    import warnings

    from nki_kernels.sbuf_plan import SbufBudgetWarning
    from nki_kernels.scheduled import sched_plan

    b = batch_factory(67, QLENS, CLENS, H=8, Hkv=2, d=32, block_size=16)
    plan = _plan(b, large_tile_size=512)
    assert plan.fused
    needs = [sched_plan.working_set_bytes(
        nc_gen="gen3", block_size=16, large_tile=p.kernel_kwargs["options"].LARGE_TILE_SZ,
        head_size=32, rows=p.launch.cls.rows, blocks=p.launch.cls.blocks, cache_itemsize=4,
        query_itemsize=4, kernel_itemsize=2, keys_on_partitions=p.launch.cls.decode_layout)[0]
        for p in plan.parts]
    with on_api("nki"), warnings.catch_warnings():
        warnings.simplefilter("error", SbufBudgetWarning)
        _run(b, b.kv_cache, 1)
    monkeypatch.setitem(sched_plan.SBUF_USABLE, "gen3", max(needs) + sched_plan.SBUF_MARGIN)
    with on_api("nki"), pytest.warns(SbufBudgetWarning, match="two classes' working sets"):
        _run(b, b.kv_cache, 1)
