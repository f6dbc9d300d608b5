"""host/scheduled/schedule.py against docs/layouts.md §16, read back through the documented
layouts only: the symbolic launch of symbolic_schedule.py checks that the items fold every
visible (query row, key) pair exactly once and nothing else, on hand-built and generated
batches.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from host.scheduled.schedule import (AttentionSchedule, bucket, class_sequences, item_geometry,
                                    make_schedule)
from host.scheduled.schedule_items import fill_partial_padding
from nki_kernels.constants import tile_geometry
from nki_kernels.contract import MAX_LAUNCH_CORES
from nki_kernels.scheduled.sched_plan import max_group_blocks
from symbolic_schedule import (P, block_tables_for, check_coverage, columns, geometry, schedule,
                               summary)


# ------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("B", [1, 2, 4, 8, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("LT", [512, 1024, 2048, 4096, 8192])
def test_item_geometry_is_the_section_1_table(B, LT):
    Tf, bp, L, nL, W = geometry(B, LT)
    assert item_geometry(B, LT) == (Tf, bp, L, nL)
    assert tile_geometry(B, LT)[1:] == (Tf, bp, L, nL)
    assert W == LT and B == Tf * bp and L % P == 0


# ------------------------------------------------------------------------- hand-built batches
def test_two_classes_hand_built():
    # B=16, LT=512: Tf=4, b'=4, L=128 rows, nL=1, W=512 keys per tile. H=4, Hkv=2: G=2.
    #   seq0 q=1   c=1000 R=2   decode  K=1001 rows 0..249 main, 250 overlay; tiles 0 (FULL), 1
    #   seq1 q=3   c=509  R=6   decode  K=512  rows 0..126 main, 127 overlay; tile 0 (PARTIAL)
    #   seq2 q=40  c=0    R=80  prefill K=40   overlay rows 0..9; tile 0
    #   seq3 q=32  c=64   R=64  decode (the boundary) K=96 rows 0..15 main, 16..23 overlay
    #   seq4 q=150 c=600  R=300 prefill, 3 Q blocks; K=750 rows 0..149 main; tiles 0 (FULL), 1
    s, kw = schedule([1, 3, 40, 32, 150], [1000, 509, 0, 64, 600], H=4, Hkv=2, d=8, B=16, LT=512)
    dec, pre = s.classes
    assert (dec.kind, dec.rows, dec.blocks, dec.num_blocks, dec.seqs.tolist()) == \
        ("decode", 64, 1, 3, [0, 1, 3])                    # rows: power of two >= max R = 64
    assert (pre.kind, pre.rows, pre.blocks, pre.num_blocks, pre.seqs.tolist()) == \
        ("prefill", 128, 3, 6, [2, 4])                     # blocks = max ceil(R / 128) = 3 (fits);
    #                                                        2 groups of 3 blocks (1 + 2 padding, 3)
    assert (dec.partial.real_items, dec.partial.items, dec.full.real_items) == (3, 3, 1)
    assert (pre.partial.real_items, pre.full.real_items) == (2, 1)
    items = check_coverage(s, **kw)
    assert dec.decode_layout and not pre.decode_layout     # decode: rows <= 64
    assert summary(items[0]) == [
        # full phase first: seq0's first tile (stores its state for the partial phase)
        ("f", 0, 0, 1, (0,), (0,), ()),
        # partial phase, fewest written KV rows first (their row sets then nest,
        # host.scheduled.row_nesting): seq3 (24 rows), seq0's last tile (123 rows; loads that
        # state, stores the output), seq1 (128 rows)
        ("p", 3, 0, 1, (0,), (), (0,)),
        ("p", 0, 1, 1, (0,), (0,), (0,)),
        ("p", 1, 0, 1, (0,), (), (0,)),
    ]
    assert dec.partial.nested_rows and pre.partial.nested_rows
    assert summary(items[1]) == [
        ("f", 4, 0, 1, (0, 1, 2), (0, 1, 2), ()),
        ("p", 2, 0, 1, (0,), (), (0,)),                    # one block in a 3-slot group
        ("p", 4, 1, 1, (0, 1, 2), (0, 1, 2), (0, 1, 2)),
    ]
    assert [it.blocks for it in items[1] if it.real] == [(3, 4, 5), (0, None, None), (3, 4, 5)]
    gathered = [(it.main, it.ov) for it in items[0] if it.real]
    assert gathered == [(128, 0), (16, 8), (122, 1), (127, 1)]    # rows 0..127; 128..249 + 250


def test_bounds_columns_hand_computed():
    # decode class (keys on partitions): meta_f is the reset column only; item t's c_q, r_q
    # are columns t*2*rows + q and t*2*rows + rows + q of the one-partition bounds array
    s, _ = schedule([1, 3], [1000, 509], H=4, Hkv=2, d=8, B=16, LT=512)
    (dec,) = s.classes
    assert dec.rows == 8 and dec.decode_layout and dec.partial.items == 2
    assert dec.partial.meta_f.shape == (P, 2) and dec.full.meta_f.shape == (P, dec.full.items)
    assert dec.partial.bounds.shape == (1, 2 * 2 * 8) and dec.partial.bounds.dtype == np.float32
    assert dec.full.bounds is None
    mf = dec.partial.meta_f.reshape(P, 2, 1)
    c = dec.partial.bounds[0].reshape(2, 16)[:, :8]
    r = dec.partial.bounds[0].reshape(2, 16)[:, 8:]
    # item 0 = seq0 tile 1 (keys 512..1023): rows 0, 1 at position 1000 -> lo' = -512,
    # hi' = 489: c = (lo' + hi' - 1) / 2 = -12, r = (hi' - lo') / 2 = 500.5; padding rows c=-0.5, r=0
    assert c[0].tolist() == [-12.0] * 2 + [-0.5] * 6
    assert r[0].tolist() == [500.5] * 2 + [0.0] * 6
    # item 1 = seq1 tile 0: positions 509, 509, 510, 510, 511, 511 -> lo' = 0, hi' = x + 1
    assert c[1].tolist() == [254.5, 254.5, 255.0, 255.0, 255.5, 255.5, -0.5, -0.5]
    assert r[1].tolist() == [255.0, 255.0, 255.5, 255.5, 256.0, 256.0, 0.0, 0.0]
    assert np.all(mf[:, :, 0] == 1.0)                            # both items start a group
    # |t - c| < r  <=>  lo' <= t < hi' for every integer t (the inverse: lo' = c - r + 1/2)
    t = np.arange(-600, 600)
    for cc, rr in zip(c[:2].ravel(), r[:2].ravel()):
        lo, hi = cc - rr + 0.5, cc + rr + 0.5
        assert np.array_equal(np.abs(t - cc) < rr, (t >= lo) & (t < hi))
    # prefill class (query rows on partitions): slot j's c, r in columns 1 + 2j, 2 + 2j,
    # partition p = row p. q=70, c=0, G=1: row p at position p -> lo' = 0, hi' = p + 1
    s, _ = schedule([70], [0], H=1, Hkv=1, d=8, B=16, LT=512)
    (pre,) = s.classes
    assert (pre.rows, pre.blocks, pre.decode_layout) == (128, 1, False)
    assert pre.partial.bounds is None and pre.full.bounds is None
    mf = pre.partial.meta_f.reshape(P, pre.partial.items, 3)
    p = np.arange(P)
    assert mf[:, 0, 1].tolist() == np.where(p < 70, p / 2, -0.5).tolist()
    assert mf[:, 0, 2].tolist() == np.where(p < 70, (p + 1) / 2, 0.0).tolist()


def test_main_row_ids_hand_computed():
    # B=256, LT=2048: Tf=16, b'=16; Hkv=2, head 1 row id of key row j = (bt[j // 16]*2 + 1)*16 + j % 16
    q, c = np.array([1]), np.array([300])                  # rows 0..17 main (288 keys), 18 overlay
    bt = np.array([[5, 2, -1]])
    s = make_schedule(q, c, bt, num_heads=2, num_kv_heads=2, head_size=4, block_size=256,
                      num_blocks=6, large_tile_size=2048)
    (cls,) = s.classes
    mi = cls.partial.meta_i.reshape(2, P, cls.partial.items, -1)
    main, ov = mi[1, :, 0, 0], mi[1, :, 0, 1]
    assert main[:16].tolist() == [(5 * 2 + 1) * 16 + t for t in range(16)]
    assert main[16:18].tolist() == [(2 * 2 + 1) * 16 + 0, (2 * 2 + 1) * 16 + 1]
    assert np.all(main[18:] >= 2 * 6 * 2 * 16)                   # sentinel: 2 * N * Hkv * Tf
    # overlay: R_ov = 1 row (positions 288..303: context 288..299, the new token 300, zeros)
    assert s.overlay_seq.tolist() == [0] and s.overlay_pos0.tolist() == [288]
    assert ov[18] == 1 * 1 + 0 and np.all(np.delete(ov, 18) >= 2 * 2 * 1)


def test_long_prefill_splits_into_groups_and_prunes_causally():
    # MQA G=8, q=1100, c=1024: 8800 rows = 69 Q blocks > 64 -> groups of blocks 0..63 (tokens
    # 0..1023, positions 1024..2047) and 64..68 (positions 2048..2123). B=16, LT=512, W=512:
    # K=2124 -> 531 rows (256 main), tiles 0..4. Group 0 never sees tile 4 (keys >= 2048).
    s, kw = schedule([1100], [1024], H=8, Hkv=1, d=4, B=16, LT=512)
    (cls,) = s.classes
    assert (cls.kind, cls.blocks, cls.num_blocks) == ("prefill", 64, 128)    # 2 whole groups
    items = check_coverage(s, **kw)[0]
    g0, g1 = tuple(range(64)), tuple(range(64, 69)) + (None,) * 59
    got = [(it.phase[0], it.tile, it.blocks == g0, it.blocks == g1, int(it.reset), bool(it.st),
            bool(it.out)) for it in items if it.real]
    assert got == [
        # full phase: tiles 0, 1 of each group; group 1's state is stored after its last one;
        # group 0, which starts the partial phase, runs last and keeps its state in SBUF
        # (host.scheduled.state_carry)
        ("f", 0, False, True, 1, False, False), ("f", 1, False, True, 0, True, False),
        ("f", 0, True, False, 1, False, False), ("f", 1, True, False, 0, False, False),
        # partial phase: group 0 continues (no reset, no load), group 1's state is loaded at
        # its first item; each output stored after the group's last item
        ("p", 2, True, False, 0, False, False), ("p", 3, True, False, 0, False, True),
        ("p", 2, False, True, 1, True, False), ("p", 3, False, True, 0, False, False),
        ("p", 4, False, True, 0, False, True),
    ]
    assert (cls.partial.items, cls.full.items) == (5, 4)


def test_prefill_groups_are_sized_to_trn1_sbuf():
    # one sequence of 20 Q blocks (q=2560, G=1) at d=512, LT=512: fp32 queries and cache leave
    # SBUF room for fewer than 20 blocks next to the tile, so the group splits; with 2-byte
    # queries and cache all 20 fit. blocks = min(64, trn1's fit, the blocks the batch needs).
    q, c = np.array([2560]), np.array([0])
    bt, N = block_tables_for(c, 16, 0)
    kw = dict(num_heads=1, num_kv_heads=1, head_size=512, block_size=16, num_blocks=N,
              large_tile_size=512)
    plan = dict(block_size=16, large_tile=512, head_size=512, rows=P, kernel_itemsize=2)
    got = {}
    for size in (4, 2):
        (cls,) = make_schedule(q, c, bt, query_itemsize=size, cache_itemsize=size, **kw).classes
        fit = max_group_blocks(nc_gen="gen2", query_itemsize=size, cache_itemsize=size, **plan)
        assert fit <= max_group_blocks(nc_gen="gen3", query_itemsize=size, cache_itemsize=size,
                                       **plan)                  # trn1 has the smaller SBUF
        assert cls.blocks == min(64, fit, 20)
        # whole groups: the last one padded with padding blocks (group-major layouts)
        assert (cls.kind, cls.num_blocks) == ("prefill", -(-20 // cls.blocks) * cls.blocks)
        starts = sorted(set(cls.partial.item_block[:cls.partial.real_items].tolist()))
        assert starts == list(range(0, 20, cls.blocks))        # groups of `blocks` Q blocks
        got[size] = cls.blocks
    assert 1 <= got[4] < 20 == got[2]


def test_sliding_window_prunes_tiles_hand_built():
    # decode q=1, c=5000, window 1000: the query (position 5000) sees keys 4001..5000 = tiles
    # 7 (keys 3584..4095, partly: PARTIAL), 8 (4096..4607, all cached, all seen: FULL),
    # 9 (4608..5000, holds the overlay row: PARTIAL); tiles 0..6 are pruned.
    s, kw = schedule([1], [5000], H=2, Hkv=1, d=8, B=16, LT=512, window=1000)
    items = check_coverage(s, **kw)[0]
    assert [(it.phase[0], it.tile) for it in items if it.real] == [("f", 8), ("p", 7), ("p", 9)]
    s_nowin, kw = schedule([1], [5000], H=2, Hkv=1, d=8, B=16, LT=512)
    items = check_coverage(s_nowin, **kw)[0]
    assert [(it.phase[0], it.tile) for it in items if it.real] == \
        [("f", k) for k in range(9)] + [("p", 9)]


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "8"])
def test_sliding_window_must_be_a_positive_integer(window):
    with pytest.raises(ValueError, match="sliding_window"):
        schedule([1], [50], H=1, Hkv=1, d=8, B=16, LT=512, window=window)


def test_window_edge_inside_a_tile_makes_it_partial():
    # window 512 = W at position 5000: keys 4489..5000 -> tiles 8 (partly) and 9
    s, kw = schedule([1], [5000], H=1, Hkv=1, d=8, B=16, LT=512, window=512)
    items = check_coverage(s, **kw)[0]
    assert [(it.phase[0], it.tile) for it in items if it.real] == [("p", 8), ("p", 9)]


def test_every_group_has_a_partial_item():
    # the tile of a group's last position holds a new token (an overlay row): never FULL, so
    # the state a full phase loads was always stored by the partial phase.
    s, kw = schedule([1, 1, 200], [4096, 511, 3000], H=2, Hkv=1, d=8, B=32, LT=1024)
    for items in check_coverage(s, **kw):
        groups_p = {it.blocks for it in items if it.real and it.phase == "partial"}
        groups_f = {it.blocks for it in items if it.real and it.phase == "full"}
        assert groups_f <= groups_p and groups_f


# ------------------------------------------------------------------------- padding items
def _padding_ids_all_out_of_bounds(s, kw):
    B, d, Hkv, N = kw["B"], kw["d"], kw["Hkv"], kw["N"]
    R_ov = len(s.overlay_seq)
    n_pad = 0
    for cls in s.classes:
        nblk, rows, blocks = cls.num_blocks, cls.rows, cls.blocks
        for arr in (cls.partial, cls.full):
            Tf, bp, L, nL, W = geometry(B, kw["LTp"] if arr.masked else kw["LT"])
            ki, kf, col0 = columns(cls, nL=nL, d=d, masked=arr.masked, alibi=kw["alibi"],
                                   row_init=kw["row_init"])
            mi = arr.meta_i.reshape(Hkv, P, arr.items, ki)[:, :, arr.real_items:]
            mf = arr.meta_f.reshape(P, arr.items, kf)[:, arr.real_items:]
            n_pad += mi.shape[2]
            # bounds: the row count of each tensor flattened to rows (both K/V halves)
            limits = np.zeros(ki, np.int64)
            limits[:nL] = 2 * N * Hkv * Tf
            limits[nL:col0["q"]] = 2 * Hkv * R_ov                       # overlay (partial)
            ngroups = nblk // blocks
            limits[col0["q"]:col0["st"]] = Hkv * ngroups * d             # Q^T (query-rows path)
            # state scratch: every core's slab (MAX_LAUNCH_CORES of ngroups * rows rows)
            limits[col0["st"]] = MAX_LAUNCH_CORES * ngroups * rows
            limits[col0["st"] + 1:] = Hkv * ngroups * rows               # output, q_init
            assert np.all(mi >= limits[None, None, None, :])
            assert np.all(arr.item_block[arr.real_items:] == -1)
            assert np.all(mf[:, :, 0] == 0.0)                  # no reset: a padding item moves no state
            if arr.masked and cls.decode_layout:               # r <= 0: no key is seen
                bnd = arr.bounds.reshape(arr.items, 2 * rows)[arr.real_items:]
                assert np.all(bnd[:, rows:] <= 0)
            elif arr.masked:
                assert np.all(mf[:, :, 2:1 + 2 * blocks:2] <= 0)
    return n_pad


def test_padding_items_move_nothing():
    # 9 decode sequences with 3 tiles each: 9 partial items -> bucket 10, 18 full items -> 20
    # (moving one full item into the partial slot leaves bucket(17) = 20: nothing moves)
    s, kw = schedule([1] * 9, [1100] * 9, H=4, Hkv=2, d=8, B=16, LT=512)
    (cls,) = s.classes
    assert (cls.partial.real_items, cls.partial.items, cls.full.real_items, cls.full.items) == \
        (9, 10, 18, 20)
    assert _padding_ids_all_out_of_bounds(s, kw) == 3
    items = check_coverage(s, **kw)[0]
    pads = [it for it in items if not it.real]
    assert len(pads) == 3 and all(it.pairs == 0 and it.main == it.ov == 0 and not it.q
                                  and not it.st and not it.out for it in pads)


def test_full_items_fill_the_partial_phases_padding():
    # 9 decode sequences with 2 tiles each: 9 full and 9 partial items (buckets 10 and 10); the
    # last full item takes the partial phase's padding slot: buckets 8 and 10, no padding at all
    s, kw = schedule([1] * 9, [700] * 9, H=4, Hkv=2, d=8, B=16, LT=512)
    (cls,) = s.classes
    assert (cls.partial.real_items, cls.partial.items, cls.full.real_items, cls.full.items) == \
        (10, 10, 8, 8)
    assert _padding_ids_all_out_of_bounds(s, kw) == 0
    rows = summary(check_coverage(s, **kw)[0])
    # the moved tile is seq 8's tile 0, a partial item now: no state store or load; it writes
    # all 128 rows, so it follows the group's last tile (123 rows: the rows nest)
    assert [r for r in rows if r[1] == 8] == [("p", 8, 1, 1, (0,), (), ()),
                                              ("p", 8, 0, 0, (), (), (0,))]
    assert cls.partial.nested_rows
    assert [r for r in rows if r[1] == 7] == [("f", 7, 0, 1, (0,), (0,), ()),
                                              ("p", 7, 1, 1, (0,), (0,), (0,))]


@pytest.mark.parametrize("F, Pn, per_tile, moved", [
    (9, 9, 1, 1),        # buckets 10 / 10 -> 8 / 10
    (9, 13, 1, 1),       # 10 / 14 -> 8 / 14
    (18, 9, 1, 0),       # 20 / 10: bucket(17) = 20, nothing moves
    (5, 5, 1, 0),        # no padding slot
    (5, 17, 2, 1),       # 5 / 20: one full tile is two partial tiles (19 <= 20)
    (5, 13, 2, 0),       # 5 / 14: one slot, a full tile needs two
    (7, 9, 1, 1),        # 7 / 10 -> 6 / 10
    (3, 25, 1, 3),       # 3 / 28: every full item moves
])
def test_fill_partial_padding(F, Pn, per_tile, moved):
    full = [(g, 0) for g in range(F)]
    part = [(g, per_tile) for g in range(Pn)]            # tile 1 of groups 0 .. Pn - 1
    f2, p2 = fill_partial_padding(full, part, per_tile)
    assert f2 == full[:F - moved]
    extra = [(g, u) for g in range(F - moved, F) for u in range(per_tile)]
    assert p2 == sorted(part + extra)
    assert bucket(len(p2)) == bucket(Pn)                 # the partial phase keeps its bucket
    assert bucket(len(f2)) <= bucket(F)
    assert moved == 0 or bucket(len(f2)) < bucket(F)     # a move always saves full iterations


@settings(max_examples=40, deadline=None, derandomize=True)
@given(lens=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 3000)), min_size=1, max_size=12),
       B=st.sampled_from([1, 4, 16, 64, 256]), LT=st.sampled_from([512, 2048, 8192]),
       d=st.sampled_from([1, 64, 130, 300]), G=st.sampled_from([1, 4]), alibi=st.booleans(),
       row_init=st.booleans(), ltp=st.sampled_from([None, 512, "auto"]))
def test_padding_items_always_out_of_bounds(lens, B, LT, d, G, alibi, row_init, ltp):
    q, c = zip(*lens)
    s, kw = schedule(q, c, H=2 * G, Hkv=2, d=d, B=B, LT=LT, alibi=alibi, row_init=row_init,
                     LTp=ltp)
    _padding_ids_all_out_of_bounds(s, kw)


# ------------------------------------------------------------------------- bucket()
def test_bucket_properties():
    ns = np.arange(0, 1 << 14)
    b = np.array([bucket(int(n)) for n in ns])
    assert b[:5].tolist() == [0, 1, 2, 3, 4]
    assert np.all(b >= ns)
    assert np.all(b[5:] - ns[5:] < ns[5:] / 4)                   # < 25 % padding
    assert np.all(np.diff(b) >= 0)                               # monotone
    assert all(bucket(int(v)) == v for v in np.unique(b))        # idempotent
    for v in np.unique(b[5:]):                                   # m * 2**e, m in {4..7}
        e = int(v).bit_length() - 3
        assert v % (1 << e) == 0 and 4 <= v >> e <= 7
    for k in range(3, 14):                                       # 4 sizes per octave
        assert len({int(v) for v in b if (1 << k) <= v < (1 << (k + 1))}) == 4
    assert [bucket(n) for n in (5, 9, 17, 33, 100, 1000)] == [5, 10, 20, 40, 112, 1024]


# ------------------------------------------------------------------------- property
LENS = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 1500)), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(lens=LENS, B=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256]),
       LT=st.sampled_from([512, 1024, 2048, 4096, 8192]),
       heads=st.sampled_from([(1, 1), (2, 1), (4, 2), (8, 1), (6, 2)]),
       d=st.sampled_from([1, 8, 128, 160]),
       window=st.one_of(st.none(), st.integers(1, 700)), alibi=st.booleans(),
       row_init=st.booleans(), seed=st.integers(0, 1000),
       ltp=st.sampled_from([None, 512, 1024, "auto"]))
def test_items_cover_every_visible_pair_exactly_once(lens, B, LT, heads, d, window, alibi,
                                                     row_init, seed, ltp):
    q, c = zip(*lens)
    ltp = None if isinstance(ltp, int) and ltp > LT else ltp
    s, kw = schedule(q, c, H=heads[0], Hkv=heads[1], d=d, B=B, LT=LT, window=window, seed=seed,
                     alibi=alibi, row_init=row_init, LTp=ltp)
    assert isinstance(s, AttentionSchedule)
    check_coverage(s, **kw)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(lens=LENS, B=st.sampled_from([1, 4, 16, 32, 128]),
       tiles=st.tuples(st.sampled_from([512, 2048, 4096]), st.sampled_from([512, 1024, 2048])),
       heads=st.sampled_from([(2, 1), (4, 2), (8, 1)]),
       window=st.one_of(st.none(), st.integers(1, 700)), seed=st.integers(0, 1000),
       ltp=st.sampled_from([None, 512, "auto"]))
def test_one_schedule_per_class_covers_every_pair_once(lens, B, tiles, heads, window, seed, ltp):
    # the step plan's form: one schedule per class (seqs=...), each at its own large tile;
    # together every query row is in exactly one class and sees every visible key once
    q, c = (np.asarray(x, np.int64) for x in zip(*lens))
    H, Hkv = heads
    bt, N = block_tables_for(c, B, seed)
    rows = np.zeros(int(q.sum()) * (H // Hkv), np.int64)
    for (kind, seqs), LT in zip(class_sequences(q, H // Hkv), tiles):
        LTp = None if isinstance(ltp, int) and ltp > LT else ltp
        s = make_schedule(q, c, bt, num_heads=H, num_kv_heads=Hkv, head_size=8, block_size=B,
                          num_blocks=N, large_tile_size=LT, sliding_window=window,
                          partial_tile_size=LTp, seqs=seqs)
        assert [cls.kind for cls in s.classes] == [kind]
        assert set(s.overlay_seq.tolist()) <= set(seqs)
        check_coverage(s, q=q, c=c, bt=bt, N=N, H=H, Hkv=Hkv, d=8, B=B, LT=LT, window=window,
                       LTp=s.partial_tile_size, seqs=seqs)
        (cls,) = s.classes
        real = cls.row_token >= 0
        rows[cls.row_token[real] * (H // Hkv) + cls.row_head[real]] += 1
    assert np.all(rows == 1)


def test_coverage_check_of_a_class_schedule_can_fail():
    # must-fail twins of the per-class form: a class schedule checked as if it covered the
    # whole batch, or as covering a sequence it leaves out
    q, c = np.array([1, 40, 1]), np.array([100, 0, 30])
    bt, N = block_tables_for(c, 16, 0)
    kw = dict(q=q, c=c, bt=bt, N=N, H=2, Hkv=1, d=8, B=16, LT=512)
    s = make_schedule(q, c, bt, num_heads=2, num_kv_heads=1, head_size=8, block_size=16,
                      num_blocks=N, large_tile_size=512, seqs=[0, 2])
    check_coverage(s, seqs=[0, 2], **kw)                                   # must pass
    for seqs in (None, [0, 1, 2], [0]):
        with pytest.raises(AssertionError):
            check_coverage(s, seqs=seqs, **kw)


@pytest.mark.parametrize("bad, what", [([], "non-empty"), ([[0, 1]], "1-D"), ([0.0], "integer"),
                                       ([0, 0], "distinct"), ([3], r"\[0, 3\)"),
                                       ([-1], r"\[0, 3\)")])
def test_seqs_is_validated(bad, what):
    q, c = np.array([1, 40, 1]), np.array([100, 0, 30])
    bt, N = block_tables_for(c, 16, 0)
    with pytest.raises(ValueError, match=rf"^seqs must .*{what}"):
        make_schedule(q, c, bt, num_heads=2, num_kv_heads=1, head_size=8, block_size=16,
                      num_blocks=N, seqs=bad)


def test_coverage_check_can_fail():
    # must-fail: the model above catches a wrong bound, a dropped output and a wrong row id
    # (decode class, keys on partitions; partial phase, item 0); a missing row-init load below
    s, kw = schedule([3, 1], [40, 700], H=2, Hkv=1, d=8, B=16, LT=512, row_init=True)
    check_coverage(s, **kw)
    cls = s.classes[0]
    assert cls.decode_layout
    ki, kf, col0 = columns(cls, nL=1, d=8, masked=True, alibi=False, row_init=True)

    def tamper(fn):
        arr = cls.partial
        mi = arr.meta_i.copy().reshape(1, P, arr.items, ki)
        mf = arr.meta_f.copy().reshape(P, arr.items, kf)
        bnd = arr.bounds.copy().reshape(arr.items, 2 * cls.rows)
        fn(mi, mf, bnd)
        bad = dataclasses.replace(arr, meta_i=mi.reshape(arr.meta_i.shape),
                                  meta_f=mf.reshape(arr.meta_f.shape),
                                  bounds=bnd.reshape(arr.bounds.shape))
        return dataclasses.replace(s, classes=(dataclasses.replace(cls, partial=bad),))

    def widen_bound(mi, mf, bnd):
        bnd[0, cls.rows] += 1.0                  # row 0's r: one key too many

    def shift_bound(mi, mf, bnd):
        bnd[0, 0] -= 1.0                         # row 0's c: the window one key to the left

    def drop_out(mi, mf, bnd):
        mi[:, :, 0, col0["out"]] = 10 ** 6       # output ids -> out of bounds

    def wrong_row(mi, mf, bnd):
        mi[:, 0, 0, 0] = mi[:, 1, 0, 0]          # partition 0 gathers partition 1's row

    for fn in (widen_bound, shift_bound, drop_out, wrong_row):
        with pytest.raises(AssertionError):
            check_coverage(tamper(fn), **kw)


def test_coverage_check_catches_a_missing_row_init_load():
    # must-fail: a query-rows class (prefill) whose group start does not load its q_init rows
    s, kw = schedule([200], [10], H=1, Hkv=1, d=8, B=16, LT=512, row_init=True)
    check_coverage(s, **kw)
    cls = s.classes[0]
    assert not cls.decode_layout
    ki, kf, col0 = columns(cls, nL=1, d=8, masked=True, alibi=False, row_init=True)
    arr = cls.partial
    mi = arr.meta_i.copy().reshape(1, P, arr.items, ki)
    mi[:, :, 0, col0["ini"]] = 10 ** 6           # q_init ids -> out of bounds
    bad = dataclasses.replace(arr, meta_i=mi.reshape(arr.meta_i.shape))
    with pytest.raises(AssertionError):
        check_coverage(dataclasses.replace(s, classes=(dataclasses.replace(cls, partial=bad),)),
                       **kw)


def test_overlay_row_map_is_sequence_major():
    # §16.1: rows floor(c/b')..ceil(K/b')-1 of each sequence, in sequence order. B=8, LT=512:
    # b'=4. seq0 K=11: rows 2 (positions 8..11: context 8, new 9, 10, zero 11); seq1 K=5: rows
    # 0, 1; seq2 c=64 (whole rows) K=65: row 16 only; seq3 K=8+7: rows 2, 3
    s, kw = schedule([2, 5, 1, 7], [9, 0, 64, 8], H=1, Hkv=1, d=4, B=8, LT=512)
    assert s.overlay_seq.tolist() == [0, 1, 1, 2, 3, 3]
    assert s.overlay_pos0.tolist() == [8, 0, 4, 64, 8, 12]
