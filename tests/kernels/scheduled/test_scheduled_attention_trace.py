"""What the scheduled kernel moves, read from the simulator's trace (docs/layouts.md §16):
padding items move no bytes, KV gathers are vectorized (one indirect DMA of up to 128 row
descriptors per load and K/V half), and the mask traffic is the fp32 metadata (reset flags,
per-row bounds; with keys on partitions the bounds on one partition), O(query rows x items)
instead of the dense O(queries x context) mask."""

from __future__ import annotations

import collections
import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.reference import paged_attention_ref
from host.scheduled.schedule import make_schedule
from host.scheduled.scheduled import build_overlay, kernel_inputs, pack_queries, row_init, unpack_output
from nki_kernels import toolchain
from nki_kernels.scheduled.scheduled_attention import SchedOptions, scheduled_paged_attention

pytestmark = pytest.mark.simulation
P = 128
BF16 = ml_dtypes.bfloat16


def _geometry(B, LT):
    """(Tf, b', nL) from docs/layouts.md §1."""
    M = LT // B
    Tf = P // M if M < P else 1
    return Tf, B // Tf, M * Tf // P


def _prepare(batch, LT, LTp=None):
    T, H, d = batch.query.shape
    _, N, Hkv, B, _ = batch.kv_cache.shape
    s = make_schedule(batch.query_lens, batch.context_lens, batch.block_tables, num_heads=H,
                      num_kv_heads=Hkv, head_size=d, block_size=B, num_blocks=N,
                      large_tile_size=LT, partial_tile_size=LTp)
    return s, build_overlay(s, batch.kv_cache, batch.key, batch.value, batch.block_tables)


def _launch(batch, s, overlay, classes, LT):
    """Run one kernel launch per class (with the classes' metadata as given); returns
    (output (T, H, d), trace)."""
    T, H, d = batch.query.shape
    Hkv = batch.kv_cache.shape[2]
    out = np.zeros((T, H, d), batch.query.dtype)
    with nki_sim.tracing() as trace:
        for cls in classes:
            args, inputs = kernel_inputs(cls, pack_queries(cls, batch.query, Hkv),
                                         row_init(cls, H, Hkv), batch.kv_cache, overlay)
            opts = SchedOptions(softmax_scale=1.0 / math.sqrt(d), mixed_precision=True,
                                LARGE_TILE_SZ=LT, PARTIAL_TILE_SZ=s.partial_tile_size)
            o = toolchain.nki.simulate_kernel(scheduled_paged_attention[1, Hkv], *args, options=opts,
                                         **inputs)
            unpack_output(cls, np.asarray(o), out)
    return out, trace


def _with_items(arr, n):
    """``arr`` with its real items followed by ``n - real_items`` copies of its own (last)
    padding item: a schedule padded to another bucket (or to none, n = real_items)."""
    Hkv, items, real = arr.meta_i.shape[0], arr.items, arr.real_items
    assert items > real, "the schedule must have a padding item to copy"
    mi = arr.meta_i.reshape(Hkv, P, items, -1)
    mf = arr.meta_f.reshape(P, items, -1)
    mi = np.concatenate([mi[:, :, :real]] + [mi[:, :, -1:]] * (n - real), axis=2)
    mf = np.concatenate([mf[:, :real]] + [mf[:, -1:]] * (n - real), axis=1)
    bounds = arr.bounds
    if bounds is not None:            # (1, items * 2 * rows): item t's columns [t*2*rows, +2*rows)
        b = bounds.reshape(items, -1)
        bounds = np.concatenate([b[:real]] + [b[-1:]] * (n - real)).reshape(1, -1)
    return dataclasses.replace(arr, items=n, meta_i=np.ascontiguousarray(mi.reshape(Hkv, P, -1)),
                               meta_f=np.ascontiguousarray(mf.reshape(P, -1)), bounds=bounds,
                               item_block=np.concatenate([arr.item_block[:real],
                                                          np.full(n - real, -1)]))


