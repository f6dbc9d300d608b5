"""Decode step of the scheduled kernel: keys on partitions, queries on the free axis (K Q^T).

Device code (legacy NKI). For a decode-class Q block (``rows`` <= 64 query rows: the G query
heads x new tokens of ONE sequence) the Q-rows step (``nki_kernels.sched_core.flash_step``)
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

import numpy as np

from nki_kernels._nki import nl, nisa
from nki_kernels.constants import B_P_SIZE, NEG_MASK
from nki_kernels.sched_core import update_state

# Blocks of at most this many rows broadcast -m' with one fp32 matmul of a repeated identity.
SMALL_ROWS = 32


def key_index_columns(loads, tiled_block_size):
    """SBUF fp32 ``(128, nL*b')``: column ``u = l*b' + s``, partition p holds the tile-local key
    index ``(l*128 + p)*b' + s`` of the key that K^T column ``u*128 + p`` carries."""
    bp = tiled_block_size
    kidx = nl.ndarray((B_P_SIZE, loads * bp), dtype=nl.float32, buffer=nl.sbuf)
    i_p = nl.arange(B_P_SIZE)[:, None]
    i_u = nl.arange(1)[None, :]
    for l in nl.static_range(loads):
        for s in nl.static_range(bp):
            kidx[:, nl.ds(l * bp + s, 1)] = nisa.iota(i_p * bp + i_u * 0 + (l * B_P_SIZE * bp + s),
                                                     dtype=nl.float32)
    return kidx


def decode_constants(rows, width, kernel_dtype):
    """Static tiles of :func:`decode_step`, built once per kernel: ``ones_k`` (128, 1) kernel
    dtype; ``ones_f`` (1, 128) fp32; for blocks of at most SMALL_ROWS rows ``ones_r`` (rows, 128) fp32 and ``eye_rep``
    (rows, width/128 * rows) fp32 whose column ``u*rows + q`` is 1 on partition q (the identity
    repeated per key chunk); for larger blocks ``ones_1`` (1, 128) bf16."""
    P = B_P_SIZE
    nch = width // P
    ones_k = nl.ndarray((P, 1), dtype=kernel_dtype, buffer=nl.sbuf)
    ones_k[...] = nisa.memset((P, 1), 1.0, dtype=kernel_dtype)
    ones_f = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)
    ones_f[...] = nisa.memset((1, P), 1.0, dtype=nl.float32)
    if rows > SMALL_ROWS:
        ones_1 = nl.ndarray((1, P), dtype=nl.bfloat16, buffer=nl.sbuf)
        ones_1[...] = nisa.memset((1, P), 1.0, dtype=nl.bfloat16)
        return dict(ones_k=ones_k, ones_f=ones_f, ones_1=ones_1)
    ones_r = nl.ndarray((rows, P), dtype=nl.float32, buffer=nl.sbuf)
    ones_r[...] = nisa.memset((rows, P), 1.0, dtype=nl.float32)
    i_q = nl.arange(rows)[:, None]
    i_c = nl.arange(rows)[None, :]
    diff = nisa.iota(i_c - i_q, dtype=nl.float32)                        # c - q
    eye = nl.equal(diff, 0.0, dtype=nl.float32)
    eye_rep = nl.ndarray((rows, nch * rows), dtype=nl.float32, buffer=nl.sbuf)
    for u in nl.static_range(nch):
        eye_rep[:, nl.ds(u * rows, rows)] = nl.copy(eye, dtype=nl.float32)
    return dict(ones_k=ones_k, ones_f=ones_f, ones_r=ones_r, eye_rep=eye_rep)


