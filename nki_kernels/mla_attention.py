"""MLA (multi-head latent attention) paged attention over a latent cache, on the scheduled items.

One source for both NKI APIs (the op layer, :mod:`nki_kernels.ops`): ``mla_paged_attention.for_api(
api)`` is the jitted kernel of ``api`` ("legacy" | "nki"); ``mla_paged_attention[1, 1]`` is the
legacy launch (grid ``[1, 1]``), the current API launches it once (no grid). MLA has ONE latent
"KV head" shared by every query head. The host (``host/mla_attention.py``; layouts in
docs/layouts.md §12 and §17) builds the same block-sparse schedule as the scheduled kernel
(``host.schedule.make_schedule`` with one KV head and the H query heads as G = H query rows per
token) and this kernel runs its items: (Q group, KV tile) pairs of one sequence, a full phase
then a masked (partial) phase, padding moving no bytes (out-of-bounds row ids,
``oob_mode.skip``). Decode blocks (<= 64 query rows, e.g. H = 16 heads x 1..4 tokens) fold with
keys on partitions (``nki_kernels.sched_decode``), larger ones with query rows on partitions
(``nki_kernels.sched_core``), both through ``nki_kernels.sched_item``.

What differs from ``nki_kernels.scheduled_attention``: a key row is a cache *entry*
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
(``nki_kernels.constants.tile_geometry``); W = nL * 128 * b' keys per item.
"""

from __future__ import annotations

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.constants import B_F_SIZE, B_P_SIZE, M_FLOOR, STEP_KEYS, decode_layout
from nki_kernels.mla_sbuf import MAX_CHUNK_ITEMS, SBUF_USABLE, decode_chunk_cap, mla_sbuf_bytes
from nki_kernels.ops import KernelFamily, dtype_name, itemsize
from nki_kernels.row_tiles import require_oob_skip
from nki_kernels.sched_checks import check_phase_metadata, softmax_scale_value, tile_geometries
from nki_kernels.sched_core import KVTile, StepConfig, key_index_tile
from nki_kernels.sched_decode import decode_constants, key_index_columns
from nki_kernels.sched_item import (FoldConfig, chunk_queries, decode_step_keys, fold_tile,
                                    load_q_slices, load_state, store_blocks)
from nki_kernels.sched_plan import meta_columns
from nki_kernels.tile_ops import transpose_blocks

KERNEL = "mla_paged_attention"
# Q blocks sharing one KV-tile load, at most (fewer when nki_kernels.mla_sbuf says they do not
# fit): per 128-row block the group keeps o (R fp32), m, l and D channels of Q^T (raw + scaled)
# in SBUF, ~6.6 KiB per partition at R = 512, D = 576 with bf16 Q.
MLA_MAX_GROUP_BLOCKS = 8
MAX_VALUE_DIM = B_F_SIZE     # R: PV accumulates (rows, R) fp32 in one PSUM bank
_FLOAT = ("float32", "bfloat16", "float16")


