"""Scheduled (block-sparse) flash paged attention: work proportional to what the batch needs.

Legacy-NKI kernel (``from nki_kernels._nki import nki, nl, nisa``), grid ``[1, Hkv]`` (one
program per KV head). The host (``host/schedule.py``, layouts in ``docs/layouts.md``
"Scheduled kernel") turns a batch into *items*: (Q group, KV tile) pairs of the same sequence,
in two static phases:

* **partial** items (masked): tiles a row of the group sees only in part (the causal diagonal,
  a sequence's last key rows, sliding-window edges). The mask is built in-kernel from two fp32
  numbers per query row (``|t - c| < r`` over the tile-local key index t), so mask traffic is
  O(query rows), never O(queries x context). The KV tile is zeroed before the gathers, so key
  rows no DMA writes are exact zeros.
* **full** items (no mask work at all): every real row of the group sees every key of the tile
  and every key row comes from the cache.

Each phase is ONE ``nl.sequential_range`` over its items (static counts, padded to a geometric
bucket by the host); everything that varies at run time is data: gather rows, Q rows, state /
output rows and a reset flag. A DMA whose row index is out of bounds is skipped
(``oob_mode.skip``), which is how padding items, padding rows and unchanged Q / state move no
bytes: the online-softmax state of the current Q group and its scaled Q stay in SBUF from one
item to the next and are (re)initialised when the reset flag says a new group starts. The
partial phase runs first and leaves each group's state in a private HBM scratch (rows of
``d + 2`` fp32: o, -m, l) when the group also has full items; the full phase starts the group
from that state and writes the output. Nothing else goes through HBM.

Each phase has its own tile geometry: full items tiles of ``LARGE_TILE_SZ`` keys, partial items
tiles of ``PARTIAL_TILE_SZ`` keys (the host cuts a large tile that is not full into partial
tiles and schedules only those some row sees), each read through its own flat view of the cache.

An fp8 cache with a 16-bit kernel dtype is never converted on chip: K^T comes from identity
matmuls of the fp8 rows (fp32 PSUM, evacuated into the kernel dtype by the copy every K^T pays)
and V is the PV matmul's fp8 operand; the 16-bit overlay rows of a partial item sit in tiles of
their own that TensorE adds in.

Dimensions (static, from the shapes): Hkv KV heads; d head size (1..512, nd = ceil(d/128)
slices of <= 128 channels); rows query rows per Q block (<= 128); blocks Q blocks per group;
nblk Q blocks of this launch; B block size; per phase T, b', nL from its tile size and B
(``nki_kernels.constants.tile_geometry``); W = nL * 128 * b' keys per item.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels._nki import nki, nl, nisa
from nki_kernels.constants import B_P_SIZE, M_FLOOR, decode_layout
from nki_kernels.row_tiles import require_oob_skip
from nki_kernels.sbuf_plan import SbufBudgetWarning
from nki_kernels.sched_plan import (SBUF_USABLE, block_bytes, fixed_bytes, max_group_blocks,
                                    meta_columns)
from nki_kernels.sched_checks import check_phase_metadata, softmax_scale_value, tile_geometries
from nki_kernels.sched_core import key_index_tile
from nki_kernels.sched_decode import decode_constants, key_index_columns
from nki_kernels.sched_item import (chunk_queries, decode_step_keys, fold_tile, load_q_slices,
                                    load_state, store_blocks)
from nki_kernels.sched_tile import gather_kv, transpose_keys
from nki_kernels.tile_ops import identity_tile

KERNEL = "scheduled_paged_attention"
MAX_D = 512
_FLOAT = ("float32", "bfloat16", "float16")
_FP8 = ("float8_e4m3", "float8_e5m2")


@nki.jit
def scheduled_paged_attention(query_t, q_full, q_part, i_full, i_part, bounds_p, q_init, kv_cache,
                              overlay,
                              meta_pi, meta_pf, meta_fi, meta_ff, rows, blocks, softmax_scale=None,
                              mixed_precision=True, LARGE_TILE_SZ=2048, PARTIAL_TILE_SZ=None,
                              logits_soft_cap=None, alibi=False, row_init=False, windowed=True):
    """Scheduled paged attention of one class of Q blocks; grid ``[1, Hkv]``.

    Args:
        query_t: (Hkv * nblk * d, rows) float32/bfloat16/float16: row ``(h*nblk + b)*d + ch``
            holds channel ch of the ``rows`` query rows of Q block b of KV head h (Q^T blocks),
            gathered when a group starts (query-rows classes).
        q_full, q_part: keys-on-partitions classes (``constants.decode_layout``): the Q^T of
            every item of the full / partial phase, (Hkv * d, items * rows) in query_t's dtype,
            column ``t*rows + r`` = row r of item t's block for KV head ``row // d``; preloaded
            with each chunk's metadata (one DMA per chunk instead of a gather per item).
            Otherwise any (1, 1) array (unused).
        i_full, i_part: keys-on-partitions classes with ``row_init``: the ``q_init`` rows of
            every item of the full / partial phase, (Hkv * rows, items * 4) float32, row
            ``h*rows + p``, columns ``[t*4, t*4 + 4)`` for query row p of item t
            (``host.scheduled.item_row_init``); preloaded with each chunk's metadata. Otherwise
            any (1, 1) float32 array (unused).
        bounds_p: decode-layout classes: (1, Ip * 2 * rows) float32, item t's mask bounds
            (``c_q`` then ``r_q`` for its rows q; row q sees tile-local key t iff
            ``|t - c_q| < r_q``) on ONE partition, broadcast in-kernel (mask bytes O(rows));
            otherwise any (1, 1) float32 array (unused).
        q_init: (Hkv * nblk * rows, 4) float32, per query row: initial -m and l of the online
            softmax (-M_FLOOR, 0 normally; -sink, 1 with an attention sink), the ALiBi slope and
            slope * query position (0 without ALiBi). Read only with ``row_init`` (gathered
            per group start; keys-on-partitions classes read ``i_full`` / ``i_part`` instead).
        kv_cache: (2, N, Hkv, B, d) [0] = K, [1] = V (read only): the query dtype, or fp8
            (float8_e4m3 / float8_e5m2, converted on chip; scales are folded in by the host).
        overlay: (2, Hkv * R_ov, b'_p * d): key rows that are not whole cached-context rows (the
            host copies a sequence's partly filled last context row and its new tokens here);
            row ``h * R_ov + r``. The kv_cache dtype, or for an fp8 cache the kernel dtype.
        meta_pi, meta_pf: partial-phase metadata, (Hkv, 128, Ip * ki) int32 and (128, Ip * kf)
            float32 (``host.schedule.PhaseArrays``; Ip items, may be 0).
        meta_fi, meta_ff: full-phase metadata, (Hkv, 128, If * ki') int32, (128, If * kf') fp32.
        rows, blocks: query rows per Q block (1..128) and Q blocks per group (static ints).
        softmax_scale: default 1/sqrt(d).
        mixed_precision: True: bf16 matmul inputs and probabilities; False: the input dtype.
            Scores, statistics and the output accumulator are fp32 either way.
        LARGE_TILE_SZ: keys per full-phase KV tile before block-size tiling (power of two,
            512..8192).
        PARTIAL_TILE_SZ: the same for the partial phase (power of two, 512..LARGE_TILE_SZ;
            None: LARGE_TILE_SZ). The partial phase's rows, overlay rows and tile-local key
            indices are those of this geometry (b'_p tokens per row, nL_p loads).
        logits_soft_cap: None or c > 0: scores become c * tanh(s / c) before masking.
        alibi: add ``slope * (key position - query position)`` to the scores before the soft-cap.
        row_init: start each group's rows from ``q_init`` (sinks, ALiBi) instead of
            (-M_FLOOR, 0); the metadata then carries the ``ini`` columns.
        windowed: False promises that every row's visible keys start at or before each tile it
            meets (no sliding window): masks then test only the upper bound (cheaper).

    Returns:
        (Hkv * nblk * rows, d) in query_t.dtype: row ``(h*nblk + b)*rows + r`` = output of query
        row r of Q block b of KV head h (rows no item stores are left unwritten; the host never
        reads them).
    """
    Hkv, d = kv_cache.shape[2], kv_cache.shape[4]
    kernel_check(len(query_t.shape) == 2 and query_t.shape[0] % max(Hkv * d, 1) == 0,
                 KERNEL, "query_t.shape", f"be (Hkv*nblk*d, rows) with Hkv*d = {Hkv * d}",
                 tuple(query_t.shape))
    nblk = query_t.shape[0] // (Hkv * d)
    out = nl.ndarray((Hkv * nblk * rows, d), dtype=query_t.dtype, buffer=nl.shared_hbm)
    state = nl.ndarray((max(nblk * rows, 1), d + 2), dtype=nl.float32, buffer=nl.hbm)
    return scheduled_body(query_t, q_full, q_part, i_full, i_part, bounds_p, q_init, kv_cache,
                          overlay, meta_pi,
                          meta_pf, meta_fi, meta_ff, rows, blocks, softmax_scale=softmax_scale,
                          mixed_precision=mixed_precision, LARGE_TILE_SZ=LARGE_TILE_SZ,
                          PARTIAL_TILE_SZ=PARTIAL_TILE_SZ,
                          logits_soft_cap=logits_soft_cap, alibi=alibi, row_init=row_init,
                          windowed=windowed, out=out, state=state)


def scheduled_body(query_t, q_full, q_part, i_full, i_part, bounds_p, q_init, kv_cache, overlay,
                   meta_pi,
                   meta_pf, meta_fi, meta_ff, rows, blocks, *, softmax_scale, mixed_precision,
                   LARGE_TILE_SZ, PARTIAL_TILE_SZ, logits_soft_cap, alibi, row_init, windowed,
                   out, state):
    """Body of :func:`scheduled_paged_attention` (``out`` / ``state`` allocated by the caller).

    Pseudocode (per program = KV head h; full phase first, then the partial phase):
        for item t in sequential_range(items):            # chunks of metadata preloaded
            Q^T <- query_t rows q[t]; [row_init] init <- q_init rows ini[t]
                                                          (keys on partitions: item t's
                                                          preloaded i_full / i_part columns)
                                                          (skipped unless a group starts here)
            if reset[t]: st = init for every row          (select, NaN-safe)
            [partial] st <- state rows st[t]  (skipped unless the group starts here and had
                                               full items)
            K, V <- kv rows kv[t] (+ overlay rows ov[t], partial phase; tile zeroed first)
            K^T by PE transposes (per 128-channel slice)
            for each block j, each <= 2048-key step: flash_step(Q^T_j, K^T, V, st_j [, mask])
            [full] state rows st[t] <- st     (skipped unless this is the group's last full item)
            [partial] out rows out[t] <- o / max(l, L_FLOOR)  (skipped unless the group ends)
    """
    require_oob_skip(KERNEL)
    cfg = _check(query_t, q_init, kv_cache, overlay, meta_pi, meta_pf, meta_fi, meta_ff, rows,
                 blocks, softmax_scale, mixed_precision, LARGE_TILE_SZ, PARTIAL_TILE_SZ,
                 logits_soft_cap, alibi, row_init)
    kernel_check(isinstance(windowed, bool), KERNEL, "windowed", "be a bool", windowed)
    cfg.update(rows=rows, blocks=blocks, soft_cap=logits_soft_cap, alibi=alibi, row_init=row_init,
               windowed=windowed)
    head = nl.program_id(axis=1)
    d, nd = cfg["d"], cfg["nd"]
    sw = d + 2
    # Persistent SBUF state of the current Q group: per block j, columns [j*sw, (j+1)*sw) hold
    # o (d), -m, l; `init` the same for a group start (o = 0; -m, l from q_init); `al` the ALiBi
    # slope and slope * query position per block; the raw Q^T slices (channels on partitions).
    st = nl.ndarray((rows, blocks * sw), dtype=nl.float32, buffer=nl.sbuf)
    init = nl.ndarray((rows, blocks * sw), dtype=nl.float32, buffer=nl.sbuf)
    al = nl.ndarray((rows, blocks * 2), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.affine_range(blocks):
        init[:, nl.ds(j * sw, d)] = nisa.memset((rows, d), 0.0, dtype=nl.float32)
        init[:, nl.ds(j * sw + d, 1)] = nisa.memset((rows, 1), -M_FLOOR, dtype=nl.float32)
        init[:, nl.ds(j * sw + d + 1, 1)] = nisa.memset((rows, 1), 0.0, dtype=nl.float32)
    al[...] = nisa.memset((rows, blocks * 2), 0.0, dtype=nl.float32)
    st[...] = nl.copy(init, dtype=nl.float32)
    q_raw = []
    for k in nl.static_range(nd):
        dk = min(B_P_SIZE, d - k * B_P_SIZE)
        qr = nl.ndarray((dk, blocks * rows), dtype=query_t.dtype, buffer=nl.sbuf)
        qr[...] = nisa.memset((dk, blocks * rows), 0.0, dtype=query_t.dtype)
        q_raw.append(qr)
    cfg["small"] = decode_layout(rows, blocks, alibi)
    # Keys on partitions (sched_decode) for decode-layout classes; query rows on partitions
    # (sched_core) for 128-row classes (per-step overheads amortize over 2048-key steps and
    # their masks take one ScalarE pass). (Measured on the cost model: keys on
    # partitions for the full items of 128-row blocks was slower, per-step small ops dominate.)
    cfg["kop_full"] = cfg["small"]
    cfg["kop_part"] = cfg["small"]
    _check_sbuf(cfg, kv_cache, query_t, rows, blocks, LARGE_TILE_SZ)
    kernel_check(not cfg["small"] or (tuple(bounds_p.shape) == (1, cfg["items_p"] * 2 * rows)
                                      and np.dtype(bounds_p.dtype) == np.float32),
                 KERNEL, "bounds_p", "be a float32 (1, items * 2 * rows) array (decode layout)",
                 (tuple(bounds_p.shape), np.dtype(bounds_p.dtype).name))
    for name, qa, n in (("q_full", q_full, cfg["items_f"]), ("q_part", q_part, cfg["items_p"])):
        want = (kv_cache.shape[2] * d, n * rows) if cfg["small"] else None
        kernel_check(want is None or (tuple(qa.shape) == want
                                      and np.dtype(qa.dtype) == np.dtype(query_t.dtype)),
                     KERNEL, name, f"be a {want} array of the query dtype (keys on partitions)",
                     (tuple(qa.shape), np.dtype(qa.dtype).name))
    for name, ia, n in (("i_full", i_full, cfg["items_f"]), ("i_part", i_part, cfg["items_p"])):
        want = (kv_cache.shape[2] * rows, n * 4) if cfg["small"] and row_init else None
        kernel_check(want is None or (tuple(ia.shape) == want
                                      and np.dtype(ia.dtype) == np.float32),
                     KERNEL, name, f"be a float32 {want} array (keys on partitions, row_init)",
                     (tuple(ia.shape), np.dtype(ia.dtype).name))
    # Per phase (False: full, True: partial): its geometry, its flat cache view (rows of b'
    # tokens), the key indices its masks / ALiBi biases need, and its step width.
    for masked, geo in cfg["geo"].items():
        kop = cfg["kop_part"] if masked else cfg["kop_full"]
        geo["kv_flat"] = kv_cache.reshape((2, geo["main_rows"], geo["bp"] * d))
        geo["kidx"] = None
        if geo["items"] > 0 and (masked or alibi):
            geo["kidx"] = (key_index_columns(geo["loads"], geo["bp"]) if kop
                           else key_index_tile(rows, geo["loads"], geo["bp"]))
        geo["step"] = min(geo["W"], decode_step_keys(rows) if kop else 2048)
    consts = None
    if cfg["kop_full"]:
        consts = decode_constants(rows, max(g["step"] for g in cfg["geo"].values()), cfg["kd"])
    eye = None
    if cfg["fp8_direct"]:      # identity matmuls transpose fp8 K rows (and the overlay rows)
        eye = (identity_tile(B_P_SIZE, kv_cache.dtype), identity_tile(B_P_SIZE, cfg["kd"]))
    bufs = dict(st=st, init=init, al=al, q_raw=q_raw, consts=consts, eye=eye)
    hbm = dict(query_t=query_t, q_init=q_init, overlay=overlay, out=out, state=state)

    for masked, mi_all, mf_all, q_all, i_all, n_items in (
            (False, meta_fi, meta_ff, q_full, i_full, cfg["items_f"]),
            (True, meta_pi, meta_pf, q_part, i_part, cfg["items_p"])):
        if n_items == 0:
            continue
        ki, kf = meta_columns(loads=cfg["geo"][masked]["loads"], blocks=blocks, head_size=d,
                              masked=masked, alibi=alibi, row_init=row_init, rows=rows)
        chunk = _chunk(n_items)
        bufs["kv"] = None
        if not masked:
            # Full items write every row; padding items (all DMAs skipped) then read the last
            # real item's rows: allocated (and zeroed) once so nothing is ever uninitialised.
            rw_all = cfg["geo"][False]["loads"] * cfg["geo"][False]["bp"] * d
            bufs["kv"] = (nl.zeros((B_P_SIZE, rw_all), dtype=kv_cache.dtype, buffer=nl.sbuf),
                          nl.zeros((B_P_SIZE, rw_all), dtype=kv_cache.dtype, buffer=nl.sbuf))
        for ch in nl.sequential_range(n_items // chunk):
            mi = nl.load(mi_all[head, :, nl.ds(ch * chunk * ki, chunk * ki)])
            mf = nl.load(mf_all[:, nl.ds(ch * chunk * kf, chunk * kf)])
            bufs["q_chunk"] = None
            if cfg["small"] and masked:      # the chunk's bounds, one partition
                bufs["b_chunk"] = nl.load(bounds_p[0:1, nl.ds(ch * chunk * 2 * rows,
                                                              chunk * 2 * rows)])
            if cfg["small"]:       # the chunk's Q^T, scaled once into the kernel dtype
                bufs["q_chunk"] = chunk_queries(q_all, head * d, d, ch * chunk * rows,
                                                chunk * rows, scale=cfg["scale"],
                                                kernel_dtype=cfg["kd"])
            if cfg["small"] and row_init:      # the chunk's row init values (rows, chunk * 4)
                bufs["i_chunk"] = nl.load(i_all[nl.ds(head * rows, rows),
                                                nl.ds(ch * chunk * 4, chunk * 4)])
            for it in nl.sequential_range(chunk):
                _item(cfg, masked, mi, mf, it, ki, kf, hbm, bufs)
    return out


def _item(cfg, masked, mi, mf, it, ki, kf, hbm, bufs):
    """Item ``it`` of the chunk: load / reset / carry the group state, gather Q and KV, fold the
    tile, store."""
    ci, cf = it * ki, it * kf
    geo = cfg["geo"][masked]
    d, nd, nL, kd = cfg["d"], cfg["nd"], geo["loads"], cfg["kd"]
    rows, blocks = cfg["rows"], cfg["blocks"]
    st, init, al, q_raw = bufs["st"], bufs["init"], bufs["al"], bufs["q_raw"]
    sw = d + 2
    i_r = nl.arange(rows)[:, None]
    q_col = ci + (2 * nL if masked else nL)
    st_col = q_col + (0 if cfg["small"] else blocks * nd)
    out_col = st_col + blocks
    ini_col = out_col + (blocks if masked else 0)
    # Step 1: a group starting here loads its Q^T and its rows' initial values (skipped rows
    # keep the group's values), then every row's state is reset (a select: stale NaN cannot leak).
    if cfg["row_init"] and cfg["small"]:    # one block; this item's values, preloaded
        init[:, nl.ds(d, 2)] = nl.copy(bufs["i_chunk"][:, nl.ds(it * 4, 2)], dtype=nl.float32)
        if cfg["alibi"]:
            al[:, nl.ds(0, 2)] = nl.copy(bufs["i_chunk"][:, nl.ds(it * 4 + 2, 2)],
                                         dtype=nl.float32)
    elif cfg["row_init"]:
        i_2 = nl.arange(2)[None, :]
        for j in nl.static_range(blocks):
            nisa.dma_copy(dst=init[i_r, j * sw + d + i_2],
                          src=hbm["q_init"][mi[i_r, ini_col + j], i_2], oob_mode=nisa.oob_mode.skip)
            if cfg["alibi"]:
                nisa.dma_copy(dst=al[i_r, j * 2 + i_2],
                              src=hbm["q_init"][mi[i_r, ini_col + j], 2 + i_2],
                              oob_mode=nisa.oob_mode.skip)
    reset = mf[0:rows, nl.ds(cf, 1)]
    st[...] = nl.where(reset, init, st, dtype=nl.float32)
    qs = [] if cfg["small"] else load_q_slices(q_raw, hbm["query_t"], mi, q_col, rows=rows,
                                               blocks=blocks, scale=cfg["scale"], kernel_dtype=kd)
    # Step 2 (partial phase): the group's state left by the full phase.
    if masked:
        load_state(st, mi, st_col, hbm["state"], rows=rows, blocks=blocks, d=d)
    # Step 3: the KV tile (the kernel dtype, or fp8 fed to TensorE as is), K^T per channel slice.
    k_rows, v_rows, k_ov, v_ov = gather_kv(cfg, geo, masked, mi, ci, hbm, bufs)
    k_t = transpose_keys(cfg, geo, k_rows, k_ov, bufs.get("eye"))
    # Step 4: fold the tile into every block's state, step by step (<= 2048 keys per step; with
    # keys on partitions, as many keys as fit one PSUM bank of scores).
    kop = cfg["kop_part"] if masked else cfg["kop_full"]
    if cfg["small"]:       # decode layout: one block, Q^T preloaded per chunk
        qs = [q[:, nl.ds(it * rows, rows)] for q in bufs["q_chunk"]]

    def alibi_of(j):
        # bias = slope * (k0 + t) - slope * qpos  ->  scale slope, offset slope*k0 - slope*qpos
        slope = al[:, nl.ds(j * 2, 1)]
        off = nisa.tensor_scalar(slope, np.multiply, mf[0:rows, nl.ds(cf + kf - 1, 1)],
                                 op1=np.subtract, operand1=al[:, nl.ds(j * 2 + 1, 1)],
                                 dtype=nl.float32)
        return slope, off

    fold_tile(qs, k_t, v_rows, st, mf, cf, d=d, rows=rows, blocks=blocks, width=geo["W"],
              step=geo["step"], masked=masked, kidx=geo["kidx"], kernel_dtype=kd, keys_on_partitions=kop, consts=bufs["consts"],
              chunk_bounds=bufs.get("b_chunk"), it=it, soft_cap=cfg["soft_cap"],
              alibi_of=alibi_of if cfg["alibi"] else None, one_sided=not cfg["windowed"],
              v_overlay=v_ov, tiled_block_size=geo["bp"])
    # Step 5: stores (row indices out of bounds -> skipped): full phase the state, partial
    # phase the output.
    store_blocks(st, mi, out_col if masked else st_col, hbm["out"], hbm["state"], rows=rows,
                 blocks=blocks, d=d, masked=masked)


def _check_sbuf(cfg, kv_cache, query_t, rows, blocks, LT):
    """Warn (``SbufBudgetWarning``, as the dense kernel) when the estimated working set
    (``nki_kernels.sched_plan``) exceeds the target's usable SBUF: the kernel still runs (the
    compiler spills) but the message names the fix."""
    gen = "gen3" if nisa.get_nc_version() == nisa.nc_version.gen3 else "gen2"
    sizes = dict(cache_itemsize=np.dtype(kv_cache.dtype).itemsize,
                 kernel_itemsize=np.dtype(cfg["kd"]).itemsize)
    fits = max_group_blocks(nc_gen=gen, block_size=kv_cache.shape[3], large_tile=LT,
                            head_size=cfg["d"], rows=rows, keys_on_partitions=cfg["small"],
                            query_itemsize=np.dtype(query_t.dtype).itemsize, **sizes)
    if blocks <= fits:
        return
    need = (fixed_bytes(block_size=kv_cache.shape[3], large_tile=LT, head_size=cfg["d"],
                        keys_on_partitions=cfg["small"], rows=rows, **sizes)
            + blocks * block_bytes(head_size=cfg["d"], rows=rows,
                                   query_itemsize=np.dtype(query_t.dtype).itemsize,
                                   kernel_itemsize=sizes["kernel_itemsize"]))
    warnings.warn(f"{KERNEL}: a working set of about {need} SBUF bytes per partition ({gen}: "
                  f"{blocks} Q block(s) of {rows} rows per group, head size {cfg['d']}, "
                  f"LARGE_TILE_SZ={LT}) exceeds the {SBUF_USABLE[gen]} usable: the compiler "
                  "will spill; use a smaller LARGE_TILE_SZ or mixed_precision=True",
                  SbufBudgetWarning, stacklevel=3)


def _chunk(n_items):
    c = n_items & -n_items
    return min(c, 64)


def _check(query_t, q_init, kv_cache, overlay, meta_pi, meta_pf, meta_fi, meta_ff, rows, blocks,
           softmax_scale, mixed_precision, LT, LTp, soft_cap, alibi, row_init):
    """Validate every input; return the static geometry."""
    ck = lambda cond, arg, constraint, got: kernel_check(cond, KERNEL, arg, constraint, got)  # noqa: E731
    ck(len(kv_cache.shape) == 5 and kv_cache.shape[0] == 2, "kv_cache.shape",
       "be (2, num_blocks, Hkv, block_size, d)", tuple(kv_cache.shape))
    _, N, Hkv, B, d = kv_cache.shape
    ck(1 <= d <= MAX_D, "kv_cache.shape[4] (head size d)", f"be in [1, {MAX_D}]", d)
    ck(np.dtype(query_t.dtype).name in _FLOAT, "query_t.dtype", f"be one of {_FLOAT}",
       np.dtype(query_t.dtype).name)
    cache_dt = np.dtype(kv_cache.dtype).name
    fp8 = cache_dt in _FP8
    kernel_unsupported(fp8 or np.dtype(kv_cache.dtype) == np.dtype(query_t.dtype), KERNEL,
                       f"a kv_cache of dtype {cache_dt} with {np.dtype(query_t.dtype).name} "
                       f"queries", f"use the query dtype or an fp8 cache ({_FP8})")
    ck(isinstance(rows, int) and 1 <= rows <= B_P_SIZE, "rows", "be an int in [1, 128]", rows)
    ck(isinstance(blocks, int) and 1 <= blocks <= 64, "blocks", "be an int in [1, 64]", blocks)
    ck(B >= 1 and (B & (B - 1)) == 0 and B <= 256, "kv_cache.shape[3] (block_size)",
       "be a power of two in [1, 256]", B)
    (T, bp, nL), (Tp, bpp, nLp) = tile_geometries(KERNEL, B, LT, LTp)
    ck(tuple(query_t.shape[1:]) == (rows,), "query_t.shape[1]", f"equal rows = {rows}",
       tuple(query_t.shape))
    ck(len(overlay.shape) == 3 and overlay.shape[0] == 2 and overlay.shape[2] == bpp * d
       and overlay.shape[1] % Hkv == 0, "overlay.shape",
       f"be (2, Hkv*R_ov, b'_p*d) = (2, {Hkv}*R_ov, {bpp * d})", tuple(overlay.shape))
    kd = nl.bfloat16 if mixed_precision is True else query_t.dtype
    ov_dt = np.dtype(kd) if fp8 else np.dtype(kv_cache.dtype)
    ck(np.dtype(overlay.dtype) == ov_dt, "overlay.dtype",
       f"equal {ov_dt.name} (the kv_cache dtype; the kernel dtype for an fp8 cache)",
       np.dtype(overlay.dtype).name)
    nblk = query_t.shape[0] // (Hkv * d)
    ck(tuple(q_init.shape) == (Hkv * nblk * rows, 4) and np.dtype(q_init.dtype) == np.float32,
       "q_init", f"be a float32 array of shape (Hkv*nblk*rows, 4) = {(Hkv * nblk * rows, 4)}",
       (tuple(q_init.shape), np.dtype(q_init.dtype).name))
    ck(isinstance(alibi, bool), "alibi", "be a bool", alibi)
    ck(isinstance(row_init, bool) and (row_init or not alibi), "row_init",
       "be a bool, True when alibi is", row_init)
    items = check_phase_metadata(
        KERNEL, meta_pi, meta_pf, meta_fi, meta_ff, programs=Hkv,
        columns=lambda masked: meta_columns(loads=nLp if masked else nL, blocks=blocks,
                                            head_size=d, masked=masked,
                                            alibi=alibi is True, row_init=row_init is True,
                                            rows=rows))
    scale = softmax_scale_value(KERNEL, softmax_scale, d)
    ck(isinstance(mixed_precision, bool), "mixed_precision", "be a bool", mixed_precision)
    ck(soft_cap is None or (isinstance(soft_cap, (int, float)) and not isinstance(soft_cap, bool)
                            and math.isfinite(float(soft_cap)) and soft_cap > 0),
       "logits_soft_cap", "be None or a finite number > 0", soft_cap)
    # fp8 rows straight into TensorE when the other operand is 16-bit (float32 matmul operands
    # must both be float32: an fp8 cache with a float32 kernel dtype is converted on chip)
    fp8_direct = fp8 and np.dtype(kd).itemsize == 2
    geo = {False: dict(bp=bp, loads=nL, W=nL * B_P_SIZE * bp, main_rows=N * Hkv * T,
                       items=items[1]),
           True: dict(bp=bpp, loads=nLp, W=nLp * B_P_SIZE * bpp, main_rows=N * Hkv * Tp,
                      items=items[0])}
    return dict(d=d, nd=-(-d // B_P_SIZE), kd=kd, fp8_direct=fp8_direct, scale=scale,
                items_p=items[0], items_f=items[1], geo=geo)
