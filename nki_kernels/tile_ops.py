"""Small on-chip building blocks shared by the paged-attention kernel modules.

Device code (legacy NKI through :mod:`nki_kernels._nki`); every function is called from inside
a kernel and allocates its temporaries in its own body, so a call inside a loop body creates
per-iteration tiles (no false loop-carried dependencies).
"""

from __future__ import annotations

from nki_kernels._nki import nl, nisa
from nki_kernels.constants import B_F_SIZE


def pe_transpose_blocks(dst, dst_col, src, src_col, block_w, n_blocks, *, evac_engine=None,
                        src_stride=None):
    """Transpose ``n_blocks`` consecutive column blocks of ``src`` on TensorE, through PSUM.

    Dimensions:
        Ps = src.shape[0] (<= 128) source partitions; block_w (<= 128) source block width,
        which becomes the destination partition count.

    Args:
        dst: SBUF tile (block_w, >= dst_col + n_blocks*Ps); written, cast to ``dst.dtype``.
        dst_col: first destination column (int or affine loop expression).
        src: SBUF tile (Ps, >= src_col + n_blocks*block_w).
        src_col: first source column.
        block_w: width of one source block.
        n_blocks: number of blocks (Python int).
        evac_engine: engine of the PSUM -> SBUF copies (``nisa.tensor_copy(engine=...)``), e.g.
            ``nisa.scalar_engine`` to keep VectorE free; default ``nl.copy`` (compiler's choice,
            VectorE). Float data only on ScalarE (it copies through fp32). A tuple of engines is
            cycled over the copies (copy u uses ``evac_engine[u % len]``) to balance two engines.
        src_stride: source columns between the starts of consecutive blocks (default block_w:
            adjacent blocks), e.g. one channel slice of consecutive fixed-size entries.

    Effect:
        ``dst[:, dst_col + u*Ps : +Ps] = src[:, src_col + u*stride : +block_w].T`` for u < n_blocks
        (stride = src_stride or block_w).
        Up to ``512 // Ps`` transposes share one PSUM tile (<= one 2 KiB bank per partition;
        fp32 on gen2, the source dtype on gen3), which is then evacuated by one copy, so the copy
        count is ceil(n_blocks / (512 // Ps)).
    """
    Ps = src.shape[0]
    per_bank = max(1, B_F_SIZE // Ps)
    n_full, rem = divmod(n_blocks, per_bank)
    engines = evac_engine if isinstance(evac_engine, tuple) else (evac_engine,)
    stride = block_w if src_stride is None else src_stride
    if len(engines) == 1:
        for g in nl.affine_range(n_full):
            _transpose_group(dst, dst_col + g * per_bank * Ps, src,
                             src_col + g * per_bank * stride, block_w, per_bank, engines[0], stride)
    else:               # static loop: the engine of copy g is chosen in Python
        for g in nl.static_range(n_full):
            _transpose_group(dst, dst_col + g * per_bank * Ps, src,
                             src_col + g * per_bank * stride, block_w, per_bank,
                             engines[g % len(engines)], stride)
    if rem:
        _transpose_group(dst, dst_col + n_full * per_bank * Ps, src,
                         src_col + n_full * per_bank * stride, block_w, rem,
                         engines[n_full % len(engines)], stride)


def _transpose_group(dst, dst_col, src, src_col, block_w, n, evac_engine, stride):
    Ps = src.shape[0]
    # PSUM tile dtype: fp32 on gen2 (the PE writes fp32); the source dtype on gen3, whose
    # transposes are bit-exact in the input dtype (AWS's kernels allocate them the same way).
    gen3 = nisa.get_nc_version() == nisa.nc_version.gen3
    t_psum = nl.ndarray((block_w, n * Ps), dtype=src.dtype if gen3 else nl.float32, buffer=nl.psum)
    for u in nl.affine_range(n):
        t_psum[:, nl.ds(u * Ps, Ps)] = nisa.nc_transpose(src[:, nl.ds(src_col + u * stride, block_w)])
    if evac_engine is None:
        dst[:, nl.ds(dst_col, n * Ps)] = nl.copy(t_psum, dtype=dst.dtype)
    else:
        dst[:, nl.ds(dst_col, n * Ps)] = nisa.tensor_copy(t_psum, dtype=dst.dtype, engine=evac_engine)


def identity_tile(size, dtype):
    """SBUF ``(size, size)`` identity in ``dtype`` (1.0 and 0.0 are exact in every float dtype,
    fp8 included): the moving operand of :func:`pe_matmul_transpose_blocks`."""
    i_p = nl.arange(size)[:, None]
    i_f = nl.arange(size)[None, :]
    diff = nisa.iota(i_f - i_p, dtype=nl.float32)
    eye = nl.ndarray((size, size), dtype=dtype, buffer=nl.sbuf)
    eye[...] = nl.equal(diff, 0.0, dtype=dtype)
    return eye


def pe_matmul_transpose_blocks(dst, dst_col, parts, block_w, n_blocks, *, evac_engine=None,
                               src_stride=None):
    """Transpose-and-sum column blocks of one or more sources as identity matmuls on TensorE.

    ``nc_matmul(stationary=block, moving=identity)`` computes ``block.T @ I = block.T`` in fp32
    PSUM on every NeuronCore version, whatever float dtype the block has (fp8 included), and
    several sources accumulate into the same PSUM tile, so a tile split over two buffers of
    different dtypes (e.g. fp8 cache rows and 16-bit overlay rows, each zero where the other has
    data) is transposed and merged by the PE array alone.

    Args:
        dst: SBUF tile (block_w, >= dst_col + n_blocks*Ps); written, cast to ``dst.dtype``.
        dst_col: first destination column.
        parts: sequence of ``(src, src_col, identity)``: src an SBUF tile (Ps, ...), its first
            source column, and a ``(Ps, Ps)`` identity (:func:`identity_tile`) whose dtype is
            not float32 unless src is (the matmul operand rule).
        block_w: width of one source block (<= 128; the destination partition count).
        n_blocks: number of blocks (Python int).
        evac_engine: engine of the PSUM -> SBUF copies (one engine).
        src_stride: source columns between consecutive blocks (default block_w).

    Effect:
        ``dst[:, dst_col + u*Ps : +Ps] = sum_i src_i[:, col_i + u*stride : +block_w].T``.
        Up to ``512 // Ps`` blocks share one fp32 PSUM tile (one 2 KiB bank), evacuated by one
        copy. Unlike ``nc_transpose``, a non-finite element of a block reaches every column of its
        output row (NaN * 0 in the matmul): callers feed rows of one sequence only.
    """
    Ps = parts[0][0].shape[0]
    per_bank = max(1, B_F_SIZE // Ps)
    stride = block_w if src_stride is None else src_stride
    for g in nl.static_range(-(-n_blocks // per_bank)):
        g0 = g * per_bank
        n = min(per_bank, n_blocks - g0)
        t_psum = nl.ndarray((block_w, n * Ps), dtype=nl.float32, buffer=nl.psum)
        for u in nl.static_range(n):
            for i, (src, col, eye) in enumerate(parts):
                prod = nisa.nc_matmul(src[:, nl.ds(col + (g0 + u) * stride, block_w)], eye)
                if i == 0:
                    t_psum[:, nl.ds(u * Ps, Ps)] = prod
                else:
                    t_psum[:, nl.ds(u * Ps, Ps)] += prod
        if evac_engine is None:
            dst[:, nl.ds(dst_col + g0 * Ps, n * Ps)] = nl.copy(t_psum, dtype=dst.dtype)
        else:
            dst[:, nl.ds(dst_col + g0 * Ps, n * Ps)] = nisa.tensor_copy(t_psum, dtype=dst.dtype,
                                                                        engine=evac_engine)
