"""Small on-chip building blocks shared by the paged-attention kernel modules.

Device code on the op layer (:mod:`nki_kernels.ops`): every function takes the op layer ``ops``
first, is called from inside a kernel and allocates its temporaries in its own body, so a call
inside a loop body creates per-iteration tiles (no false loop-carried dependencies).
"""

from __future__ import annotations

from nki_kernels.contract import PSUM_BANK_F32

PSUM_BANK_BYTES = 4 * PSUM_BANK_F32      # one PSUM bank per partition


def transpose_bank_cols(ops, src_dtype):
    """Columns of one PSUM bank in the PSUM dtype of a PE transpose of ``src_dtype``
    (``ops.transpose_psum_dtype``): PSUM_BANK_F32 for fp32, twice that for a 16-bit PSUM dtype
    (NeuronCore-v3), so :func:`transpose_blocks` evacuates twice the blocks per copy."""
    from nki_kernels.ops import itemsize
    return PSUM_BANK_BYTES // itemsize(ops.transpose_psum_dtype(src_dtype))


def fill_zero(ops, dst, engine):
    """``dst[...] = 0`` on ``engine``: a VectorE / GpSimd memset, or on ScalarE (memset runs on
    VectorE / GpSimd only) a copy of a zero column broadcast along the free axis (stride-0 view;
    the column is memset on GpSimd). ``dst``: a 2-D SBUF tile of a 16- or 32-bit float dtype."""
    if engine != "scalar":
        ops.memset(dst, 0.0, engine=engine)
        return
    zero_col = ops.sbuf((dst.shape[0], 1), dst.dtype)
    ops.memset(zero_col, 0.0, engine="gpsimd")
    ops.activation(dst, "copy", ops.free_view(zero_col, ((0, dst.shape[1]),)))