def _build(ops):
    def mla_paged_attention(query_t, q_full, q_part, bounds_p, kv_cache, overlay, meta_pi, meta_pf,
                            meta_fi, meta_ff, rows, blocks, kv_lora_rank=512, qk_rope_head_dim=64,
                            softmax_scale=None, mixed_precision=True, LARGE_TILE_SZ=2048,
                            PARTIAL_TILE_SZ=None):
        """MLA paged attention of one class of Q blocks (legacy grid ``[1, 1]``; current: one launch).

        Args:
            query_t: (nblk * D, rows) float32/bfloat16/float16: row ``b*D + ch`` holds channel ch of
                the ``rows`` query rows of Q block b (Q^T blocks, D = R + P; query row = (token,
                head) of one sequence, ``host.scheduled.pack_queries`` with one KV head), gathered
                when a group starts (query-rows classes).
            q_full, q_part: decode-layout classes (``constants.decode_layout``: one block of <= 64
                rows): the Q^T of every item of the full / partial phase, (D, items * rows) in
                query_t's dtype, column ``t*rows + r`` = row r of item t's block
                (``host.scheduled.item_queries``), preloaded per metadata chunk. Otherwise any (1, 1)
                array (unused).
            bounds_p: decode-layout classes: (1, Ip * 2 * rows) float32, the partial items' mask
                bounds on one partition (``host.schedule.PhaseArrays.bounds``), loaded per chunk and
                broadcast in-kernel. Otherwise any (1, 1) float32 array (unused).
            kv_cache: (N, B, E) latent cache, E >= R + P, query_t's dtype (read only).
            overlay: (R_ov, b'_p * E): key rows (rows of the partial phase's geometry) that are
                not whole rows of the cache below ``context - query`` (a sequence's partly filled
                rows, its new tokens included), copied by the host from the cache, zero past the
                sequence end; cache dtype.
            meta_pi, meta_pf, meta_fi, meta_ff: the partial / full phase metadata of
                ``host.schedule.PhaseArrays`` with Hkv = 1: (1, 128, I * ki) int32 and (128, I * kf)
                float32 (I items, may be 0; main rows index the flat view (N*T, b'*E)).
            rows, blocks: query rows per Q block (1..128), Q blocks per group (static ints).
            kv_lora_rank: R (1..512), the value width.  qk_rope_head_dim: P >= 0.
            softmax_scale: default 1 / sqrt(R + P).
            mixed_precision: True: bf16 matmul inputs and probabilities; False: the input dtype.
                Scores, statistics and the output accumulator are fp32 either way.
            LARGE_TILE_SZ: keys per full-phase KV tile before block-size tiling (power of two,
                512..8192).
            PARTIAL_TILE_SZ: the same for the partial phase (power of two, 512..LARGE_TILE_SZ;
                None: LARGE_TILE_SZ); its rows (b'_p entries) and overlay rows are of this geometry.

        Returns:
            (nblk * rows, R) in query_t.dtype: row ``b*rows + r`` = output of query row r of Q block
            b (rows no item stores are left unwritten; the host never reads them).
        """
        R = kv_lora_rank
        D = R + qk_rope_head_dim
        kernel_check(isinstance(R, int) and isinstance(qk_rope_head_dim, int) and 1 <= R <= MAX_VALUE_DIM
                     and qk_rope_head_dim >= 0, KERNEL, "kv_lora_rank, qk_rope_head_dim",
                     f"be ints with 1 <= kv_lora_rank <= {MAX_VALUE_DIM}, qk_rope_head_dim >= 0",
                     (kv_lora_rank, qk_rope_head_dim))
        kernel_check(len(query_t.shape) == 2 and query_t.shape[0] % D == 0 and query_t.shape[0] > 0,
                     KERNEL, "query_t.shape", f"be (nblk*D, rows) with D = R + P = {D}",
                     tuple(query_t.shape))
        cfg = _check(ops, query_t, q_full, q_part, bounds_p, kv_cache, overlay, meta_pi, meta_pf, meta_fi,
                     meta_ff, rows, blocks, R, D, softmax_scale, mixed_precision, LARGE_TILE_SZ,
                     PARTIAL_TILE_SZ)
        nblk = query_t.shape[0] // D
        out = ops.ndarray((nblk * rows, R), dtype=query_t.dtype, buffer=ops.SHARED_HBM)
        state = ops.ndarray((nblk * rows, R + 2), dtype=ops.float32, buffer=ops.PRIVATE_HBM)
        for geo in cfg["geo"].values():      # each phase's flat view: rows of b' entries
            geo["kv_flat"] = kv_cache.reshape((geo["main_rows"], geo["bp"] * cfg["E"]))
        _body(ops, cfg, query_t, overlay,
              ((False, meta_fi, meta_ff, q_full), (True, meta_pi, meta_pf, q_part)), bounds_p, out,
              state)
        return out

    return mla_paged_attention


mla_paged_attention = KernelFamily(_build, KERNEL)


