"""Garbage safety of the scheduled kernel with FP8 KV caches (docs/layouts.md §16.6,
docs/attention-variants.md §6). bf16 queries with mixed precision, so the fp8 rows go straight
to TensorE: K is transposed by identity matmuls (a non-finite element reaches its whole 128-key
block and channel) and V is the PV operand. Garbage BYTES -- NaN, e5m2 +-inf, and the e4m3fn
patterns 0x78..0x7E / 0xF8..0xFE (+-256..448 in e4m3fn, inf / NaN in the kernel's float8_e4m3
view) -- planted where no query may look never change the output by a single bit; one key inside
the visible range they are read, by the owning sequence only; a sequence's own garbage byte
(decode or prefill, full or partial items, cache rows or overlay rows) stays in that sequence and
KV head. Mirrors test_scheduled_attention_garbage.py (float32 / bfloat16 caches)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from host.fp8 import kernel_cache_view
from host.scheduled.schedule import make_schedule
from test_scheduled_variants import to_fp8

pytestmark = [pytest.mark.simulation,   # NaN through the simulated matmuls is the point here
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

E4M3FN, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
BF16 = np.dtype(ml_dtypes.bfloat16)
H, HKV, D = 4, 2, 32
G = H // HKV
# name -> (cache dtype, byte patterns cycled over the planted bytes; the first is the single byte
# of the own-garbage test). Every pattern is inf or NaN for the kernel (checked when planted).
POISON = {
    "e4m3fn_nan": (E4M3FN, [0x7F, 0xFF]),
    "e4m3fn_256to448": (E4M3FN, list(range(0x78, 0x7F)) + list(range(0xF8, 0xFF))),
    "e5m2_nan": (E5M2, [0x7F, 0xFF, 0x7D, 0xFE]),
    "e5m2_inf": (E5M2, [0x7C, 0xFC]),
}
# name -> (seed, query_lens, context_lens, block_size, large_tile_size)
BATCHES = {
    # decode (2 rows), decode (6 rows), prefill (80 rows, 2 full tiles), no context, decode (2
    # full tiles); every context ends inside a block and inside a gathered row (odd)
    "main": (7, [1, 3, 40, 2, 1], [51, 7, 1101, 0, 1333], 16, 512),
    # contexts > 2048 with large_tile_size=2048: full items of whole 2048-key tiles
    "long": (11, [1, 40, 2, 1], [4501, 2301, 700, 2049], 32, 2048),
    "window": (3, [6, 1, 1, 3, 40], [1500, 700, 2000, 260, 900], 16, 512),
}
_MEMO = {}


def _batch(factory, name, fp8):
    """The named batch with a bf16 queries / fp8 cache (per-head scales, test_scheduled_variants
    .to_fp8), relabelled so that block 0 is a spare block; memoized, arrays read-only."""
    key = ("batch", name, fp8)
    if key not in _MEMO:
        seed, q, c, B, _ = BATCHES[name]
        b = factory(seed, q, c, H=H, Hkv=HKV, d=D, block_size=B, dtype=BF16, spare_blocks=3,
                    max_blocks_extra=2)
        b, ks, vs = to_fp8(b, POISON[fp8][0])
        used = b.block_tables[b.block_tables >= 0]
        s = sorted(set(range(b.kv_cache.shape[1])) - set(used.tolist()))[-1]
        if 0 in used:
            b.block_tables = np.where(b.block_tables == 0, s, b.block_tables).astype(np.int32)
            b.kv_cache[:, [0, s]] = b.kv_cache[:, [s, 0]]
        for a in (b.query, b.key, b.value, b.kv_cache, b.block_tables):
            a.flags.writeable = False
        _MEMO[key] = b, dict(k_scale=ks, v_scale=vs)
    return _MEMO[key]


def _run(b, scales, name, target="trn2", window=None, **override):
    a = dict(query=b.query, key=b.key, value=b.value, kv_cache=b.kv_cache,
             block_tables=b.block_tables)
    a.update(override)
    opts = {} if window is None else dict(sliding_window=window)
    with nki_sim.use_target(target):
        return paged_attention(a["query"], a["key"], a["value"], a["kv_cache"], a["block_tables"],
                               b.query_lens, b.context_lens, backend="sim", kernel="scheduled",
                               mixed_precision=True, large_tile_size=BATCHES[name][4],
                               **scales, **opts)


def _clean(factory, name, fp8, target="trn2", window=None):
    key = ("clean", name, fp8, target, window)
    if key not in _MEMO:
        b, scales = _batch(factory, name, fp8)
        out = _run(b, scales, name, target, window)
        assert np.isfinite(out.astype(np.float32)).all()
        _MEMO[key] = out
    return _MEMO[key]


def _plant(cache, idx, fp8):
    """Write the poison's byte pattern into ``cache[idx]`` through its uint8 view."""
    u8 = cache.view(np.uint8)
    u8[idx] = np.resize(np.array(POISON[fp8][1], np.uint8), u8[idx].shape)
    assert not np.isfinite(kernel_cache_view(cache)[idx].astype(np.float32)).any()


