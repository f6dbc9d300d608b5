"""Online-softmax step of the scheduled kernel: one Q block against <= 2048 keys of a KV tile.

Device code (legacy NKI). Query rows are on partitions (``rows`` <= 128: a decode block packs
the G query heads x new tokens of ONE sequence; a prefill block is 128 rows), keys on the free
axis. Compared with ``nki_kernels.flash_core`` this step reads the scores straight from PSUM
when no mask is needed, builds a mask from two fp32 numbers per row when one is, supports head
sizes up to 512 (QK^T accumulated over 128-channel slices in PSUM) and an optional logit
soft-cap, and keeps the state of a block as ``d + 2`` fp32 columns of one SBUF tile.

State columns of a block (``st[:, col0 : col0 + d + 2]``, fp32): o (d, un-normalised output),
-m (negated running max), l (running sum of exp(s - m)). Masked scores become
NEG_MASK / mult (mult = soft-cap or 1) so that exp(mult * NEG - m) is exactly 0 for every row
(``nki_kernels.constants``: m starts at M_FLOOR > NEG_MASK).
"""

from __future__ import annotations

import numpy as np

from nki_kernels._nki import nl, nisa
from nki_kernels.constants import B_F_SIZE, B_P_SIZE, NEG_MASK
from nki_kernels.tile_ops import pe_transpose_blocks


def key_index_tile(rows, loads, tiled_block_size):
    """SBUF fp32 ``(rows, W)``, W = loads*128*b': column ``c = l*128*b' + s*128 + p`` holds the
    tile-local key index ``(l*128 + p)*b' + s`` of the key it carries (same on every row)."""
    bp = tiled_block_size
    W = loads * B_P_SIZE * bp
    kidx = nl.ndarray((rows, W), dtype=nl.float32, buffer=nl.sbuf)
    i_r = nl.arange(rows)[:, None]
    i_f = nl.arange(B_P_SIZE)[None, :]
    for l in nl.static_range(loads):
        for s in nl.static_range(bp):
            kidx[:, nl.ds(l * B_P_SIZE * bp + s * B_P_SIZE, B_P_SIZE)] = nisa.iota(
                i_r * 0 + i_f * bp + (l * B_P_SIZE * bp + s), dtype=nl.float32)
    return kidx


