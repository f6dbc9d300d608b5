"""What the scheduled kernel moves, read from the simulator's trace (docs/layouts.md §14):
padding items move no bytes, KV gathers are vectorized (one indirect DMA of up to 128 row
descriptors per load and K/V half), and the mask traffic is the fp32 metadata (per-row bounds
and reset flags), O(query rows x items) instead of the dense O(queries x context) mask."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import nki_sim
from host.reference import paged_attention_ref
from host.schedule import make_schedule
from host.scheduled import build_overlay, kernel_inputs, pack_queries, row_init, unpack_output
from nki_kernels import _nki
from nki_kernels.scheduled_attention import scheduled_paged_attention

pytestmark = pytest.mark.simulation
P = 128


def _geometry(B, LT):
    """(Tf, b', nL) from docs/layouts.md §1."""
    M = LT // B
    Tf = P // M if M < P else 1
    return Tf, B // Tf, M * Tf // P


def _columns(nL, blocks, d, masked):
    """(ki, kf): metadata columns per item (§14.4; no ALiBi column)."""
    nd = -(-d // P)
    return (2 * nL if masked else nL) + blocks * nd + 3 * blocks, 1 + (2 * blocks if masked else 0)


def _prepare(batch, LT):
    T, H, d = batch.query.shape
    _, N, Hkv, B, _ = batch.kv_cache.shape
    s = make_schedule(batch.query_lens, batch.context_lens, batch.block_tables, num_heads=H,
                      num_kv_heads=Hkv, head_size=d, block_size=B, num_blocks=N,
                      large_tile_size=LT)
    return s, build_overlay(s, batch.kv_cache, batch.key, batch.value, batch.block_tables)


def _launch(batch, s, overlay, classes, LT):
    """Run one kernel launch per class (with the classes' metadata as given); returns
    (output (T, H, d), trace)."""
    T, H, d = batch.query.shape
    Hkv = batch.kv_cache.shape[2]
    out = np.zeros((T, H, d), batch.query.dtype)
    with nki_sim.tracing() as trace:
        for cls in classes:
            args = kernel_inputs(cls, pack_queries(cls, batch.query, Hkv), row_init(cls, H, Hkv),
                                 batch.kv_cache, overlay)
            o = _nki.nki.simulate_kernel(scheduled_paged_attention[1, Hkv], *args,
                                         softmax_scale=1.0 / math.sqrt(d), mixed_precision=True,
                                         LARGE_TILE_SZ=LT)
            unpack_output(cls, np.asarray(o), out)
    return out, trace


def _padded(arr, extra, *, sentinels, kf):
    """``arr`` with ``extra`` padding items appended, built from §14.4: every int column its
    sentinel, reset 1.0, bounds 0."""
    Hkv = arr.meta_i.shape[0]
    mi = np.broadcast_to(np.array(sentinels, np.int32), (Hkv, P, extra, len(sentinels)))
    mf = np.zeros((P, extra, kf), np.float32)
    mf[:, :, 0] = 1.0
    return dataclasses.replace(
        arr, items=arr.items + extra,
        meta_i=np.concatenate([arr.meta_i, mi.reshape(Hkv, P, -1)], axis=2),
        meta_f=np.concatenate([arr.meta_f, mf.reshape(P, -1)], axis=1))


def _stripped(arr, ki, kf):
    """``arr`` without its padding items (the real items only)."""
    n = arr.real_items
    return dataclasses.replace(arr, items=n, meta_i=np.ascontiguousarray(arr.meta_i[:, :, :n * ki]),
                               meta_f=np.ascontiguousarray(arr.meta_f[:, :n * kf]))


def _moved(trace):
    """Bytes and descriptors of the data DMAs (Q, KV rows, state, output: the indirect ones)
    and bytes of the direct ones (the metadata loads)."""
    dma = [e for e in trace.events if e.engine == "dma"]
    ind = [e for e in dma if e.dma_kind == "indirect"]
    return (sum(e.bytes for e in ind), sum(len(e.descriptor_bytes) for e in ind),
            sum(e.bytes for e in dma if e.dma_kind == "direct"))


def test_padding_items_move_no_bytes(batch_factory):
    # 9 decode sequences with 2 tiles each: 9 partial + 9 full items, each padded to bucket 10
    batch = batch_factory(3, [1, 2, 1, 3, 1, 1, 2, 1, 1], [600] * 9, H=4, Hkv=2, d=16,
                          block_size=16)
    LT = 512
    s, overlay = _prepare(batch, LT)
    (cls,) = s.classes
    assert (cls.partial.real_items, cls.partial.items, cls.full.real_items, cls.full.items) == \
        (9, 10, 9, 10)
    Tf, bp, nL = _geometry(16, LT)
    d, Hkv, N, nblk, rows, blocks = 16, 2, batch.kv_cache.shape[1], cls.num_blocks, cls.rows, cls.blocks
    R_ov = len(s.overlay_seq)
    tail = [Hkv * nblk * d] * blocks + [nblk * rows] * blocks + [Hkv * nblk * rows] * (2 * blocks)
    kip, kfp = _columns(nL, blocks, d, True)
    kif, kff = _columns(nL, blocks, d, False)
    variants = {
        "bucket": cls,
        "stripped": dataclasses.replace(cls, partial=_stripped(cls.partial, kip, kfp),
                                        full=_stripped(cls.full, kif, kff)),
        "padded": dataclasses.replace(
            cls, partial=_padded(cls.partial, 6, kf=kfp, sentinels=[2 * N * Hkv * Tf] * nL
                                 + [2 * Hkv * R_ov] * nL + tail),
            full=_padded(cls.full, 22, kf=kff, sentinels=[2 * N * Hkv * Tf] * nL + tail)),
    }
    got = {k: _launch(batch, s, overlay, [c], LT) for k, c in variants.items()}
    ref = paged_attention_ref(*batch.args())
    assert np.abs(got["bucket"][0] - ref).max() < 3e-2
    moved = {k: _moved(tr) for k, (_, tr) in got.items()}
    for k in ("stripped", "padded"):
        assert got[k][0].tobytes() == got["bucket"][0].tobytes()
        assert moved[k][:2] == moved["bucket"][:2]                 # data bytes and descriptors
    # only the metadata preload grows: exactly the padding items' columns, per program
    for k, c in variants.items():
        assert moved[k][2] == Hkv * 4 * P * (c.partial.items * (kip + kfp) + c.full.items * (kif + kff))
    assert moved["padded"][2] - moved["stripped"][2] == Hkv * 4 * P * ((6 + 1) * (kip + kfp)
                                                                       + (22 + 1) * (kif + kff))


GEOMETRIES = [(1, 512, 8), (16, 2048, 8), (256, 2048, 8), (32, 8192, 16), (4, 1024, 130)]


@pytest.mark.parametrize("B, LT, d", GEOMETRIES, ids=[f"b{b}_t{t}_d{d}" for b, t, d in GEOMETRIES])
def test_kv_gathers_are_vectorized(B, LT, d, batch_factory):
    batch = batch_factory(B, [1, 3, 40], [LT + 5, 20, 2 * LT // 3], H=4, Hkv=2, d=d, block_size=B)
    s, overlay = _prepare(batch, LT)
    Tf, bp, nL = _geometry(B, LT)
    Hkv, N, R_ov = 2, batch.kv_cache.shape[1], len(s.overlay_seq)
    _, trace = _launch(batch, s, overlay, s.classes, LT)
    row_bytes = bp * d * batch.kv_cache.dtype.itemsize
    gathers = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"
               and e.src_buffer == "hbm" and e.out_shape == (P, bp * d)]
    # one gather per (item, load, K/V) from the cache, plus one from the overlay when masked
    want_instr = want_desc = 0
    for cls in s.classes:
        for arr in (cls.partial, cls.full):
            ki, _ = _columns(nL, cls.blocks, d, arr.masked)
            mi = arr.meta_i.reshape(Hkv, P, arr.items, ki)
            want_instr += Hkv * arr.items * nL * (4 if arr.masked else 2)
            want_desc += 2 * int((mi[..., :nL] < N * Hkv * Tf).sum())
            if arr.masked:
                want_desc += 2 * int((mi[..., nL:2 * nL] < Hkv * R_ov).sum())
    assert len(gathers) == want_instr
    assert sum(len(e.descriptor_bytes) for e in gathers) == want_desc
    for e in gathers:
        assert e.partitions == P and len(e.descriptor_bytes) <= P
        assert set(e.descriptor_bytes) <= {row_bytes}                 # one row per descriptor
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


@pytest.mark.parametrize("kind", ["decode", "bench_mixed"])
def test_mask_bytes_are_per_row_not_per_context(kind):
    # schedule only (no kernel run): what the mask costs the host and the DMA
    if kind == "decode":
        q, c, B, LT, H, Hkv = np.ones(256, np.int64), np.full(256, 4096), 16, 2048, 8, 8
    else:
        (q, c), B, LT, H, Hkv = _bench_batch(), 32, 2048, 32, 8
    nb = -(-c // B)
    bt = np.arange(int(nb.sum())).reshape(-1)
    tables = np.zeros((len(q), int(nb.max())), np.int64)
    off = np.concatenate(([0], np.cumsum(nb)))
    for i in range(len(q)):
        tables[i, :nb[i]] = bt[off[i]:off[i + 1]]
    s = make_schedule(q, c, tables, num_heads=H, num_kv_heads=Hkv, head_size=128, block_size=B,
                      num_blocks=int(nb.sum()), large_tile_size=LT)
    meta_f = sum(a.meta_f.nbytes for cls in s.classes for a in (cls.partial, cls.full))
    dense = _dense_mask_bytes(q, c, B, LT)
    assert meta_f < 1_000_000
    if kind == "decode":
        assert dense == 256 * (256 * 4096 + 256)                  # 268.5 MB (Qpad 256)
        # per sequence (K = 4097, W = 2048): tiles 0, 1 FULL (512 B each), tile 2 PARTIAL
        # (128 partitions x (reset, c, r) x 4 B)
        assert meta_f == 256 * (2 * 512 + 128 * 3 * 4) == 655_360
    else:
        assert 1.35e9 < dense < 1.37e9                            # 1.36 GB (Qpad 1280)
    assert dense > 250 * meta_f


def test_mask_dma_bytes_equal_the_bounds_and_reset_arrays(batch_factory):
    # small kernel run: the only fp32 arrays the kernel reads with direct DMAs are meta_f
    # (bounds + reset flags), each program reads all of it once
    batch = batch_factory(5, [1, 4, 90], [700, 30, 200], H=4, Hkv=2, d=16, block_size=16)
    s, overlay = _prepare(batch, 512)
    _, trace = _launch(batch, s, overlay, s.classes, 512)
    f32_direct = sum(e.bytes for e in trace.events if e.engine == "dma" and e.dma_kind == "direct"
                     and e.src_buffer == "hbm" and e.in_dtypes == ("float32",))
    meta_f = sum(a.meta_f.nbytes for cls in s.classes for a in (cls.partial, cls.full))
    assert f32_direct == 2 * meta_f
