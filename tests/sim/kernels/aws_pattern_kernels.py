"""Small legacy-NKI kernels (written for this suite, for real ``neuronxcc.nki``; no project
imports) that use the constructs AWS's public legacy kernels rely on -- nki-samples' flash
attention forward / backward, the SD-attention tutorial and vLLM's flash paged attention --
so the simulator keeps accepting them at its default settings:

* block dimensions in front of ``par_dim`` on SBUF accumulators and index tiles (accepted up
  to SDK 2.22, deprecated with a warning from 2.23; nki_sim/README.md rule 1);
* a column ``acc[:, i]`` of a (128, n) tile, or a block ``acc[i, g]``, passed to a helper
  that reads and writes it as ``[:, 0]`` (on-chip views stay 2-D);
* ``nisa.affine_select`` whose ``on_true_tile`` is the PSUM matmul result;
* ``shared_hbm`` outputs created under ``if <trace-time constant>:`` (a training / debug flag).

Layouts are given per kernel; every kernel is small enough to simulate in well under a second.
"""

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

P = 128          # partitions / query rows per tile
NEG = -9984.0    # masked score (finite, like AWS's kernels)


# ----------------------------------------------------------------------------- flash forward
def _scores_step(q_t, k_t, v_blk, o_acc, m_acc, lse_col, *, q_idx, kv_idx, kv_tile, chunk, causal):
    """One (128 query rows) x (kv_tile keys) step of the online softmax.

    q_t (d, 128) scaled queries, k_t (d, kv_tile), v_blk (kv_tile // 128, par_dim(128), d);
    o_acc (128, d) and m_acc (128, 1) are views of block-dim accumulators, lse_col (128, 1) a
    column of the (128, n_q) running log-sum-exp tile. All three are updated in place.
    """
    d = q_t.shape[0]
    n_chunks = kv_tile // chunk
    scores = nl.ndarray((par_dim(P), kv_tile), dtype=nl.float32, buffer=nl.sbuf)
    chunk_max = nl.ndarray((par_dim(P), n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.affine_range(n_chunks):
        s_psum = nl.ndarray((par_dim(P), chunk), dtype=nl.float32, buffer=nl.psum)
        s_psum[...] = nl.matmul(q_t, k_t[:, nl.ds(c * chunk, chunk)], transpose_x=True)
        if causal:
            rows, cols = nl.mgrid[0:P, 0:chunk]
            keep = q_idx * P + rows >= kv_idx * kv_tile + c * chunk + cols
            scores[:, nl.ds(c * chunk, chunk)] = nisa.affine_select(
                pred=keep, on_true_tile=s_psum, on_false_value=NEG, dtype=nl.float32)
        else:
            scores[:, nl.ds(c * chunk, chunk)] = nl.copy(s_psum, dtype=nl.float32)
        chunk_max[:, c] = nisa.tensor_reduce(np.max, scores[:, nl.ds(c * chunk, chunk)], axis=(1,),
                                             dtype=nl.float32)

    m_old = nl.copy(m_acc[:, 0])
    m_acc[:, 0] = nl.maximum(m_old, nisa.tensor_reduce(np.max, chunk_max, axis=(1,), dtype=nl.float32))
    m_new = m_acc[:, 0]
    alpha = nisa.activation(np.exp, m_old, bias=-1.0 * m_new, scale=1.0)     # exp(m_old - m_new)

    probs = nl.ndarray((par_dim(P), kv_tile), dtype=nl.float32, buffer=nl.sbuf)
    row_sum = nl.ndarray((par_dim(P), 1), dtype=nl.float32, buffer=nl.sbuf)
    probs[...] = nisa.activation_reduce(np.exp, scores, bias=-1.0 * m_new, scale=1.0,
                                        reduce_op=nl.add, reduce_res=row_sum[:, 0], dtype=nl.float32)

    pv = nl.zeros((par_dim(P), d), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(kv_tile // P):
        p_t_psum = nl.ndarray((par_dim(P), P), dtype=nl.float32, buffer=nl.psum)
        p_t_psum[...] = nisa.nc_transpose(probs[:, nl.ds(t * P, P)])
        p_t = nl.copy(p_t_psum, dtype=nl.float32)
        pv[...] += nl.matmul(p_t, v_blk[t, :, :], transpose_x=True)
    o_acc[...] = nl.add(nl.multiply(o_acc, alpha), pv)

    # lse <- m_new + log(exp(lse - m_new) + row_sum)
    carried = nisa.activation(np.exp, lse_col[:, 0], bias=-1.0 * m_new, scale=1.0)
    lse_col[:, 0] = nl.add(m_new, nl.log(nl.add(carried, row_sum)))


@nki.jit
def flash_fwd_pattern(q, k, v, *, causal, with_lse, kv_tile=256, chunk=128):
    """Attention forward with an online softmax, flash_fwd-style.

    q (b, h, d, sq) and k (b, h, d, sk) head-dim major, v (b, h, sk, d); grid [b, h].
    Returns o (b, h, sq, d); with ``with_lse`` also lse (b, h, 128, sq // 128) where
    lse[b, h, r, i] is the log-sum-exp of query row i * 128 + r.
    """
    _, _, d, sq = q.shape
    sk = k.shape[3]
    n_q, n_kv = sq // P, sk // kv_tile
    b_id = nl.program_id(axis=0)
    h_id = nl.program_id(axis=1)

    o = nl.ndarray((q.shape[0], q.shape[1], sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    if with_lse:
        lse = nl.ndarray((q.shape[0], q.shape[1], P, n_q), dtype=nl.float32, buffer=nl.shared_hbm)
    else:
        lse = None

    o_acc = nl.zeros((n_q, par_dim(P), d), dtype=nl.float32, buffer=nl.sbuf)
    m_acc = nl.full((n_q, par_dim(P), 1), fill_value=nl.fp32.min, dtype=nl.float32, buffer=nl.sbuf)
    lse_acc = nl.full((par_dim(P), n_q), fill_value=nl.fp32.min, dtype=nl.float32, buffer=nl.sbuf)
    scale = 1.0 / float(np.sqrt(d))

    for j in nl.sequential_range(n_kv):
        k_t = nl.ndarray((par_dim(d), kv_tile), dtype=nl.float32, buffer=nl.sbuf)
        k_t[...] = nl.load(k[b_id, h_id, :, nl.ds(j * kv_tile, kv_tile)])
        v_blk = nl.ndarray((kv_tile // P, par_dim(P), d), dtype=nl.float32, buffer=nl.sbuf)
        for t in nl.affine_range(kv_tile // P):
            v_blk[t, :, :] = nl.load(v[b_id, h_id, nl.ds(j * kv_tile + t * P, P), :])
        for i in nl.affine_range(n_q):
            if (not causal) or i * P + P - 1 >= j * kv_tile:       # skip tiles above the diagonal
                q_t = nl.ndarray((d, P), dtype=nl.float32, buffer=nl.sbuf)
                q_t[...] = nl.load(q[b_id, h_id, :, nl.ds(i * P, P)]) * scale
                _scores_step(q_t, k_t, v_blk, o_acc[i], m_acc[i], lse_acc[:, i], q_idx=i, kv_idx=j,
                             kv_tile=kv_tile, chunk=chunk, causal=causal)

    for i in nl.affine_range(n_q):
        norm = nisa.activation(np.exp, lse_acc[:, i], bias=m_acc[i, :, :], scale=-1.0)   # exp(m - lse)
        nl.store(o[b_id, h_id, nl.ds(i * P, P), :], nl.multiply(o_acc[i, :, :], norm, dtype=q.dtype))
    if with_lse:
        nl.store(lse[b_id, h_id, :, :], lse_acc[:, :])
        return o, lse
    return o


# ------------------------------------------------------------------ SD-attention masked scores
@nki.jit
def masked_scores_pattern(q_t, k_t):
    """Causally masked scores, SD-attention-tutorial style: nisa.nc_matmul accumulated into a
    PSUM tile through arange indices, masked by affine_select reading that PSUM view.

    q_t (d, sq), k_t (d, sk) with d <= 128, sq % 128 == 0, sk <= 512 -> (sq, sk) fp32 scores
    with score[q, k] = NEG where k > q."""
    d, sq = q_t.shape
    sk = k_t.shape[1]
    out = nl.ndarray((sq, sk), dtype=nl.float32, buffer=nl.shared_hbm)
    ip_d, if_q = nl.arange(d)[:, None], nl.arange(P)[None, :]
    if_k = nl.arange(sk)[None, :]
    ip_s = nl.arange(P)[:, None]
    k_sb = nl.load(k_t[ip_d, if_k])
    for i in nl.affine_range(sq // P):
        q_sb = nl.load(q_t[ip_d, i * P + if_q])
        s_psum = nl.zeros((par_dim(P), sk), dtype=nl.float32, buffer=nl.psum)
        s_psum[ip_s, if_k] += nisa.nc_matmul(stationary=q_sb, moving=k_sb)
        masked = nisa.affine_select(pred=(i * P + ip_s >= if_k), on_true_tile=s_psum[ip_s, if_k],
                                    on_false_value=NEG, dtype=nl.float32)
        nl.store(out[i * P + ip_s, if_k], masked)
    return out


# ------------------------------------------------------------ paged attention, fused KV cache
def _load_block_table(block_table, n_tiles, blocks_per_tile):
    """(n_tiles * blocks_per_tile,) int32 in HBM -> (ceil(n_tiles/128), par_dim(128), blocks_per_tile)."""
    bt = block_table.reshape((n_tiles, blocks_per_tile))
    n_chunks = (n_tiles + P - 1) // P
    bt_sb = nl.zeros((n_chunks, par_dim(P), blocks_per_tile), dtype=nl.int32, buffer=nl.sbuf)
    for c in nl.affine_range(n_chunks):
        i_p = nl.arange(P)[:, None]
        i_f = nl.arange(blocks_per_tile)[None, :]
        bt_sb[c, i_p, i_f] = nl.load(bt[c * P + i_p, i_f], dtype=nl.int32, mask=(c * P + i_p < n_tiles))
    return bt_sb


def _paged_step(q_t, k_t, v_sb, mask_tile, o_view, m_view, l_view, *, initialize, n_slots):
    """Online-softmax update of one 128-query tile with one context tile of 128 * n_slots
    tokens; o_view (128, d), m_view / l_view (128, 1) are block-dim accumulator views."""
    d = q_t.shape[0]
    width = P * n_slots
    s_psum = nl.ndarray((par_dim(P), width), dtype=nl.float32, buffer=nl.psum)
    s_psum[:, :] = nl.matmul(q_t, k_t, transpose_x=True)
    scores = nl.where(mask_tile, s_psum, NEG, dtype=nl.float32)
    m_tile = nisa.tensor_reduce(np.max, scores, axis=(1,), dtype=nl.float32)
    if initialize:
        m_view[:, 0] = nl.copy(m_tile)
        m_new = m_tile
    else:
        m_old = nl.copy(m_view[:, 0])
        m_view[:, 0] = nl.maximum(m_old, m_tile)
        m_new = m_view[:, 0]
        alpha = nisa.activation(np.exp, m_old, bias=-1.0 * m_new, scale=1.0)
    row_sum = nl.ndarray((par_dim(P), 1), dtype=nl.float32, buffer=nl.sbuf)
    probs = nisa.activation_reduce(np.exp, scores, bias=-1.0 * m_new, scale=1.0, reduce_op=nl.add,
                                   reduce_res=row_sum[:, 0], dtype=nl.float32)
    pv = nl.zeros((par_dim(P), d), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(n_slots):
        p_t = nl.transpose(probs[:, nl.ds(t * P, P)])
        pv[:, :] += nl.matmul(p_t, v_sb[:, nl.ds(t * d, d)], transpose_x=True)
    if initialize:
        o_view[:, :] = nl.copy(pv)
        l_view[:, 0] = nl.add(nl.log(row_sum), m_new)
    else:
        o_view[:, :] = nl.add(nl.multiply(o_view[:, :], alpha), pv)
        l_old = l_view[:, 0]
        l_view[:, 0] = nl.add(m_new, nl.log(nl.add(nl.exp(nl.subtract(l_old, m_new)), row_sum)))


@nki.jit
def paged_attention_pattern(query, kv_cache, block_table, mask, *, return_stats=False):
    """Context attention over a paged, fused KV cache, vLLM flash_paged_attention-style.

    query (1, H, d, sq) with sq % 128 == 0; kv_cache (2, n_blocks, Hkv, bs, d) with K at [0]
    and V at [1]; block_table (n_tiles * 128,) int32 block ids; mask (sq, n_tiles * 128 * bs)
    uint8. Context tile t holds the bs slots of blocks block_table[t*128 : (t+1)*128], visited
    slot-major: token (slot s, block b) is column s * 128 + b of the tile, the order ``mask``
    uses.
    Grid [1, Hkv]. Returns o (1, H, sq, d); with ``return_stats`` also the running max and
    the log-sum-exp per query row, each (1, H, sq).
    """
    _, n_heads, d, sq = query.shape
    _, n_blocks, n_kv, bs, _ = kv_cache.shape
    group = n_heads // n_kv
    n_q = sq // P
    n_tiles = block_table.shape[0] // P
    kv_id = nl.program_id(axis=1)

    o = nl.ndarray((1, n_heads, sq, d), dtype=query.dtype, buffer=nl.shared_hbm)
    m_hbm = l_hbm = None
    if return_stats:
        m_hbm = nl.ndarray((1, n_heads, sq), dtype=nl.float32, buffer=nl.shared_hbm)
        l_hbm = nl.ndarray((1, n_heads, sq), dtype=nl.float32, buffer=nl.shared_hbm)

    # block table, transposed so that each tile's 128 blocks lie on the partitions, as row
    # numbers of the (n_blocks * Hkv, bs * d) view of one half of the cache
    bt_sb = _load_block_table(block_table, n_tiles, P)
    head_col = nl.transpose(nisa.iota(kv_id, dtype=nl.int32).reshape((1, 1)).broadcast_to((1, n_tiles)))
    rows = bt_sb[0, :n_tiles, :] * n_kv + head_col.broadcast_to((n_tiles, P))
    rows_t = nl.ndarray((1, par_dim(P), n_tiles), dtype=nl.int32, buffer=nl.sbuf)
    rows_t[0, :, :] = nl.transpose(rows)
    cache = kv_cache.reshape((2, n_blocks * n_kv, bs * d))

    o_acc = nl.zeros((n_q, group, par_dim(P), d), dtype=nl.float32, buffer=nl.sbuf)
    m_acc = nl.zeros((n_q, group, par_dim(P), 1), dtype=nl.float32, buffer=nl.sbuf)
    l_acc = nl.zeros((n_q, group, par_dim(P), 1), dtype=nl.float32, buffer=nl.sbuf)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(bs * d)[None, :]
    scale = 1.0 / float(np.sqrt(d))
    for tile in nl.sequential_range(n_tiles):
        k_rows = nl.load(cache[0, rows_t[0, i_p, tile], i_f])         # (128 blocks, bs * d)
        v_sb = nl.load(cache[1, rows_t[0, i_p, tile], i_f])
        k_t = nl.ndarray((par_dim(d), P * bs), dtype=nl.float32, buffer=nl.sbuf)
        for s in nl.affine_range(bs):
            k_t[:, nl.ds(s * P, P)] = nl.transpose(k_rows[:, nl.ds(s * d, d)])
        for i in nl.affine_range(n_q):
            mask_tile = nl.load(mask[nl.ds(i * P, P), nl.ds(tile * P * bs, P * bs)])
            for g in nl.affine_range(group):
                q_t = nl.ndarray((d, P), dtype=nl.float32, buffer=nl.sbuf)
                q_t[:, :] = nl.load(query[0, kv_id * group + g, :, nl.ds(i * P, P)]) * scale
                _paged_step(q_t, k_t, v_sb, mask_tile, o_acc[i, g], m_acc[i, g], l_acc[i, g],
                            initialize=tile == 0, n_slots=bs)

    for g in nl.affine_range(group):
        for i in nl.affine_range(n_q):
            out = nl.multiply(o_acc[i, g], nl.exp(m_acc[i, g] - l_acc[i, g]), dtype=query.dtype)
            nl.store(o[0, kv_id * group + g, nl.ds(i * P, P), :], out)
            if return_stats:
                nl.store(m_hbm[0, kv_id * group + g, nl.ds(i * P, P)], m_acc[i, g, :, :])
                nl.store(l_hbm[0, kv_id * group + g, nl.ds(i * P, P)], l_acc[i, g])
    if return_stats:
        return o, m_hbm, l_hbm
    return o