def _moved(trace):
    """Bytes and descriptors of the data gathers / scatters (KV rows, Q^T rows of the
    query-rows path, state, output: the indirect DMAs) and bytes of the direct DMAs (metadata
    and, with keys on partitions, the per-chunk Q^T preload)."""
    dma = [e for e in trace.events if e.engine == "dma"]
    ind = [e for e in dma if e.dma_kind == "indirect"]
    return (sum(e.bytes for e in ind), sum(len(e.descriptor_bytes) for e in ind),
            sum(e.bytes for e in dma if e.dma_kind == "direct"))


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_padding_items_move_no_bytes(kind, batch_factory):
    # 9 sequences with 3 tiles each (tiles 0, 1 FULL, tile 2 PARTIAL): 18 + 9 items, padded to
    # buckets 20 and 10 (a full item in the partial phase's padding slot would leave
    # bucket(17) = 20, so none moves); decode rows fold with keys on partitions, prefill rows
    # without
    q = [1, 2, 1, 3, 1, 1, 2, 1, 1] if kind == "decode" else [40, 33, 70, 41, 40, 65, 40, 50, 40]
    batch = batch_factory(3, q, [1100] * 9, H=4, Hkv=2, d=16, block_size=16)
    LT = 512
    s, overlay = _prepare(batch, LT)
    (cls,) = s.classes
    assert cls.kind == kind and cls.decode_layout == (kind == "decode")
    assert (cls.partial.real_items, cls.partial.items, cls.full.real_items, cls.full.items) == \
        (9, 10, 18, 20)
    variants = {n: dataclasses.replace(cls, partial=_with_items(cls.partial, n),
                                       full=_with_items(cls.full, n + 18)) for n in (9, 10, 16)}
    got = {n: _launch(batch, s, overlay, [c], LT) for n, c in variants.items()}
    ref = paged_attention_ref(*batch.args())
    assert np.abs(got[10][0] - ref).max() < 3e-2
    moved = {n: _moved(tr) for n, (_, tr) in got.items()}
    for n in (9, 16):
        assert got[n][0].tobytes() == got[10][0].tobytes()
        assert moved[n][:2] == moved[10][:2]                 # data bytes and descriptors
    # the direct DMAs grow by exactly the padding items' metadata columns (and, with keys on
    # partitions, their preloaded Q^T columns: rows x d zeros, and in the partial phase their
    # bounds: 2 x rows fp32 on one partition), per program
    Hkv, rows, d = 2, cls.rows, 16
    per_item = {}
    for arr in (cls.partial, cls.full):
        ki, kf = arr.meta_i.shape[2] // arr.items, arr.meta_f.shape[1] // arr.items
        per_item[arr.masked] = P * 4 * (ki + kf) + (rows * d * 4 if cls.decode_layout else 0)
    if cls.decode_layout:
        per_item[True] += 2 * rows * 4
    extra = (16 - 9) * per_item[True] + (16 - 9) * per_item[False]
    assert moved[16][2] - moved[9][2] == Hkv * extra


GEOMETRIES = [(1, 512, 8, None), (16, 2048, 8, None), (256, 2048, 8, None), (32, 8192, 16, None),
              (4, 1024, 130, None), (16, 2048, 8, 512), (1, 1024, 8, 512), (32, 8192, 16, 1024)]


@pytest.mark.parametrize("B, LT, d, LTp", GEOMETRIES,
                         ids=[f"b{b}_t{t}_d{d}_p{p}" for b, t, d, p in GEOMETRIES])