def decode_step(q_slices, k_slices, v_rows, st, col0, d, *, k0, width, kidx_t, bounds,
                kernel_dtype, consts, soft_cap=None, v_stride=None, v_overlay=None, alibi=None):
    """Fold keys ``[k0, k0 + width)`` of the tile into a decode block's state (keys on partitions).

    Args:
        q_slices: nd SBUF tiles ``(dk, rows)`` kernel dtype: the block's Q^T, pre-scaled.
        k_slices: nd SBUF tiles ``(dk, W)``: K^T of the tile.
        v_rows: SBUF ``(128, ...)``: V chunk u at columns ``[u*v_stride, u*v_stride + d)``.
        st: SBUF fp32 state tile (rows on partitions); this block's columns start at ``col0``.
        d: value head size.  k0, width: first key column and width (multiples of 128,
            width * rows / 128 <= 512: one PSUM bank of scores). rows <= 128.
        kidx_t: ``key_index_columns`` (masked steps, ALiBi) or None.
        bounds: None (no mask) or ``(c, r)``: two ``(128, rows)`` fp32 tiles (module docstring).
        kernel_dtype: matmul-input / probability dtype.  consts: :func:`decode_constants`.
        soft_cap: None or c > 0.  v_stride: columns between V chunks (default d).
        v_overlay: None or a second V tile of ``v_rows``' layout, added into every PV product.
        alibi: None or ``(slope, off)``, two ``(128, rows)`` fp32 tiles (row q's values in column
            q of every partition): scores get ``slope_q * t + off_q`` added (t = tile-local key
            index from ``kidx_t``), before the soft-cap.

    Pseudocode:
        S^T[:, u*rows:(u+1)*rows] = K_u Q^T            (stationary K^T chunk, moving Q^T)
        S^T += slope_q * kidx + off_q                  (ALiBi; (128, nch, rows) views)
        U = tanh(S^T / cap) if soft_cap else S^T;  mult = cap or 1
        U = where(|kidx - c_q| < r_q, U, NEG / mult)   (masked steps; (128, nch, rows) views)
        mx = max over chunks (one reduce over a (128, rows, nch) view), then over partitions
             (one PE transpose and a free-axis max)
        -m' = min(-m, -mult * mx);  alpha = exp(m - m')
        NM = ones^T (eye_rep * -m')                    (-m'[q] on every partition and chunk)
        P^T = exp(mult * U + NM)                       (unmasked: NM accumulated into S^T's PSUM)
        l = alpha * l + sum_u P^T_u^T 1;  o = alpha * o + (sum_u V_u^T P^T_u)^T   (PSUM
        accumulation; d > 128: o = alpha * o + sum_u P^T_u^T V_u)
    """
    P = B_P_SIZE
    rows = q_slices[0].shape[1]
    nd = len(q_slices)
    nch = width // P
    ncol = nch * rows
    mult = float(soft_cap) if soft_cap is not None else 1.0
    vs = d if v_stride is None else v_stride
    c0 = k0 // P
    # Step 1: S^T in one PSUM tile (ncol <= 512 fp32 columns).
    ps = nl.ndarray((P, ncol), dtype=nl.float32, buffer=nl.psum)
    for u in nl.static_range(nch):
        for k in nl.static_range(nd):
            prod = nisa.nc_matmul(k_slices[k][:, nl.ds(k0 + u * P, P)], q_slices[k])
            if k == 0:
                ps[:, nl.ds(u * rows, rows)] = prod
            else:
                ps[:, nl.ds(u * rows, rows)] += prod
    # Step 2: ALiBi bias, soft-cap and mask on the way out of PSUM (few columns: cheap).
    src = ps
    kk = None
    if alibi is not None or bounds is not None:
        kk = nl.copy(kidx_t[:, nl.ds(c0, nch)], dtype=nl.float32).reshape((P, nch, 1))
    if alibi is not None:
        bias = nl.add(nl.multiply(kk, alibi[0].reshape((P, 1, rows)), dtype=nl.float32),
                      alibi[1].reshape((P, 1, rows)), dtype=nl.float32)
        src = nl.add(ps, bias.reshape((P, ncol)), dtype=nl.float32)
    if soft_cap is not None:
        src = nisa.activation(np.tanh, src, scale=1.0 / mult, dtype=nl.float32)
    if bounds is not None:
        dist = nl.abs(nl.subtract(kk, bounds[0].reshape((P, 1, rows)), dtype=nl.float32),
                      dtype=nl.float32)
        seen = nl.less(dist, bounds[1].reshape((P, 1, rows)))
        src = nl.where(seen.reshape((P, ncol)), src, NEG_MASK / mult, dtype=nl.float32)
    # Step 3: row max over chunks (a (128, rows, nch) view), then over partitions.
    i_p = nl.arange(P)[:, None, None]
    i_q = nl.arange(rows)[None, :, None]
    i_u = nl.arange(nch)[None, None, :]
    red = nisa.tensor_reduce(np.max, src[i_p, i_u * rows + i_q], axis=(2,), dtype=nl.float32)
    red_t = nl.ndarray((rows, P), dtype=nl.float32, buffer=nl.psum)
    red_t[...] = nisa.nc_transpose(red)
    m_tile = nisa.tensor_reduce(np.max, red_t, axis=(1,), dtype=nl.float32, keepdims=True)
    nm_prev = st[:, nl.ds(col0 + d, 1)]
    nm_new = nisa.tensor_scalar(m_tile, np.multiply, -mult, op1=np.minimum, operand1=nm_prev,
                                dtype=nl.float32)
    alpha = nisa.activation(np.exp, nm_prev, bias=nm_new, scale=-1.0, dtype=nl.float32)
    # Step 4: P^T = exp(mult * U - m'), -m' on every partition by ones matmuls: small blocks
    # multiply a repeated identity by -m' (one fp32 matmul); 128-row blocks transpose -m' to a
    # row, split it into two bf16 parts (hi + lo, exact in the fp32 PSUM sum) and add both per
    # chunk; -m' becomes hi + lo everywhere, so the shift stays consistent with alpha.
    fused = bounds is None and soft_cap is None and alibi is None
    if fused:
        nm_bc = ps
    else:
        nm_bc = nl.ndarray((P, ncol), dtype=nl.float32, buffer=nl.psum)
    if "eye_rep" in consts:
        # a select, not a product: a NaN row stays in its own columns (NaN * 0 would not)
        nm_diag = nl.where(consts["eye_rep"][:, nl.ds(0, ncol)], nm_new, 0.0, dtype=nl.float32)
        if fused:
            nm_bc += nisa.nc_matmul(consts["ones_r"], nm_diag)
        else:
            nm_bc[...] = nisa.nc_matmul(consts["ones_r"], nm_diag)
    else:
        nm_row = nl.ndarray((1, rows), dtype=nl.float32, buffer=nl.psum)
        nm_row[...] = nisa.nc_transpose(nm_new)
        hi = nl.copy(nm_row, dtype=nl.bfloat16)
        lo = nl.subtract(nm_row, hi, dtype=nl.bfloat16)
        nm_sum = nl.add(hi, lo, dtype=nl.float32)                        # (1, rows): -m' used
        nm_col = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.psum)
        nm_col[...] = nisa.nc_transpose(nm_sum)
        nm_new = nl.copy(nm_col, dtype=nl.float32)
        alpha = nisa.activation(np.exp, nm_prev, bias=nm_new, scale=-1.0, dtype=nl.float32)
        for u in nl.static_range(nch):
            cols = nl.ds(u * rows, rows)
            if fused:
                nm_bc[:, cols] += nisa.nc_matmul(consts["ones_1"], hi)
            else:
                nm_bc[:, cols] = nisa.nc_matmul(consts["ones_1"], hi)
            nm_bc[:, cols] += nisa.nc_matmul(consts["ones_1"], lo)
    probs_t = nl.ndarray((P, ncol), dtype=kernel_dtype, buffer=nl.sbuf)
    if fused:
        probs_t[...] = nisa.activation(np.exp, ps, dtype=kernel_dtype)
    else:
        z = nl.add(nl.multiply(src, mult, dtype=nl.float32) if mult != 1.0 else src, nm_bc,
                   dtype=nl.float32)
        probs_t[...] = nisa.activation(np.exp, z, dtype=kernel_dtype)
    # Step 5: row sums and PV, accumulated over the chunks in PSUM. With d <= 128, PV is taken
    # as (P V)^T = V^T P^T (V stationary, the few rows moving: half the TensorE cycles of P
    # stationary, d moving) and transposed back once per step.
    rs = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.psum)
    pv_t = d <= P
    if pv_t:
        acc = nl.ndarray((d, rows), dtype=nl.float32, buffer=nl.psum)
    else:
        acc = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
    for u in nl.static_range(nch):
        p_u = probs_t[:, nl.ds(u * rows, rows)]
        s_prod = nisa.nc_matmul(p_u, consts["ones_k"])
        if u == 0:
            rs[...] = s_prod
        else:
            rs += s_prod
        for i, vt in enumerate((v_rows,) if v_overlay is None else (v_rows, v_overlay)):
            v_u = vt[:, nl.ds((c0 + u) * vs, d)]
            prod = nisa.nc_matmul(v_u, p_u) if pv_t else nisa.nc_matmul(p_u, v_u)
            if u == 0 and i == 0:
                acc[...] = prod
            else:
                acc += prod
    if pv_t:
        pv_sb = nl.copy(acc, dtype=nl.float32)
        pv = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
        pv[...] = nisa.nc_transpose(pv_sb)
    else:
        pv = acc
    # Step 6: state update.
    update_state(st, col0, d, alpha=alpha, row_sum=rs, nm_new=nm_new, pv=pv)
