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
from nki_kernels.constants import B_F_SIZE, B_P_SIZE, NEG_MASK
from nki_kernels.tile_ops import pe_transpose_blocks


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


def decode_step(q_slices, k_slices, v_rows, st, col0, d, *, k0, width, kidx_t, bounds,
                kernel_dtype, soft_cap=None, v_stride=None):
    """Fold keys ``[k0, k0 + width)`` of the tile into a decode block's state (keys on partitions).

    Args:
        q_slices: nd SBUF tiles ``(dk, rows)`` kernel dtype: the block's Q^T, pre-scaled.
        k_slices: nd SBUF tiles ``(dk, W)``: K^T of the tile.
        v_rows: SBUF ``(128, ...)``: V chunk u at columns ``[u*v_stride, u*v_stride + d)``.
        st: SBUF fp32 state tile (rows on partitions); this block's columns start at ``col0``.
        d: value head size.  k0, width: first key column and width (multiples of 128).
        kidx_t: ``key_index_columns`` (masked steps) or None.
        bounds: None (no mask) or ``(c, r)``: two ``(128, rows)`` fp32 tiles (module docstring).
        kernel_dtype: matmul-input / probability dtype.  soft_cap: None or c > 0.

    Pseudocode:
        S^T[:, u*rows:(u+1)*rows] = K_u Q^T            (stationary K^T chunk, moving Q^T)
        U = tanh(S^T / cap) if soft_cap else S^T;  mult = cap or 1
        U = where(|kidx - c_q| < r_q, U, NEG / mult)   (masked steps; (128, nch, rows) views)
        mx = max over chunks (halving tree) then over partitions (one PE transpose)
        -m' = min(-m, -mult * mx);  alpha = exp(m - m')
        P^T = exp(mult * U - m'[q])   (-m' broadcast to every partition by a ones matmul)
        l = alpha * l + sum_k P^T (ones matmul);  o = alpha * o + sum_u P^T_u^T V_u
    """
    P = B_P_SIZE
    rows = q_slices[0].shape[1]
    nd = len(q_slices)
    nch = width // P
    ncol = nch * rows
    mult = float(soft_cap) if soft_cap is not None else 1.0
    vs = d if v_stride is None else v_stride
    c0 = k0 // P
    # Step 1: S^T, up to 512 fp32 columns per PSUM tile.
    per_ps = max(1, B_F_SIZE // rows)
    src = nl.ndarray((P, ncol), dtype=nl.float32, buffer=nl.sbuf)
    for g0 in range(0, nch, per_ps):          # static (Python) loops: shapes differ
        n = min(per_ps, nch - g0)
        ps = nl.ndarray((P, n * rows), dtype=nl.float32, buffer=nl.psum)
        for u in nl.static_range(n):
            for k in nl.static_range(nd):
                prod = nisa.nc_matmul(k_slices[k][:, nl.ds(k0 + (g0 + u) * P, P)], q_slices[k])
                if k == 0:
                    ps[:, nl.ds(u * rows, rows)] = prod
                else:
                    ps[:, nl.ds(u * rows, rows)] += prod
        # Step 2: soft-cap and mask on the way out of PSUM (few columns: cheap).
        u_t = ps
        if soft_cap is not None:
            u_t = nisa.activation(np.tanh, ps, scale=1.0 / mult, dtype=nl.float32)
        if bounds is not None:
            kk = nl.copy(kidx_t[:, nl.ds(c0 + g0, n)], dtype=nl.float32).reshape((P, n, 1))
            cq = bounds[0].reshape((P, 1, rows))
            rq = bounds[1].reshape((P, 1, rows))
            dist = nl.abs(nl.subtract(kk, cq, dtype=nl.float32), dtype=nl.float32)
            seen = nl.less(dist, rq)
            src[:, nl.ds(g0 * rows, n * rows)] = nl.where(
                seen.reshape((P, n * rows)), u_t, NEG_MASK / mult, dtype=nl.float32)
        else:
            src[:, nl.ds(g0 * rows, n * rows)] = nl.copy(u_t, dtype=nl.float32)
    # Step 3: row max: halving tree over the chunks (contiguous halves), then a PE transpose
    # (128, rows) -> (rows, 128) and a free-axis max.
    red = src
    n = nch
    while n > 1:
        h = n // 2
        nxt = nl.ndarray((P, h * rows), dtype=nl.float32, buffer=nl.sbuf)
        nxt[...] = nl.maximum(red[:, nl.ds(0, h * rows)], red[:, nl.ds(h * rows, h * rows)],
                              dtype=nl.float32)
        red = nxt
        n = h
    red_t = nl.ndarray((rows, P), dtype=nl.float32, buffer=nl.psum)
    red_t[...] = nisa.nc_transpose(red[:, nl.ds(0, rows)])
    m_tile = nisa.tensor_reduce(np.max, red_t, axis=(1,), dtype=nl.float32, keepdims=True)
    nm_prev = st[:, nl.ds(col0 + d, 1)]
    nm_new = nisa.tensor_scalar(m_tile, np.multiply, -mult, op1=np.minimum, operand1=nm_prev,
                                dtype=nl.float32)
    alpha = nisa.activation(np.exp, nm_prev, bias=nm_new, scale=-1.0, dtype=nl.float32)
    # Step 4: -m' as a row (1, rows), repeated over the chunks (doubling copies), broadcast to
    # all 128 partitions by a ones matmul; P^T = exp(mult * U - m') in the kernel dtype.
    nm_row_ps = nl.ndarray((1, rows), dtype=nl.float32, buffer=nl.psum)
    nm_row_ps[...] = nisa.nc_transpose(nm_new)
    nm_rep = nl.ndarray((1, ncol), dtype=nl.float32, buffer=nl.sbuf)
    nm_rep[:, nl.ds(0, rows)] = nl.copy(nm_row_ps, dtype=nl.float32)
    n = 1
    while n < nch:
        c = min(n, nch - n)
        nm_rep[:, nl.ds(n * rows, c * rows)] = nl.copy(nm_rep[:, nl.ds(0, c * rows)],
                                                       dtype=nl.float32)
        n += c
    ones_row = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)
    ones_row[...] = nisa.memset((1, P), 1.0, dtype=nl.float32)
    probs_t = nl.ndarray((P, ncol), dtype=kernel_dtype, buffer=nl.sbuf)
    for g0 in range(0, ncol, B_F_SIZE):
        w = min(B_F_SIZE, ncol - g0)
        nm_bc = nl.ndarray((P, w), dtype=nl.float32, buffer=nl.psum)
        nm_bc[...] = nisa.nc_matmul(ones_row, nm_rep[:, nl.ds(g0, w)])
        z = nl.add(nl.multiply(src[:, nl.ds(g0, w)], mult, dtype=nl.float32), nm_bc,
                   dtype=nl.float32) if mult != 1.0 else nl.add(src[:, nl.ds(g0, w)], nm_bc,
                                                               dtype=nl.float32)
        probs_t[:, nl.ds(g0, w)] = nisa.activation(np.exp, z, dtype=kernel_dtype)
    # Step 5: row sums (ones matmul over the key partitions, then a tree over the chunks) and PV.
    ones_col = nl.ndarray((P, 1), dtype=kernel_dtype, buffer=nl.sbuf)
    ones_col[...] = nisa.memset((P, 1), 1.0, dtype=kernel_dtype)
    sums = nl.ndarray((1, ncol), dtype=nl.float32, buffer=nl.sbuf)
    for g0 in range(0, ncol, B_F_SIZE):
        w = min(B_F_SIZE, ncol - g0)
        s_ps = nl.ndarray((1, w), dtype=nl.float32, buffer=nl.psum)
        s_ps[...] = nisa.nc_matmul(ones_col, probs_t[:, nl.ds(g0, w)])
        sums[:, nl.ds(g0, w)] = nl.copy(s_ps, dtype=nl.float32)
    n = nch
    while n > 1:
        h = n // 2
        sums[:, nl.ds(0, h * rows)] = nl.add(sums[:, nl.ds(0, h * rows)],
                                             sums[:, nl.ds(h * rows, h * rows)], dtype=nl.float32)
        n = h
    rs_ps = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.psum)
    rs_ps[...] = nisa.nc_transpose(sums[:, nl.ds(0, rows)])
    pv = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
    for u in nl.static_range(nch):
        prod = nisa.nc_matmul(probs_t[:, nl.ds(u * rows, rows)], v_rows[:, nl.ds((c0 + u) * vs, d)])
        if u == 0:
            pv[...] = prod
        else:
            pv += prod
    # Step 6: state update.
    l_col = st[:, nl.ds(col0 + d + 1, 1)]
    st[:, nl.ds(col0 + d + 1, 1)] = nisa.tensor_scalar(l_col, np.multiply, alpha, op1=np.add,
                                                       operand1=rs_ps, dtype=nl.float32)
    st[:, nl.ds(col0 + d, 1)] = nl.copy(nm_new, dtype=nl.float32)
    o_view = st[:, nl.ds(col0, d)]
    st[:, nl.ds(col0, d)] = nl.add(nl.multiply(o_view, alpha, dtype=nl.float32), pv,
                                   dtype=nl.float32)
