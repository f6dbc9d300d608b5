"""Tutorial-style legacy NKI kernels (written for real ``neuronxcc.nki``; no project imports).

Each kernel takes NumPy arrays (HBM tensors), creates its outputs with
``nl.ndarray(..., buffer=nl.shared_hbm)`` and returns them. Shapes are given per kernel;
the partition axis of every on-chip tile is axis 0 (<= 128).
"""

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

TILE_P = 128          # partitions per tile
TILE_F = 256          # free elements per tile of the SPMD add
MM_N = 512            # moving free size of one matmul (one PSUM bank of fp32)


@nki.jit
def spmd_tensor_add(a, b):
    """out = a + b for a, b of shape (TILE_P * grid0, TILE_F * grid1); one tile per program."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    row = nl.program_id(0)
    col = nl.program_id(1)
    i_p = row * TILE_P + nl.arange(TILE_P)[:, None]
    i_f = col * TILE_F + nl.arange(TILE_F)[None, :]
    a_tile = nl.load(a[i_p, i_f])
    b_tile = nl.load(b[i_p, i_f])
    nl.store(out[i_p, i_f], value=nl.add(a_tile, b_tile))
    return out


@nki.jit
def grid_coordinates(template):
    """Each program writes [pid0, pid1, num_programs(), num_programs(1), program_ndim()]
    into row pid0 * num_programs(1) + pid1 of an int32 (num_programs(), 5) output.
    ``template`` only fixes the output shape."""
    out = nl.ndarray(template.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    p0 = nl.program_id(0)
    p1 = nl.program_id(1)
    row = nl.ndarray((1, 5), dtype=nl.int32, buffer=nl.sbuf)
    row[0:1, 0:1] = p0
    row[0:1, 1:2] = p1
    row[0:1, 2:3] = nl.num_programs()
    row[0:1, 3:4] = nl.num_programs(1)
    row[0:1, 4:5] = nl.program_ndim()
    nl.store(out[nl.ds(p0 * nl.num_programs(1) + p1, 1), 0:5], value=row)
    return out


@nki.jit
def tiled_matmul(lhs_t, rhs):
    """out (M, N) fp32 = lhs_t.T @ rhs with lhs_t (K, M), rhs (K, N); K, M multiples of 128,
    N a multiple of 512. PSUM accumulation with ``+=`` over K tiles in an affine_range."""
    k_dim, m_dim = lhs_t.shape
    n_dim = rhs.shape[1]
    out = nl.ndarray((m_dim, n_dim), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // TILE_P):
        for n in nl.affine_range(n_dim // MM_N):
            acc = nl.zeros((TILE_P, MM_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // TILE_P):
                a_tile = nl.load(lhs_t[k * TILE_P:(k + 1) * TILE_P, m * TILE_P:(m + 1) * TILE_P])
                b_tile = nl.load(rhs[k * TILE_P:(k + 1) * TILE_P, n * MM_N:(n + 1) * MM_N])
                acc += nl.matmul(a_tile, b_tile, transpose_x=True)
            res = nl.copy(acc, dtype=nl.float32)
            nl.store(out[m * TILE_P:(m + 1) * TILE_P, n * MM_N:(n + 1) * MM_N], value=res)
    return out


@nki.jit
def tiled_matmul_isa(lhs_t, rhs):
    """Same contract as ``tiled_matmul`` but with ``nisa.nc_matmul(stationary, moving)``."""
    k_dim, m_dim = lhs_t.shape
    n_dim = rhs.shape[1]
    out = nl.ndarray((m_dim, n_dim), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // TILE_P):
        for n in nl.affine_range(n_dim // MM_N):
            acc = nl.zeros((TILE_P, MM_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // TILE_P):
                stationary = nl.load(lhs_t[nl.ds(k * TILE_P, TILE_P), nl.ds(m * TILE_P, TILE_P)])
                moving = nl.load(rhs[nl.ds(k * TILE_P, TILE_P), nl.ds(n * MM_N, MM_N)])
                acc += nisa.nc_matmul(stationary, moving)
            res = nisa.tensor_copy(acc, dtype=nl.float32)
            nl.store(out[nl.ds(m * TILE_P, TILE_P), nl.ds(n * MM_N, MM_N)], value=res)
    return out


@nki.jit
def matmul_plain(x, y):
    """out (M, N) = x @ y with x (M, K), y (K, N): nl.matmul without transpose_x (M, K <= 128)."""
    out = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    x_tile = nl.load(x)
    y_tile = nl.load(y)
    prod = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.psum)
    prod[...] = nl.matmul(x_tile, y_tile)
    nl.store(out, value=nl.copy(prod))
    return out


@nki.jit
def transpose_three_ways(x):
    """x (P, F) fp32 with P, F <= 32: returns (x.T via nl.transpose, x.T via TensorE
    nc_transpose, x.T via VectorE nc_transpose), each (F, P)."""
    p_dim, f_dim = x.shape
    out_nl = nl.ndarray((f_dim, p_dim), dtype=x.dtype, buffer=nl.shared_hbm)
    out_pe = nl.ndarray((f_dim, p_dim), dtype=x.dtype, buffer=nl.shared_hbm)
    out_ve = nl.ndarray((f_dim, p_dim), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    via_nl = nl.ndarray((f_dim, p_dim), dtype=x.dtype, buffer=nl.sbuf)
    via_nl[:, :] = nl.transpose(tile)
    nl.store(out_nl, value=via_nl)
    via_pe = nisa.nc_transpose(tile, engine=nisa.tensor_engine)
    nl.store(out_pe, value=nl.copy(via_pe, dtype=x.dtype))
    via_ve = nisa.nc_transpose(tile, engine=nisa.vector_engine)
    nl.store(out_ve, value=via_ve)
    return out_nl, out_pe, out_ve


@nki.jit
def transpose_large(x):
    """x (128, 96) -> x.T (96, 128) through nl.transpose (both dims <= 128)."""
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    res = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    res[:, :] = nl.transpose(tile)
    nl.store(out, value=res)
    return out


@nki.jit
def row_softmax(x):
    """Numerically stable softmax over the free axis of x (rows <= 128, any free size)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    row_max = nl.max(tile, axis=1, keepdims=True)
    shifted = nl.subtract(tile, row_max)
    exps = nl.exp(shifted)
    row_sum = nl.sum(exps, axis=1, keepdims=True)
    inv = nl.reciprocal(row_sum)
    nl.store(out, value=nl.multiply(exps, inv))
    return out


