"""What the scheduled kernel moves, read from the simulator's trace (docs/layouts.md §16):
padding items move no bytes, KV gathers are vectorized (one indirect DMA of up to 128 row
descriptors per load and K/V half), and the mask traffic is the fp32 metadata (reset flags,
per-row bounds; with keys on partitions the bounds on one partition), O(query rows x items)
instead of the dense O(queries x context) mask. Where the steps' passes run:
test_scheduled_step_engines.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from host.reference import paged_attention_ref
from host.scheduled.schedule import make_schedule
from sched_trace_util import BF16, P, geometry, launch, prepare

pytestmark = pytest.mark.simulation


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
def test_padding_items_move_no_bytes(kind, batch_factory, monkeypatch):
    # 9 sequences with 3 tiles each (tiles 0, 1 FULL, tile 2 PARTIAL): 18 + 9 items, padded to
    # buckets 20 and 10 (a full item in the partial phase's padding slot would leave
    # bucket(17) = 20, so none moves); decode rows fold with keys on partitions, prefill rows
    # without
    q = [1, 2, 1, 3, 1, 1, 2, 1, 1] if kind == "decode" else [40, 33, 70, 41, 40, 65, 40, 50, 40]
    batch = batch_factory(3, q, [1100] * 9, H=4, Hkv=2, d=16, block_size=16)
    LT = 512
    # padding items are appended to the full phase below, so no group may keep its state in
    # SBUF between the phases (host.scheduled.state_carry puts that phase's padding first)
    from host.scheduled import schedule
    monkeypatch.setattr(schedule, "carry_order", lambda f, p, w, decode: (f, p, None))
    s, overlay = prepare(batch, LT)
    (cls,) = s.classes
    assert cls.kind == kind and cls.decode_layout == (kind == "decode")
    assert (cls.partial.real_items, cls.partial.items, cls.full.real_items, cls.full.items) == \
        (9, 10, 18, 20)
    variants = {n: dataclasses.replace(cls, partial=_with_items(cls.partial, n),
                                       full=_with_items(cls.full, n + 18)) for n in (9, 10, 16)}
    got = {n: launch(batch, s, overlay, [c], LT) for n, c in variants.items()}
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
    s, overlay = prepare(batch, LT, LTp)
    Hkv, N, R_ov = 2, batch.kv_cache.shape[1], len(s.overlay_seq)
    _, trace = launch(batch, s, overlay, s.classes, LT)
    # per phase (its own geometry: LT full, LTp partial): one gather per (item, load, K/V)
    # from the cache, plus one from the overlay when masked, each of rows of b' tokens; the
    # phases are told apart by their row width (summed when both geometries are the same)
    want = {}                                                  # row width -> [instr, descriptors]
    for masked, tile in ((False, LT), (True, LTp or LT)):
        Tf, bp, nL = geometry(B, tile)
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
    s, overlay = prepare(batch, 512)
    dec, pre = s.classes
    assert dec.decode_layout and dec.partial.bounds.size == dec.partial.items * 2 * dec.rows
    assert not pre.decode_layout and pre.partial.bounds is None
    _, trace = launch(batch, s, overlay, s.classes, 512)
    f32 = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "direct"
           and e.src_buffer == "hbm" and e.in_dtypes == ("float32",)]
    assert sum(e.bytes for e in f32) == 2 * _mask_bytes(s)
    one_partition = sum(e.bytes for e in f32 if e.partitions == 1)
    assert one_partition == 2 * dec.partial.bounds.nbytes > 0
