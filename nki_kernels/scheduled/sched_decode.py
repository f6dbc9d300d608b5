"""Decode step of the scheduled kernel: keys on partitions, queries on the free axis (K Q^T).

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first). For a decode-class Q block (``rows`` <= 64 query rows: the G query
heads x new tokens of ONE sequence) the Q-rows step (``nki_kernels.scheduled.sched_core.flash_step``)
pays every VectorE / ScalarE pass per KEY (the free axis is the key axis, and the rows are
few). Here the scores are computed transposed, ``S^T = K Q^T`` (128 keys on partitions, the
block's rows on the free axis), so the row max, the mask, the exponentials and the
probabilities cost per (128-key chunk x row) column: ``W/128 * rows`` elements instead of W
per pass, and P needs no transpose before the PV matmul. Only the K^T copy (PSUM -> SBUF after
the PE transposes, shared with the Q-rows path) still costs one pass per key.

Layout of a step over keys ``[k0, k0 + width)`` of the tile (width/128 = nch chunks):
    S^T      (128, nch*rows) fp32: column ``u*rows + q`` holds the scores of key chunk u
             (keys in K^T column order, partition p = column ``k0 + u*128 + p``) for row q
    kidx_t   (128, nch_all) fp32: tile-local key index of partition p of chunk u (static)
    bounds   c, r: (128, rows) fp32 each, the same on every partition; row q sees key t iff
             ``|t - c_q| < r_q`` (masked steps only)
State (rows on partitions, as ``flash_step``): ``st[:, col0 : col0 + d + 2]`` = o, -m, l.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nki_kernels.contract import NEG_MASK, PARTITIONS
from nki_kernels.scheduled.sched_core import (KVTile, StepConfig, mask_eye_tile, new_max,
                                              new_max_of_negated, rescale_factor,
                                              update_state)

P = PARTITIONS
# Blocks of at most this many rows broadcast -m' with one fp32 matmul of a repeated identity.
SMALL_ROWS = 32


@dataclass(frozen=True)
class DecodeConstants:
    """Static tiles of :func:`decode_step`, built once per kernel (:func:`decode_constants`):
    ``ones_k`` (128, 2) kernel dtype (row sums into two PSUM columns at once); ``ones_f`` (1, 128) fp32; for blocks of at most SMALL_ROWS
    rows ``ones_r`` (rows, 128) fp32 and ``eye_rep`` (rows, width/128 * rows) ``ops.FLAG`` whose
    column ``u*rows + q`` is 1 on partition q (the identity repeated per key chunk); for larger
    blocks ``ones_1`` (1, 128) bf16 (the others None); ``mask_eye`` None or (128, 128) kernel
    dtype, ``sched_core.MASK_EYE_VALUE`` on the diagonal: masked steps then add their
    upper-bound mask to S^T on TensorE (``scheduled_attention.additive_decode_mask``: no stale
    key row in any tile) instead of a VectorE select."""

    ones_k: Any
    ones_f: Any
    ones_r: Any = None
    eye_rep: Any = None
    ones_1: Any = None
    mask_eye: Any = None


def key_index_columns(ops, loads, tiled_block_size):
    """SBUF fp32 ``(128, nL*b')``: column ``u = l*b' + s``, partition p holds the tile-local key
    index ``(l*128 + p)*b' + s`` of the key that K^T column ``u*128 + p`` carries."""
    bp = tiled_block_size
    kidx = ops.sbuf((P, loads * bp), ops.float32)
    for l in ops.static_range(loads):       # one iota per load: columns s = 0 .. b'-1
        ops.iota(kidx[:, ops.ds(l * bp, bp)], step=1, offset=l * P * bp, partition_step=bp)
    return kidx


def decode_constants(ops, rows, width, kernel_dtype, additive=False):
    """The :class:`DecodeConstants` of blocks of ``rows`` rows and steps of ``width`` keys;
    ``additive``: with ``mask_eye`` (``scheduled_attention.additive_decode_mask``)."""
    nch = width // P
    mask_eye = mask_eye_tile(ops, P, kernel_dtype) if additive else None
    ones_k = ops.sbuf((P, 2), kernel_dtype)
    ops.memset(ones_k, 1.0)
    ones_f = ops.sbuf((1, P), ops.float32)
    ops.memset(ones_f, 1.0)
    if rows > SMALL_ROWS:
        ones_1 = ops.sbuf((1, P), ops.bfloat16)
        ops.memset(ones_1, 1.0)
        return DecodeConstants(ones_k=ones_k, ones_f=ones_f, ones_1=ones_1, mask_eye=mask_eye)
    ones_r = ops.sbuf((rows, P), ops.float32)
    ops.memset(ones_r, 1.0)
    diff = ops.sbuf((rows, rows), ops.float32)
    ops.iota(diff, step=1, partition_step=-1)                             # c - q
    eye = ops.sbuf((rows, rows), ops.FLAG)
    ops.tensor_tensor(eye, diff, 0.0, "equal")
    eye_rep = ops.sbuf((rows, nch * rows), ops.FLAG)
    ops.copy(eye_rep[:, ops.ds(0, rows)], eye)
    done = 1                    # chunks filled; each copy doubles them (log2(nch) copies)
    while done < nch:
        more = min(done, nch - done)
        ops.copy(eye_rep[:, ops.ds(done * rows, more * rows)], eye_rep[:, ops.ds(0, more * rows)])
        done += more
    return DecodeConstants(ones_k=ones_k, ones_f=ones_f, ones_r=ones_r, eye_rep=eye_rep,
                           mask_eye=mask_eye)


def decode_step(ops, cfg: StepConfig, q_slices, tile: KVTile, st, col0, *, k0, width, consts,
                bounds=None, alibi=None, prev=None):
    """Fold keys ``[k0, k0 + width)`` of the tile into a decode block's state (keys on partitions).

    Args:
        cfg: the phase's ``sched_core.StepConfig`` (``tiled_block_size`` and ``p_evac`` do not
            apply: masks here cost per (chunk x row) column; ``windowed`` is the caller's choice
            of the ``bounds`` form).
        q_slices: nd SBUF tiles ``(dk, rows)`` kernel dtype: the block's Q^T, pre-scaled.
        tile: the ``sched_core.KVTile`` (``kidx``: :func:`key_index_columns`, masked steps and
            ALiBi).
        st: SBUF fp32 state tile (rows on partitions); this block's columns start at ``col0``.
        k0, width: first key column and width (multiples of 128, width * rows / 128 <= 512: one
            PSUM bank of scores). rows <= 128.
        consts: :class:`DecodeConstants`.
        bounds: None (no mask), ``(c, r)``: two ``(128, rows)`` fp32 tiles (module docstring),
            or ``(top, None)``: one such tile holding ``c + r`` (in PSUM with
            ``consts.mask_eye``: only VectorE reads it) -- rows whose visible range
            starts at or before the tile (``cfg.windowed`` False) see key t iff ``t < top_q``.
        alibi: None or ``(slope, off)``, two ``(128, rows)`` fp32 tiles (row q's values in column
            q of every partition): scores get ``slope_q * t + off_q`` added (t = tile-local key
            index), before the soft-cap.
        prev: None (the state is ``st``'s), or a tile of ``st``'s layout the previous state is
            read from (the group's initial values, ``scheduled_attention.fresh_start``); the new
            state is written to ``st`` either way.

    Pseudocode:
        S^T[:, u*rows:(u+1)*rows] = K_u Q^T            (stationary K^T chunk, moving Q^T)
        S^T += slope_q * kidx + off_q                  (ALiBi; (128, nch, rows) views)
        U = tanh(S^T / cap) if soft_cap else S^T;  mult = cap or 1
        U = where(|kidx - c_q| < r_q, U, NEG / mult)   (masked steps; (128, nch, rows) views;
                                                        upper bound only: kidx < top_q; with
                                                        consts.mask_eye instead, on TensorE:
                                                        S^T += MASK_EYE_VALUE * (top_q < kidx))
        mx = max over chunks (one reduce over a (128, rows, nch) view), then over partitions
             (one PE transpose and a free-axis max); without soft-cap the chunk maxima are
             negated and -m' = min(-m, min over partitions) is one tensor_scalar_reduce
        -m' = min(-m, -mult * mx);  alpha = exp(m - m')    (-m, l, o read from ``prev``)
        NM = ones^T (eye_rep * -m')                    (-m'[q] on every partition and chunk)
        P^T = exp(mult * U + NM)                       (unmasked: NM accumulated into S^T's PSUM)
        l = alpha * l + sum_u P^T_u^T 1;  o = alpha * o + (sum_u V_u^T P^T_u)^T   (PSUM
        accumulation; d > 128: o = alpha * o + sum_u P^T_u^T V_u)
    """
    f32, d, kd = ops.float32, cfg.d, cfg.kernel_dtype
    rows = q_slices[0].shape[1]
    nd = len(q_slices)
    nch = width // P
    ncol = nch * rows
    mult = float(cfg.soft_cap) if cfg.soft_cap is not None else 1.0
    vs = d if cfg.v_stride is None else cfg.v_stride
    c0 = k0 // P
    grid = ((rows, nch), (1, rows))             # (128, nch, rows) view of a (128, ncol) tile
    # Step 1: S^T in one PSUM tile (ncol <= 512 fp32 columns).
    ps = ops.psum((P, ncol), f32)
    for u in ops.static_range(nch):
        for k in ops.static_range(nd):
            ops.matmul(ps[:, ops.ds(u * rows, rows)], tile.k_t[k][:, ops.ds(k0 + u * P, P)],
                       q_slices[k], accumulate=k > 0)
    # Step 2: ALiBi bias, soft-cap and mask on the way out of PSUM (few columns: cheap).
    src = ps
    kk = None
    if alibi is not None or bounds is not None:
        kk = ops.free_view(tile.kidx[:, ops.ds(c0, nch)], ((1, nch), (0, rows)))  # all rows
    if alibi is not None:
        prod = ops.sbuf((P, ncol), f32)
        ops.tensor_tensor(ops.free_view(prod, grid), kk,
                          ops.free_view(alibi[0], ((0, nch), (1, rows))), "multiply")
        bias = ops.sbuf((P, ncol), f32)
        ops.tensor_tensor(ops.free_view(bias, grid), ops.free_view(prod, grid),
                          ops.free_view(alibi[1], ((0, nch), (1, rows))), "add")
        biased = ops.sbuf((P, ncol), f32)
        ops.tensor_tensor(biased, ps, bias, "add")
        src = biased
    if cfg.soft_cap is not None:
        capped = ops.sbuf((P, ncol), f32)
        ops.activation(capped, "tanh", src, scale=1.0 / mult)
        src = capped
    # consts.mask_eye exists only without soft-cap / ALiBi (additive_decode_mask)
    additive = bounds is not None and bounds[1] is None and consts.mask_eye is not None
    if additive:        # masked keys (t > top) get MASK_EYE_VALUE added in PSUM, on TensorE
        # (``top`` still in PSUM, sched_item.fold_tile: the compare on VectorE)
        far = ops.sbuf((P, ncol), kd)
        ops.tensor_tensor(ops.free_view(far, grid), ops.free_view(bounds[0], ((0, nch), (1, rows))),
                          kk, "less", engine="vector")
        ops.matmul(ps, consts.mask_eye, far, accumulate=True)
    elif bounds is not None and bounds[1] is None:      # upper bound only: t < top
        seen = ops.sbuf((P, ncol), ops.PRED)
        # SBUF operands only: on GpSimd, off VectorE (the select, the max and the state)
        ops.tensor_tensor(ops.free_view(seen, grid), kk,
                          ops.free_view(bounds[0], ((0, nch), (1, rows))), "less",
                          engine="gpsimd")
        masked = ops.sbuf((P, ncol), f32)
        ops.where(masked, seen, src, NEG_MASK / mult)
        src = masked
    elif bounds is not None:
        diff = ops.sbuf((P, ncol), f32)
        ops.tensor_tensor(ops.free_view(diff, grid), kk,
                          ops.free_view(bounds[0], ((0, nch), (1, rows))), "subtract")
        dist = ops.sbuf((P, ncol), f32)
        ops.absolute(ops.free_view(dist, grid), ops.free_view(diff, grid), engine=cfg.side_engine)
        seen = ops.sbuf((P, ncol), ops.PRED)
        ops.tensor_tensor(ops.free_view(seen, grid), ops.free_view(dist, grid),
                          ops.free_view(bounds[1], ((0, nch), (1, rows))), "less")
        masked = ops.sbuf((P, ncol), f32)
        ops.where(masked, seen, src, NEG_MASK / mult)
        src = masked
    # Step 3: row max over chunks (a (128, rows, nch) view), then over partitions.
    # Without soft-cap the chunk maxima are taken negated, so one tensor_scalar_reduce of their
    # transpose (min against -m, min-reduced) gives -m' (new_max_of_negated).
    negated = cfg.soft_cap is None
    red = ops.sbuf((P, rows), f32)
    ops.tensor_reduce(red, "max", ops.free_view(src, ((1, rows), (rows, nch))), axis=(2,),
                      negate=negated)
    red_t = ops.psum((rows, P), f32)
    ops.transpose(red_t, red)
    src_st = st if prev is None else prev
    if negated:
        nm_prev, nm_new, alpha = new_max_of_negated(ops, src_st, col0 + d, red_t)
    else:
        nm_prev, nm_new, alpha = new_max(ops, src_st, col0 + d, red_t, mult,
                                         engine=cfg.state_engine)
    # Step 4: P^T = exp(mult * U - m'), -m' on every partition by ones matmuls: small blocks
    # multiply a repeated identity by -m' (one fp32 matmul); 128-row blocks transpose -m' to a
    # row, split it into two bf16 parts (hi + lo, exact in the fp32 PSUM sum) and add both per
    # chunk; -m' becomes hi + lo everywhere, so the shift stays consistent with alpha.
    fused = (bounds is None or additive) and cfg.soft_cap is None and alibi is None
    nm_bc = ps if fused else ops.psum((P, ncol), f32)
    if consts.eye_rep is not None:
        # a select, not a product: a NaN row stays in its own columns (NaN * 0 would not)
        nm_diag = ops.sbuf((rows, ncol), f32)
        ops.where(nm_diag, consts.eye_rep[:, ops.ds(0, ncol)], nm_new, 0.0)
        ops.matmul(nm_bc, consts.ones_r, nm_diag, accumulate=fused)
    else:
        nm_row = ops.psum((1, rows), f32)
        ops.transpose(nm_row, nm_new)
        hi = ops.sbuf((1, rows), ops.bfloat16)
        ops.copy(hi, nm_row)
        lo = ops.sbuf((1, rows), ops.bfloat16)
        ops.tensor_tensor(lo, nm_row, hi, "subtract")
        nm_sum = ops.sbuf((1, rows), f32)
        ops.tensor_tensor(nm_sum, hi, lo, "add")                       # (1, rows): -m' used
        nm_col = ops.psum((rows, 1), f32)
        ops.transpose(nm_col, nm_sum)
        nm_new = ops.sbuf((rows, 1), f32)
        ops.copy(nm_new, nm_col)
        alpha = rescale_factor(ops, nm_prev, nm_new)
        for u in ops.static_range(nch):
            cols = nm_bc[:, ops.ds(u * rows, rows)]
            ops.matmul(cols, consts.ones_1, hi, accumulate=fused)
            ops.matmul(cols, consts.ones_1, lo, accumulate=True)
    probs_t = ops.sbuf((P, ncol), kd)
    if fused:
        ops.activation(probs_t, "exp", ps)
    else:
        z = ops.sbuf((P, ncol), f32)
        if mult != 1.0:
            scaled = ops.sbuf((P, ncol), f32)
            ops.tensor_tensor(scaled, src, mult, "multiply")
            ops.tensor_tensor(z, scaled, nm_bc, "add")
        else:
            ops.tensor_tensor(z, src, nm_bc, "add")
        ops.activation(probs_t, "exp", z)
    # Step 5: row sums and PV, accumulated over the chunks in PSUM. With d <= 128, PV is taken
    # as (P V)^T = V^T P^T (V stationary, the few rows moving: half the TensorE cycles of P
    # stationary, d moving) and transposed back once per step.
    # With d <= 128 the row sums land beside PV's transpose, in columns d and d + 1 of one PSUM
    # tile, so one pass rescales o and l together (state columns o, -m, l; -m is rewritten).
    pv_t = d <= P
    ext = ops.psum((rows, d + 2), f32) if pv_t else None
    rs = ext[:, ops.ds(d, 2)] if pv_t else ops.psum((rows, 1), f32)
    ones = consts.ones_k if pv_t else consts.ones_k[:, ops.ds(0, 1)]
    acc = ops.psum((d, rows) if pv_t else (rows, d), f32)
    v_tiles = (tile.v_rows,) if tile.v_overlay is None else (tile.v_rows, tile.v_overlay)
    for u in ops.static_range(nch):
        p_u = probs_t[:, ops.ds(u * rows, rows)]
        ops.matmul(rs, p_u, ones, accumulate=u > 0)
        for i, vt in enumerate(v_tiles):
            v_u = vt[:, ops.ds((c0 + u) * vs, d)]
            if pv_t:
                ops.matmul(acc, v_u, p_u, accumulate=u > 0 or i > 0)
            else:
                ops.matmul(acc, p_u, v_u, accumulate=u > 0 or i > 0)
    # Step 6: state update.
    if pv_t:
        pv_sb = ops.sbuf((d, rows), f32)
        ops.copy(pv_sb, acc, engine=cfg.copy_engine)
        ops.transpose(ext[:, ops.ds(0, d)], pv_sb)
        sw = d + 2
        ops.scale_add(st[:, ops.ds(col0, sw)], src_st[:, ops.ds(col0, sw)], alpha, ext)
        ops.copy(st[:, ops.ds(col0 + d, 1)], nm_new, engine=cfg.state_copy_engine)
        return
    update_state(ops, st, col0, d, alpha=alpha, row_sum=rs, nm_new=nm_new, pv=acc,
                 copy_engine=cfg.state_copy_engine, prev=src_st)
