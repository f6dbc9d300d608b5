"""MLA (multi-head latent attention) paged attention over a latent cache, on the scheduled items.

One source for both NKI APIs (the op layer, :mod:`nki_kernels.ops`): ``mla_paged_attention.for_api(
api)`` is the jitted kernel of ``api`` ("legacy" | "nki"); ``mla_paged_attention[1, 1]`` is the
legacy launch (grid ``[1, 1]``), the current API launches it once (no grid). MLA has ONE latent
"KV head" shared by every query head. The host (``host/mla/mla_attention.py``; layouts in
docs/layouts.md §12 and §17) builds the same block-sparse schedule as the scheduled kernel
(``host.scheduled.schedule.make_schedule`` with one KV head and the H query heads as G = H query rows per
token) and this kernel runs its items: (Q group, KV tile) pairs of one sequence, a full phase
then a masked (partial) phase, padding moving no bytes (out-of-bounds row ids,
``oob_mode.skip``). Decode blocks (<= 64 query rows, e.g. H = 16 heads x 1..4 tokens) fold with
keys on partitions (``nki_kernels.scheduled.sched_decode``), larger ones with query rows on partitions
(``nki_kernels.scheduled.sched_core``), both through ``nki_kernels.scheduled.sched_item``.

What differs from ``nki_kernels.scheduled.scheduled_attention``: a key row is a cache *entry*
``[kv_c (R) | k_pe (P) | padding (E - R - P)]`` and the value is its first R elements, so K and V
come from the SAME gathered rows -- one indirect DMA per 128 rows of b' entries (``b' * E``
elements each, the flat view ``(N*T, b'*E)`` of the ``(N, B, E)`` cache), not one for K and one
for V. K^T is built per <= 128-channel slice of the ``R + P`` key channels by PE transposes
(576 = 4 x 128 + 64); PV reads the value chunks ``[0, R)`` of the same rows at a stride of E
(``flash_step(v_stride=E)``), with R <= 512 (one PSUM bank). Entry padding is gathered with its
row but never read by an engine.

Dimensions (static): R = kv_lora_rank, P = qk_rope_head_dim, D = R + P key channels
(nd = ceil(D / 128) slices), E >= D entry size, N blocks of B entries; rows query rows per Q
block (<= 128; a row is (token, head)), blocks Q blocks per group (<= MLA_MAX_GROUP_BLOCKS),
nblk Q blocks of the launch; T, b', nL from ``LARGE_TILE_SZ`` and B
(``nki_kernels.contract.tile_geometry``); W = nL * 128 * b' keys per item. The launch's static
configuration (options, per-phase geometry, inputs, tiles) is the frozen dataclasses of
``nki_kernels.mla.mla_config``.
"""

from __future__ import annotations

from dataclasses import replace

from nki_kernels.contract import M_FLOOR, PARTITIONS as P
from nki_kernels.mla.mla_config import (KERNEL, MAX_VALUE_DIM, MLA_MAX_GROUP_BLOCKS,  # noqa: F401
                                    MLAChunk, MLAConfig, MLAInputs, MLAOptions, MLAPhase,
                                    MLATiles, configure)
from nki_kernels.ops import KernelFamily, dtype_name
from nki_kernels.row_tiles import require_oob_skip
from nki_kernels.scheduled.sched_core import KVTile, key_index_tile
from nki_kernels.scheduled.sched_decode import decode_constants, key_index_columns
from nki_kernels.scheduled.sched_item import chunk_queries, fold_tile, load_q_slices, load_state, store_blocks
from nki_kernels.tile_ops import transpose_blocks


