"""Online-softmax (flash attention) update of one 128-row Q tile against one KV tile.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first).

Dimensions:
    P = 128  query rows per Q tile (partitions)       d   head size (<= 128)
    W        KV tile width (keys), a multiple of 128  F = 512 score columns per PSUM bank

State per (Q tile, query head) "slot" s, kept in SBUF across KV tiles (all rows on partitions):
    nm_buf[:, s]          NEGATED running row max -m of the masked, scaled scores (fp32); kept
                          negated because -m is the bias of every exp()
    l_buf[:, s]           running row sum of exp(score - m) (fp32; plain sum, not log-sum-exp)
    o_buf[:, s*w:(s+1)*w] (w = d + 1) running un-normalised output sum_k exp(score_k - m) v_k
                          (acc dtype) in columns 0 .. d-1, and in column d the same sum of the
                          keys' fault flags (``nki_kernels.dense.finite``): > 0 iff the row
                          saw a key whose K or V was not finite
Initial state (set by the caller): nm = -M_FLOOR, l = 0, o = 0. Final output: o / max(l, L_FLOOR),
NaN in every row whose fault column is > 0.
See ``nki_kernels.constants`` for why masked scores use NEG_MASK with m starting at M_FLOOR:
masked keys contribute exactly 0, an all-masked tile changes nothing, and a row masked
everywhere ends with o = l = 0 (output exactly 0).
"""

from __future__ import annotations

from nki_kernels.constants import B_F_SIZE, B_P_SIZE, NEG_MASK, STEP_KEYS
from nki_kernels.dense.finite import value_stride
from nki_kernels.tile_ops import transpose_blocks


