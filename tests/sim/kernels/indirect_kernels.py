"""Legacy NKI kernels for indirect DMA (gather / scatter), masked loads and stores, and
strided direct loads (written for real ``neuronxcc.nki``; no project imports).

Indirect access follows the legacy rule: an SBUF index tile (int32, one index per
partition) replaces the subscript of the partition axis of the HBM side; the free axis
uses ``nl.arange``. ``out[p, f] = data[idx[p], f]`` (gather), ``dst[idx[p], f] = src[p, f]``
(scatter).
"""

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt
from neuronxcc.nki.isa.constants import oob_mode

TILE_P = 128


@nki.jit
def gather_rows(data, idx):
    """data (R, F), idx (P, 1) int32 -> (P, F) with row p = data[idx[p]] (nl.load)."""
    n_idx = idx.shape[0]
    width = data.shape[1]
    out = nl.ndarray((n_idx, width), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(n_idx)[:, None]
    i_f = nl.arange(width)[None, :]
    idx_tile = nl.load(idx)
    rows = nl.load(data[idx_tile[i_p, 0], i_f])
    nl.store(out[i_p, i_f], value=rows)
    return out


@nki.jit
def gather_rows_tile_index(data, idx):
    """Same as ``gather_rows`` with the (P, 1) index tile used directly as the subscript."""
    n_idx = idx.shape[0]
    width = data.shape[1]
    out = nl.ndarray((n_idx, width), dtype=data.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(width)[None, :]
    idx_tile = nl.load(idx)
    rows = nl.load(data[idx_tile, i_f])
    nl.store(out, value=rows)
    return out


@nki.jit
def gather_rows_dma(data, idx, *, skip, fill):
    """nisa.dma_copy gather into a tile memset to ``fill``: (P, F) with row p = data[idx[p]];
    out-of-bounds rows raise (skip=False, oob_mode.error) or keep ``fill`` (skip=True)."""
    n_idx = idx.shape[0]
    width = data.shape[1]
    out = nl.ndarray((n_idx, width), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(n_idx)[:, None]
    i_f = nl.arange(width)[None, :]
    idx_tile = nl.load(idx)
    buf = nisa.memset(shape=(n_idx, width), value=fill, dtype=data.dtype)
    mode = oob_mode.skip if skip else oob_mode.error
    nisa.dma_copy(dst=buf[i_p, i_f], src=data[idx_tile[i_p, 0], i_f], oob_mode=mode)
    nl.store(out, value=buf)
    return out


@nki.jit
def scatter_rows(src, idx, *, nrows):
    """src (P, F), idx (P, 1) int32 unique -> (nrows, F) zeros with row idx[p] = src[p]
    (nl.store indirect). nrows is a multiple of 128."""
    n_idx, width = src.shape
    out = nl.ndarray((nrows, width), dtype=src.dtype, buffer=nl.shared_hbm)
    zeros = nl.zeros((TILE_P, width), dtype=src.dtype)
    for r in nl.affine_range(nrows // TILE_P):
        nl.store(out[nl.ds(r * TILE_P, TILE_P), 0:width], value=zeros)
    i_p = nl.arange(n_idx)[:, None]
    i_f = nl.arange(width)[None, :]
    tile = nl.load(src)
    idx_tile = nl.load(idx)
    nl.store(out[idx_tile[i_p, 0], i_f], value=tile)
    return out


@nki.jit
def scatter_add_dma(base: nt.mutable_tensor, src, idx):
    """base (R, F) += scattered src: base[idx[p]] += src[p] via nisa.dma_copy(dst_rmw_op=np.add),
    in place; returns base."""
    n_idx, width = src.shape
    i_p = nl.arange(n_idx)[:, None]
    i_f = nl.arange(width)[None, :]
    tile = nl.load(src)
    idx_tile = nl.load(idx)
    nisa.dma_copy(dst=base[idx_tile[i_p, 0], i_f], src=tile[i_p, i_f], dst_rmw_op=np.add)
    return base


@nki.jit
def scatter_rows_dma_skip(base: nt.mutable_tensor, src, idx):
    """base[idx[p]] = src[p] in place via nisa.dma_copy(oob_mode.skip); OOB rows dropped."""
    n_idx, width = src.shape
    i_p = nl.arange(n_idx)[:, None]
    i_f = nl.arange(width)[None, :]
    tile = nl.load(src)
    idx_tile = nl.load(idx)
    nisa.dma_copy(dst=base[idx_tile[i_p, 0], i_f], src=tile[i_p, i_f], oob_mode=oob_mode.skip)
    return base


@nki.jit
def masked_load(x, *, fill):
    """x (n, F) with n < 128 -> (128, F): rows < n from x, rows >= n keep ``fill``."""
    n_rows, width = x.shape
    out = nl.ndarray((TILE_P, width), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.full((TILE_P, width), fill, dtype=x.dtype)
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(width)[None, :]
    tile[i_p, i_f] = nl.load(x[i_p, i_f], mask=(i_p < n_rows))
    nl.store(out, value=tile)
    return out


@nki.jit
def masked_tiled_load(x):
    """x (n, F) int32, any n -> (ceil(n/128)*128, F): x padded with zero rows, one masked
    load per 128-row tile (the vLLM block-table load pattern)."""
    n_rows, width = x.shape
    n_tiles = (n_rows + TILE_P - 1) // TILE_P
    out = nl.ndarray((n_tiles * TILE_P, width), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(width)[None, :]
    for t in nl.affine_range(n_tiles):
        tile = nl.zeros((TILE_P, width), dtype=x.dtype)
        tile[i_p, i_f] = nl.load(x[t * TILE_P + i_p, i_f], mask=(t * TILE_P + i_p < n_rows))
        nl.store(out[t * TILE_P + i_p, i_f], value=tile)
    return out


@nki.jit
def masked_store(x, dst: nt.mutable_tensor, *, rows, cols):
    """dst[:rows, :cols] = 2 * x[:rows, :cols] in place (masked nl.store); returns dst."""
    p_dim, f_dim = x.shape
    i_p = nl.arange(p_dim)[:, None]
    i_f = nl.arange(f_dim)[None, :]
    tile = nl.load(x)
    doubled = nl.multiply(tile, 2.0)
    nl.store(dst[i_p, i_f], value=doubled, mask=(i_p < rows) & (i_f < cols))
    return dst


@nki.jit
def three_gathers(data, idx):
    """data (R, F), idx (128, 3) int32 -> (128, 3F): block j of the output row p is
    data[idx[p, j]]; three indirect loads, one direct index load, one store."""
    width = data.shape[1]
    n_gather = idx.shape[1]
    out = nl.ndarray((TILE_P, n_gather * width), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(width)[None, :]
    idx_tile = nl.load(idx)
    acc = nl.ndarray((TILE_P, n_gather * width), dtype=data.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(n_gather):
        acc[i_p, j * width + i_f] = nl.load(data[idx_tile[i_p, j], i_f])
    nl.store(out, value=acc)
    return out


@nki.jit
def strided_load(x, *, keep):
    """x (P, B, F) -> (P, B, keep) = x[:, :, :keep]; each partition reads B runs of keep elements."""
    p_dim, blocks, _ = x.shape
    out = nl.ndarray((p_dim, blocks, keep), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x[:, :, 0:keep])
    nl.store(out, value=tile)
    return out
