"""The DMA ops of the current-API op layer (:mod:`nki_kernels.ops.current`, which re-exports
every name here): direct and indirect DMAs, DMA transposes and the row-tile views of the cache
kernels, each the documented ``nisa.dma_copy`` / ``nisa.dma_transpose`` form (``.ap()`` access
patterns, ``vector_offset`` indirection, ``oob_mode.skip``). Interface: :mod:`nki_kernels.ops`.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.toolchain import load_current

nki, nl, nisa = load_current()

__all__ = ["load", "gather", "scatter", "has_gather_transpose", "gather_transpose",
           "has_sbuf_dma_transpose", "transpose_on_dma", "MUTABLE", "row_block", "rows",
           "gather_rows", "scatter_rows", "load_cast", "dma_transpose_block", "dma"]


def _sbuf(shape, dtype):
    return nl.ndarray(tuple(shape), dtype=dtype, buffer=nl.sbuf)


# ---- DMA --------------------------------------------------------------------------------------
def load(dst, src):
    """Direct DMA of an HBM region into an on-chip tile."""
    nisa.dma_copy(dst=dst, src=src)


def _flat(table, lead):
    """``table`` (``(*lead_dims, R, F)`` HBM) as 2-D rows of F elements, and the element offset
    of row 0 of the ``lead`` slice: ``(flat, offset, F)``."""
    shape = tuple(table.shape)
    R, F = shape[-2], shape[-1]
    lead_rows = 0
    for k, i in enumerate(lead):
        lead_rows = lead_rows * shape[k] + i
    return table.reshape((int(np.prod(shape[:-1])), F)), lead_rows * R * F, F


def _rows(table, idx, idx_col, parts, n, lead, col0, tokens=1, step=0):
    """``table`` (``(*lead_dims, R, F)`` HBM) as an indirect view of ``parts`` rows of ``n``
    elements: row p = flat row ``lead * R + idx[p, idx_col]``, columns ``[col0, col0 + n)``
    (``tokens > 1``: ``tokens`` pieces of ``n / tokens`` elements, ``step`` apart)."""
    flat, base, F = _flat(table, lead)
    pattern = [[F, parts], [1, n]] if tokens == 1 else [[F, parts], [step, tokens],
                                                         [1, n // tokens]]
    return flat.ap(pattern, offset=base + col0,
                   vector_offset=idx[0:parts, idx_col:idx_col + 1], indirect_dim=0)


def gather(dst, table, idx, idx_col, *, lead=(), col0=0, tokens=1, step=0, width=None,
           dst_step=None):
    """``dst[p, :] = table[*lead, idx[p, idx_col], col0 : col0 + n]`` for the ``P, n`` of ``dst``;
    rows whose index is out of bounds are skipped (``dst`` keeps them). ``tokens > 1``: the row's
    ``tokens`` pieces of ``w`` elements (``width``, default ``n / tokens``) lie ``step`` apart
    and land ``dst_step`` (default w) apart,
    ``dst[p, s*dst_step + e] = table[*lead, idx[p, idx_col], col0 + s*step + e]`` (one indirect
    DMA: a 3-D access pattern on both sides)."""
    P, n = dst.shape
    w = n // tokens if width is None else width
    src = _rows(table, idx, idx_col, P, w * tokens, lead, col0, tokens, step)
    if tokens > 1:
        dst = dst.ap([[dst.strides[0], P], [w if dst_step is None else dst_step, tokens], [1, w]],
                     offset=dst.offset)
    nisa.dma_copy(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)


def scatter(table, idx, idx_col, src, *, lead=(), col0=0):
    """``table[*lead, idx[p, idx_col], col0 : col0 + n] = src[p, :]``; out-of-bounds rows skipped."""
    dst = _rows(table, idx, idx_col, src.shape[0], src.shape[1], lead, col0)
    nisa.dma_copy(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)


def has_gather_transpose(dtype, width):
    """Trace-time flag: an indirect (gather) DMA transpose of rows of ``width`` elements of
    ``dtype`` (NeuronCore-v3+, swdge, a 2-byte dtype, ``width <= 128``; NKI >= 0.4)."""
    from nki_kernels.ops import itemsize
    from nki_kernels.ops.current import nc_gen

    return nc_gen() != "gen2" and itemsize(dtype) == 2 and 1 <= width <= 128


def gather_transpose(dst, table, idx, idx_col, *, tokens, width, lead=(), col0=0, step=None,
                     src_col0=0):
    """``dst[c, col0 + s*P + p] = table[*lead, idx[p, idx_col], src_col0 + s*step + c]`` for the
    P = 128 gathered rows p, ``s < tokens``, ``c < width`` (``step`` default ``width``: the row's
    tokens contiguous; ``dst`` (width, ...) SBUF, ``table`` ``(*lead_dims, R, F)`` HBM): one
    indirect ``dma_transpose`` (4-D src ``(P, 1, tokens, width)``, axes (3, 1, 2, 0), swdge),
    out-of-bounds rows skipped (their columns keep ``dst``'s values)."""
    flat, base, F = _flat(table, lead)
    parts = 128
    ids = idx.view(nl.uint32)[0:parts, idx_col:idx_col + 1]
    src = flat.ap([[F, parts], [1, 1], [width if step is None else step, tokens], [1, width]],
                  offset=base + src_col0, vector_offset=ids, indirect_dim=0)
    out = dst.ap([[dst.strides[0], width], [1, 1], [parts, tokens], [1, parts]],
                 offset=dst.offset + col0)
    nisa.dma_transpose(dst=out, src=src, axes=(3, 1, 2, 0), dge_mode=nisa.dge_mode.swdge,
                       oob_mode=nisa.oob_mode.skip)


def has_sbuf_dma_transpose(dtype):
    """Trace-time flag: an on-chip (SBUF -> SBUF) ``dma_transpose`` of ``dtype`` (NeuronCore-v3+,
    2-byte dtypes)."""
    from nki_kernels.ops import itemsize
    from nki_kernels.ops.current import nc_gen

    return nc_gen() != "gen2" and itemsize(dtype) == 2


def transpose_on_dma(dst, dst_col, src, src_col, n_blocks, width=128):
    """``dst[:, dst_col + u*R : + R] = src[:, src_col + u*width : + width].T`` for u < n_blocks
    (``src`` (R <= 128, ...) and ``dst`` (width <= 128, ...) SBUF tiles of one 2-byte dtype):
    one SBUF -> SBUF ``dma_transpose`` of the 4-D view ``(R, 1, n_blocks, width)`` of ``src``
    into the view ``(width, 1, n_blocks, R)`` of ``dst`` (axes (3, 1, 2, 0), the 4-D form
    nki-library's prefill kernel transposes its probabilities with); the compiler picks the
    DGE mode. The DMA engines move ``n_blocks * width * 2`` bytes per source partition."""
    rows = src.shape[0]
    s = src.ap([[src.strides[0], rows], [1, 1], [width, n_blocks], [1, width]],
               offset=src.offset + src_col)
    d = dst.ap([[dst.strides[0], width], [1, 1], [rows, n_blocks], [1, rows]],
               offset=dst.offset + dst_col)
    nisa.dma_transpose(dst=d, src=s, axes=(3, 1, 2, 0))


# ---- cache kernels: row-tile views of HBM row tensors and in-place arguments -----------------
# (added for the KV-cache write / block copy / MLA cache kernels; see the ops package docstring)
MUTABLE = None      # no annotation: the current API updates every HBM argument in place


def row_block(table, first, stride, parts, count):
    """View ``(parts, count, F)`` of a 2-D HBM row tensor ``table`` (R, F):
    ``[p, t, :] = table[p * stride + first + t, :]`` (an ``.ap`` pattern in elements)."""
    F = table.shape[1]
    return table.ap([[stride * F, parts], [F, count], [1, F]], offset=table.offset + first * F)


def rows(table, start, n):
    """View ``(n, F)`` of rows ``start .. start + n - 1`` of a 2-D HBM row tensor ``table`` (an
    ``.ap`` pattern: ``start`` may hold ``nl.program_id`` arithmetic, as in :func:`row_block`)."""
    F = table.shape[1]
    return table.ap([[F, n], [1, F]], offset=table.offset + start * F)


def gather_rows(dst, table, idx, idx_col):
    """``dst[p, :] = table[idx[p, idx_col], :]`` (2-D ``table``); every index must be in bounds
    (``oob_mode.error``). ``dma_copy`` from ``table.ap(vector_offset=..., indirect_dim=0)``."""
    P, n = dst.shape
    src = table.ap([[table.shape[1], P], [1, n]], offset=table.offset,
                   vector_offset=idx[0:P, idx_col:idx_col + 1], indirect_dim=0)
    nisa.dma_copy(dst=dst, src=src)


def scatter_rows(table, idx, idx_col, src):
    """``table[idx[p, idx_col], :] = src[p, :]`` (2-D ``table``); every index in bounds."""
    P, n = src.shape
    dst = table.ap([[table.shape[1], P], [1, n]], offset=table.offset,
                   vector_offset=idx[0:P, idx_col:idx_col + 1], indirect_dim=0)
    nisa.dma_copy(dst=dst, src=src)


def load_cast(dst, src):
    """Direct DMA of an HBM region into an on-chip tile of another float dtype: the DMA keeps
    the dtype (into a staging tile of ``src``'s dtype), then :func:`copy` converts on ScalarE;
    one DMA when the dtypes agree."""
    from nki_kernels.ops import dtype_name

    if dtype_name(src.dtype) == dtype_name(dst.dtype):
        nisa.dma_copy(dst=dst, src=src)
        return
    from nki_kernels.ops.current import copy

    staged = _sbuf(tuple(dst.shape), src.dtype)
    nisa.dma_copy(dst=staged, src=src)
    copy(dst, staged)


def dma_transpose_block(dst, src):
    """``dst = src.T`` for one 2-D block of a 2-byte dtype, SBUF -> SBUF on the DMA engines
    (``dma_transpose``, 2-D ``axes`` (1, 0); NeuronCore-v3+)."""
    nisa.dma_transpose(dst=dst, src=src)


def dma(dst, src):
    """Direct DMA ``dst <- src`` (``nisa.dma_copy``; the same instruction as :func:`load`)."""
    nisa.dma_copy(dst=dst, src=src)