def flash_step(q_slices, k_slices, v_rows, st, col0, d, *, k0, width, kidx, bounds,
               kernel_dtype, soft_cap=None, p_evac=None, v_stride=None, alibi=None,
               one_sided=False, v_overlay=None, tiled_block_size=None):
    """Fold keys ``[k0, k0 + width)`` of the tile into one block's state.

    Args:
        q_slices: nd SBUF tiles ``(dk, rows)`` kernel_dtype: Q^T of the block, pre-scaled by the
            softmax scale (channel slice k holds channels [128k, 128k + dk)).
        k_slices: nd SBUF tiles ``(dk, W)``: K^T of the tile (column order of ``key_index_tile``).
        v_rows: SBUF ``(128, ...)``: V chunk u (keys ``u*128 + p`` in column order) at columns
            ``[u*v_stride, u*v_stride + d)``.
        st: SBUF ``(rows, ...)`` fp32 state tile; this block's columns start at ``col0``.
        d: value head size (columns of o; the key head size is that of q / k slices).
        k0, width: first key column and width (multiples of 512, width <= 2048).
        kidx: ``key_index_tile`` (masked steps) or None.
        bounds: None (no mask) or ``(c, r)``, two ``(rows, 1)`` fp32 tiles: row i sees tile-local
            key t iff ``|t - c_i| < r_i``.
        kernel_dtype: matmul-input / probability dtype.  soft_cap: None or c > 0.
        p_evac: engine(s) of the P^T PSUM -> SBUF copies (``pe_transpose_blocks``).
        v_stride: columns between V chunks (default d; e.g. an MLA entry size when K and V are
            the same gathered rows).
        one_sided: every row's visible range starts at or before this tile (no sliding window):
            the mask is ``t < c + r + 1/2`` (one ScalarE pass instead of |t - c| and a compare).
        v_overlay: None or a second V tile of ``v_rows``' layout, added into every PV product.
        tiled_block_size: b' of the tile's rows (K^T column ``l*128*b' + s*128 + p`` is key
            ``(l*128 + p)*b' + s``). Given on NeuronCore-v3, a masked step selects and takes the
            row max in ONE VectorE pass per 128-key block (``nisa.range_select``: in each block
            the keys a row sees are an interval of p) instead of a distance pass, a select pass
            and a max pass.
        alibi: None or ``(slope, off)``, two ``(rows, 1)`` fp32 tiles: scores get
            ``slope * t + off`` added (t = tile-local key index from ``kidx``), before the soft-cap.

    Pseudocode:
        S = q^T k  (PSUM, 512 columns per chunk; summed over channel slices)
        S = S + slope * kidx + off                                    (ALiBi only)
        U = tanh(S / cap) if soft_cap else S;  mult = cap or 1        (score = mult * U)
        U = where(|kidx - c| < r, U, NEG_MASK / mult)                 (masked steps only;
                                                                       one-sided: kidx < c + r + 1/2;
                                                                       v3: range_select, fp32.min)
        -m' = min(-m, -mult * rowmax(U));  alpha = exp(m - m')
        P = exp(mult * U - m') (kernel dtype), rs = rowsum (fp32)     [ScalarE, fused]
        l = alpha * l + rs;  o = alpha * o + P V  (P^T by PE transposes, PV accumulated in PSUM)
    """
    rows = q_slices[0].shape[1]
    nd = len(q_slices)
    n_c = width // B_F_SIZE
    mult = float(soft_cap) if soft_cap is not None else 1.0
    # Step 1: scores per 512-column chunk in PSUM (fp32).
    src = []
    for c in nl.static_range(n_c):
        ps = nl.ndarray((rows, B_F_SIZE), dtype=nl.float32, buffer=nl.psum)
        for k in nl.static_range(nd):      # the first slice starts the PSUM accumulation
            prod = nisa.nc_matmul(q_slices[k], k_slices[k][:, nl.ds(k0 + c * B_F_SIZE, B_F_SIZE)])
            if k == 0:
                ps[...] = prod
            else:
                ps += prod
        src.append(ps)
    # Step 2: optional ALiBi bias (ScalarE + VectorE pass), soft-cap (one ScalarE pass) and mask
    # (ScalarE |t - c| + 2 VectorE passes).
    if alibi is not None:
        bias = nisa.activation(np.copy, kidx[:, nl.ds(k0, width)], scale=alibi[0], bias=alibi[1],
                               dtype=nl.float32)
        src = [nl.add(src[c], bias[:, nl.ds(c * B_F_SIZE, B_F_SIZE)], dtype=nl.float32)
               for c in range(n_c)]
    n_k = width // B_P_SIZE
    ranged = (bounds is not None and tiled_block_size is not None
              and nisa.get_nc_version() == nisa.nc_version.gen3)
    mx = None
    if ranged:
        src, mx = _range_masked(src, bounds, kidx, k0, n_k, rows, tiled_block_size, soft_cap)
    elif soft_cap is not None or bounds is not None:
        if bounds is not None and one_sided:
            # every row's range starts at or before the tile (no window): t < hi = c + r + 1/2,
            # i.e. relu(c + r - t) > 0 for integer t -- one ScalarE pass, a float predicate
            top = nl.add(bounds[0], bounds[1], dtype=nl.float32)
            seen = nisa.activation(nl.relu, kidx[:, nl.ds(k0, width)], bias=top, scale=-1.0,
                                   dtype=nl.float32)
        elif bounds is not None:
            neg_c = nisa.tensor_scalar(bounds[0], np.multiply, -1.0, dtype=nl.float32)
            dist = nisa.activation(np.abs, kidx[:, nl.ds(k0, width)], bias=neg_c, scale=1.0,
                                   dtype=nl.float32)
            seen = nl.less(dist, bounds[1])
        vals = []
        for c in nl.static_range(n_c):
            u = src[c]
            if soft_cap is not None:
                u = nisa.activation(np.tanh, u, scale=1.0 / mult, dtype=nl.float32)
            if bounds is not None:
                u = nl.where(seen[:, nl.ds(c * B_F_SIZE, B_F_SIZE)], u, NEG_MASK / mult,
                             dtype=nl.float32)
            vals.append(u)
        src = vals
    # Step 3: running max (kept negated) and the rescale factor.
    if mx is None:
        mx = nl.ndarray((rows, n_c), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.static_range(n_c):
            mx[:, nl.ds(c, 1)] = nisa.tensor_reduce(np.max, src[c], axis=(1,), dtype=nl.float32,
                                                    keepdims=True)
    m_tile = nisa.tensor_reduce(np.max, mx, axis=(1,), dtype=nl.float32, keepdims=True)
    nm_prev = st[:, nl.ds(col0 + d, 1)]
    nm_new = nisa.tensor_scalar(m_tile, np.multiply, -mult, op1=np.minimum, operand1=nm_prev,
                                dtype=nl.float32)
    alpha = nisa.activation(np.exp, nm_prev, bias=nm_new, scale=-1.0, dtype=nl.float32)
    # Step 4: probabilities and their row sums in one ScalarE pass per chunk.
    probs = nl.ndarray((rows, width), dtype=kernel_dtype, buffer=nl.sbuf)
    rs = nl.ndarray((rows, n_c), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.static_range(n_c):
        probs[:, nl.ds(c * B_F_SIZE, B_F_SIZE)] = nisa.activation_reduce(
            np.exp, src[c], bias=nm_new, scale=mult, reduce_op=np.add,
            reduce_res=rs[:, nl.ds(c, 1)], dtype=kernel_dtype)
    row_sum = nisa.tensor_reduce(np.add, rs, axis=(1,), dtype=nl.float32, keepdims=True)
    # Step 5: P^T (keys on partitions; 128-key chunk u at columns [u*rows, (u+1)*rows)), then
    # P V accumulated over the chunks in one PSUM tile.
    probs_t = nl.ndarray((B_P_SIZE, n_k * rows), dtype=kernel_dtype, buffer=nl.sbuf)
    pe_transpose_blocks(probs_t, 0, probs, 0, B_P_SIZE, n_k, evac_engine=p_evac)
    pv = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
    u0 = k0 // B_P_SIZE
    vs = d if v_stride is None else v_stride
    v_tiles = (v_rows,) if v_overlay is None else (v_rows, v_overlay)
    for u in nl.static_range(n_k):     # the first product starts the PSUM accumulation
        for i, vt in enumerate(v_tiles):
            prod = nisa.nc_matmul(probs_t[:, nl.ds(u * rows, rows)], vt[:, nl.ds((u0 + u) * vs, d)])
            if u == 0 and i == 0:
                pv[...] = prod
            else:
                pv += prod
    # Step 6: state update.
    update_state(st, col0, d, alpha=alpha, row_sum=row_sum, nm_new=nm_new, pv=pv)


def _range_masked(src, bounds, kidx, k0, n_k, rows, bp, soft_cap):
    """NeuronCore-v3 masked step: per 128-key block i of the step (K^T columns
    ``[k0 + 128i, +128)``, keys ``kidx0_i + p*b'``, p < 128), row q sees p iff
    ``lo_q <= kidx0_i + p*b' < hi_q``, i.e. ``(lo_q - kidx0_i)/b' <= p < (hi_q - kidx0_i)/b'``
    (exact in fp32: integers and a power-of-two divisor): one ``range_select`` keeps those
    scores (fp32.min elsewhere) and reduces the block's row max. Returns the masked scores, one
    SBUF tile per 512-key chunk, and the (rows, n_k) block maxima."""
    mult = float(soft_cap) if soft_cap is not None else 1.0
    i_r = nl.arange(rows)[:, None]
    i_b = nl.arange(n_k)[None, :]
    kb = kidx[i_r, k0 + i_b * B_P_SIZE]                       # key index at p = 0 of block i
    lo = nisa.tensor_scalar(bounds[0], np.subtract, bounds[1], op1=np.add, operand1=0.5,
                            dtype=nl.float32)                # c - r + 1/2: first key seen
    hi = nisa.tensor_scalar(bounds[0], np.add, bounds[1], op1=np.add, operand1=0.5,
                            dtype=nl.float32)                # c + r + 1/2: first key not seen
    b0 = nisa.tensor_scalar(kb, np.subtract, lo, reverse0=True, op1=np.multiply,
                            operand1=1.0 / bp, dtype=nl.float32)
    b1 = nisa.tensor_scalar(kb, np.subtract, hi, reverse0=True, op1=np.multiply,
                            operand1=1.0 / bp, dtype=nl.float32)
    per = B_F_SIZE // B_P_SIZE
    mx = nl.ndarray((rows, n_k), dtype=nl.float32, buffer=nl.sbuf)
    vals = []
    for c in nl.static_range(len(src)):
        u = src[c]
        if soft_cap is not None:
            u = nisa.activation(np.tanh, u, scale=1.0 / mult, dtype=nl.float32)
        out = nl.ndarray((rows, B_F_SIZE), dtype=nl.float32, buffer=nl.sbuf)
        for i4 in nl.static_range(per):
            i = c * per + i4
            out[:, nl.ds(i4 * B_P_SIZE, B_P_SIZE)] = nisa.range_select(
                on_true_tile=u[:, nl.ds(i4 * B_P_SIZE, B_P_SIZE)], comp_op0=np.greater_equal,
                comp_op1=np.less, bound0=b0[:, nl.ds(i, 1)], bound1=b1[:, nl.ds(i, 1)],
                reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=mx[:, nl.ds(i, 1)],
                reduce_op=np.amax, range_start=0, on_false_value=nl.fp32.min, dtype=nl.float32)
        vals.append(out)
    return vals, mx


def update_state(st, col0, d, *, alpha, row_sum, nm_new, pv):
    """``l = alpha * l + row_sum``, ``-m = nm_new``, ``o = alpha * o + pv`` for one block's state
    columns ``st[:, col0 : col0 + d + 2]`` (o, -m, l; fp32; rows on partitions)."""
    l_col = st[:, nl.ds(col0 + d + 1, 1)]
    st[:, nl.ds(col0 + d + 1, 1)] = nisa.tensor_scalar(l_col, np.multiply, alpha, op1=np.add,
                                                       operand1=row_sum, dtype=nl.float32)
    st[:, nl.ds(col0 + d, 1)] = nl.copy(nm_new, dtype=nl.float32)
    o_view = st[:, nl.ds(col0, d)]
    st[:, nl.ds(col0, d)] = nl.add(nl.multiply(o_view, alpha, dtype=nl.float32), pv,
                                   dtype=nl.float32)
