"""Prefill class launches (``SchedOptions.prefill_only``, set by the host for every prefill
class launched alone: a mixed batch's pair launch leaves it off): on NeuronCore-v3 a group's state is reset by a DMA from a table of initial rows instead of a
VectorE select where ``sched_item.reset_by_dma`` says so (a full phase; on the current API
groups of at least ``RESET_BY_DMA_MIN_BLOCKS`` Q blocks, lowered here to exercise that path on
small batches; on NeuronCore-v2 no full phase, 512-key partial tiles, two KV heads), the query-rows steps fold their chunks' row maxima on GpSimd (both APIs), and on the current API
(NeuronCore-v3) transpose P by SBUF -> SBUF DMA transposes, eight 128-key blocks per DMA; the
legacy API keeps the PE transposes. The outputs match the float64 reference, and the prefill
rows are bit-identical to the same sequences run with the host's ``PREFILL_CLASS_OFFLOAD``
turned off, so the two transposes, the two folds and the two resets agree to the bit, and to the
same sequences beside a decode (whose launch leaves the prefill launch as it is); a sequence's
own NaN stays in that sequence with the DMA reset as with the select.

The op-layer transform itself (``ops.transpose_on_dma``) is checked against NumPy, with its
inverse, and must fail on NeuronCore-v2 and on the legacy layer."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from host.launch import launch_kernel
from host.reference import paged_attention_ref
from nki_kernels.ops import KernelFamily

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
P = 128
BF16 = ml_dtypes.bfloat16
BLOCKS_PER_DMA = 8


def _sbuf_transposes(trace):
    return [e for e in trace.events if e.op == "dma_transpose" and e.src_buffer == "sbuf"]


def _combines(trace):
    """(engine, op, free size) of the fp32 SBUF operations that fold a step's 4 chunk maxima: a
    VectorE reduce of 4 columns, or a GpSimd maximum of 2 columns against the other two."""
    return [(e.engine, e.op, e.free_elems) for e in trace.events
            if e.partitions == P and e.in_dtypes and e.in_dtypes[0] == "float32"
            and e.src_buffer == "sbuf"
            and ((e.op == "tensor_reduce" and e.free_elems == 4)
                 or (e.op == "tensor_scalar" and e.engine == "gpsimd" and e.free_elems == 2))]


def _state_selects(trace, d):
    """Selects over whole group states (fp32, every block's d + 2 columns): the reset without
    the prefill-class offload and of decode classes (``tensor_copy_predicated`` on the current API, ``where`` on the
    legacy one); mask selects are 512 or 128 columns wide, never a multiple of d + 2 here."""
    return [e for e in trace.events if e.op in ("tensor_copy_predicated", "where")
            and e.out_dtype == "float32" and e.out_shape[-1] % (d + 2) == 0]


def _reset_gathers(trace, d):
    """Indirect fp32 gathers of whole group states from HBM: the state loads of the partial
    phase and, without a decode class, the resets (skipped, 0 bytes, unless a group starts)."""
    return [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"
            and e.src_buffer == "hbm" and e.dst_buffer == "sbuf" and e.out_dtype == "float32"
            and e.out_shape[-1] % (d + 2) == 0]


N_PREFILL = 500          # tokens of the two prefill chunks
D = 32


def _assert_nan_only_in(out, clean, seq, group):
    """``out`` (tokens, H, d) is NaN on prefill sequence ``seq``'s rows (0: the first 300
    tokens, 1: the rest of N_PREFILL) of KV head 0's ``group`` query heads -- the must-fail
    side: the NaN is read -- and bit-equal to ``clean`` everywhere else."""
    rows = slice(0, 300) if seq == 0 else slice(300, N_PREFILL)
    hit = np.zeros(out.shape[:2], bool)
    hit[rows, :group] = True
    assert np.isnan(out[hit].astype(np.float32)).all()
    assert out[~hit].tobytes() == clean[~hit].tobytes()


@pytest.fixture
def prefill_batch(batch_factory, poison_unseen):
    """Two prefill chunks (2048-key steps: 16 blocks, two DMAs each) beside a decode
    (``with_decode``), or the same two chunks alone (the same cache and data); NaN in every
    cache slot no query may see."""
    import dataclasses

    mixed = batch_factory(61, [300, 200, 1], [2500, 4200, 900], H=8, Hkv=2, d=D, block_size=16,
                          dtype=BF16)
    mixed = dataclasses.replace(mixed, kv_cache=poison_unseen(mixed))

    def make(with_decode):
        if with_decode:
            return mixed
        return dataclasses.replace(
            mixed, query=mixed.query[:N_PREFILL], key=mixed.key[:N_PREFILL],
            value=mixed.value[:N_PREFILL], block_tables=mixed.block_tables[:2],
            query_lens=mixed.query_lens[:2], context_lens=mixed.context_lens[:2])
    return make


@pytest.fixture
def reset_min_blocks(monkeypatch):
    """Set ``sched_item.RESET_BY_DMA_MIN_BLOCKS`` (the current API's group size for a DMA
    reset) for one test; None leaves the shipped value."""
    import nki_kernels.scheduled.sched_item as si

    def set_to(blocks):
        if blocks is not None:
            monkeypatch.setattr(si, "RESET_BY_DMA_MIN_BLOCKS", blocks)
            monkeypatch.setattr(si, "RESET_BY_DMA_MIN_BLOCKS_PARTS", blocks)
    return set_to


# (target, api, lnc, min blocks or None, reset by DMA without a decode class): the test batch
# has a full phase and groups of fewer than 20 Q blocks
RESET_CASES = [("trn2", "nki", 1, None, False), ("trn2", "nki", 1, 1, True),
               ("trn2", "nki", 2, 1, True), ("trn2", "legacy", 1, None, True),
               ("trn1", "legacy", None, 1, False)]


@pytest.mark.parametrize("target, api, lnc, min_blocks, by_dma", RESET_CASES)
def test_prefill_only_batches_move_p_transposes_to_dma(target, api, lnc, min_blocks, by_dma,
                                                       on_api, prefill_batch, reset_min_blocks,
                                                       monkeypatch, tol):
    import host.step_plan as step_plan

    reset_min_blocks(min_blocks)
    outs, traces = {}, {}
    # False: the prefill chunks alone; True: beside a decode in two launches with the offload
    # turned off; "apart": beside a decode in two launches (the prefill launch offloads all the
    # same); "mixed": beside a decode as shipped -- one pair launch, whose prefill class shares
    # the DMA queues and GpSimd with the decodes and does not offload
    for key, with_decode, offload, fuse in ((False, False, True, True), (True, True, False, False),
                                            ("apart", True, True, False),
                                            ("mixed", True, True, True)):
        monkeypatch.setattr(step_plan, "PREFILL_CLASS_OFFLOAD", offload)
        monkeypatch.setattr(step_plan, "FUSE_CLASSES", fuse)
        b = prefill_batch(with_decode)
        with on_api(api, target), nki_sim.tracing() as traces[key]:
            outs[key] = np.asarray(paged_attention(
                *b.args(), backend="sim", kernel="scheduled", large_tile_size=2048,
                partial_tile_size=2048, lnc=lnc), np.float64)
        ref = paged_attention_ref(*b.args())
        atol, rtol = tol("mixed", b.query.dtype)
        assert np.all(np.abs(outs[key] - ref) <= atol + rtol * np.abs(ref))
    assert np.array_equal(outs[False], outs[True][:N_PREFILL])
    assert np.array_equal(outs["mixed"], outs[True]) and np.array_equal(outs["apart"], outs[True])
    # both APIs: the maxima fold on GpSimd with the offload, on VectorE without
    comb = {k: set(_combines(t)) for k, t in traces.items()}
    assert comb == {False: {("gpsimd", "tensor_scalar", 2)},
                    True: {("vector", "tensor_reduce", 4)},
                    "apart": {("gpsimd", "tensor_scalar", 2)},
                    "mixed": {("vector", "tensor_reduce", 4)}}
    assert len(_sbuf_transposes(traces["apart"])) == len(_sbuf_transposes(traces[False]))
    assert not _sbuf_transposes(traces["mixed"])
    # the state reset: a DMA where the rule says so (no select; more state-sized gathers, most
    # of them skipped), else a select; always a select without the offload
    gathers = {k: _reset_gathers(t, D) for k, t in traces.items()}
    assert _state_selects(traces[True], D)
    if not by_dma:
        # every state gather loads a state, except the one per KV head (2) and part of the
        # group that keeps its state in SBUF between the phases (host.scheduled.state_carry)
        assert _state_selects(traces[False], D) and any(e.bytes for e in gathers[False])
        assert len([e for e in gathers[False] if not e.bytes]) <= 2 * (lnc or 1)
    else:
        assert not _state_selects(traces[False], D)
        assert len(gathers[False]) > len(gathers[True])
        assert any(e.bytes == 0 for e in gathers[False]) and any(e.bytes for e in gathers[False])
    on_dma = _sbuf_transposes(traces[False])
    if (target, api) != ("trn2", "nki"):
        assert not on_dma                            # no SBUF DMA transpose on this layer
        return
    assert on_dma and not _sbuf_transposes(traces[True])      # no offload: PE transposes
    rows = {tuple(e.out_shape) for e in on_dma}
    assert rows == {(P, 1, BLOCKS_PER_DMA, P)}                # 8 blocks of 128 rows per DMA
    nt = {k: sum(e.op == "nc_transpose" for e in t.events) for k, t in traces.items()}
    assert nt[False] < nt[True]



@pytest.mark.parametrize("target, api, lnc, min_blocks, by_dma", RESET_CASES)
@pytest.mark.parametrize("seq", [0, 1])
def test_prefill_only_a_sequences_nan_stays_in_that_sequence(target, api, lnc, min_blocks,
                                                             by_dma, seq, on_api, prefill_batch,
                                                             reset_min_blocks):
    # the two chunks' groups follow each other through one state tile per KV head: a NaN state
    # left by one group must not survive the reset (DMA or select) into the next (either order)
    import dataclasses

    reset_min_blocks(min_blocks)

    b = prefill_batch(False)
    cache = b.kv_cache.copy()
    cache[1, b.block_tables[seq, 0], 0, 0, :] = np.nan      # V of a key every query sees
    bad = dataclasses.replace(b, kv_cache=cache)
    kw = dict(backend="sim", kernel="scheduled", large_tile_size=2048, partial_tile_size=512,
              lnc=lnc)
    with on_api(api, target):
        clean = np.asarray(paged_attention(*b.args(), **kw))
        out = np.asarray(paged_attention(*bad.args(), **kw))
    _assert_nan_only_in(out, clean, seq, b.query.shape[1] // b.kv_cache.shape[2])


@pytest.mark.parametrize("seq", [0, 1])
def test_trn1_dma_reset_keeps_a_sequences_nan_there(seq, on_api, batch_factory, poison_unseen,
                                                     tol):
    # NeuronCore-v2's DMA reset (no full phase, 512-key partial tiles, two KV heads): a NaN in
    # one sequence's V reaches that sequence's rows of its KV head and nothing else
    import dataclasses

    b = batch_factory(67, [300, 200], [0, 100], H=8, Hkv=2, d=D, block_size=16, dtype=BF16)
    b = dataclasses.replace(b, kv_cache=poison_unseen(b))
    value = b.value.copy()
    value[0 if seq == 0 else 300, 0, :] = np.nan     # V of the sequence's first (new) key
    bad = dataclasses.replace(b, value=value)
    kw = dict(backend="sim", kernel="scheduled", large_tile_size=2048, partial_tile_size=512)
    with on_api("legacy", "trn1"), nki_sim.tracing() as trace:
        clean = np.asarray(paged_attention(*b.args(), **kw))
    with on_api("legacy", "trn1"):
        out = np.asarray(paged_attention(*bad.args(), **kw))
    assert not _state_selects(trace, D)              # the DMA reset ran
    ref = paged_attention_ref(*b.args())
    atol, rtol = tol("mixed", b.query.dtype)
    assert np.all(np.abs(clean.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))
    _assert_nan_only_in(out, clean, seq, 4)


@pytest.mark.parametrize("api", ["nki", "legacy"])
def test_prefill_only_item_parts_reset_on_each_core(api, on_api, batch_factory, poison_unseen,
                                                    reset_min_blocks, tol):
    # one KV head on both cores of trn2 (item parts, docs/layouts.md §16.3): each core resets
    # its groups from its own slab of the table; NaN in one sequence's data stays there
    import dataclasses

    reset_min_blocks(1)

    b = batch_factory(64, [300, 200, 90], [2500, 0, 700], H=4, Hkv=1, d=D, block_size=16,
                      dtype=BF16)
    b = dataclasses.replace(b, kv_cache=poison_unseen(b))
    cache = b.kv_cache.copy()
    cache[1, b.block_tables[0, 0], 0, 0, :] = np.nan        # V of a key sequence 0 always sees
    bad = dataclasses.replace(b, kv_cache=cache)
    kw = dict(backend="sim", kernel="scheduled", large_tile_size=2048, partial_tile_size=512)
    outs = {}
    with on_api(api, "trn2"):
        for lnc in (1, 2):
            with nki_sim.tracing() as trace:
                outs[lnc] = np.asarray(paged_attention(*b.args(), lnc=lnc, **kw), np.float64)
            assert not _state_selects(trace, D)
        poisoned = np.asarray(paged_attention(*bad.args(), lnc=2, **kw))
    ref = paged_attention_ref(*b.args())
    atol, rtol = tol("mixed", b.query.dtype)
    for out in outs.values():
        assert np.all(np.abs(out - ref) <= atol + rtol * np.abs(ref))
    assert np.isnan(poisoned[:300].astype(np.float32)).all()    # must-fail side: it is read
    assert np.array_equal(poisoned[300:].astype(np.float64), outs[2][300:])


@pytest.mark.parametrize("variant", ["window", "softcap", "alibi", "sinks"])
@pytest.mark.parametrize("min_blocks", [None, 1])
def test_prefill_only_variants_match_the_reference(variant, min_blocks, on_api, prefill_batch,
                                                   reset_min_blocks, tol):
    # the DMA-transposed P, the GpSimd fold and either reset (the DMA one writes sinks' and
    # ALiBi's initial rows straight into the state) under every score variant (trn2, current
    # API): the reference of the same variant, NaN in every unseen slot, DMA transposes issued
    reset_min_blocks(min_blocks)
    b = prefill_batch(False)
    H = b.query.shape[1]
    rng = np.random.default_rng(63)
    kw = {"window": dict(sliding_window=3000), "softcap": dict(logits_soft_cap=5.0),
          "alibi": dict(alibi_slopes=np.linspace(0.01, 0.3, H).astype(np.float32)),
          "sinks": dict(sinks=rng.normal(0.0, 1.0, H).astype(np.float32))}[variant]
    with on_api("nki"), nki_sim.tracing() as trace:
        out = np.asarray(paged_attention(*b.args(), backend="sim", kernel="scheduled",
                                         large_tile_size=2048, partial_tile_size=2048, lnc=1,
                                         **kw), np.float64)
    ref = paged_attention_ref(*b.args(), **kw)
    atol, rtol = tol("mixed", b.query.dtype)
    assert np.all(np.abs(out - ref) <= atol + rtol * np.abs(ref))
    assert _sbuf_transposes(trace)
    assert (not _state_selects(trace, D)) == (min_blocks == 1)

# ---- the op-layer transform -------------------------------------------------------------------
ROWS, BLOCKS, LEAD = 96, 3, 2


def _build(ops):
    def blocks_by_dma(x):
        """x (ROWS, LEAD*128 + BLOCKS*128) bf16 -> (128, LEAD*ROWS + BLOCKS*ROWS): the BLOCKS
        column blocks after the LEAD ones, transposed into columns after LEAD*ROWS."""
        out = ops.ndarray((P, (LEAD + BLOCKS) * ROWS), dtype=x.dtype, buffer=ops.SHARED_HBM)
        src = ops.sbuf((ROWS, (LEAD + BLOCKS) * P), x.dtype)
        ops.load(src, x)
        dst = ops.sbuf((P, (LEAD + BLOCKS) * ROWS), x.dtype)
        ops.memset(dst, 0.0)
        ops.transpose_on_dma(dst, LEAD * ROWS, src, LEAD * P, BLOCKS)
        idx = ops.sbuf((P, 1), ops.int32)
        ops.iota(idx, step=0, partition_step=1)
        ops.scatter(out, idx, 0, dst)
        return out

    return blocks_by_dma


BY_DMA = KernelFamily(_build, "blocks_by_dma")


def _input():
    rng = np.random.default_rng(62)
    return rng.standard_normal((ROWS, (LEAD + BLOCKS) * P)).astype(BF16)


def test_transpose_on_dma_transposes_each_block_and_inverts():
    x = _input()
    with nki_sim.use_target("trn2"):
        got = launch_kernel(BY_DMA, (x,), {}, grid_heads=1, backend="sim", api="nki")
    assert not got[:, :LEAD * ROWS].astype(np.float32).any()      # columns before: untouched
    back = np.empty((ROWS, BLOCKS * P), BF16)
    for u in range(BLOCKS):
        blk = got[:, (LEAD + u) * ROWS:(LEAD + u + 1) * ROWS]
        assert np.array_equal(blk, x[:, (LEAD + u) * P:(LEAD + u + 1) * P].T)
        back[:, u * P:(u + 1) * P] = blk.T
    assert np.array_equal(back, x[:, LEAD * P:])                  # the inverse rebuilds x


def test_transpose_on_dma_is_refused_by_the_legacy_layer():
    # must-fail: the legacy layer has no SBUF DMA transpose of block views (its flag says so);
    # NeuronCore-v2's refusal of dma_transpose is the simulator's (tests/sim_nki)
    from nki_kernels import ops

    assert not ops.for_api("legacy").has_sbuf_dma_transpose(BF16)
    with nki_sim.use_target("trn2"), pytest.raises(NotImplementedError, match="has_sbuf_dma"):
        launch_kernel(BY_DMA, (_input(),), {}, grid_heads=1, backend="sim", api="legacy")


@pytest.mark.parametrize("target, api, q, c, lnc, hkv, tile, by_dma", [
    ("trn2", "legacy", [300, 200], [0, 100], 1, 1, 2048, False),   # no full phase: the select
    ("trn2", "legacy", [300, 200], [2500, 4200], 1, 1, 2048, True),  # a full phase, no DMA Ts
    ("trn2", "nki", [300, 200], [2500, 4200], 1, 1, 2048, False),  # K^T by DMA, 10-block groups
    ("trn2", "nki", [512], [2100], 1, 1, 2048, False),             # K^T by DMA, 16-block groups
    ("trn2", "nki", [640], [2100], 1, 1, 2048, True),              # K^T by DMA, 20-block groups
    ("trn2", "nki", [1024], [2100], 2, 1, 2048, False),            # item parts, 8-block groups
    ("trn2", "nki", [2048], [2100], 2, 1, 2048, True),             # item parts, 16-block groups
    ("trn1", "legacy", [300, 200], [0, 100], 1, 2, 512, True),     # no full phase, 512 keys
    ("trn1", "legacy", [300, 200], [0, 100], 1, 1, 512, False),    # one KV head
    ("trn1", "legacy", [300, 200], [0, 100], 1, 2, 1024, False),   # 1024-key partial tiles
    ("trn1", "legacy", [300, 200], [2500, 4200], 1, 2, 512, False)])   # a full phase
def test_reset_rule_picks_the_dma_where_vector_e_binds(target, api, q, c, lnc, hkv, tile, by_dma,
                                                       on_api, batch_factory, poison_unseen,
                                                       tol):
    # sched_item.reset_by_dma with the shipped thresholds, and the reference either way
    import dataclasses

    import nki_kernels.scheduled.sched_item as si

    b = batch_factory(65, q, c, H=4 * hkv, Hkv=hkv, d=D, block_size=16, dtype=BF16)
    b = dataclasses.replace(b, kv_cache=poison_unseen(b))
    with on_api(api, target), nki_sim.tracing() as trace:
        out = np.asarray(paged_attention(*b.args(), backend="sim", kernel="scheduled",
                                         large_tile_size=2048, partial_tile_size=tile,
                                         lnc=lnc), np.float64)
    k_by_dma = [e for e in trace.events if e.op == "dma_transpose" and e.src_buffer == "hbm"]
    assert bool(k_by_dma) == (api == "nki")
    assert (not _state_selects(trace, D)) == by_dma
    # the shipped values these cases straddle
    assert (si.RESET_BY_DMA_MIN_BLOCKS, si.RESET_BY_DMA_MIN_BLOCKS_PARTS,
            si.RESET_BY_DMA_GEN2_MAX_KEYS) == (20, 12, 512)
    ref = paged_attention_ref(*b.args())
    atol, rtol = tol("mixed", b.query.dtype)
    assert np.all(np.abs(out - ref) <= atol + rtol * np.abs(ref))


@pytest.mark.parametrize("api, context, partial_tile, on_vector", [
    (api, 0, tile, share) for api in ("nki", "legacy")
    for tile, share in ((2048, 1 / 4), (1024, 1 / 8), (512, 0.0))] + [   # no full phase
    # a full phase (its P^T by DMA on this API): as many masked keys as full ones (one 2048-key
    # item each), one copy in eight moves; four times as many full keys, VectorE binds, none
    ("nki", 2100, 2048, 1 / 8), ("nki", 4200, 1024, 0.0)])
def test_masked_only_launches_send_some_p_copies_to_vector_e(api, context, partial_tile,
                                                             on_vector, on_api, batch_factory,
                                                             tol):
    # sched_item.P_EVAC_GEN3_MASKED_ONLY / _MASKED_HEAVY: the masked steps' P^T PSUM copies
    # (16-bit, 1024 columns at most) of a prefill-only launch, trn2
    b = batch_factory(66, [512], [context], H=4, Hkv=1, d=D, block_size=16, dtype=BF16)
    with on_api(api, "trn2"), nki_sim.tracing() as trace:
        out = np.asarray(paged_attention(*b.args(), backend="sim", kernel="scheduled",
                                         large_tile_size=2048, partial_tile_size=partial_tile,
                                         lnc=1), np.float64)
    ref = paged_attention_ref(*b.args())
    atol, rtol = tol("mixed", b.query.dtype)
    assert np.all(np.abs(out - ref) <= atol + rtol * np.abs(ref))
    copies = [e.engine for e in trace.events if e.op == "tensor_copy" and e.src_buffer == "psum"
              and e.partitions == P and e.out_dtype == "bfloat16"]
    assert copies and copies.count("vector") == on_vector * len(copies)