def _rows_of(b, seq):
    off = np.concatenate(([0], np.cumsum(b.query_lens)))
    return slice(int(off[seq]), int(off[seq + 1]))


def _changed(b, out, clean):
    """Sequences whose output differs from the clean run in any bit."""
    return [i for i in range(len(b.query_lens))
            if out[_rows_of(b, i)].tobytes() != clean[_rows_of(b, i)].tobytes()]


def _spare(b):
    used = set(b.block_tables[b.block_tables >= 0].tolist())
    return [k for k in range(b.kv_cache.shape[1]) if k not in used]


def _tails(b, fp8, inside):
    """(a) positions c .. B-1 of every sequence's last block (inside: position c - 1 of seq 0)."""
    cache, bt, B = b.kv_cache.copy(), b.block_tables, b.kv_cache.shape[3]
    for i, c in enumerate(b.context_lens.tolist()):
        if c % B:
            _plant(cache, np.s_[:, bt[i, c // B], :, c % B:], fp8)
    if inside:
        c0 = int(b.context_lens[0])
        _plant(cache, np.s_[:, bt[0, (c0 - 1) // B], :, (c0 - 1) % B], fp8)
    return dict(kv_cache=cache)


def _padded_entries(b, fp8, inside):
    """(b) block-table entries past ceil(c / B) point at a garbage block (inside: seq 0's last
    used entry does too)."""
    g, B = _spare(b)[-1], b.kv_cache.shape[3]
    cache, bt = b.kv_cache.copy(), b.block_tables.copy()
    _plant(cache, np.s_[:, g], fp8)
    for i, c in enumerate(b.context_lens.tolist()):
        bt[i, -(-c // B):] = g
    if inside:
        bt[0, -(-int(b.context_lens[0]) // B) - 1] = g
    return dict(kv_cache=cache, block_tables=bt)


def _block0_padding(b, fp8, inside):
    """(c) padding entries are block 0 (as vLLM pads) and block 0 holds garbage (inside: seq 0's
    first block is block 0)."""
    cache, bt = b.kv_cache.copy(), b.block_tables.copy()
    assert 0 in _spare(b)
    _plant(cache, np.s_[:, 0], fp8)
    bt[bt < 0] = 0
    if inside:
        bt[0, 0] = 0
    return dict(kv_cache=cache, block_tables=bt)


def _unreferenced(b, fp8, inside):
    """(d) every block no table entry names (inside: seq 2's block 5 too, in a full tile)."""
    cache = b.kv_cache.copy()
    _plant(cache, np.s_[:, _spare(b)], fp8)
    if inside:
        _plant(cache, np.s_[:, b.block_tables[2, 5]], fp8)
    return dict(kv_cache=cache)


PLACES = {"block_tails": _tails, "padded_table_entries": _padded_entries,
          "block0_as_padding": _block0_padding, "unreferenced_blocks": _unreferenced}


def _schedule(b, name, window=None):
    """The schedule host.paged_attention builds for the batch (bf16 queries, fp8 cache)."""
    _, _, Hkv, B, d = b.kv_cache.shape
    return make_schedule(b.query_lens, b.context_lens, b.block_tables, num_heads=H,
                         num_kv_heads=Hkv, head_size=d, block_size=B,
                         num_blocks=b.kv_cache.shape[1], large_tile_size=BATCHES[name][4],
                         partial_tile_size="auto", sliding_window=window, query_itemsize=2,
                         cache_itemsize=1, kernel_itemsize=2)


@pytest.mark.parametrize("name, window", [("main", None), ("long", None), ("window", 1200)])
def test_batches_use_full_items(name, window, batch_factory):
    # the batches below run whole cached tiles (identity-matmul K^T of full items) in both the
    # decode and the prefill class, so garbage meets the full-phase path too
    b, _ = _batch(batch_factory, name, "e4m3fn_nan")
    full = {cls.kind: cls.full.real_items for cls in _schedule(b, name, window).classes}
    assert full.get("decode", 0) > 0 and full.get("prefill", 0) > 0, full


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("fp8", list(POISON))
@pytest.mark.parametrize("place", list(PLACES))
def test_garbage_bytes_where_no_query_looks_never_reach_the_output(place, fp8, target,
                                                                  batch_factory):
    # must-pass: bit-identical to the clean run
    b, scales = _batch(batch_factory, "main", fp8)
    clean = _clean(batch_factory, "main", fp8, target)
    out = _run(b, scales, "main", target, **PLACES[place](b, fp8, inside=False))
    assert out.tobytes() == clean.tobytes(), f"garbage reached sequences {_changed(b, out, clean)}"


@pytest.mark.parametrize("fp8", list(POISON))
@pytest.mark.parametrize("place", list(PLACES))
def test_the_same_garbage_one_step_inside_is_read(place, fp8, batch_factory):
    # must-fail side: moved onto a visible key (K and V, every head), the bytes are read --
    # every row of the owning sequence becomes non-finite, no other sequence changes
    b, scales = _batch(batch_factory, "main", fp8)
    clean = _clean(batch_factory, "main", fp8)
    out = _run(b, scales, "main", **PLACES[place](b, fp8, inside=True))
    victim = 2 if place == "unreferenced_blocks" else 0
    assert not np.isfinite(out[_rows_of(b, victim)].astype(np.float32)).any()
    assert _changed(b, out, clean) == [victim]


# (batch, sequence) pairs of the own-garbage test: a decode and a prefill of each batch
OWN = {"main": {"decode": 4, "prefill": 2}, "long": {"decode": 0, "prefill": 1}}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("fp8", list(POISON))
@pytest.mark.parametrize("pos", ["first", "last_tile_row", "last"])
@pytest.mark.parametrize("what", ["k", "v"])
@pytest.mark.parametrize("kind", ["decode", "prefill"])
@pytest.mark.parametrize("name", ["main", "long"])
def test_a_sequences_own_garbage_byte_stays_in_that_sequence(name, kind, what, pos, fp8, target,
                                                             batch_factory):
    # one garbage byte (KV head 0, channel 5) in a position every query of the sequence sees:
    # position 0 (a full item), a whole cache row of the last, partial tile, or position c - 1
    # (the overlay row). It reaches exactly the sequence's rows of KV head 0 (a key: all their
    # channels; a value: channel 5, or on trn1 all channels of a decode's rows: the decode step
    # takes PV as (P V)^T and transposes it back on TensorE, and NeuronCore-v2's PE transpose
    # spreads a non-finite element along its output row); nothing else changes by a bit.
    b, scales = _batch(batch_factory, name, fp8)
    clean = _clean(batch_factory, name, fp8, target)
    seq, lt, B = OWN[name][kind], BATCHES[name][4], b.kv_cache.shape[3]
    c = int(b.context_lens[seq])
    p = {"first": 0, "last_tile_row": (c // lt) * lt + 1, "last": c - 1}[pos]
    bpp = _schedule(b, name).partial_tiled_block_size
    assert (p >= c // bpp * bpp) == (pos == "last")      # overlay row only for "last"
    ch = 5
    cache = b.kv_cache.copy()
    blk = b.block_tables[seq, p // B]
    cache.view(np.uint8)[0 if what == "k" else 1, blk, 0, p % B, ch] = POISON[fp8][1][0]
    out = _run(b, scales, name, target, kv_cache=cache)
    hit = np.zeros(out.shape, bool)
    every_channel = what == "k" or (target == "trn1" and kind == "decode")
    hit[_rows_of(b, seq), :G, slice(None) if every_channel else ch] = True
    assert not np.isfinite(out[hit].astype(np.float32)).any()
    assert out[~hit].tobytes() == clean[~hit].tobytes(), \
        f"changed outside the hit rows; sequences changed: {_changed(b, out, clean)}"


def _dead_blocks(b, window):
    """Blocks whose every token is before the window of its sequence's first query (position
    c), hence outside every query's window."""
    B = b.kv_cache.shape[3]
    return sorted(int(b.block_tables[i, j]) for i, c in enumerate(b.context_lens.tolist())
                  for j in range(max(0, c - window + 1) // B))


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("fp8", list(POISON))
@pytest.mark.parametrize("window", [40, 500, 1200])
def test_garbage_outside_every_window_never_reaches_the_output(window, fp8, target,
                                                               batch_factory):
    # must-pass with sliding_window: garbage in every block wholly before all windows (in
    # pruned tiles and in the tile the window edge cuts) and in unused blocks: bit-identical
    b, scales = _batch(batch_factory, "window", fp8)
    clean = _clean(batch_factory, "window", fp8, target, window)
    dead = _dead_blocks(b, window)
    assert len(dead) >= 8
    cache = b.kv_cache.copy()
    _plant(cache, np.s_[:, dead + _spare(b)], fp8)
    out = _run(b, scales, "window", target, window, kv_cache=cache)
    assert out.tobytes() == clean.tobytes(), f"garbage reached sequences {_changed(b, out, clean)}"


@pytest.mark.parametrize("fp8", ["e4m3fn_256to448", "e5m2_inf"])
@pytest.mark.parametrize("window", [40, 500, 1200])
def test_garbage_on_the_window_edge_is_read(window, fp8, batch_factory):
    # must-fail side: the first key of seq 0's first window (K and V, every head) is read --
    # that query's rows become non-finite, no other sequence changes
    b, scales = _batch(batch_factory, "window", fp8)
    clean = _clean(batch_factory, "window", fp8, window=window)
    B, lo = b.kv_cache.shape[3], int(b.context_lens[0]) - window + 1
    cache = b.kv_cache.copy()
    _plant(cache, np.s_[:, b.block_tables[0, lo // B], :, lo % B], fp8)
    out = _run(b, scales, "window", window=window, kv_cache=cache)
    assert not np.isfinite(out[0].astype(np.float32)).any()
    assert _changed(b, out, clean) == [0]