def _body(ops, cfg, query_t, overlay, phases, bounds_p, out, state):
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
    rows, blocks, R = cfg["rows"], cfg["blocks"], cfg["R"]
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
    for k in ops.static_range(cfg["nd"]):
        dk = min(B_P_SIZE, cfg["D"] - k * B_P_SIZE)
        qr = ops.sbuf((dk, blocks * rows), query_t.dtype)
        ops.memset(qr, 0.0)
        q_raw.append(qr)
    pg = cfg["geo"][True]
    pg["kidx"] = None
    if cfg["items"][0] > 0:        # masked items: the tile-local key index of every column
        pg["kidx"] = (key_index_columns(ops, pg["loads"], pg["bp"]) if cfg["small"]
                      else key_index_tile(ops, rows, pg["loads"], pg["bp"]))
    cfg["geo"][False]["kidx"] = None
    consts = (decode_constants(ops, rows, max(g["step"] for g in cfg["geo"].values()), cfg["kd"])
              if cfg["small"] else None)
    # The KV rows of an item, zeroed ONCE: a row no DMA of an item writes keeps what an earlier
    # item gathered -- whole rows of cached context or overlay rows, always finite (block tails,
    # unreferenced blocks and beyond-the-end positions are never gathered; entry padding is
    # gathered but no engine reads it) -- and is masked, so its probability is exactly 0.
    # (both phases use the same tile, the partial phase its first nL_p * b'_p * E columns)
    width = max(g["loads"] * g["rw"] for g in cfg["geo"].values())
    x_rows = ops.zeros((B_P_SIZE, width), cfg["cache_dtype"])
    bufs = dict(st=st, init=init, q_raw=q_raw, x_rows=x_rows, consts=consts)
    for masked, mi_all, mf_all, q_all in phases:
        n_items = cfg["items"][0 if masked else 1]
        if n_items == 0:
            continue
        ki, kf = meta_columns(loads=cfg["geo"][masked]["loads"], blocks=blocks,
                              head_size=cfg["D"], masked=masked, rows=rows)
        chunk = mla_chunk(n_items, cfg["chunk_cap"])
        for ch in ops.sequential_range(n_items // chunk):
            mi = ops.sbuf((B_P_SIZE, chunk * ki), ops.int32)
            ops.load(mi, mi_all[0, :, ops.ds(ch * chunk * ki, chunk * ki)])
            mf = ops.sbuf((B_P_SIZE, chunk * kf), f32)
            ops.load(mf, mf_all[:, ops.ds(ch * chunk * kf, chunk * kf)])
            if cfg["small"] and masked:      # decode layout: the chunk's bounds, one partition
                b_chunk = ops.sbuf((1, chunk * 2 * rows), f32)
                ops.load(b_chunk, bounds_p[0:1, ops.ds(ch * chunk * 2 * rows, chunk * 2 * rows)])
                bufs["b_chunk"] = b_chunk
            if cfg["small"]:       # decode layout: the chunk's Q^T, scaled once
                bufs["q_chunk"] = chunk_queries(ops, q_all, 0, cfg["D"], ch * chunk * rows,
                                                chunk * rows, scale=cfg["scale"],
                                                kernel_dtype=cfg["kd"])
            for it in ops.sequential_range(chunk):
                _item(ops, cfg, masked, (mi, mf, it, ki, kf), query_t, overlay, out, state, bufs)


def _item(ops, cfg, masked, meta, query_t, overlay, out, state, bufs):
    """Item ``it`` of the chunk (``meta = (mi, mf, it, ki, kf)``): reset / carry the group state,
    load Q and the KV rows, fold the tile, store."""
    mi, mf, it, ki, kf = meta
    ci, cf = it * ki, it * kf
    P = B_P_SIZE
    rows, blocks, R, D, E = cfg["rows"], cfg["blocks"], cfg["R"], cfg["D"], cfg["E"]
    geo = cfg["geo"][masked]
    nd, bp, nL, rw, kd = cfg["nd"], geo["bp"], geo["loads"], geo["rw"], cfg["kd"]
    kv_flat = geo["kv_flat"]
    st, q_raw = bufs["st"], bufs["q_raw"]
    q_col = ci + (2 * nL if masked else nL)
    st_col = q_col + (0 if cfg["small"] else blocks * nd)
    out_col = st_col + blocks
    # Step 1: a new group starts -> every row's state is reset.
    ops.where(st, mf[0:rows, ops.ds(cf, 1)], bufs["init"], st)
    # Step 2: Q^T slices of every block, scaled into the kernel dtype: the item's columns of the
    # chunk's preloaded Q^T (decode layout), or gathered when a group starts (skipped rows keep
    # the group's Q).
    if cfg["small"]:
        q_scaled = [q[:, ops.ds(it * rows, rows)] for q in bufs["q_chunk"]]
    else:
        q_scaled = load_q_slices(ops, q_raw, query_t, mi, q_col, rows=rows, blocks=blocks,
                                 scale=cfg["scale"], kernel_dtype=kd)
    if masked:          # Step 3: the group's state left by the full phase
        load_state(ops, st, mi, st_col, state, rows=rows, blocks=blocks, d=R)
    # Step 4: ONE gather per 128 rows of b' entries; keys and values are the same rows.
    x = bufs["x_rows"]
    for l in ops.static_range(nL):
        ops.gather(x[:, ops.ds(l * rw, rw)], kv_flat, mi, ci + l)
        if masked:
            ops.gather(x[:, ops.ds(l * rw, rw)], overlay, mi, ci + nL + l)
    if dtype_name(kv_flat.dtype) != dtype_name(kd):
        xc = ops.sbuf(x.shape, kd)
        ops.copy(xc, x, engine="scalar")
        x = xc
    # K^T slice k, column l*128*b' + s*128 + p = channels [128k, 128k + dk) of entry s of row
    # (l, p): the transposes of one slice read b' entries at a stride of E.
    k_t = []
    for k in ops.static_range(nd):
        dk = min(P, D - k * P)
        kt = ops.sbuf((dk, geo["W"]), kd)
        for l in ops.static_range(nL):
            transpose_blocks(ops, kt, l * P * bp, x, l * rw + k * P, dk, bp, evac="scalar",
                             src_stride=E)
        k_t.append(kt)
    # P^T copies of 128-row blocks split 2:1 between ScalarE and VectorE on both targets: ScalarE
    # also copies the K^T of D-wide entries (5 channel slices at D = 576), the busier engine here.
    p_evac = ("scalar", "scalar", "vector") if rows == P else None
    # Step 5: fold the tile into every block's state; V = x read in place at the stride E. No
    # sliding window: every row's visible keys start at position 0 (one-sided masks).
    step = StepConfig(d=R, kernel_dtype=kd, v_stride=E, one_sided=True, tiled_block_size=bp,
                      p_evac=p_evac)
    fc = FoldConfig(step=step, rows=rows, blocks=blocks, width=geo["W"], step_keys=geo["step"],
                    masked=masked, keys_on_partitions=cfg["small"])
    fold_tile(ops, fc, q_scaled, KVTile(k_t=k_t, v_rows=x, kidx=geo["kidx"]), st, mf, cf,
              consts=bufs["consts"], chunk_bounds=bufs.get("b_chunk"), it=it)
    # Step 6: stores (row ids out of bounds -> skipped): full phase the state, masked the output.
    store_blocks(ops, st, mi, out_col if masked else st_col, out, state, rows=rows,
                 blocks=blocks, d=R, masked=masked)


def mla_chunk(n_items, cap):
    """Items per metadata chunk: the largest power of two dividing ``n_items`` (a bucketed
    count), at most ``cap`` (a power of two)."""
    return min(n_items & -n_items, cap)


def _check(ops, query_t, q_full, q_part, bounds_p, kv_cache, overlay, meta_pi, meta_pf, meta_fi,
           meta_ff, rows, blocks, R, D, softmax_scale, mixed_precision, LT, LTp=None):
    """Validate every input; return the static geometry."""
    ck = lambda cond, arg, constraint, got: kernel_check(cond, KERNEL, arg, constraint, got)  # noqa: E731
    ck(len(kv_cache.shape) == 3, "kv_cache.shape", "be (num_blocks, block_size, E)",
       tuple(kv_cache.shape))
    N, B, E = kv_cache.shape
    ck(E >= D, "kv_cache.shape[2] (entry size E)", f"be >= kv_lora_rank + qk_rope_head_dim = {D}", E)
    q_dt, c_dt = dtype_name(query_t.dtype), dtype_name(kv_cache.dtype)
    ck(q_dt in _FLOAT, "query_t.dtype", f"be one of {_FLOAT}", q_dt)
    kernel_unsupported(c_dt == q_dt, KERNEL, f"a kv_cache of dtype {c_dt} with {q_dt} queries",
                       "cast the cache or the queries")
    ck(isinstance(rows, int) and 1 <= rows <= B_P_SIZE, "rows", "be an int in [1, 128]", rows)
    ck(isinstance(blocks, int) and 1 <= blocks <= MLA_MAX_GROUP_BLOCKS, "blocks",
       f"be an int in [1, {MLA_MAX_GROUP_BLOCKS}]", blocks)
    ck(B >= 1 and (B & (B - 1)) == 0 and B <= 256, "kv_cache.shape[1] (block_size)",
       "be a power of two in [1, 256]", B)
    g_full, g_part = tile_geometries(KERNEL, B, LT, LTp)
    (T, bp, nL), (Tp, bpp, nLp) = (g_full.T, g_full.bp, g_full.nL), (g_part.T, g_part.bp, g_part.nL)
    ck(tuple(query_t.shape[1:]) == (rows,), "query_t.shape[1]", f"equal rows = {rows}",
       tuple(query_t.shape))
    ck(len(overlay.shape) == 2 and overlay.shape[1] == bpp * E and overlay.shape[0] >= 1,
       "overlay.shape", f"be (R_ov >= 1, b'_p*E) = (R_ov, {bpp * E})", tuple(overlay.shape))
    ck(dtype_name(overlay.dtype) == c_dt, "overlay.dtype", f"equal kv_cache.dtype ({c_dt})",
       dtype_name(overlay.dtype))
    small = decode_layout(rows, blocks)
    items = check_phase_metadata(
        KERNEL, meta_pi, meta_pf, meta_fi, meta_ff, programs=1,
        columns=lambda masked: meta_columns(loads=nLp if masked else nL, blocks=blocks,
                                            head_size=D, masked=masked, rows=rows))
    for name, qa, n in (("q_full", q_full, items[1]), ("q_part", q_part, items[0])):
        want = (D, n * rows) if small else None
        ck(want is None or (tuple(qa.shape) == want and dtype_name(qa.dtype) == q_dt),
           name, f"be a {want} array of the query dtype (decode layout)",
           (tuple(qa.shape), dtype_name(qa.dtype)))
    ck(not small or (tuple(bounds_p.shape) == (1, items[0] * 2 * rows)
                     and dtype_name(bounds_p.dtype) == "float32"),
       "bounds_p", "be a float32 (1, items * 2 * rows) array (decode layout)",
       (tuple(bounds_p.shape), dtype_name(bounds_p.dtype)))
    scale = softmax_scale_value(KERNEL, softmax_scale, D)
    ck(isinstance(mixed_precision, bool), "mixed_precision", "be a bool", mixed_precision)
    kd = ops.bfloat16 if mixed_precision else query_t.dtype
    kds = itemsize(kd)
    cap = decode_chunk_cap(key_width=D, rows=rows, kernel_itemsize=kds) if small else MAX_CHUNK_ITEMS
    gen = "gen2" if ops.nc_gen() == "gen2" else "gen3"
    need = mla_sbuf_bytes(loads=nL, tiled_block_size=bp, entry_size=E, key_width=D, value_width=R,
                          rows=rows, blocks=blocks, cache_itemsize=itemsize(c_dt),
                          kernel_itemsize=kds, query_itemsize=itemsize(q_dt),
                          preload_cols=cap * rows if small else 0)
    kernel_unsupported(need <= SBUF_USABLE[gen], KERNEL,
                       f"LARGE_TILE_SZ={LT} with E={E}, {blocks} Q blocks of {rows} rows and "
                       f"{dtype_name(kd)} compute ({need} SBUF bytes per partition, "
                       f"{SBUF_USABLE[gen]} usable on {gen})",
                       "use a smaller LARGE_TILE_SZ, fewer Q blocks per group or mixed precision")
    step = lambda W: min(W, decode_step_keys(rows) if small else STEP_KEYS)  # noqa: E731
    geo = {False: dict(bp=bp, loads=nL, rw=bp * E, W=nL * B_P_SIZE * bp, main_rows=N * T),
           True: dict(bp=bpp, loads=nLp, rw=bpp * E, W=nLp * B_P_SIZE * bpp, main_rows=N * Tp)}
    for g in geo.values():
        g["step"] = step(g["W"])
    return dict(R=R, D=D, E=E, nd=-(-D // B_P_SIZE), kd=kd, scale=scale, items=items, rows=rows,
                blocks=blocks, small=small, chunk_cap=cap, geo=geo,
                cache_dtype=kv_cache.dtype)