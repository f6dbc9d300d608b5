"""Where the scheduled kernel's online-softmax steps run their passes, read from the
simulator's trace: masked steps' select / max forms per NeuronCore version, the trn1 mask
distances and row-max copies, row sums on TensorE, per-bank copies and state ops, one DMA per
item for query-rows groups, whole-tile decode steps, the partial tile size check and the decode
fills and K^T copies. Every run also matches the float64 reference."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

import nki_sim
from host.reference import paged_attention_ref
from host.scheduled.scheduled import kernel_inputs, pack_queries, row_init
from nki_kernels import toolchain
from nki_kernels.scheduled.scheduled_attention import SchedOptions, scheduled_paged_attention
from sched_trace_util import BF16, P, launch, prepare

pytestmark = pytest.mark.simulation


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_masked_prefill_steps_select_and_reduce_in_one_pass_on_trn2(target, batch_factory):
    """Query-rows masked steps: NeuronCore-v3 selects and takes the row max with one
    range_select per 512-key chunk (scores in natural key order; no distance pass, no separate
    select); v2 keeps the distance, select and max passes (range_select does not exist
    there)."""
    batch = batch_factory(3, [40, 1], [300, 700], H=4, Hkv=2, d=16, block_size=16)
    s, overlay = prepare(batch, 2048, 512)
    with nki_sim.use_target(target):
        out, trace = launch(batch, s, overlay, s.classes, 2048)
    assert np.abs(out - paged_attention_ref(*batch.args())).max() < 3e-2
    prefill = [c for c in s.classes if not c.decode_layout]
    assert prefill and prefill[0].partial.real_items > 0
    ops = [e.op for e in trace.events if e.engine == "vector"]
    n_sel = ops.count("range_select")
    if target == "trn2":
        # one per 512-key chunk of every masked 128-row block step (partial tiles of 512 keys)
        assert n_sel == 2 * prefill[0].partial.items * prefill[0].blocks
        assert {e.free_elems for e in trace.events if e.op == "range_select"} == {512}
    else:
        assert n_sel == 0


@pytest.mark.parametrize("api", ["legacy", "nki"])
@pytest.mark.parametrize("variant", ["causal", "window", "softcap"])
@pytest.mark.parametrize("B, ltp, starts", [(8, 2048, {0.0, 512.0, 1024.0, 1536.0}),
                                            (32, 8192, {0.0, 128.0})],
                         ids=["natural", "tiled"])
def test_masked_prefill_range_select_forms_on_trn2(api, variant, B, ltp, starts, on_api,
                                                   batch_factory, poison_unseen):
    """NeuronCore-v3 masked query-rows steps in their two range-select forms, read from each
    range select's range_start:

    * natural key order (``sched_range.natural_order``: every load of the tile inside one
      2048-key step; here partial tiles of 2048 keys at B = 8, b' = 8, loads of 1024 keys): the
      QK matmul reads K^T in natural order, so ONE range select per 512-key chunk starts at
      the chunk's first key (0, 512, 1024, 1536) with the rows' plain bounds;
    * tiled order (b' = 32 at B = 32 and 8192-key tiles: a load of 4096 keys spans two steps):
      one per 128-key block, with per-offset bounds from 2 b' instructions per item (10 Q blocks
      x 4 steps per item make that the cheaper form) and a static range_start l * 128 (l = 0,
      1: two loads).

    Both match the float64 reference, and NaN in every cache slot no query may see changes no
    output bit."""
    from host.attention import paged_attention

    q, c = [300, 1], [200, 700]
    b = batch_factory(3, q, c, H=8, Hkv=2, d=16, block_size=B, dtype=BF16, spare_blocks=2)
    kw = {"causal": {}, "window": dict(sliding_window=150),
          "softcap": dict(logits_soft_cap=2.0)}[variant]
    run = dict(backend="sim", kernel="scheduled", large_tile_size=ltp, partial_tile_size=ltp,
               **kw)
    with on_api(api), nki_sim.tracing() as trace:
        out = paged_attention(*b.args(), **run)
    ref = paged_attention_ref(*b.args(), **kw)
    assert np.abs(np.asarray(out, np.float32) - ref).max() < 3e-2
    sel = [e for e in trace.events if e.op == "range_select"]
    assert sel and {dict(e.attrs)["range_start"] for e in sel} == starts
    assert {e.free_elems for e in sel} == {512 if len(starts) == 4 else P}
    with on_api(api):
        again = paged_attention(b.query, b.key, b.value, poison_unseen(b),
                                *b.args()[4:], **run)
    assert np.asarray(again).tobytes() == np.asarray(out).tobytes()


@pytest.mark.parametrize("variant", ["causal", "window", "softcap"])
def test_masked_prefill_steps_add_the_mask_on_tensore_on_trn1(variant, batch_factory):
    """NeuronCore-v2 masked query-rows steps with a bf16 kernel dtype and no soft-cap add their
    mask to the scores on TensorE (sched_core.additive_mask_ok): one (128 x 128) x (128 x 512)
    matmul per 512-key chunk, no VectorE select in the steps; causal and windowed masks match
    the float64 reference. With a soft-cap the mask must follow the tanh: the steps select on
    VectorE and issue no mask matmul (the other side)."""
    from host.attention import paged_attention

    batch = batch_factory(3, [300, 1], [200, 700], H=4, Hkv=2, d=16, block_size=16, dtype=BF16)
    kw = {"causal": {}, "window": dict(sliding_window=150),
          "softcap": dict(logits_soft_cap=2.0)}[variant]
    with nki_sim.use_target("trn1"), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                              mixed_precision=True, large_tile_size=512, **kw)
    ref = paged_attention_ref(*batch.args(), **kw)
    assert np.abs(np.asarray(out, np.float32) - ref).max() < 3e-2
    mask_mm = [e for e in trace.events if e.op == "nc_matmul"
               and tuple(map(tuple, e.in_shapes)) == ((P, P), (P, 512))]
    steps = [e for e in trace.events if e.engine == "vector" and e.op in ("where", "select")
             and e.src_loc[0] == "legacy.py" and e.free_elems == 512]
    if variant == "softcap":
        assert not mask_mm and steps
    else:
        assert mask_mm and not steps


def test_trn1_causal_mask_distances_run_on_scalar_or_gpsimd(batch_factory, monkeypatch):
    """The additive mask's distance pass without a window is a ScalarE relu by default (it holds
    neither shared port of NeuronCore-v2), or with ``StepConfig.distance_engine="gpsimd"`` a
    GpSimd (t - top) max 0 (SBUF operands only); the outputs are bit-identical and match the
    float64 reference."""
    from host.attention import paged_attention
    from nki_kernels.scheduled import sched_config

    batch = batch_factory(3, [300, 1], [200, 700], H=4, Hkv=2, d=16, block_size=16, dtype=BF16)

    def run():
        with nki_sim.use_target("trn1"), nki_sim.tracing() as trace:
            out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                                  mixed_precision=True, large_tile_size=512)
        wide = collections.Counter(
            (e.engine, e.op) for e in trace.events if e.out_dtype == "bfloat16"
            and e.free_elems == 512 and e.op in ("tensor_scalar", "activation")
            and e.partitions == P and e.in_dtypes and e.in_dtypes[0] == "float32"
            and e.src_buffer == "sbuf")        # the exponentials (from SBUF) and the distances
        return np.asarray(out, np.float32), wide

    out, wide = run()
    assert ("gpsimd", "tensor_scalar") not in wide
    orig = sched_config.SchedConfig.step_config
    monkeypatch.setattr(sched_config.SchedConfig, "step_config", lambda self, *a, **k:
                        dataclasses.replace(orig(self, *a, **k), distance_engine="gpsimd"))
    out_g, wide_g = run()
    moved = wide_g[("gpsimd", "tensor_scalar")]
    assert moved > 0 and wide[("scalar", "activation")] - wide_g[("scalar", "activation")] == moved
    assert out.tobytes() == out_g.tobytes()
    assert np.abs(out - paged_attention_ref(*batch.args())).max() < 3e-2


def test_trn1_row_max_copies_the_scores_out_of_psum(batch_factory):
    """On NeuronCore-v2 (VectorE and ScalarE take turns on PSUM) the row max of a chunk in PSUM
    also copies its scores to SBUF (one ``tensor_scalar_reduce``) and the exponentials read the
    copy; on NeuronCore-v3 the max is a ``tensor_reduce`` of PSUM and the exponentials read
    PSUM (the other side). Both match the float64 reference."""
    from host.attention import paged_attention

    batch = batch_factory(4, [300], [700], H=4, Hkv=2, d=16, block_size=16, dtype=BF16)
    for target, max_op, exp_src in (("trn1", "tensor_scalar_reduce", "sbuf"),
                                    ("trn2", "tensor_reduce", "psum")):
        with nki_sim.use_target(target), nki_sim.tracing() as trace:
            out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                                  mixed_precision=True, large_tile_size=512, api="legacy")
        assert np.abs(np.asarray(out, np.float32) - paged_attention_ref(*batch.args())).max() \
            < 3e-2
        wide = [e for e in trace.events if e.free_elems == 512 and e.partitions == P
                and e.engine in ("vector", "scalar")]
        maxes = {e.op for e in wide if e.engine == "vector" and e.out_dtype == "float32"
                 and e.src_buffer == "psum" and e.op in ("tensor_reduce", "tensor_scalar_reduce")}
        exps = {e.src_buffer for e in wide if e.op == "activation" and e.out_dtype == "bfloat16"
                and e.in_dtypes[0] == "float32"}
        assert max_op in maxes, (target, maxes)
        assert exp_src in exps, (target, exps)
        if target == "trn1":
            assert "tensor_reduce" not in maxes


@pytest.mark.parametrize("target, api, variant", [("trn1", "legacy", "causal"),
                                                  ("trn1", "legacy", "softcap"),
                                                  ("trn2", "nki", "causal"),
                                                  ("trn2", "legacy", "softcap")])
def test_steps_in_sbuf_exponentiate_in_one_pass(target, api, variant, on_api, batch_factory,
                                                poison_unseen):
    """A query-rows step of several 512-key chunks whose values are in SBUF -- copied out of
    PSUM by the trn1 row max, masked by a NeuronCore-v3 range select, or soft-capped and
    selected -- exponentiates them in ONE ScalarE instruction over the step (an SBUF access may
    span PSUM banks' worth of columns); a step still in PSUM (trn2 full steps) keeps one per
    bank. Selected values (trn1's soft-capped steps) take their chunk maxima in one reduce of
    a (rows, chunks, 512) view.
    Matches the float64 reference; NaN in every cache slot no query may see changes no output
    bit."""
    from host.attention import paged_attention

    kw = {"causal": {}, "softcap": dict(logits_soft_cap=2.0)}[variant]
    b = batch_factory(6, [300, 1], [200, 1900], H=8, Hkv=2, d=16, block_size=16, dtype=BF16,
                      spare_blocks=2)
    run = dict(backend="sim", kernel="scheduled", large_tile_size=2048, partial_tile_size=2048,
               **kw)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(*b.args(), **run)
    assert np.abs(np.asarray(out, np.float32) - paged_attention_ref(*b.args(), **kw)).max() \
        < 3e-2
    exps = [e for e in trace.events if e.op in ("activation", "activation_reduce")
            and e.attr("func") == "exp" and e.partitions == P and e.out_dtype == "bfloat16"]
    from_sbuf = [e.free_elems for e in exps if e.src_buffer == "sbuf"]
    assert from_sbuf and max(from_sbuf) == 2048, sorted(set(from_sbuf))
    assert all(e.free_elems <= 512 for e in exps if e.src_buffer == "psum")
    if target == "trn1" and variant == "softcap":
        maxes = [e for e in trace.events if e.op == "tensor_reduce" and e.partitions == P
                 and e.free_elems == 2048 and e.src_buffer == "sbuf"]
        assert maxes and all(tuple(e.out_shape) == (P, 4) for e in maxes)
    with on_api(api, target):
        again = paged_attention(b.query, b.key, b.value, poison_unseen(b), *b.args()[4:], **run)
    assert np.asarray(again).tobytes() == np.asarray(out).tobytes()


@pytest.mark.parametrize("d", [16, 512])
def test_prefill_row_sums_come_from_tensore(d, batch_factory):
    """128-row steps with d + 2 <= 512 take their row sums as P 1 on TensorE (a (128, 2) ones
    operand beside P V) and exponentiate without the ScalarE accumulator; d = 512 leaves no room
    in the P V bank, so those steps keep activation_reduce (the other side). Both match the
    float64 reference."""
    from host.attention import paged_attention

    batch = batch_factory(5, [40], [300], H=2, Hkv=1, d=d, block_size=16, dtype=BF16)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                              mixed_precision=True, large_tile_size=512)
    ref = paged_attention_ref(*batch.args())
    assert np.abs(np.asarray(out, np.float32) - ref).max() < 3e-2
    sums = [e for e in trace.events if e.op == "nc_matmul"
            and tuple(map(tuple, e.in_shapes)) == ((P, P), (P, 2))]
    reduces = [e for e in trace.events if e.op == "activation_reduce" and e.free_elems == 512]
    if d == 16:
        assert sums and not reduces
    else:
        assert reduces and not sums


@pytest.mark.parametrize("target, api", [("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy")])
def test_step_copies_per_psum_bank_and_state_ops_on_gpsimd(target, api, on_api, batch_factory,
                                                           monkeypatch):
    """Engine placement of the query-rows steps (2048-key steps, bf16 kernel dtype): on
    NeuronCore-v3 the P^T transposes land in a 16-bit PSUM dtype, eight 128-key blocks per bank,
    so every P^T copy out of PSUM is 1024 columns wide; on v2 (fp32 PSUM) 512. Every step's
    -m' = min(-max, -m) and its copy into the state run on GpSimd (SBUF operands only): one
    of each per step (the prefill-class offload, ``host.step_plan.PREFILL_CLASS_OFFLOAD``, of a
    prefill class launched alone, turned off; with it GpSimd also folds the chunks' maxima, one more tensor_scalar per step
    of two chunks). The output matches the float64 reference."""
    import host.step_plan as step_plan
    from host.attention import paged_attention

    batch = batch_factory(3, [300, 1], [200, 700], H=8, Hkv=2, d=16, block_size=16, dtype=BF16)
    state_ops = {}
    monkeypatch.setattr(step_plan, "FUSE_CLASSES", False)   # two launches: the prefill's offloads
    for offload in (False, True):
        monkeypatch.setattr(step_plan, "PREFILL_CLASS_OFFLOAD", offload)
        with on_api(api, target), nki_sim.tracing() as trace:
            out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                                  large_tile_size=2048, partial_tile_size=2048)
        err = np.abs(np.asarray(out, np.float32) - paged_attention_ref(*batch.args())).max()
        assert err < 3e-2
        # 128-row blocks only: the decode class's steps take -m' in one VectorE
        # tensor_scalar_reduce (sched_core.new_max_of_negated)
        one_col = [(e.engine, e.op) for e in trace.events if e.free_elems == 1
                   and e.op in ("tensor_scalar", "tensor_copy") and e.in_dtypes[0] == "float32"
                   and e.partitions == P]
        state_ops[offload] = (one_col.count(("gpsimd", "tensor_scalar")),
                              one_col.count(("gpsimd", "tensor_copy")))
        if offload:
            continue
        p_copies = [e.free_elems for e in trace.events if e.op == "tensor_copy"
                    and e.engine in ("scalar", "vector") and e.src_buffer == "psum"
                    and e.partitions == P and e.out_dtype == "bfloat16"]
        assert p_copies and set(p_copies) == {1024 if target == "trn2" else 512}
    steps, copies = state_ops[False]
    assert steps > 0 and copies == steps
    assert state_ops[True][1] == copies and state_ops[True][0] > steps


@pytest.mark.parametrize("target, api, force, reset_by_dma", [
    ("trn2", "nki", False, False), ("trn2", "nki", True, True), ("trn1", "legacy", False, True)])
def test_query_rows_groups_move_in_one_dma_per_item(target, api, force, reset_by_dma, on_api,
                                                    batch_factory, monkeypatch):
    """Group-major layouts (docs/layouts.md §16.2): every item of a query-rows class moves its
    group's Q^T with one gather per channel slice, its row init values with one gather, its
    state with one DMA and (partial phase) its output with one scatter, whatever the number of
    Q blocks per group -- here 10, and a second group of 3 real blocks padded to 10; with the
    state reset by DMA one more gather per item (``sched_item.reset_by_dma`` picks it for
    this batch -- no full phase, 512-key tiles, two KV heads -- on NeuronCore-v2 and the select
    on v3, where it is also forced). The output (with attention sinks: row init values)
    matches the float64 reference."""
    import nki_kernels.scheduled.scheduled_attention as sa
    from host.attention import paged_attention

    if force:
        monkeypatch.setattr(sa, "reset_by_dma", lambda *args: True)

    batch = batch_factory(3, [300, 70], [200, 0], H=8, Hkv=2, d=16, block_size=16, dtype=BF16)
    sinks = np.linspace(-1.0, 2.0, 8).astype(np.float32)
    s, _ = prepare(batch, 512)
    (cls,) = s.classes
    rows, blocks, Hkv, d = cls.rows, cls.blocks, 2, 16
    assert (cls.kind, rows, blocks, cls.num_blocks) == ("prefill", P, 10, 20)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                              large_tile_size=512, sinks=sinks)
    ref = paged_attention_ref(*batch.args(), sinks=sinks)
    assert np.abs(np.asarray(out, np.float32) - ref).max() < 3e-2
    ind = collections.Counter(tuple(e.out_shape) for e in trace.events
                              if e.engine == "dma" and e.dma_kind == "indirect")
    items = cls.full.items + cls.partial.items
    assert ind[(d, blocks * rows)] == Hkv * items                       # Q^T, nd = 1
    # state store / load, and with the reset by DMA a gather per item (skipped unless a group
    # starts) from a table each program writes once (one per core of the LNC-2 launch)
    resets = Hkv * items + 2 if reset_by_dma else 0
    assert ind[(rows, blocks * (d + 2))] == Hkv * items + resets
    assert ind[(rows, blocks * d)] == Hkv * cls.partial.items           # output
    assert ind[(rows, blocks, 2)] == Hkv * items                        # row init (-m, l)


@pytest.mark.parametrize("target, api", [("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy")])
def test_decode_steps_fold_a_whole_4096_key_tile(target, api, on_api, batch_factory):
    """Keys-on-partitions steps take as many keys as one PSUM bank of S^T holds (not the
    query-rows steps' 2048): 4-row decode blocks (G = 4, one token) with 4096-key tiles fold a
    full tile in ONE step, whose exponentials are one (128, 32 chunks x 4 rows) pass. The output
    matches the float64 reference."""
    from host.attention import paged_attention

    batch = batch_factory(5, [1, 1, 1], [5000, 4500, 4200], H=8, Hkv=2, d=16, block_size=32,
                          dtype=BF16)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                              large_tile_size=4096)
    assert np.abs(np.asarray(out, np.float32) - paged_attention_ref(*batch.args())).max() < 3e-2
    exps = [e.free_elems for e in trace.events if e.engine == "scalar" and e.op == "activation"
            and e.partitions == P and e.free_elems >= 32]
    assert exps and max(exps) == 4096 // P * 4


@pytest.mark.parametrize("ltp, match", [(1000, r"PARTIAL_TILE_SZ must be None or a power of two"),
                                        (4096, r"PARTIAL_TILE_SZ must be None or a power of two"),
                                        (512, r"overlay.shape must be \(2, Hkv\*R_ov, b'_p\*d\)")])
def test_kernel_checks_the_partial_tile_size(ltp, match, batch_factory):
    # the schedule was built with one tile size for both phases (LTp = LT = 2048): another
    # PARTIAL_TILE_SZ is refused (bad value, larger than LARGE_TILE_SZ, or rows of another width)
    batch = batch_factory(2, [1, 3], [3000, 20], H=4, Hkv=2, d=16, block_size=16)
    s, overlay = prepare(batch, 2048)
    T, H, d = batch.query.shape
    cls = s.classes[0]
    args, inputs = kernel_inputs(cls, pack_queries(cls, batch.query, 2), row_init(cls, H, 2),
                                 batch.kv_cache, overlay)
    with pytest.raises(ValueError, match=match):
        toolchain.nki.simulate_kernel(scheduled_paged_attention[1, 2], *args, **inputs,
                                 options=SchedOptions(LARGE_TILE_SZ=2048, PARTIAL_TILE_SZ=ltp))


@pytest.mark.parametrize("target, api", [("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy")])
def test_one_chunk_steps_take_their_row_max_as_it_is(target, api, on_api, batch_factory):
    """A query-rows step of one 512-key chunk (512-key partial tiles) has one partial row max
    per row: the running max reads it directly, with no reduce of a single column. The output
    matches the float64 reference."""
    from host.attention import paged_attention

    batch = batch_factory(7, [300], [700], H=8, Hkv=2, d=16, block_size=16, dtype=BF16)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                              large_tile_size=512, partial_tile_size=512)
    assert np.abs(np.asarray(out, np.float32) - paged_attention_ref(*batch.args())).max() < 3e-2
    # (on NeuronCore-v2 the chunk's max comes with the copy of its scores out of PSUM: ops.scalar_reduce)
    reduces = [e.free_elems for e in trace.events if e.op == "tensor_reduce"]
    assert min(reduces, default=2) > 1
    assert reduces or target == "trn1"


def _decode_trace(target, api, on_api, batch_factory):
    """A decode batch (G = 4, one token, block 32, 4096-key tiles in both phases: one 32-token
    row per partition, d = 32) on ``api``: (its trace, the V tile's size in 32-bit words)."""
    from host.attention import paged_attention

    batch = batch_factory(9, [1, 1, 1], [5000, 4500, 2100], H=8, Hkv=2, d=32, block_size=32,
                          dtype=BF16)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                              large_tile_size=4096, partial_tile_size=4096)
    assert np.abs(np.asarray(out, np.float32) - paged_attention_ref(*batch.args())).max() < 3e-2
    return trace, 32 * 32 // 2


def test_masked_decode_items_zero_v_on_two_engines(on_api, batch_factory, keep_item_order):
    """With K^T by DMA transpose (trn2, current API) and items whose written rows do not nest
    (the host's order kept: 29, 13 and 66 rows), a masked keys-on-partitions item zeroes its V
    tile in two fills, two thirds on ScalarE and the rest on GpSimd (cut on a 64-word boundary:
    320 + 192 of the 512 words here; neither engine carries K^T copies on this path, VectorE
    carries the masks): one fill of each per item and KV head. The decode masks' compares (SBUF
    operands only) run on GpSimd too."""
    trace, words = _decode_trace("trn2", "nki", on_api, batch_factory)
    fills = collections.Counter((e.engine, e.free_elems) for e in trace.events
                                if e.out_dtype == "float32" and e.partitions == P
                                and e.op in ("memset", "activation")
                                and e.free_elems in (320, 192))
    # three sequences, each with one masked item, two KV heads
    assert words == 512 and set(fills) == {("scalar", 320), ("gpsimd", 192)}
    assert fills[("scalar", 320)] == fills[("gpsimd", 192)] >= 3 * 2
    compares = collections.Counter(e.engine for e in trace.events if e.op == "tensor_tensor"
                                   and e.out_dtype == "uint8" and e.partitions == P)
    assert set(compares) == {"gpsimd"} and compares["gpsimd"] >= 3 * 2
    whole = [e.engine for e in trace.events if e.free_elems == words and e.out_dtype == "float32"
             and e.op in ("memset", "activation")]
    assert whole == ["gpsimd"] * 2           # only the full phase's V tile, once per head
    # stale K^T columns possible (not nested): the masks stay selects, no mask diagonal
    assert not [e for e in trace.events if e.op == "nc_matmul" and tuple(e.in_shapes[0]) == (P, P)
                and e.free_elems == 32 * 4]


@pytest.mark.parametrize("target, api", [("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy")])
def test_nested_masked_items_zero_their_tiles_once_per_head(target, api, on_api, batch_factory,
                                                           poison_unseen):
    """The host orders the masked items by the KV rows they write (13, 29, 66: each set holds
    the one before it) and sets ``nested_rows``: the partial phase zeroes its K (K^T) and V tiles
    once per KV head, in whole-tile GpSimd fills, and no item zeroes anything. With no stale
    row in a tile the masked steps add their mask on TensorE (one matmul of the (128, 128) mask
    diagonal per step, ``additive_decode_mask``) instead of a select, its 0 / 1 flags one VectorE
    compare reading the rows' bounds from PSUM. Matches the float64
    reference; NaN in every cache slot no query may see changes no output bit."""
    from host.attention import paged_attention
    from host.step_plan import plan_paged_attention

    batch = batch_factory(9, [1, 1, 1], [5000, 4500, 2100], H=8, Hkv=2, d=32, block_size=32,
                          dtype=BF16)
    run = dict(backend="sim", kernel="scheduled", large_tile_size=4096, partial_tile_size=4096)
    with on_api(api, target):
        plan = plan_paged_attention(*batch.args()[4:], num_heads=8, num_kv_heads=2,
                                    head_size=32, block_size=32, dtype=BF16,
                                    num_blocks=batch.kv_cache.shape[1], **run)
    assert plan.parts[0].kernel_kwargs["options"].nested_rows
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), **run)
    assert np.abs(np.asarray(out, np.float32) - paged_attention_ref(*batch.args())).max() < 3e-2
    words = 32 * 32 // 2
    fills = [e for e in trace.events if e.op in ("memset", "activation") and e.partitions == P
             and e.out_dtype == "float32" and e.free_elems <= words and e.free_elems >= 64]
    # per head: the K and V row tiles of each phase (with K^T by DMA transpose, "nki", the two
    # K^T tiles have 32 partitions: not counted here) -- nothing per item
    assert {e.engine for e in fills} == {"gpsimd"}
    assert len([e for e in fills if e.free_elems == words]) == 2 * (4 if api == "legacy" else 2)
    masks = [e for e in trace.events if e.op == "nc_matmul" and e.partitions == P
             and tuple(e.in_shapes[0]) == (P, P) and e.in_dtypes == ("bfloat16", "bfloat16")
             and e.free_elems == 32 * 4]      # a 4096-key step: 32 chunks x 4 rows
    assert len(masks) == 3 * 2               # one per masked item and KV head
    assert not [e for e in trace.events if e.op in ("where", "select", "select_reduce")
                and tuple(e.out_shape) == (P, 32 * 4)]
    # the flags the mask diagonal multiplies: one VectorE compare per masked step reading the
    # rows' bounds straight from PSUM (no SBUF copy of them)
    far = [e for e in trace.events if e.op == "tensor_tensor" and e.attr("alu") == "less"
           and e.out_dtype == "bfloat16" and tuple(e.out_shape)[0] == P]
    assert len(far) == 3 * 2 and {(e.engine, e.src_buffer) for e in far} == {("vector", "psum")}
    assert not [e for e in trace.events if e.op in ("tensor_copy", "activation")
                and e.src_buffer == "psum" and tuple(e.out_shape) == (P, 4)
                and e.out_dtype == "float32"]
    with on_api(api, target):
        again = paged_attention(batch.query, batch.key, batch.value, poison_unseen(batch),
                                *batch.args()[4:], **run)
    assert np.asarray(again).tobytes() == np.asarray(out).tobytes()


@pytest.mark.parametrize("target", ["trn2", "trn1"])
def test_decode_k_transpose_copies_go_one_in_four_to_vectore_on_v3(target, on_api, batch_factory):
    """PE transposes of K (legacy API): a keys-on-partitions class on NeuronCore-v3 evacuates
    one K^T copy in four (cycled over each load's copies) on VectorE, the rest on ScalarE; on
    NeuronCore-v2, where a VectorE copy from PSUM also takes VectorE's turn on SBUF, every copy
    is on ScalarE (the other side)."""
    trace, _ = _decode_trace(target, "legacy", on_api, batch_factory)
    copies = collections.Counter(e.engine for e in trace.events if e.op == "tensor_copy"
                                 and e.src_buffer == "psum" and e.out_dtype == "bfloat16"
                                 and e.out_shape[0] == 32)        # (d, keys): K^T
    if target == "trn2":
        assert copies["scalar"] == 3 * copies["vector"] > 0 and set(copies) == {"scalar", "vector"}
    else:
        assert copies["scalar"] > 0 and set(copies) == {"scalar"}