def test_kv_gathers_are_vectorized(B, LT, d, LTp, batch_factory):
    batch = batch_factory(B, [1, 3, 40], [LT + 5, 20, 2 * LT // 3], H=4, Hkv=2, d=d, block_size=B)
    s, overlay = _prepare(batch, LT, LTp)
    Hkv, N, R_ov = 2, batch.kv_cache.shape[1], len(s.overlay_seq)
    _, trace = _launch(batch, s, overlay, s.classes, LT)
    # per phase (its own geometry: LT full, LTp partial): one gather per (item, load, K/V)
    # from the cache, plus one from the overlay when masked, each of rows of b' tokens; the
    # phases are told apart by their row width (summed when both geometries are the same)
    want = {}                                                  # row width -> [instr, descriptors]
    for masked, tile in ((False, LT), (True, LTp or LT)):
        Tf, bp, nL = _geometry(B, tile)
        w = want.setdefault(bp * d, [0, 0])
        for cls in s.classes:
            arr = cls.partial if masked else cls.full
            if arr.items == 0:
                continue
            mi = arr.meta_i.reshape(Hkv, P, arr.items, -1)        # kv[l], then ov[l] (§16.4)
            w[0] += Hkv * arr.items * nL * (4 if masked else 2)
            w[1] += 2 * int((mi[..., :nL] < N * Hkv * Tf).sum())
            if masked:
                w[1] += 2 * int((mi[..., nL:2 * nL] < Hkv * R_ov).sum())
    gathers = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"
               and e.src_buffer == "hbm" and e.out_shape in {(P, width) for width in want}]
    for width, (n_instr, n_desc) in want.items():
        mine = [e for e in gathers if e.out_shape == (P, width)]
        row_bytes = width * batch.kv_cache.dtype.itemsize
        assert len(mine) == n_instr, width
        assert sum(len(e.descriptor_bytes) for e in mine) == n_desc
        for e in mine:
            assert e.partitions == P and len(e.descriptor_bytes) <= P
            assert set(e.descriptor_bytes) <= {row_bytes}             # one row per descriptor
            assert e.bytes == len(e.descriptor_bytes) * row_bytes
    assert max(len(e.descriptor_bytes) for e in gathers) == P           # full 128-row gathers


# ------------------------------------------------------------------------- mask traffic
def _dense_mask_bytes(q, c, B, LT):
    """Bytes of the dense kernel's bool mask, Qpad x (ctx + Qpad) (docs/layouts.md §1, §9)."""
    Qpad = max(P, -(-int(q.sum()) // P) * P)
    M = LT // B
    nab = max(M, -(-int((-(-c // B)).sum()) // M) * M)
    return Qpad * (nab * B + Qpad)


def _bench_batch():
    """The host-preparation benchmark's batch: 240 decode + 16 chunked-prefill (q=64)
    sequences, contexts uniform in [3584, 4608], shuffled (seeded)."""
    rng = np.random.default_rng(0)
    q = np.array([1] * 240 + [64] * 16)
    rng.shuffle(q)
    return q, rng.integers(3584, 4609, size=256)


def _mask_bytes(s):
    """HBM bytes of the schedule's mask data: meta_f (reset flags, query-rows bounds, ALiBi
    tile starts) of both phases plus the one-partition bounds of keys-on-partitions classes."""
    return sum(a.meta_f.nbytes + (0 if a.bounds is None else a.bounds.nbytes)
               for cls in s.classes for a in (cls.partial, cls.full))


@pytest.mark.parametrize("kind, G", [("decode", 1), ("decode", 4), ("decode", 8),
                                     ("bench_mixed", 4)],
                         ids=["decode_G1", "decode_G4", "decode_G8", "bench_mixed_G4"])
def test_mask_bytes_are_per_row_not_per_context(kind, G):
    # schedule only (no kernel run): what the mask costs the host and the DMA
    Hkv = 8
    if kind == "decode":
        q, c, B, LT = np.ones(256, np.int64), np.full(256, 4096), 16, 2048
    else:
        (q, c), B, LT = _bench_batch(), 32, 2048
    nb = -(-c // B)
    bt = np.arange(int(nb.sum())).reshape(-1)
    tables = np.zeros((len(q), int(nb.max())), np.int64)
    off = np.concatenate(([0], np.cumsum(nb)))
    for i in range(len(q)):
        tables[i, :nb[i]] = bt[off[i]:off[i + 1]]
    s = make_schedule(q, c, tables, num_heads=G * Hkv, num_kv_heads=Hkv, head_size=128,
                      block_size=B, num_blocks=int(nb.sum()), large_tile_size=LT)
    mask = _mask_bytes(s)
    dense = _dense_mask_bytes(q, c, B, LT)
    if kind == "decode":
        assert dense == 256 * (256 * 4096 + 256)                  # 268.5 MB (Qpad 256)
        # per sequence (K = 4097, W = 2048): tiles 0, 1 FULL, tile 2 PARTIAL; every item a
        # reset flag on 128 partitions (128 x 4 B), the partial item the bounds c_q, r_q of
        # its `rows` = G query rows on one partition (2 x rows x 4 B, §16.4)
        (cls,) = s.classes
        rows = {1: 1, 4: 4, 8: 8}[G]
        assert cls.decode_layout and cls.rows == rows
        assert (cls.partial.items, cls.full.items) == (256, 512)
        assert cls.partial.meta_f.shape == (P, 256) and cls.full.meta_f.shape == (P, 512)
        assert cls.partial.bounds.shape == (1, 256 * 2 * rows) and cls.full.bounds is None
        assert mask == 256 * (3 * P * 4 + 2 * rows * 4)
    else:
        assert 1.35e9 < dense < 1.37e9                            # 1.36 GB (Qpad 1280)
    assert dense > 100 * mask
    assert mask < 1_000_000


def test_mask_dma_bytes_equal_the_bounds_and_reset_arrays(batch_factory):
    # small kernel run with bf16 queries: the only fp32 arrays the kernel reads with direct
    # DMAs are meta_f (reset flags, query-rows bounds) and the decode class's one-partition
    # bounds; each program reads all of them once, the bounds on one partition
    batch = batch_factory(5, [1, 4, 90], [700, 30, 200], H=4, Hkv=2, d=16, block_size=16,
                          dtype=BF16)
    s, overlay = _prepare(batch, 512)
    dec, pre = s.classes
    assert dec.decode_layout and dec.partial.bounds.size == dec.partial.items * 2 * dec.rows
    assert not pre.decode_layout and pre.partial.bounds is None
    _, trace = _launch(batch, s, overlay, s.classes, 512)
    f32 = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "direct"
           and e.src_buffer == "hbm" and e.in_dtypes == ("float32",)]
    assert sum(e.bytes for e in f32) == 2 * _mask_bytes(s)
    one_partition = sum(e.bytes for e in f32 if e.partitions == 1)
    assert one_partition == 2 * dec.partial.bounds.nbytes > 0


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_masked_prefill_steps_select_and_reduce_in_one_pass_on_trn2(target, batch_factory):
    """Query-rows masked steps: NeuronCore-v3 selects and takes the row max with one
    range_select per 512-key chunk (scores in natural key order; no distance pass, no separate
    select); v2 keeps the distance, select and max passes (range_select does not exist
    there)."""
    batch = batch_factory(3, [40, 1], [300, 700], H=4, Hkv=2, d=16, block_size=16)
    s, overlay = _prepare(batch, 2048, 512)
    with nki_sim.use_target(target):
        out, trace = _launch(batch, s, overlay, s.classes, 2048)
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
def test_step_copies_per_psum_bank_and_state_ops_on_gpsimd(target, api, on_api, batch_factory):
    """Engine placement of the query-rows steps (2048-key steps, bf16 kernel dtype): on
    NeuronCore-v3 the P^T transposes land in a 16-bit PSUM dtype, eight 128-key blocks per bank,
    so every P^T copy out of PSUM is 1024 columns wide; on v2 (fp32 PSUM) 512. Every step's
    -m' = min(-max, -m) and its copy into the state run on GpSimd (SBUF operands only): one
    of each per step. The output matches the float64 reference."""
    from host.attention import paged_attention

    batch = batch_factory(3, [300, 1], [200, 700], H=8, Hkv=2, d=16, block_size=16, dtype=BF16)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", kernel="scheduled",
                              large_tile_size=2048, partial_tile_size=2048)
    assert np.abs(np.asarray(out, np.float32) - paged_attention_ref(*batch.args())).max() < 3e-2
    p_copies = [e.free_elems for e in trace.events if e.op == "tensor_copy"
                and e.engine in ("scalar", "vector") and e.src_buffer == "psum"
                and e.partitions == P and e.out_dtype == "bfloat16"]
    assert p_copies and set(p_copies) == {1024 if target == "trn2" else 512}
    one_col = [(e.engine, e.op) for e in trace.events if e.free_elems == 1
               and e.op in ("tensor_scalar", "tensor_copy") and e.in_dtypes[0] == "float32"]
    steps = one_col.count(("gpsimd", "tensor_scalar"))
    assert steps > 0 and one_col.count(("gpsimd", "tensor_copy")) == steps


@pytest.mark.parametrize("target, api", [("trn2", "nki"), ("trn1", "legacy")])
def test_query_rows_groups_move_in_one_dma_per_item(target, api, on_api, batch_factory):
    """Group-major layouts (docs/layouts.md §16.2): every item of a query-rows class moves its
    group's Q^T with one gather per channel slice, its row init values with one gather, its
    state with one DMA and (partial phase) its output with one scatter, whatever the number of
    Q blocks per group -- here 10, and a second group of 3 real blocks padded to 10. The output
    (with attention sinks: row init values) matches the float64 reference."""
    from host.attention import paged_attention

    batch = batch_factory(3, [300, 70], [200, 0], H=8, Hkv=2, d=16, block_size=16, dtype=BF16)
    sinks = np.linspace(-1.0, 2.0, 8).astype(np.float32)
    s, _ = _prepare(batch, 512)
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
    assert ind[(rows, blocks * (d + 2))] == Hkv * items                 # state store / load
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
    s, overlay = _prepare(batch, 2048)
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
    # (on NeuronCore-v2 the chunk's max is the copy_max of its scores out of PSUM)
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


def test_masked_decode_items_zero_v_on_two_engines(on_api, batch_factory):
    """With K^T by DMA transpose (trn2, current API) a masked keys-on-partitions item zeroes
    its V tile in two fills, two thirds on ScalarE and the rest on GpSimd (cut on a 64-word
    boundary: 320 + 192 of the 512 words here; neither engine carries K^T copies on this path,
    VectorE carries the masks): one fill of each per item and KV head. The decode masks'
    compares (SBUF operands only) run on GpSimd too."""
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