def _build(ops):
    def mla_paged_attention(query_t, kv_cache, overlay, meta_pi, meta_pf, meta_fi, meta_ff, rows,
                            blocks, options=MLAOptions(), q_full=None, q_part=None,
                            bounds_p=None):
        """MLA paged attention of one class of Q blocks (legacy grid ``[1, 1]``, with
        ``options.item_parts = 2`` ``[nl.nc(2), 1]``; current: one launch).

        Args:
            query_t: (ngroups * D, blocks * rows) float32/bfloat16/float16, group-major: row
                ``g*D + ch``, columns ``[j*rows, (j+1)*rows)`` hold channel ch of the ``rows``
                query rows of Q block ``g*blocks + j`` (Q^T blocks, D = R + P; query row =
                (token, head) of one sequence, ``host.scheduled.scheduled.pack_queries`` with one
                KV head), one gather per channel slice when a group starts (query-rows classes).
            kv_cache: (N, B, E) latent cache, E >= R + P, query_t's dtype (read only).
            overlay: (R_ov, b'_p * E): key rows (rows of the partial phase's geometry) that are
                not whole rows of the cache below ``context - query`` (a sequence's partly filled
                rows, its new tokens included), copied by the host from the cache, zero past the
                sequence end; cache dtype.
            meta_pi, meta_pf, meta_fi, meta_ff: the partial / full phase metadata of
                ``host.scheduled.schedule.PhaseArrays`` with Hkv = 1: (1, 128, I * ki) int32 and (128, I * kf)
                float32 (I items, may be 0; main rows index the flat view (N*T, b'*E); columns
                ``contract.meta_layout``).
            rows, blocks: query rows per Q block (1..128), Q blocks per group (static ints).
            options: :class:`MLAOptions` (R, P, softmax scale, precision, tile sizes).
            q_full, q_part: decode-layout classes (``contract.decode_layout``: one block of <= 64
                rows) only, else None (not read): the Q^T of every item of the full / partial
                phase, (D, items * rows) in query_t's dtype, column ``t*rows + r`` = row r of item
                t's block (``host.scheduled.scheduled.item_queries``), preloaded per metadata chunk.
            bounds_p: decode-layout classes only, else None (not read): (1, Ip * 2 * rows)
                float32, the partial items' mask bounds on one partition
                (``host.scheduled.schedule.PhaseArrays.bounds``), loaded per chunk and broadcast in-kernel.

        Returns:
            (ngroups * rows, blocks * R) in query_t.dtype, group-major: row ``g*rows + r``,
            columns ``[j*R, (j+1)*R)`` = output of query row r of Q block ``g*blocks + j`` (rows
            no block of a group holds are left unwritten; the host never reads padding rows).

        Raises:
            ValueError: a bad input (named), including a decode-layout input left None.
            NotImplementedError: a cache dtype other than the query's, or a working set over the
                target's SBUF.
        """
        ins = MLAInputs(query_t=query_t, overlay=overlay, q_items=(q_full, q_part),
                        bounds_p=bounds_p, meta_i=(meta_fi, meta_pi), meta_f=(meta_ff, meta_pf),
                        out=None, state=None)
        cfg = configure(ops, ins, kv_cache, rows, blocks, options)
        ngroups = query_t.shape[0] // cfg.D
        out = ops.ndarray((ngroups * rows, blocks * cfg.R), dtype=query_t.dtype,
                          buffer=ops.SHARED_HBM)
        state = ops.ndarray((ops.launch_core()[1], ngroups * rows, blocks * (cfg.R + 2)),
                            dtype=ops.float32, buffer=ops.PRIVATE_HBM)     # a slab per core
        _body(ops, cfg, replace(ins, out=out, state=state))
        return out

    return mla_paged_attention


mla_paged_attention = KernelFamily(_build, KERNEL)


def _body(ops, cfg: MLAConfig, ins: MLAInputs):
    """The item loops (full phase first, masked phase last).

    Pseudocode, per phase, per item t (metadata chunks preloaded):
        if reset[t]: st = (o=0, -m=-M_FLOOR, l=0) for every row      (a select: NaN-safe)
        Q^T slices <- decode layout: the item's columns of the chunk's preloaded q_full / q_part;
                      else query_t rows q[t] (skipped unless the group starts here); scaled
        [masked] st <- state rows st[t]  (skipped unless the group starts here, after full items)
        X <- cache rows kv[t] (+ overlay rows ov[t], masked)   one DMA per load (X zeroed once)
        K^T slices <- PE transposes of X[:, entry*E + 128k : +dk]
        fold: decode blocks (<= 64 rows) decode_step (keys on partitions), else per block
              flash_step; K^T and V = X[:, entry*E : +R] (v_stride = E)
        [full] state rows st[t] <- st    (skipped unless this is the group's last full item)
        [masked] out rows out[t] <- o / max(l, L_FLOOR)   (skipped unless the group ends here)
    """
    require_oob_skip(ops, KERNEL)
    part = ops.item_part(1, cfg.parts)         # the one latent head; 0 without item parts
    tiles = _tiles(ops, cfg, ins.query_t.dtype)
    for phase in (cfg.full, cfg.partial):
        if phase.items:
            _run_phase(ops, cfg, ins, phase, tiles, part)


