"""A model of one class launch of the scheduled kernel written from docs/layouts.md §16 (not from
the schedule code), for the schedule tests.

``run_symbolically`` decodes every metadata column of every item (row ids -> (sequence, key
row), Q / state / output ids -> Q block and row, bounds -> visible tile-local keys), follows the
documented dataflow (reset, Q load at a group's first item, state store / load between the
phases, output store) and counts, per output row, how often each key position was folded into
what that row finally stores; ``check_coverage`` compares those counts with the definition of
attention visibility (same sequence, key position <= query position, sliding window): every
visible (query row, key) pair exactly once, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from host.scheduled.schedule import DECODE_MAX_ROWS, bucket, make_schedule, meta_columns

P = 128


# ------------------------------------------------------------------------- definitions (§1, §16)
def geometry(B, LT):
    """(Tf, b', L, nL, W) from the §1 formulas."""
    M = LT // B
    Tf = P // M if M < P else 1
    L = M * Tf
    return Tf, B // Tf, L, L // P, L * (B // Tf)


def block_tables_for(context_lens, B, seed, *, extra=2, pad=-1):
    """(S, max_blocks + extra) distinct block ids (a seeded permutation), unused entries ``pad``;
    returns (table, N) with two spare blocks in the cache."""
    nb = [-(-int(c) // B) for c in context_lens]
    N = sum(nb) + 2
    perm = np.random.default_rng(seed).permutation(N)
    bt = np.full((len(nb), max(nb) + extra), pad, np.int64)
    off = 0
    for i, n in enumerate(nb):
        bt[i, :n] = perm[off:off + n]
        off += n
    return bt, N


def visible(x, window):
    """[lo, hi): key positions a query at position x sees."""
    return (0 if window is None else max(0, x - window + 1)), x + 1


def expected_rows(q, G, seqs, rows, blocks):
    """(row_token, row_head) of a class from §16.2: each sequence's q_i*G rows (token a = r // G,
    head g = r % G) cut into blocks of ``rows``, the blocks into groups of ``blocks`` (the last
    group of a sequence padded with whole padding blocks), sequence after sequence, -1 for
    padding."""
    tok_off = np.concatenate(([0], np.cumsum(q)[:-1]))
    tok, head = [], []
    span = rows * blocks
    for i in seqs:
        R = int(q[i]) * G
        r = np.arange(-(-R // span) * span)
        tok.append(np.where(r < R, tok_off[i] + r // G, -1))
        head.append(np.where(r < R, r % G, -1))
    return np.concatenate(tok), np.concatenate(head)


# ------------------------------------------------------------------------- symbolic run (§16.4)
@dataclass
class Item:
    phase: str
    real: bool
    reset: bool
    seq: int              # sequence of the gathered key rows (-1: none)
    tile: int             # k (-1: none)
    blocks: tuple         # Q blocks of the current group, slot by slot (None = empty slot)
    q: tuple              # slots whose Q^T is loaded here (keys on partitions: item_block)
    st: tuple             # slots whose state rows are stored (full) / loaded (partial) here
    out: tuple            # slots whose output rows are stored here
    main: int             # gathered main rows
    ov: int               # gathered overlay rows
    pairs: int            # visible (real query row, key) pairs folded


def columns(cls, *, nL, d, masked, alibi, row_init):
    """(ki, kf, offsets) of §16.4: kv, ov, q, st, out, ini column starts (group-major: one Q^T
    column per channel slice, one state / output / init column per item)."""
    blocks, nd = cls.blocks, -(-d // P)
    kop = cls.decode_layout
    kv0, ov0 = 0, nL
    q0 = 2 * nL if masked else nL
    st0 = q0 + (0 if kop else nd)
    out0 = st0 + 1
    ini0 = out0 + (1 if masked else 0)
    ki = ini0 + (1 if row_init and not kop else 0)     # kop: row init values preloaded
    kf = 1 + (2 * blocks if masked and not kop else 0) + (1 if alibi else 0)   # kop: bounds apart
    assert (ki, kf) == meta_columns(loads=nL, blocks=blocks, head_size=d, masked=masked,
                                    alibi=alibi, row_init=row_init, rows=cls.rows)
    return ki, kf, dict(kv=kv0, ov=ov0, q=q0, st=st0, out=out0, ini=ini0)


def run_symbolically(cls, *, q, c, bt, N, H, Hkv, d, B, LT, head, window=None, alibi=False,
                     row_init=False, LTp=None, seqs=None):
    """Decode one class launch for KV head ``head``; returns (items, counts, writes): counts[b]
    (rows, max K) = times each key position reached the stored output of query row p of Q block
    b; writes[b] (rows,) = output stores per row. The full phase's tiles are those of LT, the
    partial phase's (and the overlay rows) those of LTp (default LT); ``seqs``: the sequences
    the schedule covers (None: all), the only ones with overlay rows."""
    LTp = LT if LTp is None else LTp
    nd = -(-d // P)
    K = c + q
    bp = geometry(B, LTp)[1]                           # overlay rows: partial geometry (§16.1)
    m_main, n_rows = c // bp, -(-K // bp)
    ov_map = [(i, j) for i in (range(len(q)) if seqs is None else seqs)             # §16.1
              for j in range(m_main[i], n_rows[i])]
    R_ov = max(len(ov_map), 1)
    owner_seq, owner_jb = np.full(N, -1), np.full(N, -1)       # used block -> (sequence, entry)
    for i in range(len(q)):
        nb = -(-int(c[i]) // B)
        owner_seq[bt[i, :nb]], owner_jb[bt[i, :nb]] = i, np.arange(nb)
    ov_seq = np.array([i for i, _ in ov_map] or [-1])
    ov_row = np.array([j for _, j in ov_map] or [-1])
    rows, blocks, nblk = cls.rows, cls.blocks, cls.num_blocks
    ngroups = nblk // blocks
    assert ngroups * blocks == nblk, "Q blocks are not whole groups"
    kop = cls.decode_layout
    assert kop == (rows <= 64 and blocks == 1)
    seq_of_row = np.full(nblk * rows, -1)
    tok_off = np.concatenate(([0], np.cumsum(q)[:-1]))
    real_rows = cls.row_token >= 0
    seq_of_row[real_rows] = np.searchsorted(tok_off, cls.row_token[real_rows], side="right") - 1
    pos_of_row = np.where(real_rows, c[np.maximum(seq_of_row, 0)] + cls.row_token
                          - tok_off[np.maximum(seq_of_row, 0)], -1)
    Kmax = int(K.max())
    counts = np.zeros((nblk, rows, Kmax), np.int64)
    writes = np.zeros((nblk, rows), np.int64)
    saved = {}                                         # state scratch rows: b -> (rows, Kmax)
    items = []
    parts = cls.full.parts
    assert cls.partial.parts == parts
    # one core's run: per part, its full phase then its partial phase, on one state tile (a
    # group's state may stay in it from the full phase's last item to the partial phase's
    # first, host.scheduled.state_carry)
    runs = [(pp, phase, arr) for pp in range(parts)
            for phase, arr in (("full", cls.full), ("partial", cls.partial))]
    group = acc = None
    for pp, phase, arr in runs:
        if phase == "full":
            group, acc = [None] * blocks, [None] * blocks
        masked = phase == "partial"
        Tf, bp, L, nL, W = geometry(B, LTp if masked else LT)
        m_main = c // bp
        tl_of = (np.arange(nL)[:, None, None] * P + np.arange(P)[None, :, None]) * bp \
            + np.arange(bp)[None, None, :]             # tile-local key of (l, p, s)
        ki, kf, col0 = columns(cls, nL=nL, d=d, masked=masked, alibi=alibi, row_init=row_init)
        assert arr.masked == masked and (arr.items == bucket(arr.real_items) if arr.parts == 1
                                         else arr.items % arr.parts == 0)
        assert arr.meta_i.shape == (Hkv, P, arr.items * ki) and arr.meta_i.dtype == np.int32
        assert arr.meta_f.shape == (P, arr.items * kf) and arr.meta_f.dtype == np.float32
        assert arr.item_block.shape == (arr.items,)
        mi = arr.meta_i[head].reshape(P, arr.items, ki).astype(np.int64)
        mf = arr.meta_f.reshape(P, arr.items, kf).astype(np.float64)
        if masked and kop:        # item t's c_q, r_q at t*2*rows + q, t*2*rows + rows + q
            assert arr.bounds.shape == (1, arr.items * 2 * rows) and arr.bounds.dtype == np.float32
            bnd = arr.bounds.reshape(arr.items, 2 * rows).astype(np.float64)
        else:
            assert arr.bounds is None
        per = arr.items // parts
        real_of = arr.item_block[pp * per:(pp + 1) * per] >= 0   # padding items carry -1
        n_real = int(real_of.sum())
        # the part's real items are contiguous: padding after them, or (a full phase carrying
        # its last group's state out) before them
        assert (real_of[:n_real].all() or (phase == "full" and real_of[per - n_real:].all()))
        if parts == 1:
            assert n_real == arr.real_items
        for t in range(pp * per, (pp + 1) * per):
            reset = mf[0, t, 0]
            assert np.all(mf[:, t, 0] == reset) and reset in (0.0, 1.0)
            real_t = bool(arr.item_block[t] >= 0)
            if reset or not real_t:
                # a padding item (no reset) folds what its skipped DMAs left in the tiles: the
                # state is garbage from here on, and no later item may store or load it
                group, acc = [None] * blocks, [None] * blocks
            q_slots = []
            if kop:      # the item's Q^T comes from item_block (preloaded per chunk)
                b = int(arr.item_block[t])
                if b >= 0:
                    if reset:
                        group[0], acc[0] = b, np.zeros((rows, Kmax), np.int64)
                        q_slots.append(0)
                    assert group[0] == b, "item_block changes inside a group"
            else:        # Q^T ids: (h*ngroups + g)*d + 128k + p, only at a group's first item
                col = mi[:, t, col0["q"]:col0["q"] + nd]                      # (128, nd)
                inb = col < Hkv * ngroups * d
                if inb.any():
                    assert reset, "Q loaded in the middle of a group"
                    hh, g = col // (ngroups * d), (col // d) % ngroups
                    ch = col % d
                    dk = np.minimum(P, d - np.arange(nd) * P)
                    assert np.array_equal(inb, np.arange(P)[:, None] < dk[None, :])
                    assert np.all(hh[inb] == head) and np.all(g[inb] == g[0, 0])
                    assert np.array_equal(ch[inb], (np.arange(nd)[None, :] * P + np.arange(P)[:, None])[inb])
                    for jj in range(blocks):           # slot j: block g*blocks + j (None: padding)
                        b = int(g[0, 0]) * blocks + jj
                        if real_rows[b * rows:(b + 1) * rows].any():
                            group[jj] = b
                            acc[jj] = np.zeros((rows, Kmax), np.int64)
                            q_slots.append(jj)
                if real_t:
                    assert arr.item_block[t] == group[0]
            g_cur = None if group[0] is None else group[0] // blocks
            # q_init ids (row_init only, not kop): (h*ngroups + g)*rows + p for every row, with
            # the group start
            if row_init and not kop:
                col = mi[:, t, col0["ini"]]
                inb = col < Hkv * ngroups * rows
                if q_slots:
                    assert np.array_equal(inb, np.arange(P) < rows)
                    assert np.array_equal(col[:rows], (head * ngroups + g_cur) * rows + np.arange(rows))
                else:
                    assert not inb.any(), "row init values loaded without the group's Q"
            # state ids: g*rows + p (rows real in some block of the group), else >=
            # ngroups*rows; output ids (partial phase): (h*ngroups + g)*rows + p, else >=
            # Hkv*ngroups*rows. One id per row moves every block of the group.
            st_slots, out_slots = [], []
            kinds = (("st", col0["st"], ngroups * rows),) + ((("out", col0["out"], Hkv * ngroups * rows),)
                                                             if masked else ())
            for kind, c0, lim in kinds:
                col = mi[:, t, c0]
                inb = col < lim
                if not inb.any():
                    continue
                assert g_cur is not None, f"{kind} ids for an empty group"
                base = (head * ngroups + g_cur) * rows if kind == "out" else g_cur * rows
                pr = np.arange(P)
                g_real = real_rows[g_cur * blocks * rows:(g_cur + 1) * blocks * rows]
                want = (pr < rows) & np.concatenate([g_real.reshape(blocks, rows).any(axis=0),
                                                     np.zeros(P - rows, bool)])
                assert np.array_equal(inb, want), (kind, phase, t)
                assert np.array_equal(col[inb], base + pr[inb])
                slots = [jj for jj in range(blocks) if group[jj] is not None]
                (st_slots if kind == "st" else out_slots).extend(slots)
            if masked:                                 # partial: state load right after the reset
                for jj in st_slots:
                    assert reset and group[jj] in saved, "state loaded that was never stored"
                    acc[jj] = saved.pop(group[jj])
            # KV rows of the tile: (seq, position) of every tile-local key index.
            key_seq = np.full(W, -1)
            key_pos = np.full(W, -1)
            n_main = n_ov = 0
            for l in range(nL):
                ids = mi[:, t, col0["kv"] + l]
                inb = ids < N * Hkv * Tf
                assert np.all(inb | (ids >= 2 * N * Hkv * Tf)), "id inside the flat cache, off the K axis"
                ov_inb = np.zeros(P, bool)
                if masked:
                    ov = mi[:, t, col0["ov"] + l]
                    ov_inb = ov < Hkv * R_ov
                    assert np.all(ov_inb | (ov >= 2 * Hkv * R_ov))
                    assert not np.any(inb & ov_inb), "a partition gathered twice"
                rid = ids[inb]                         # ((blk * Hkv + h) * Tf + t)
                blk, hh, sub = rid // (Hkv * Tf), (rid // Tf) % Hkv, rid % Tf
                assert np.all(hh == head) and np.all(owner_seq[blk] >= 0), "unreferenced block"
                i, j = owner_seq[blk], owner_jb[blk] * Tf + sub
                assert np.all(j < m_main[i]), "a main row that is not a whole row of cached context"
                key_seq[tl_of[l, inb]] = i[:, None]
                key_pos[tl_of[l, inb]] = j[:, None] * bp + np.arange(bp)[None, :]
                n_main += int(inb.sum())
                if masked:                             # overlay row h * R_ov + r
                    rid = mi[ov_inb, t, col0["ov"] + l]
                    assert np.all(rid // R_ov == head)
                    i, j = ov_seq[rid % R_ov], ov_row[rid % R_ov]
                    key_seq[tl_of[l, ov_inb]] = i[:, None]
                    key_pos[tl_of[l, ov_inb]] = j[:, None] * bp + np.arange(bp)[None, :]
                    n_ov += int(ov_inb.sum())
            if masked and arr.nested_rows:
                # the kernel zeroes the partial phase's tiles once per head and part: a key slot
                # a real item does not write must still hold nothing (-1), never an earlier
                # item's key (another sequence's NaN would reach this item's P V)
                if t % (arr.items // arr.parts) == 0:
                    held = np.full(W, -1)
                wrote = key_seq >= 0
                assert not (real_t and ((held >= 0) & ~wrote).any()), \
                    "nested_rows: a slot the item does not write holds an earlier item's key"
                held[wrote] = key_seq[wrote]
            seqs = set(key_seq[key_seq >= 0].tolist())
            assert len(seqs) <= 1, "an item gathers rows of two sequences"
            iseq = seqs.pop() if seqs else -1
            tiles = np.unique(key_pos[key_pos >= 0] // W)
            assert tiles.size <= 1
            tile = int(tiles[0]) if tiles.size else -1
            if iseq >= 0:            # the rows sit at their own tile-local index (§16.3)
                gathered = key_pos >= 0
                assert np.array_equal(key_pos[gathered] - tile * W, np.arange(W)[gathered])
            if not masked and real_t:
                assert n_main == nL * P, "a FULL item with a row that is not gathered"
            if alibi and real_t:           # first key position of the tile
                assert np.all(mf[:, t, kf - 1] == tile * W)
            # fold: every slot with a block, visible keys of its real rows.
            pairs = 0
            for jj in range(blocks):
                b = group[jj]
                if b is None:
                    continue
                tl = np.arange(W)[None, :]
                if masked and kop:                     # row q's c, r: bounds row t, q / rows + q
                    cc, rr = bnd[t, :rows][:, None], bnd[t, rows:][:, None]
                    vis = np.abs(tl - cc) < rr
                elif masked:                           # slot j's c, r on partition p = row p
                    cc = mf[:rows, t, 1 + 2 * jj][:, None]
                    rr = mf[:rows, t, 2 + 2 * jj][:, None]
                    vis = np.abs(tl - cc) < rr
                else:
                    vis = np.ones((rows, W), bool)
                vis &= real_rows[b * rows:(b + 1) * rows][:, None]
                if not vis.any():
                    continue
                assert np.all(key_seq[np.nonzero(vis)[1]] >= 0), "a visible key no DMA wrote"
                assert iseq == seq_of_row[b * rows], "keys of another sequence are visible"
                assert np.all(key_pos[np.nonzero(vis)[1]] < K[iseq]), "zero padding is visible"
                r_idx, w_idx = np.nonzero(vis)
                np.add.at(acc[jj], (r_idx, key_pos[w_idx]), 1)
                pairs += r_idx.size
            if not masked:                             # full: state store after the fold
                for jj in st_slots:
                    assert group[jj] not in saved
                    saved[group[jj]] = acc[jj].copy()
            for jj in out_slots:
                b = group[jj]
                real = real_rows[b * rows:(b + 1) * rows]
                counts[b][real] += acc[jj][real]
                writes[b][real] += 1
            items.append(Item(phase, real_t, bool(reset), iseq, tile,
                              tuple(group), tuple(q_slots), tuple(st_slots), tuple(out_slots),
                              n_main, n_ov, pairs))
    assert not saved, "state stored by the full phase and never loaded"
    return items, counts, writes, (seq_of_row, pos_of_row)


def check_coverage(sched, *, q, c, bt, N, H, Hkv, d, B, LT, window=None, alibi=False,
                   row_init=False, LTp=None, seqs=None):
    """Every head of every class: each visible (real query row, key) pair folded exactly once
    into the stored output, nothing else; every real item folds something (exact pruning).
    ``seqs``: the sequences the schedule covers (None: all): their query rows are in exactly
    one class, the others' in none."""
    G = H // Hkv
    covered = np.zeros(int(q.sum()) * G, np.int64)
    all_items = []
    for cls in sched.classes:
        decode = cls.kind == "decode"
        assert all((q[i] * G <= DECODE_MAX_ROWS) == decode for i in cls.seqs)
        tok, hd = expected_rows(q, G, cls.seqs, cls.rows, cls.blocks)
        assert np.array_equal(cls.row_token, tok) and np.array_equal(cls.row_head, hd)
        qoff = np.concatenate(([0], np.cumsum(q)))
        seq = np.searchsorted(qoff, tok, side="right") - 1
        pos = np.where(tok >= 0, c[np.maximum(seq, 0)] + tok - qoff[np.maximum(seq, 0)], -1)
        assert np.array_equal(cls.row_pos, pos)                      # absolute query position
        for head in range(Hkv):
            items, counts, writes, (seq_of_row, pos_of_row) = run_symbolically(
                cls, q=q, c=c, bt=bt, N=N, H=H, Hkv=Hkv, d=d, B=B, LT=LT, head=head, window=window,
                alibi=alibi, row_init=row_init, LTp=LTp, seqs=seqs)
            flat = counts.reshape(-1, counts.shape[-1])
            real = cls.row_token >= 0
            assert np.array_equal(writes.reshape(-1), real.astype(np.int64)), "output rows stored != once"
            for r in np.nonzero(real)[0]:
                i = seq_of_row[r]
                lo, hi = visible(int(pos_of_row[r]), window)
                want = np.zeros(flat.shape[1], np.int64)
                want[lo:hi] = 1
                assert np.array_equal(flat[r], want), (cls.kind, head, r, i)
            assert all(it.pairs > 0 for it in items if it.real), "an item nobody sees"
            if head == 0:
                all_items.append(items)
                covered[cls.row_token[real] * G + cls.row_head[real]] += 1
    want = np.ones_like(covered)
    if seqs is not None:
        mine = np.isin(np.repeat(np.arange(len(q)), q), seqs)        # per token
        want = np.repeat(mine, G).astype(np.int64)
    assert np.array_equal(covered, want), "a query row in no class or in two"
    return all_items


def schedule(q, c, *, H, Hkv, d, B, LT, window=None, seed=0, pad=-1, alibi=False,
             row_init=False, LTp=None, cap=None, parts=1):
    """The schedule and the keywords of ``check_coverage``; ``LTp``: ``partial_tile_size``
    (an int, "auto" -- the size the schedule picked is then checked -- or None); ``cap``:
    ``group_blocks_cap``; ``parts``: ``item_parts`` (the parts run one after the other here,
    as one core would: their groups and state rows are disjoint)."""
    q, c = np.asarray(q, np.int64), np.asarray(c, np.int64)
    bt, N = block_tables_for(c, B, seed, pad=pad)
    s = make_schedule(q, c, bt, num_heads=H, num_kv_heads=Hkv, head_size=d, block_size=B,
                      num_blocks=N, large_tile_size=LT, sliding_window=window, alibi=alibi,
                      row_init=row_init, partial_tile_size=LTp, group_blocks_cap=cap,
                      item_parts=parts)
    want = LT if LTp is None else LTp
    if LTp == "auto":
        want = s.partial_tile_size
        assert want in [512 << k for k in range(5)] and want <= LT
    assert s.partial_tile_size == want
    assert (s.partial_tiling_factor, s.partial_tiled_block_size, s.partial_loads) == \
        geometry(B, want)[:2] + (geometry(B, want)[3],)
    return s, dict(q=q, c=c, bt=bt, N=N, H=H, Hkv=Hkv, d=d, B=B, LT=LT, window=window,
                   alibi=alibi, row_init=row_init, LTp=want)


def summary(items):
    """(phase, seq, tile, reset, Q slots, state slots, output slots) of the real items."""
    return [(it.phase[0], it.seq, it.tile, int(it.reset), it.q, it.st, it.out)
            for it in items if it.real]