def transpose_copies(n_blocks, src_rows, bank_cols):
    """PSUM -> SBUF copies :func:`transpose_blocks` makes for ``n_blocks`` blocks of a
    ``src_rows``-partition source: ``bank_cols // src_rows`` transposes share one copy."""
    return -(-n_blocks // _blocks_per_bank(bank_cols, src_rows))


def _blocks_per_bank(bank_cols, src_rows):
    return max(1, bank_cols // src_rows)


def transpose_blocks(ops, dst, dst_col, src, src_col, block_w, n_blocks, *, evac=None,
                     src_stride=None, bank_cols=PSUM_BANK_F32, interleave=1):
    """Transpose ``n_blocks`` consecutive column blocks of ``src`` on TensorE, through PSUM.

    Dimensions:
        Ps = src.shape[0] (<= 128) source partitions; block_w (<= 128) source block width,
        which becomes the destination partition count.

    Args:
        dst: SBUF tile (block_w, >= dst_col + n_blocks*Ps); written, cast to ``dst.dtype``.
        dst_col: first destination column (int or loop expression).
        src: SBUF tile (Ps, >= src_col + n_blocks*block_w).
        src_col: first source column.
        block_w: width of one source block.
        n_blocks: number of blocks (Python int).
        evac: engine name of the PSUM -> SBUF copies ("scalar" keeps VectorE free); default the
            compiler's choice. Float data only on ScalarE (it copies through fp32). A tuple of
            names is cycled over the copies (copy u uses ``evac[u % len]``).
        src_stride: source columns between the starts of consecutive blocks (default block_w).
        bank_cols: columns per partition of one PSUM bank in the transpose's PSUM dtype
            (``ops.transpose_psum_dtype``): PSUM_BANK_F32 (fp32, the default) or twice that for
            a 16-bit PSUM dtype (NeuronCore-v3), which halves the copies.
        interleave: b > 1 reads each block as every b-th column: block ``u = g*b + s`` is
            columns ``src_col + g*b*block_w + s + b*i`` (i < block_w) -- the tiled order of
            ``sched_core.key_index_tile`` out of a natural-order source (``src_stride`` unused).

    Effect:
        ``dst[:, dst_col + u*Ps : +Ps] = src[:, src_col + u*stride : +block_w].T`` for u < n_blocks
        (``interleave`` b > 1: the block's columns as above).
        Up to ``bank_cols // Ps`` transposes share one PSUM tile (<= one 2 KiB bank per partition;
        the dtype ``ops.transpose_psum_dtype``), evacuated by one copy: ceil(n_blocks /
        (bank_cols // Ps)) copies.
    """
    Ps = src.shape[0]
    per_bank = _blocks_per_bank(bank_cols, Ps)
    n_full, rem = divmod(n_blocks, per_bank)
    engines = evac if isinstance(evac, tuple) else (evac,)
    stride = block_w if src_stride is None else src_stride
    if interleave > 1:      # static: block u's columns depend on u // b and u % b
        for g in ops.static_range(n_full + (1 if rem else 0)):
            n = per_bank if g < n_full else rem
            _transpose_group(ops, dst, dst_col + g * per_bank * Ps, src, src_col, block_w, n,
                             engines[g % len(engines)], stride, u0=g * per_bank, b=interleave)
        return
    if len(engines) == 1:
        for g in ops.parallel_range(n_full):
            _transpose_group(ops, dst, dst_col + g * per_bank * Ps, src,
                             src_col + g * per_bank * stride, block_w, per_bank, engines[0], stride)
    else:               # static loop: the engine of copy g is chosen in Python
        for g in ops.static_range(n_full):
            _transpose_group(ops, dst, dst_col + g * per_bank * Ps, src,
                             src_col + g * per_bank * stride, block_w, per_bank,
                             engines[g % len(engines)], stride)
    if rem:
        _transpose_group(ops, dst, dst_col + n_full * per_bank * Ps, src,
                         src_col + n_full * per_bank * stride, block_w, rem,
                         engines[n_full % len(engines)], stride)


def _transpose_group(ops, dst, dst_col, src, src_col, block_w, n, evac, stride, u0=0, b=1):
    """``n`` transposes into one PSUM tile and its copy; ``b > 1``: blocks ``u0 ..`` of an
    interleaved source (:func:`transpose_blocks`)."""
    Ps = src.shape[0]
    t_psum = ops.psum((block_w, n * Ps), ops.transpose_psum_dtype(src.dtype))
    for u in (ops.parallel_range(n) if b == 1 else ops.static_range(n)):
        if b == 1:
            blk = src[:, ops.ds(src_col + u * stride, block_w)]
        else:
            g, s = divmod(u0 + u, b)
            blk = ops.free_view(src, ((b, block_w),), col0=src_col + g * b * block_w + s)
        ops.transpose(t_psum[:, ops.ds(u * Ps, Ps)], blk)
    ops.copy(dst[:, ops.ds(dst_col, n * Ps)], t_psum, engine=evac)


def identity_tile(ops, size, dtype):
    """SBUF ``(size, size)`` identity in ``dtype`` (1.0 and 0.0 are exact in every float dtype,
    fp8 included): the moving operand of :func:`pe_matmul_transpose_blocks`."""
    diff = ops.sbuf((size, size), ops.float32)
    ops.iota(diff, step=1, partition_step=-1)
    eye = ops.sbuf((size, size), dtype)
    ops.tensor_tensor(eye, diff, 0.0, "equal")
    return eye


def pe_matmul_transpose_blocks(ops, dst, dst_col, parts, block_w, n_blocks, *, evac=None,
                               src_stride=None):
    """Transpose-and-sum column blocks of one or more sources as identity matmuls on TensorE.

    ``matmul(stationary=block, moving=identity)`` computes ``block.T @ I = block.T`` in fp32
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
        evac: engine name of the PSUM -> SBUF copies (one engine).
        src_stride: source columns between consecutive blocks (default block_w).

    Effect:
        ``dst[:, dst_col + u*Ps : +Ps] = sum_i src_i[:, col_i + u*stride : +block_w].T``.
        Up to ``512 // Ps`` blocks share one fp32 PSUM tile (one 2 KiB bank), evacuated by one
        copy. Unlike ``transpose``, a non-finite element of a block reaches every column of its
        output row (NaN * 0 in the matmul): callers feed rows of one sequence only.
    """
    Ps = parts[0][0].shape[0]
    per_bank = max(1, PSUM_BANK_F32 // Ps)
    stride = block_w if src_stride is None else src_stride
    for g in ops.static_range(-(-n_blocks // per_bank)):
        g0 = g * per_bank
        n = min(per_bank, n_blocks - g0)
        t_psum = ops.psum((block_w, n * Ps), ops.float32)
        for u in ops.static_range(n):
            for i, (src, col, eye) in enumerate(parts):
                ops.matmul(t_psum[:, ops.ds(u * Ps, Ps)],
                           src[:, ops.ds(col + (g0 + u) * stride, block_w)], eye,
                           accumulate=i > 0)
        ops.copy(dst[:, ops.ds(dst_col + g0 * Ps, n * Ps)], t_psum, engine=evac)