def _tiles(ops, cfg, q_dtype) -> MLATiles:
    """The group state, its reset copy, the raw Q^T slices, the key indices, the decode
    constants and the KV rows of an item."""
    rows, blocks, R = cfg.rows, cfg.blocks, cfg.R
    sw = R + 2
    f32 = ops.float32
    st = ops.sbuf((rows, blocks * sw), f32)
    init = ops.sbuf((rows, blocks * sw), f32)
    for j in ops.parallel_range(blocks):
        ops.memset(init[:, ops.ds(j * sw, R)], 0.0)
        ops.memset(init[:, ops.ds(j * sw + R, 1)], -M_FLOOR)
        ops.memset(init[:, ops.ds(j * sw + R + 1, 1)], 0.0)
    ops.copy(st, init)
    q_raw = []
    for k in ops.static_range(cfg.nd):
        dk = min(P, cfg.D - k * P)
        qr = ops.sbuf((dk, blocks * rows), q_dtype)
        ops.memset(qr, 0.0)
        q_raw.append(qr)
    pg = cfg.partial
    kidx = None
    if pg.items > 0:        # masked items: the tile-local key index of every column
        kidx = (key_index_columns(ops, pg.geo.nL, pg.geo.bp) if cfg.decode
                else key_index_tile(ops, rows, pg.geo.nL, pg.geo.bp))
    consts = (decode_constants(ops, rows, max(cfg.full.step_keys, pg.step_keys), cfg.kd)
              if cfg.decode else None)
    # The KV rows of an item, zeroed ONCE: a row no DMA of an item writes keeps what an earlier
    # item gathered -- whole rows of cached context or overlay rows, always finite (block tails,
    # unreferenced blocks and beyond-the-end positions are never gathered; entry padding is
    # gathered but no engine reads it) -- and is masked, so its probability is exactly 0.
    # (both phases use the same tile, the partial phase its first nL_p * b'_p * E columns)
    width = max(g.geo.nL * g.rw for g in (cfg.full, pg))
    x_rows = ops.zeros((P, width), cfg.cache_dtype)
    return MLATiles(st=st, init=init, q_raw=tuple(q_raw), x_rows=x_rows, kidx=(None, kidx),
                    consts=consts)


