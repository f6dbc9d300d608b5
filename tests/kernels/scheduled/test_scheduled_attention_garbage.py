"""Garbage safety of the scheduled kernel (docs/layouts.md §16.6): NaN / Inf planted where no
query may look never reaches any output (bit-identical to a clean run), the same value planted
one key inside the visible range does (so the planted place is really next to what is read),
and a sequence's own garbage stays in that sequence. The dense kernel reads whole blocks and
zeroes the values of keys no row of a query tile may see, so block-tail garbage reaches no
output either (asserted below)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from host.attention import paged_attention

pytestmark = [pytest.mark.simulation,   # NaN through the simulated matmuls is the point here
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

B, LT = 16, 512
# seq0..seq4: decode (G=2: 2 rows), decode (6 rows), prefill (80 rows), no context, decode
QLENS, CLENS = [1, 3, 40, 2, 1], [50, 7, 300, 0, 33]      # every context ends inside a block
H, HKV, D = 4, 2, 16


def _batch(batch_factory, dtype):
    b = batch_factory(7, QLENS, CLENS, H=H, Hkv=HKV, d=D, block_size=B, dtype=dtype,
                      spare_blocks=3, max_blocks_extra=2)
    # relabel so that block 0 is a spare block (no sequence references it)
    used = b.block_tables[b.block_tables >= 0]
    spare = sorted(set(range(b.kv_cache.shape[1])) - set(used.tolist()))
    s = spare[-1]
    if 0 in used:
        b.block_tables = np.where(b.block_tables == 0, s, b.block_tables).astype(np.int32)
        b.kv_cache[:, [0, s]] = b.kv_cache[:, [s, 0]]
    return b


def _run(b, *, kernel="scheduled", **override):
    args = dict(query=b.query, key=b.key, value=b.value, kv_cache=b.kv_cache,
                block_tables=b.block_tables)
    args.update(override)
    return paged_attention(args["query"], args["key"], args["value"], args["kv_cache"],
                           args["block_tables"], b.query_lens, b.context_lens, backend="sim",
                           large_tile_size=LT, kernel=kernel)


def _rows_of(seq):
    off = np.concatenate(([0], np.cumsum(QLENS)))
    return slice(int(off[seq]), int(off[seq + 1]))


def _spare_blocks(b):
    used = set(b.block_tables[b.block_tables >= 0].tolist())
    return [k for k in range(b.kv_cache.shape[1]) if k not in used]


def _tails(b, bad, inside):
    """(a) positions c .. B-1 of every sequence's last block (inside: also position c - 1 of
    seq 0, a visible key)."""
    cache = b.kv_cache.copy()
    for i, c in enumerate(CLENS):
        if c % B:
            cache[:, b.block_tables[i, c // B], :, c % B:, :] = bad
    if inside:
        cache[:, b.block_tables[0, (CLENS[0] - 1) // B], :, (CLENS[0] - 1) % B, :] = bad
    return dict(kv_cache=cache)


def _padded_entries(b, bad, inside):
    """(b) block-table entries past ceil(c / B) point at a garbage block (inside: seq 0's last
    used entry does too)."""
    g = _spare_blocks(b)[-1]
    cache, bt = b.kv_cache.copy(), b.block_tables.copy()
    cache[:, g] = bad
    for i, c in enumerate(CLENS):
        bt[i, -(-c // B):] = g
    if inside:
        bt[0, -(-CLENS[0] // B) - 1] = g
    return dict(kv_cache=cache, block_tables=bt)


def _block0_padding(b, bad, inside):
    """(c) padding entries are block 0 (as vLLM pads), and block 0 holds garbage (inside: seq 0
    uses block 0 as its first block)."""
    cache, bt = b.kv_cache.copy(), b.block_tables.copy()
    assert 0 in _spare_blocks(b)
    cache[:, 0] = bad
    bt[bt < 0] = 0
    if inside:
        bt[0, 0] = 0
    return dict(kv_cache=cache, block_tables=bt)


def _unreferenced(b, bad, inside):
    """(d) every block no table entry names is garbage (inside: seq 2's block 5 too)."""
    cache = b.kv_cache.copy()
    cache[:, _spare_blocks(b)] = bad
    if inside:
        cache[:, b.block_tables[2, 5]] = bad
    return dict(kv_cache=cache)


PLACES = {"block_tails": _tails, "padded_table_entries": _padded_entries,
          "block0_as_padding": _block0_padding, "unreferenced_blocks": _unreferenced}
POISON = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("poison", list(POISON))
@pytest.mark.parametrize("place", list(PLACES))
def test_garbage_where_no_query_looks_never_reaches_the_output(place, poison, dtype, batch_factory):
    b = _batch(batch_factory, DTYPES[dtype])
    clean = _run(b)
    assert np.isfinite(clean.astype(np.float32)).all()
    out = _run(b, **PLACES[place](b, POISON[poison], inside=False))
    assert out.tobytes() == clean.tobytes()


@pytest.mark.parametrize("place", list(PLACES))
def test_the_same_garbage_one_step_inside_is_read(place, batch_factory):
    # must-fail side: moved onto a visible key, the planted NaN does reach the output -- of the
    # sequence that owns the key only
    b = _batch(batch_factory, np.float32)
    clean = _run(b)
    out = _run(b, **PLACES[place](b, np.nan, inside=True))
    victim = 2 if place == "unreferenced_blocks" else 0
    assert np.isnan(out[_rows_of(victim)]).all()
    for i in range(len(QLENS)):
        if i != victim:
            assert out[_rows_of(i)].tobytes() == clean[_rows_of(i)].tobytes(), i


def _own_garbage(b, what, seq, bad):
    """(e) garbage in one key / value / query vector of sequence ``seq``, KV head 0 (query
    head 0) only."""
    r0 = _rows_of(seq).start
    if what in ("cache_k", "cache_v"):            # context position 0: visible to every query
        cache = b.kv_cache.copy()
        cache[0 if what == "cache_k" else 1, b.block_tables[seq, 0], 0, 0, :] = bad
        return dict(kv_cache=cache)
    if what in ("new_k", "new_v"):                # the first new token: visible to every query
        arr = (b.key if what == "new_k" else b.value).copy()
        arr[r0, 0, :] = bad
        return {"key" if what == "new_k" else "value": arr}
    q = b.query.copy()
    q[r0, 0, :] = bad
    return dict(query=q)


@pytest.mark.parametrize("poison", ["nan", "inf"])
@pytest.mark.parametrize("seq", [0, 2, 4], ids=["decode", "prefill", "decode_last"])
@pytest.mark.parametrize("what", ["cache_k", "cache_v", "new_k", "new_v", "query"])
def test_a_sequences_own_garbage_stays_in_that_sequence(what, seq, poison, batch_factory):
    b = _batch(batch_factory, np.float32)
    clean = _run(b)
    out = _run(b, **_own_garbage(b, what, seq, POISON[poison]))
    G = H // HKV
    rows = _rows_of(seq)
    hit = np.zeros(out.shape[:2], bool)       # (token, query head) rows the garbage may reach
    if what == "query":
        hit[rows.start, 0] = True       # a query reaches its own output row only
    else:
        hit[rows, :G] = True            # a key / value: the query heads of KV head 0
    # must-fail side: the garbage is read. NaN poisons every reached row; an Inf key may give
    # a -inf score (probability 0) for some rows, so Inf only has to change the sequence
    if what == "query":
        assert not np.isfinite(out[rows.start, 0]).any()   # the poisoned row itself
    elif poison == "nan":
        assert np.isnan(out[hit]).all()
    else:
        assert out[hit].tobytes() != clean[hit].tobytes()
    # nothing else changes by a single bit: other rows of the sequence, other sequences
    assert out[~hit].tobytes() == clean[~hit].tobytes()
    for i in range(len(QLENS)):
        if i != seq:
            assert out[_rows_of(i)].tobytes() == clean[_rows_of(i)].tobytes(), i


@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_dense_kernel_keeps_block_tail_garbage_out_of_every_output(poison, batch_factory):
    # The dense kernel gathers whole blocks; value rows that are not finite are zeroed before
    # P V (nki_kernels.dense.finite, docs/layouts.md §16.6), so NaN / Inf in block tails, which
    # no query sees, changes no output bit.
    b = _batch(batch_factory, np.float32)
    clean = _run(b, kernel="dense")
    assert np.isfinite(clean).all()
    out = _run(b, kernel="dense", **_tails(b, POISON[poison], inside=False))
    assert out.tobytes() == clean.tobytes()
    assert out.shape[0] <= 128


# trn1 (NeuronCore-v2) takes other paths than the default trn2: K^T by PE transposes and, in
# 128-row masked steps, the mask ADDED to the scores on TensorE (docs/layouts.md §16.6). The
# cross-sequence guarantees above are re-checked there (both must-pass and must-fail sides).
@pytest.mark.parametrize("poison", ["nan", "inf"])
@pytest.mark.parametrize("place", list(PLACES))
def test_trn1_garbage_where_no_query_looks_never_reaches_the_output(place, poison, batch_factory):
    import nki_sim
    b = _batch(batch_factory, ml_dtypes.bfloat16)
    with nki_sim.use_target("trn1"):
        clean = _run(b)
        out = _run(b, **PLACES[place](b, POISON[poison], inside=False))
        inside = _run(b, **PLACES[place](b, np.nan, inside=True))
    assert np.isfinite(clean.astype(np.float32)).all()
    assert out.tobytes() == clean.tobytes()
    victim = 2 if place == "unreferenced_blocks" else 0          # must-fail side: it is read
    assert np.isnan(inside[_rows_of(victim)].astype(np.float32)).all()


@pytest.mark.parametrize("what", ["cache_k", "new_k", "new_v"])
def test_trn1_prefill_garbage_stays_in_its_sequence(what, batch_factory):
    import nki_sim
    b = _batch(batch_factory, np.float32)
    with nki_sim.use_target("trn1"):
        clean = _run(b)
        out = _run(b, **_own_garbage(b, what, 2, np.nan))
    assert np.isnan(out[_rows_of(2), :H // HKV]).all()          # must-fail side: it is read
    for i in range(len(QLENS)):
        if i != 2:
            assert out[_rows_of(i)].tobytes() == clean[_rows_of(i)].tobytes(), i


# Masked decode items on NeuronCore-v3+ share one K rows tile per phase, zeroed once
# (sched_tile.stale_keys_ok): rows a later item's DMAs skip keep an earlier item's keys. Sequence
# 0 (31 cache blocks in its one tile) sees a NaN key in its block 20; sequence 1 (2 cache blocks)
# comes after it in the same phase (the host's nesting order, which would put sequence 1 first,
# is switched off: ``keep_item_order``), so row 20 of its tile still holds that NaN key.
STALE_QLENS, STALE_CLENS = [1, 1], [500, 40]



def _stale_run(b, cache, target, lnc=1):
    import nki_sim
    with nki_sim.use_target(target):
        return paged_attention(b.query, b.key, b.value, cache, b.block_tables, b.query_lens,
                               b.context_lens, backend="sim", large_tile_size=LT, lnc=lnc)


def _stale_batch(batch_factory, kv=0):
    """The stale-row batch and its cache with NaN in K (``kv`` = 0) or V (1) of a key
    sequence 0 sees (its block 20)."""
    b = batch_factory(8, STALE_QLENS, STALE_CLENS, H=H, Hkv=HKV, d=D, block_size=B,
                      dtype=ml_dtypes.bfloat16)
    cache = b.kv_cache.copy()
    cache[kv, b.block_tables[0, 20], 0, 3, :] = np.nan
    return b, cache


@pytest.mark.parametrize("api,target,lnc", [("legacy", "trn2", 1), ("legacy", "trn2", 2),
                                            ("nki", "trn2", 1), ("legacy", "trn1", 1)])
def test_an_earlier_sequences_nan_key_left_in_a_tile_reaches_no_later_sequence(
        api, target, lnc, on_api, batch_factory, keep_item_order):
    b, cache = _stale_batch(batch_factory)
    with on_api(api, target):
        clean = _stale_run(b, b.kv_cache, target, lnc)
        out = _stale_run(b, cache, target, lnc)
    assert np.isnan(out[0, :H // HKV].astype(np.float32)).all()     # read by sequence 0
    assert out[1].tobytes() == clean[1].tobytes()
    assert out[0, H // HKV:].tobytes() == clean[0, H // HKV:].tobytes()


def test_a_stale_key_row_would_reach_the_later_sequence_through_gen2_transposes(
        on_api, batch_factory, monkeypatch, keep_item_order):
    # must-fail side: on NeuronCore-v2 with the stale rows kept (the rule forced on), the PE
    # transpose spreads the NaN along its K^T row, into sequence 1's scores
    from nki_kernels.scheduled import sched_tile, scheduled_attention
    for mod in (sched_tile, scheduled_attention):
        monkeypatch.setattr(mod, "stale_keys_ok", lambda ops, cfg, phase: True)
    b, cache = _stale_batch(batch_factory)
    with on_api("legacy", "trn1"):
        out = _stale_run(b, cache, "trn1")
    assert np.isnan(out[1, :H // HKV].astype(np.float32)).all()


# The partial phase's tiles zeroed once per head (SchedOptions.nested_rows): the host orders the
# masked items so that each writes every KV row an earlier one wrote (sequence 1, 2 cache rows,
# before sequence 0, 31) and promises so only after checking the metadata. A NaN in the V of a
# key sequence 0 sees then never sits in a row of sequence 1's tile.
@pytest.mark.parametrize("api,target", [("legacy", "trn2"), ("nki", "trn2"), ("legacy", "trn1")])
def test_nested_rows_keep_an_earlier_sequences_nan_value_out_of_later_items(
        api, target, on_api, batch_factory):
    from host.scheduled import schedule
    b, cache = _stale_batch(batch_factory, kv=1)
    s = schedule.make_schedule(b.query_lens, b.context_lens, b.block_tables, num_heads=H,
                               num_kv_heads=HKV, head_size=D, block_size=B,
                               num_blocks=cache.shape[1], large_tile_size=LT)
    assert all(c.partial.nested_rows for c in s.classes)
    with on_api(api, target):
        clean = _stale_run(b, b.kv_cache, target)
        out = _stale_run(b, cache, target)
    assert np.isnan(out[0, :H // HKV].astype(np.float32)).all()     # read by sequence 0
    assert out[1].tobytes() == clean[1].tobytes()


@pytest.mark.parametrize("api,target", [("legacy", "trn2"), ("nki", "trn2"), ("legacy", "trn1")])
def test_a_broken_nesting_promise_would_let_a_stale_nan_value_into_a_later_sequence(
        api, target, on_api, batch_factory, monkeypatch, keep_item_order):
    # must-fail side: the items in group order (sequence 0's 31 rows, then sequence 1's 2) with
    # the promise forced on: sequence 1's tile keeps sequence 0's row 20, and P = 0 times its
    # NaN value is NaN
    from host.scheduled import schedule
    monkeypatch.setattr(schedule, "rows_nested", lambda *a, **k: True)
    b, cache = _stale_batch(batch_factory, kv=1)
    with on_api(api, target):
        out = _stale_run(b, cache, target)
    assert np.isnan(out[1, :H // HKV].astype(np.float32)).all()


@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_an_additive_decode_mask_over_stale_rows_would_leak(api, on_api, batch_factory,
                                                             monkeypatch, keep_item_order):
    # must-fail side of scheduled_attention.additive_decode_mask: with stale K rows kept (the
    # host's order, not nested, on NeuronCore-v3) the mask must stay a select; forced additive,
    # sequence 0's NaN key left in row 20 of sequence 1's tile scores NaN + MASK = NaN, which
    # the exponentials carry into sequence 1's output
    from nki_kernels.scheduled import scheduled_attention
    monkeypatch.setattr(scheduled_attention, "additive_decode_mask", lambda ops, cfg: True)
    b, cache = _stale_batch(batch_factory)
    with on_api(api, "trn2"):
        out = _stale_run(b, cache, "trn2")
    assert np.isnan(out[1, :H // HKV].astype(np.float32)).all()
