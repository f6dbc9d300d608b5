"""A small block-KV decode kernel with the constructs of nki-library's attention_tkg: a block
table loaded through a transposing ``.ap`` view, K gathered by one indirect 4-D
``dma_transpose``, V by an indirect ``dma_copy`` with ``oob_mode.skip`` for padded table
entries, ``memset(-inf)`` + ``tensor_copy_predicated`` masking, ``tensor_reduce`` max,
``activation`` exp with bias and sum reduce, ``reciprocal``, PE ``nc_transpose`` and an
accumulating ``nc_matmul`` group.  Checked against a float64 reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sim_nki_util import nisa, nki, nl, out_of, sb

BF16 = ml_dtypes.bfloat16
P, BL = 128, 4                  # blocks per fold (partitions), tokens per block


@nki.jit
def decode(q, k_cache, v_cache, table, mask):
    """q [d, s]; k_cache / v_cache [n_blocks, BL, d]; table [1, 128] uint32 (0xFFFFFFFF = none);
    mask [s, BL * 128] uint8 in (token-in-block, block) column order -> out [s, d] bf16."""
    d, s = q.shape
    tq = sb((d, s), nl.bfloat16)
    nisa.dma_copy(dst=tq, src=q)
    tt = sb((P, 1), nl.uint32)
    nisa.dma_copy(dst=tt, src=table.ap([[1, P], [P, 1]], offset=0))        # (1, 128) -> (128, 1)
    kt = sb((d, 1, BL, P), nl.bfloat16)
    nisa.memset(dst=kt, value=0.0)
    nisa.dma_transpose(dst=kt, src=k_cache.ap([[BL * d, P], [1, 1], [d, BL], [1, d]], vector_offset=tt,
                                              indirect_dim=0),
                       axes=(3, 1, 2, 0), dge_mode=nisa.dge_mode.swdge, oob_mode=nisa.oob_mode.skip)
    vs = sb((P, BL * d), nl.bfloat16)
    nisa.memset(dst=vs, value=0.0)
    nisa.dma_copy(dst=vs, src=v_cache.ap([[BL * d, P], [1, BL * d]], vector_offset=tt, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    qk = nl.ndarray((s, BL * P), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=qk, stationary=tq, moving=kt.reshape((d, BL * P)))
    tm = sb((s, BL * P), nl.uint8)
    nisa.dma_copy(dst=tm, src=mask)
    sc = sb((s, BL * P))
    nisa.memset(dst=sc, value=float("-inf"))
    nisa.tensor_copy_predicated(dst=sc, src=qk, predicate=tm)
    mx, neg = sb((s, 1)), sb((s, 1))
    nisa.tensor_reduce(dst=mx, op=nl.maximum, data=sc, axis=1, negate=False)
    nisa.tensor_scalar(dst=neg, data=mx, op0=nl.multiply, operand0=-1.0)
    e, tot, rc = sb((s, BL * P), nl.bfloat16), sb((s, 1)), sb((s, 1))
    nisa.activation(dst=e, op=nl.exp, data=sc, bias=neg, reduce_op=nl.add, reduce_res=tot,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.reciprocal(dst=rc, data=tot)
    o = nl.ndarray((s, d), nl.float32, buffer=nl.psum)
    for j in range(BL):
        et = nl.ndarray((P, s), nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=et, data=e[:, j * P:(j + 1) * P])
        ets = sb((P, s), nl.bfloat16)
        nisa.tensor_copy(dst=ets, src=et)
        nisa.nc_matmul(dst=o, stationary=ets, moving=vs[:, j * d:(j + 1) * d], accumulate=(j > 0))
    res = sb((s, d), nl.bfloat16)
    nisa.tensor_scalar(dst=res, data=o, op0=nl.multiply, operand0=rc)
    return out_of(res)


def _reference(q, k_cache, v_cache, blocks, ctx):
    k = k_cache[blocks].reshape(-1, q.shape[0])[:ctx].astype(np.float64)
    v = v_cache[blocks].reshape(-1, q.shape[0])[:ctx].astype(np.float64)
    s = q.astype(np.float64).T @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


@pytest.mark.parametrize("ctx", [37, 512])
def test_block_kv_decode_matches_reference(ctx):
    rng = np.random.default_rng(ctx)
    d, s, n_blocks = 64, 4, 300
    q = (0.05 * rng.standard_normal((d, s))).astype(BF16)          # O(1) scores: masking matters
    k_cache = rng.standard_normal((n_blocks, BL, d)).astype(BF16)
    v_cache = rng.standard_normal((n_blocks, BL, d)).astype(BF16)
    nb = -(-ctx // BL)
    blocks = rng.choice(n_blocks, nb, replace=False)
    table = np.full((1, P), 0xFFFFFFFF, np.uint32)
    table[0, :nb] = blocks
    tok = np.arange(BL)[:, None] + BL * np.arange(P)[None, :]          # (j, p) -> context position
    mask = np.broadcast_to((tok < ctx).reshape(1, -1), (s, BL * P)).astype(np.uint8)
    out = decode(q, k_cache, v_cache, table, np.ascontiguousarray(mask))
    ref = _reference(q, k_cache, v_cache, blocks, ctx)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-2, atol=2e-2)
