"""Legacy-API DMA ops (re-exported by :mod:`nki_kernels.ops.legacy`, as
:mod:`nki_kernels.ops.current_dma` is by the current layer): direct and indirect loads and
stores, the DMA-transpose feature flags, and the cache kernels' row tiles."""

from __future__ import annotations

from nki_kernels.toolchain import nl, nisa, nt



def load(dst, src):
    """Direct DMA of an HBM region into an on-chip tile."""
    dst[...] = nl.load(src)


def gather(dst, table, idx, idx_col, *, lead=(), col0=0, tokens=1, step=0, width=None,
           dst_step=None):
    """``dst[p, :] = table[*lead, idx[p, idx_col], col0 : col0 + n]`` for the ``P, n`` of ``dst``;
    rows whose index is out of bounds are skipped (``dst`` keeps them). ``tokens > 1``: the row's
    ``tokens`` pieces of ``w`` elements (``width``, default ``n / tokens``) lie ``step`` apart
    and land ``dst_step`` (default w) apart,
    ``dst[p, s*dst_step + e] = table[*lead, idx[p, idx_col], col0 + s*step + e]`` (one indirect
    DMA; an ``nl.arange`` expression over (partition, piece, element))."""
    if tokens > 1:
        w = dst.shape[1] // tokens if width is None else width
        i_p = nl.arange(dst.shape[0])[:, None, None]
        i_s = nl.arange(tokens)[None, :, None]
        i_e = nl.arange(w)[None, None, :]
        src = table[tuple(lead) + (idx[i_p, idx_col], col0 + i_s * step + i_e)]
        out = i_s * (w if dst_step is None else dst_step) + i_e
        nisa.dma_copy(dst=dst[i_p, out], src=src, oob_mode=nisa.oob_mode.skip)
        return
    i_p = nl.arange(dst.shape[0])[:, None]
    i_f = nl.arange(dst.shape[1])[None, :]
    src = table[tuple(lead) + (idx[i_p, idx_col], col0 + i_f if col0 else i_f)]
    nisa.dma_copy(dst=dst[i_p, i_f], src=src, oob_mode=nisa.oob_mode.skip)


def scatter(table, idx, idx_col, src, *, lead=(), col0=0):
    """``table[*lead, idx[p, idx_col], col0 : col0 + n] = src[p, :]``; out-of-bounds rows skipped."""
    i_p = nl.arange(src.shape[0])[:, None]
    i_f = nl.arange(src.shape[1])[None, :]
    dst = table[tuple(lead) + (idx[i_p, idx_col], col0 + i_f if col0 else i_f)]
    nisa.dma_copy(dst=dst, src=src[i_p, i_f], oob_mode=nisa.oob_mode.skip)


def has_gather_transpose(dtype, width):
    """Trace-time flag: an indirect (gather) DMA transpose; the legacy API documents none."""
    del dtype, width
    return False


def has_sbuf_dma_transpose(dtype):
    """Trace-time flag: an on-chip DMA transpose of a multi-block view. The legacy API's
    ``nisa.dma_transpose`` (v3) returns a new tile of one 2-D block; this layer does not use it
    (128-row blocks move 256 B per partition, below the DMA's efficient descriptor size)."""
    del dtype
    return False


def transpose_on_dma(dst, dst_col, src, src_col, n_blocks, width=128):
    raise NotImplementedError("the legacy ops layer has no SBUF DMA transpose of block views; "
                              "check ops.has_sbuf_dma_transpose(dtype) and use transpose()")


def gather_transpose(dst, table, idx, idx_col, *, tokens, width, lead=(), col0=0, step=None,
                     src_col0=0):
    raise NotImplementedError("the legacy NKI API has no indirect DMA transpose; check "
                              "has_gather_transpose() and use PE transposes")


# ---- cache kernels: row-tile views of HBM row tensors and in-place arguments -----------------
# (added for the KV-cache write / block copy / MLA cache kernels; see the ops package docstring)

MUTABLE = nt.mutable_tensor     # annotation of a kernel argument the kernel writes in place


def row_block(table, first, stride, parts, count):
    """View ``(parts, count, F)`` of a 2-D HBM row tensor ``table`` (R, F):
    ``[p, t, :] = table[p * stride + first + t, :]`` (one ``nl.arange`` index expression)."""
    i_p = nl.arange(parts)[:, None, None]
    i_t = nl.arange(count)[None, :, None]
    i_f = nl.arange(table.shape[1])[None, None, :]
    return table[i_p * stride + first + i_t, i_f]


def rows(table, start, n):
    """View ``(n, F)`` of rows ``start .. start + n - 1`` of a 2-D HBM row tensor ``table``."""
    i_p = nl.arange(n)[:, None]
    i_f = nl.arange(table.shape[1])[None, :]
    return table[start + i_p, i_f]


def gather_rows(dst, table, idx, idx_col):
    """``dst[p, :] = table[idx[p, idx_col], :]`` (2-D ``table``); every index must be in bounds
    (no skip: an out-of-bounds row is an error). ``nl.load`` of an ``nl.arange`` expression."""
    i_p = nl.arange(dst.shape[0])[:, None]
    i_f = nl.arange(dst.shape[1])[None, :]
    dst[...] = nl.load(table[idx[i_p, idx_col], i_f])


def scatter_rows(table, idx, idx_col, src):
    """``table[idx[p, idx_col], :] = src[p, :]`` (2-D ``table``); every index in bounds."""
    i_p = nl.arange(src.shape[0])[:, None]
    i_f = nl.arange(src.shape[1])[None, :]
    nl.store(table[idx[i_p, idx_col], i_f], value=src)


def load_cast(dst, src):
    """Direct DMA of an HBM region into an on-chip tile of another float dtype: ``nl.load``
    with ``dtype=`` (the legacy load converts on the way in)."""
    dst[...] = nl.load(src, dtype=dst.dtype)


def dma_transpose_block(dst, src):
    """``dst = src.T`` for one 2-D block of a 2-byte dtype, SBUF -> SBUF on the DMA engines
    (``nisa.dma_transpose``, NeuronCore-v3; vLLM's kernel transposes P so)."""
    dst[...] = nisa.dma_transpose(src)


def dma(dst, src):
    """Direct DMA ``dst <- src`` written as ``nisa.dma_copy`` (e.g. into a column range of an
    existing tile; :func:`load` is the ``nl.load`` form)."""
    nisa.dma_copy(dst=dst, src=src)