def flash_attention_tile(ops, q_tile, k_tile, v_tile, mask_tile, o_buf, nm_buf, l_buf, slot, *,
                         k_start, width, kernel_dtype, use_dma_transpose):
    """One online-softmax step: fold keys ``[k_start, k_start + width)`` into slot ``slot``.

    Args:
        ops: the op layer.
        q_tile: SBUF ``(d, 128)`` kernel_dtype, already multiplied by the softmax scale
            (column r = query row r of the Q tile).
        k_tile: SBUF ``(d, >= k_start + width)`` kernel_dtype; column c = key c.
        v_tile: SBUF ``(128, ...)`` kernel_dtype, the layout of ``finite.finite_values``: columns
            ``[(c//128)*w, (c//128)*w + d)`` at partition ``c % 128`` hold the value of key c
            (w = d + 1), column ``(c//128)*w + d`` its fault flag.
        mask_tile: SBUF ``(128, >= width)`` bool / uint8 (a tile or a column slice of one);
            ``mask_tile[r, c]`` = row r may see key k_start + c.
        o_buf, nm_buf, l_buf: SBUF state tiles (module docstring; o_buf's slots d + 1 wide),
            updated in place.
        slot: state slot index (int or loop expression).
        k_start: first key (Python int, multiple of 128).
        width: W (Python int, multiple of 128, <= STEP_KEYS: bounds the per-step SBUF tiles).
        kernel_dtype: matmul-input / probability dtype (bf16 in mixed precision).
        use_dma_transpose: transpose P on the DMA engines (NeuronCore-v3, 2-byte dtypes)
            instead of TensorE transposes through PSUM (NeuronCore-v2, or 4-byte dtypes).

    Pseudocode:
        S[:, c] = where(mask, q^T k_c, NEG_MASK)          per 512-column PSUM chunk (fp32)
        nm_new = -max(m, rowmax(S)) = min(nm, -rowmax(S)); alpha = exp(nm_new - nm)
        Pr = exp(S + nm_new) (kernel_dtype), rs = rowsum(exp(S + nm_new)) (fp32)  [ScalarE, fused]
        l = alpha*l + rs;  nm = nm_new
        P^T in 128x128 blocks (DMA or PE transpose)
        o = alpha*o + sum_k P^T_k^T [V_k | fault_k]       (PSUM accumulation over 128-key chunks)
    """
    P = B_P_SIZE
    d = q_tile.shape[0]
    assert width % P == 0 and width <= STEP_KEYS, f"internal: step width {width}"
    f32 = ops.float32
    acc_dtype = o_buf.dtype

    # Step 1: masked scores (fp32, SBUF), 512 columns (one PSUM bank) per matmul, then the row
    # max. Legacy API: a select per chunk and one tensor_reduce over the step, as vLLM
    # (nisa.select_reduce would fuse them on gen3 but only exists from SDK 2.26 and is reported
    # wrong on trn1); current API: each chunk's select also takes its chunk's row max
    # (ops.where_max), so only the few chunk maxima are reduced.
    scores = ops.sbuf((P, width), f32)
    n_full, tail = divmod(width, B_F_SIZE)
    n_chunks = n_full + (1 if tail else 0)
    chunk_max = ops.sbuf((P, n_chunks), f32) if ops.has_select_max() else None
    for c in ops.parallel_range(n_full):
        _masked_scores(ops, scores, q_tile, k_tile, mask_tile, k_start, c * B_F_SIZE, B_F_SIZE,
                       None if chunk_max is None else chunk_max[:, ops.ds(c, 1)])
    if tail:
        _masked_scores(ops, scores, q_tile, k_tile, mask_tile, k_start, n_full * B_F_SIZE, tail,
                       None if chunk_max is None else chunk_max[:, ops.ds(n_full, 1)])
    m_tile = ops.sbuf((P, 1), f32)
    ops.tensor_reduce(m_tile, "max", scores if chunk_max is None else chunk_max, axis=(1,),
                      keepdims=True)

    # Step 2: running max (kept negated: nm = -m feeds the exp biases directly) and the
    # rescale factor alpha = exp(m_prev - m_new) = exp(nm_new - nm_prev).
    nm_prev = nm_buf[:, ops.ds(slot, 1)]
    nm_new = ops.sbuf((P, 1), f32)
    ops.tensor_scalar(nm_new, m_tile, "multiply", -1.0, op1="minimum", operand1=nm_prev)
    alpha = ops.sbuf((P, 1), f32)
    ops.activation(alpha, "exp", nm_prev, bias=nm_new, scale=-1.0)

    # Step 3: P = exp(S + nm_new) and its row sums in one ScalarE pass.
    row_sum = ops.sbuf((P, 1), f32)
    probs = ops.sbuf((P, width), kernel_dtype)
    ops.activation(probs, "exp", scores, bias=nm_new, row_sum=row_sum)

    # Step 4: P^T (keys on partitions), 128x128 blocks.
    n_k = width // P
    probs_t = ops.sbuf((P, width), kernel_dtype)
    if use_dma_transpose and ops.has_sbuf_dma_transpose(kernel_dtype):
        ops.transpose_on_dma(probs_t, 0, probs, 0, n_k)      # one DMA for every block
    elif use_dma_transpose:
        for k in ops.parallel_range(n_k):
            ops.dma_transpose_block(probs_t[:, ops.ds(k * P, P)], probs[:, ops.ds(k * P, P)])
    else:
        transpose_blocks(ops, probs_t, 0, probs, 0, P, n_k, evac="scalar")

    # Step 5: P [V | fault] over 128-key chunks, accumulated in one PSUM tile (the fault column
    # is one more moving column: a row's sum of the probabilities of the faulty keys it saw).
    w = value_stride(d)
    v_col = (k_start // P) * w
    pv = ops.psum((P, w), f32)
    for k in ops.static_range(n_k):
        ops.matmul(pv, probs_t[:, ops.ds(k * P, P)], v_tile[:, ops.ds(v_col + k * w, w)],
                   accumulate=k > 0)

    # l = alpha * l + rowsum;  nm = nm_new;  o = alpha * o + P V.
    l_col = l_buf[:, ops.ds(slot, 1)]
    ops.tensor_scalar(l_col, l_col, "multiply", alpha, op1="add", operand1=row_sum)
    ops.copy(nm_buf[:, ops.ds(slot, 1)], nm_new)
    o_view = o_buf[:, ops.ds(slot * w, w)]
    scaled = ops.sbuf((P, w), acc_dtype)
    ops.tensor_tensor(scaled, o_view, alpha, "multiply")
    ops.tensor_tensor(o_view, scaled, pv, "add")


def _masked_scores(ops, scores, q_tile, k_tile, mask_tile, k_start, c0, cw, row_max=None):
    """``scores[:, c0:c0+cw] = where(mask[:, c0:c0+cw], q^T k[:, k_start+c0 : +cw], NEG_MASK)``;
    ``row_max`` (P, 1) fp32 or None: also the max of each row of those columns (ops.where_max)."""
    s_psum = ops.psum((B_P_SIZE, cw), ops.float32)
    ops.matmul(s_psum, q_tile, k_tile[:, ops.ds(k_start + c0, cw)])
    dst, pred = scores[:, ops.ds(c0, cw)], mask_tile[:, ops.ds(c0, cw)]
    if row_max is None:
        ops.where(dst, pred, s_psum, NEG_MASK)
    else:
        ops.where_max(dst, pred, s_psum, NEG_MASK, row_max)
