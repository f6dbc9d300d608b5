"""A small single-head causal attention kernel in the legacy NKI style (written for real
``neuronxcc.nki``; no project imports). It strings together the ops the flash paged-attention
kernel family relies on: transposes (nl.transpose, nisa.nc_transpose, nisa.dma_transpose on
gen3), nl.matmul into PSUM with += accumulation, affine_select causal masking,
tensor_reduce, activation_reduce, reciprocal and a per-partition rescale.

Layout: q, k, v are (S, d) HBM tensors with S a multiple of 128 and <= 512 (one PSUM bank of
fp32 scores per query tile) and d <= 128. The output is (S, d) in q's dtype.
"""

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

TILE = 128
NEG = -9984.0


def _transpose_p(p_tile, kernel_dtype):
    """(128, 128) probabilities -> their transpose in SBUF (DMA transpose on gen3 for 2-byte
    dtypes, TensorE through fp32 PSUM otherwise)."""
    if nisa.get_nc_version() == nisa.nc_version.gen3 and np.dtype(kernel_dtype).itemsize == 2:
        p_t = nl.ndarray((TILE, TILE), dtype=kernel_dtype, buffer=nl.sbuf)
        p_t[...] = nisa.dma_transpose(p_tile)
        return p_t
    p_t_psum = nl.ndarray((TILE, TILE), dtype=nl.float32, buffer=nl.psum)
    p_t_psum[...] = nisa.nc_transpose(p_tile)
    return nl.copy(p_t_psum, dtype=kernel_dtype)


@nki.jit
def causal_attention(q, k, v, *, softmax_scale, mixed_precision):
    """softmax(q k^T * scale + causal mask) v for one head; (S, d) in, (S, d) out."""
    seq, head = q.shape
    n_tiles = seq // TILE
    kernel_dtype = nl.bfloat16 if mixed_precision else q.dtype
    out = nl.ndarray((seq, head), dtype=q.dtype, buffer=nl.shared_hbm)

    # K^T (d, S) and V tiles (128, d) stay resident in SBUF
    k_t = nl.ndarray((head, seq), dtype=kernel_dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((TILE, n_tiles * head), dtype=kernel_dtype, buffer=nl.sbuf)
    for j in nl.affine_range(n_tiles):
        k_tile = nl.load(k[nl.ds(j * TILE, TILE), :], dtype=kernel_dtype)
        k_t[:, nl.ds(j * TILE, TILE)] = nl.transpose(k_tile)
        v_sb[:, nl.ds(j * head, head)] = nl.load(v[nl.ds(j * TILE, TILE), :], dtype=kernel_dtype)

    i_p = nl.arange(TILE)[:, None]
    i_f = nl.arange(seq)[None, :]
    for i in nl.affine_range(n_tiles):
        q_tile = nl.load(q[nl.ds(i * TILE, TILE), :])
        q_scaled = nl.multiply(q_tile, softmax_scale, dtype=kernel_dtype)
        q_t = nl.ndarray((head, TILE), dtype=kernel_dtype, buffer=nl.sbuf)
        q_t[...] = nl.transpose(q_scaled)

        scores = nl.ndarray((TILE, seq), dtype=nl.float32, buffer=nl.psum)
        scores[...] = nl.matmul(q_t, k_t, transpose_x=True)
        scores_sb = nl.copy(scores, dtype=nl.float32)          # GpSimd cannot read PSUM
        masked = nisa.affine_select(pred=(i * TILE + i_p >= i_f), on_true_tile=scores_sb,
                                    on_false_value=NEG, dtype=nl.float32)
        row_max = nisa.tensor_reduce(np.max, masked, axis=(1,), dtype=nl.float32, keepdims=True)
        row_sum = nl.ndarray((TILE, 1), dtype=nl.float32, buffer=nl.sbuf)
        probs = nisa.activation_reduce(np.exp, masked, bias=-1.0 * row_max, scale=1.0,
                                       reduce_op=nl.add, reduce_res=row_sum, dtype=kernel_dtype)

        acc = nl.zeros((TILE, head), dtype=nl.float32, buffer=nl.psum)
        for j in nl.affine_range(n_tiles):
            p_t = _transpose_p(probs[:, nl.ds(j * TILE, TILE)], kernel_dtype)
            acc += nl.matmul(p_t, v_sb[:, nl.ds(j * head, head)], transpose_x=True)

        inv = nisa.reciprocal(row_sum)
        nl.store(out[nl.ds(i * TILE, TILE), :], value=nl.multiply(acc, inv, dtype=q.dtype))
    return out