def _run_phase(ops, cfg, ins, phase, tiles, part):
    """The phase's item loop, one metadata chunk at a time: every item, or with ``cfg.parts`` > 1
    the ``part``-th of that many equal runs of items."""
    masked, rows, f32 = phase.masked, cfg.rows, ops.float32
    ki, kf = phase.meta.ki, phase.meta.kf
    mi_all, mf_all = ins.meta_i[int(masked)], ins.meta_f[int(masked)]
    q_all = ins.q_items[int(masked)]
    per_part = phase.items // cfg.parts
    chunk = mla_chunk(per_part, cfg.chunk_cap)
    for c in ops.sequential_range(per_part // chunk):
        ch = part * (per_part // chunk) + c
        mi = ops.sbuf((P, chunk * ki), ops.int32)
        ops.load(mi, mi_all[0, :, ops.ds(ch * chunk * ki, chunk * ki)])
        mf = ops.sbuf((P, chunk * kf), f32)
        ops.load(mf, mf_all[:, ops.ds(ch * chunk * kf, chunk * kf)])
        q = bounds = None
        if cfg.decode and masked:      # decode layout: the chunk's bounds, one partition
            bounds = ops.sbuf((1, chunk * 2 * rows), f32)
            ops.load(bounds, ins.bounds_p[0:1, ops.ds(ch * chunk * 2 * rows, chunk * 2 * rows)])
        if cfg.decode:       # decode layout: the chunk's Q^T, scaled once
            q = chunk_queries(ops, q_all, 0, cfg.D, ch * chunk * rows, chunk * rows,
                              scale=cfg.scale, kernel_dtype=cfg.kd)
        data = MLAChunk(mi=mi, mf=mf, q=q, bounds=bounds)
        for it in ops.sequential_range(chunk):
            _item(ops, cfg, ins, phase, data, it, tiles)


def _item(ops, cfg, ins, phase, data, it, tiles):
    """Item ``it`` of the chunk: reset / carry the group state, load Q and the KV rows, fold the
    tile, store."""
    m, masked = phase.meta, phase.masked
    ci, cf = it * m.ki, it * m.kf
    rows, blocks, R, D, E, nd, kd = cfg.rows, cfg.blocks, cfg.R, cfg.D, cfg.E, cfg.nd, cfg.kd
    bp, nL, rw, kv_flat = phase.geo.bp, phase.geo.nL, phase.rw, phase.kv_flat
    st, mi, mf = tiles.st, data.mi, data.mf
    # Step 1: a new group starts -> every row's state is reset.
    ops.where(st, mf[0:rows, ops.ds(cf + m.reset, 1)], tiles.init, st)
    # Step 2: Q^T slices of every block, scaled into the kernel dtype: the item's columns of the
    # chunk's preloaded Q^T (decode layout), or gathered when a group starts (skipped rows keep
    # the group's Q).
    if cfg.decode:
        q_scaled = [q[:, ops.ds(it * rows, rows)] for q in data.q]
    else:
        q_scaled = load_q_slices(ops, tiles.q_raw, ins.query_t, mi, ci + m.q, scale=cfg.scale,
                                 kernel_dtype=kd)
    if masked:          # Step 3: the group's state left by the full phase
        load_state(ops, st, mi, ci + m.st, ins.state, ops.launch_core()[0])
    # Step 4: ONE gather per 128 rows of b' entries; keys and values are the same rows.
    x = tiles.x_rows
    for l in ops.static_range(nL):
        ops.gather(x[:, ops.ds(l * rw, rw)], kv_flat, mi, ci + m.kv + l)
        if masked:
            ops.gather(x[:, ops.ds(l * rw, rw)], ins.overlay, mi, ci + m.ov + l)
    if dtype_name(kv_flat.dtype) != dtype_name(kd):
        xc = ops.sbuf(x.shape, kd)
        ops.copy(xc, x, engine="scalar")
        x = xc
    # K^T slice k, column l*128*b' + s*128 + p = channels [128k, 128k + dk) of entry s of row
    # (l, p): the transposes of one slice read b' entries at a stride of E.
    k_t = []
    for k in ops.static_range(nd):
        dk = min(P, D - k * P)
        kt = ops.sbuf((dk, phase.geo.W), kd)
        for l in ops.static_range(nL):
            transpose_blocks(ops, kt, l * P * bp, x, l * rw + k * P, dk, bp, evac="scalar",
                             src_stride=E)
        k_t.append(kt)
    # Step 5: fold the tile into every block's state; V = x read in place at the stride E.
    tile = KVTile(k_t=k_t, v_rows=x, kidx=tiles.kidx[int(masked)])
    fold_tile(ops, cfg.fold_config(phase), q_scaled, tile, st, mf, cf, consts=tiles.consts,
              chunk_bounds=data.bounds, it=it)
    # Step 6: stores (row ids out of bounds -> skipped): full phase the state, masked the output.
    store_blocks(ops, st, mi, ci + (m.out if masked else m.st), ins.out, ins.state, rows=rows,
                 blocks=blocks, d=R, masked=masked, engine="vector",   # ScalarE: the busier
                 core=ops.launch_core()[0])


def mla_chunk(n_items, cap):
    """Items per metadata chunk: the largest power of two dividing ``n_items`` (a bucketed
    count), at most ``cap`` (a power of two)."""
    return min(n_items & -n_items, cap)