@nki.jit
def row_layernorm(x, gamma):
    """y = (x - mean) / sqrt(var + 1e-5) * gamma over the free axis; x (P, F), gamma (1, F)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    g = nl.load(gamma)
    mean = nl.mean(tile, axis=1, keepdims=True)
    centered = tile - mean
    var = nl.mean(nl.multiply(centered, centered), axis=1, keepdims=True)
    inv_std = nl.rsqrt(var + 1e-5)
    normed = nl.multiply(centered, inv_std)
    nl.store(out, value=nl.multiply(normed, g.broadcast_to(x.shape)))
    return out


@nki.jit
def iota_int_arith(*, rows, cols, mul, add):
    """int32 (rows, cols): idx = p*cols + f built by nisa.iota; returns
    ((idx*mul + add) - idx), (idx & 255) and (idx >> 3)."""
    out_affine = nl.ndarray((rows, cols), dtype=nl.int32, buffer=nl.shared_hbm)
    out_and = nl.ndarray((rows, cols), dtype=nl.int32, buffer=nl.shared_hbm)
    out_shift = nl.ndarray((rows, cols), dtype=nl.int32, buffer=nl.shared_hbm)
    i_p = nl.arange(rows)[:, None]
    i_f = nl.arange(cols)[None, :]
    idx = nisa.iota(i_p * cols + i_f, dtype=nl.int32)
    affine = nl.subtract(nl.add(nl.multiply(idx, mul), add), idx)
    nl.store(out_affine, value=affine)
    nl.store(out_and, value=nl.bitwise_and(idx, 255))
    nl.store(out_shift, value=nl.right_shift(idx, 3))
    return out_affine, out_and, out_shift


@nki.jit
def bf16_write_paths(x):
    """x (P, F) fp32 -> four bf16 (P, F) outputs written through: assignment into a bf16
    tile, nl.load(dtype=bf16), nl.copy(dtype=bf16), and nl.store of an fp32 tile into a
    bf16 HBM tensor."""
    out_assign = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    out_load = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    out_copy = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    out_store = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    tile = nl.load(x)
    assigned = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    assigned[...] = tile
    nl.store(out_assign, value=assigned)
    nl.store(out_load, value=nl.load(x, dtype=nl.bfloat16))
    nl.store(out_copy, value=nl.copy(tile, dtype=nl.bfloat16))
    nl.store(out_store, value=tile)
    return out_assign, out_load, out_copy, out_store


@nki.jit
def bf16_add(a, b):
    """a + b for bf16 inputs (P, F): the result dtype is bf16, computed in fp32, rounded once."""
    out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    res = nl.add(nl.load(a), nl.load(b))
    assert res.dtype == np.dtype(nl.bfloat16), res.dtype
    nl.store(out, value=res)
    return out


@nki.jit
def transpose_by_target(x):
    """x (128, 128) bf16 -> x.T, taking the trn2 (gen3) DMA-transpose path or the trn1
    (gen2) TensorE path into fp32 PSUM, as the vLLM flash-attention kernel does."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    if nisa.get_nc_version() == nisa.nc_version.gen3:
        res = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        res[...] = nisa.dma_transpose(tile)
    else:
        res_psum = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        res_psum[...] = nisa.nc_transpose(tile)
        res = nl.copy(res_psum, dtype=x.dtype)
    nl.store(out, value=res)
    return out
