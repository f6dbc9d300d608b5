"""KV-cache write (vLLM ``reshape_and_cache``) as an NKI kernel: indirect DMA scatters, 128 rows each.

One source for both NKI APIs (the op layer, :mod:`nki_kernels.ops`): ``kv_cache_update.for_api(
api)`` is the jitted kernel of ``api`` ("legacy" | "nki"); calling the family runs the legacy one.
Both write ``kv_cache`` in place (legacy: a ``mutable_tensor`` argument, returned; current: every
HBM argument is updated in place). The scatters are ``ops.scatter``: legacy an ``nl.arange``
index into the cache rows, current ``.ap(..., vector_offset=<(128, 1) index column>,
indirect_dim=0)``; both with ``oob_mode.skip``.

Dimensions:
    T    new tokens;  Hkv  KV heads;  d  head size;  N  cache blocks;  B  block size
    R  = T * Hkv      rows to write per K / V half: one row = one (token, head) = d elements
    NHB = N * Hkv * B rows per K / V half of the cache

Layout choice. The paged cache is (2, N, Hkv, B, d). For a fixed (kv, block, head) the B token
slots are consecutive d-element rows, but one token's Hkv heads are B*d elements apart, so the
largest contiguous unit a new token writes is one (token, head) row of d elements. We view the
cache as (2, NHB, d) (a free reshape of a C-contiguous array) and give every (token, head)
row its own destination row

    row(t, h) = (block(t) * Hkv + h) * B + offset(t),   block = slot // B, offset = slot % B

computed on the host. With an index per row, 128 (token, head) rows of ANY tokens and heads
share one indirect DMA, so the store count is 2 * ceil(T * Hkv / 128) (K and V halves), not
one per token (``nki_kernels/baselines/kv_write_per_token.py``) or per (token, head).
The kernel reshapes key / value to (R, d) row views and the cache to (2, NHB, d) (free views of
HBM tensors, as vLLM's kernel does with ``kv_cache.reshape``). The row index is built on the host,
where vLLM's model runner builds ``slot_mapping`` anyway (an O(T * Hkv) int32 expansion; doing
the div / mod by B on device would need exact integer arithmetic on GpSimd).

Negative slots (padding) are skipped on the DMA: the host maps them to row index 2 * NHB and the
stores skip out-of-bounds rows (``oob_mode.skip``). 2 * NHB is out of bounds of the
whole cache, so it is skipped whether the hardware bounds-checks the indexed axis or the
flattened tensor (the documented simulator message is about the flattened tensor; an index of
NHB would land in the V half of the flattened cache). Skipping keeps every shape fixed (no
recompilation per number of valid tokens) and needs no host compaction of key / value.
``oob_mode`` needs Neuron SDK >= 2.23 (``row_tiles.require_oob_skip`` checks it up front;
the current API always has it).

Row order. Row q of the inputs goes to partition / tile as in :mod:`nki_kernels.row_tiles`
(bulk row q = p * n_tiles + t), so one direct DMA per chunk loads the K rows (and one the V rows,
one the indices) of up to ``chunk`` tiles with one contiguous descriptor per partition.

DMA instructions of one core (n_tiles = R // 128, rem = R % 128, n_chunks = ceil(n_tiles /
chunk); on the current API at LNC 2 each core counts its ceil(R / 2) rows, ``row_tiles``):
    3 * n_chunks + 2 * n_tiles            bulk: index + K + V loads per chunk, 2 stores per tile
    + 5 if rem > 0                        tail tile: index, K, V loads and 2 stores
    indirect stores = 2 * ceil(R / 128)

Pseudocode:
    key_rows, value_rows = key / value as (R, d); cache_rows = kv_cache as (2, NHB, d)
    for each chunk of full tiles:                       # sequential_range
        idx[p, t]  = row_index[p * n_tiles + first + t]       # 1 DMA
        k[p, t, :] = key_rows[p * n_tiles + first + t, :]     # 1 DMA
        v[p, t, :] = value_rows[...]                          # 1 DMA
        for t in chunk:                                 # affine_range
            cache_rows[0, idx[p, t], :] = k[p, t, :]  (skip OOB)   # 1 indirect DMA, 128 rows
            cache_rows[1, idx[p, t], :] = v[p, t, :]  (skip OOB)   # 1 indirect DMA, 128 rows
    tail tile (rem rows): the same with rows 128 * n_tiles + p

vLLM's block-KV layout (``kv_cache_update_blocks``; vLLM / vllm-neuron hand over one (N, B, Hkv, d)
tensor per K and per V, block 0 their null block). Slot s = block * B + offset holds its Hkv heads
contiguously, so one token's write is ONE contiguous row of Hkv * d elements: the caches are viewed
as (N * B, Hkv * d) rows (free reshapes), row = slot, and each 128-token tile is one indirect DMA
per K / V with one descriptor of Hkv * d * itemsize bytes per token (the (2, N, Hkv, B, d) layout
needs Hkv descriptors of d * itemsize per token). Rows over 16 KiB fall back to (token, head) rows
of d elements (row = slot * Hkv + head). Same chunking, padding skip (row N * B * Hkv * d / F) and
DMA counts with R = T (or T * Hkv) rows; the caches are written in place, never copied.

FP8 caches (``kv_cache_update_fp8``). The cache is float8_e4m3 or float8_e5m2 (the host passes a
float8_e4m3fn cache as its float8_e4m3 byte view, see docs/attention-variants.md); key / value
stay in their float dtype and every row carries its inverse scales ``row_scale[q] = [1/k_scale,
1/v_scale]`` of its KV head (float32 (R, 2), loaded per chunk like the indices). Per tile and per
K / V, before the store:
    y = x * inv_scale[p]                 ScalarE activation (copy) with a [128, 1] fp32 scale
    y8 = max(min(y, S), -S) -> fp8       VectorE tensor_scalar, written in the cache dtype (RNE)
with S the largest finite value of the cache dtype (float8_e4m3: 240, float8_e5m2: 57344), so no
value overflows to inf / NaN. Four compute instructions per tile; DMA counts as above, plus one
row_scale load per chunk (and one for the tail tile).
"""

from nki_kernels.contract import CACHE_WRITE_MAX_ROW_BYTES
from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.ops import KernelFamily
from nki_kernels.row_tiles import PMAX, cache_itemsize, require_oob_skip, run_row_tiles


KERNEL = "kv_cache_update"
KERNEL_FP8 = "kv_cache_update_fp8"
KERNEL_BLOCKS = "kv_cache_update_blocks"
# Per-partition SBUF bytes for one chunk's K rows + V rows + indices. 32 KiB of the ~176-208 KiB
# usable per partition (trn1 / trn2) leaves room for the compiler to double-buffer chunks.
CHUNK_BUDGET_BYTES = 32 * 1024
# Largest row (d * itemsize) we put in one partition; head sizes are <= 512 in practice.
MAX_ROW_BYTES = CACHE_WRITE_MAX_ROW_BYTES


def _fp8_saturation(ops, dtype):
    """Largest finite value of an NKI fp8 cache dtype, or None for any other dtype."""
    for known, bound in ((ops.float8_e4m3, 240.0), (ops.float8_e5m2, 57344.0)):
        if dtype == known:
            return bound
    return None


def _build(ops):
    def kv_cache_update(key, value, kv_cache: ops.MUTABLE, row_index):
        """Scatter new K / V rows into the paged cache through per-row indices; returns ``kv_cache``.

        Args:
            key: (T, Hkv, d) HBM, the new keys, same dtype as the cache (the host casts).
            value: (T, Hkv, d) HBM, the new values.
            kv_cache: (2, N, Hkv, B, d) HBM, float32 / bfloat16 / float16. Written in place.
            row_index: (T * Hkv, 1) int32 (or uint32) HBM; row_index[t * Hkv + h, 0] is the
                destination row of (token t, head h) in the (2, N*Hkv*B, d) view of kv_cache (the
                same row in the K and the V half); a row >= N*Hkv*B (the host uses 2*N*Hkv*B) is
                skipped.

        Returns:
            kv_cache (the written input, as the legacy API requires for a written parameter).

        Raises:
            ValueError: shapes / dtypes inconsistent.
            NotImplementedError: unsupported cache dtype, d * itemsize > 16 KiB, or a legacy NKI
                toolchain older than Neuron SDK 2.23 (no ``nisa.oob_mode``).
        """
        _check_shapes(KERNEL, key, value, kv_cache, row_index)
        d = key.shape[2]
        kernel_check(key.dtype == kv_cache.dtype and value.dtype == kv_cache.dtype, KERNEL,
                     "key.dtype / value.dtype", f"equal kv_cache.dtype {kv_cache.dtype}",
                     (str(key.dtype), str(value.dtype)))
        row_bytes = d * cache_itemsize(ops, kv_cache.dtype, KERNEL)
        kernel_unsupported(_fp8_saturation(ops, kv_cache.dtype) is None, KERNEL,
                           f"an unscaled write into a {kv_cache.dtype} cache",
                           "write fp8 caches with kv_cache_update_fp8 (quantizes with per-row scales)")
        _write_rows(ops, key, value, kv_cache, row_index, None, 2 * row_bytes + 4, row_bytes)
        return kv_cache

    return kv_cache_update


def _build_fp8(ops):
    def kv_cache_update_fp8(key, value, kv_cache: ops.MUTABLE, row_index, row_scale):
        """Quantize new K / V rows to fp8 and scatter them into the paged cache; returns ``kv_cache``.

        Args:
            key, value: (T, Hkv, d) HBM, float32 / bfloat16 / float16 (both the same dtype).
            kv_cache: (2, N, Hkv, B, d) HBM, float8_e4m3 or float8_e5m2. Written in place.
            row_index: (T * Hkv, 1) int32 / uint32, as in :func:`kv_cache_update`.
            row_scale: (T * Hkv, 2) float32; row q = t * Hkv + h holds [1 / k_scale, 1 / v_scale]
                of KV head h. The cache receives fp8(clamp(x * row_scale[q, kv], -S, S)).

        Returns:
            kv_cache (the written input).

        Raises:
            ValueError: shapes / dtypes inconsistent.
            NotImplementedError: a non-fp8 cache (use kv_cache_update), d * itemsize > 16 KiB, or
                a legacy NKI toolchain older than Neuron SDK 2.23.
        """
        name = KERNEL_FP8
        rows = _check_shapes(name, key, value, kv_cache, row_index)
        kernel_unsupported(_fp8_saturation(ops, kv_cache.dtype) is not None, name,
                           f"kv_cache dtype {kv_cache.dtype} (an fp8 write needs float8_e4m3 or "
                           "float8_e5m2)", "use kv_cache_update for float32 / bfloat16 / float16 caches")
        kernel_check(tuple(row_scale.shape) == (rows, 2), name, "row_scale.shape", f"be ({rows}, 2)",
                     tuple(row_scale.shape))
        kernel_check(row_scale.dtype == ops.float32, name, "row_scale.dtype", "be float32",
                     str(row_scale.dtype))
        kernel_check(key.dtype == ops.float32 or key.dtype == ops.bfloat16 or key.dtype == ops.float16,
                     name, "key.dtype", "be float32, bfloat16 or float16", str(key.dtype))
        kernel_check(value.dtype == key.dtype, name, "value.dtype", f"equal key.dtype {key.dtype}",
                     str(value.dtype))
        row_bytes = key.shape[2] * (4 if key.dtype == ops.float32 else 2)
        _write_rows(ops, key, value, kv_cache, row_index, row_scale, 2 * row_bytes + 12, row_bytes,
                    name)
        return kv_cache

    return kv_cache_update_fp8


def _build_blocks(ops):
    def kv_cache_update_blocks(key, value, key_cache: ops.MUTABLE, value_cache: ops.MUTABLE,
                               row_index, row_elems=0):
        """Scatter new K / V into vLLM's block-KV layout (one tensor per K and per V); returns
        ``(key_cache, value_cache)``.

        Args:
            key, value: (T, Hkv, d) HBM, the cache dtype (float32 / bfloat16 / float16).
            key_cache, value_cache: (N, B, Hkv, d) HBM each (vLLM / vllm-neuron block-KV; slot
                s = block * B + offset holds its Hkv heads contiguously). Written in place.
            row_index: (R, 1) int32 / uint32, R = T * Hkv * d / row_elems: destination row of
                input row q in the (N*B*Hkv*d / F, F) view of either cache (the same row in
                both); a row >= that count is skipped (the host uses the count).
            row_elems: F (compile-time int): Hkv * d (one row per token: row = slot) or d (one
                row per (token, head): row = slot * Hkv + head).

        Returns:
            (key_cache, value_cache), written in place.

        Raises:
            ValueError: shapes / dtypes inconsistent, or row_elems not Hkv * d or d.
            NotImplementedError: an fp8 or other unsupported cache dtype, a row over 16 KiB, or
                a legacy NKI toolchain older than Neuron SDK 2.23.
        """
        name = KERNEL_BLOCKS
        kernel_check(len(key.shape) == 3 and tuple(value.shape) == tuple(key.shape), name,
                     "key / value", "be (T, Hkv, d) of equal shape",
                     (tuple(key.shape), tuple(value.shape)))
        n_tok, n_heads, d = key.shape
        for arg, c in (("key_cache", key_cache), ("value_cache", value_cache)):
            kernel_check(len(c.shape) == 4 and tuple(c.shape[2:]) == (n_heads, d), name,
                         f"{arg}.shape", f"be (N, B, {n_heads}, {d})", tuple(c.shape))
        kernel_check(tuple(value_cache.shape) == tuple(key_cache.shape), name, "value_cache.shape",
                     f"equal key_cache.shape {tuple(key_cache.shape)}", tuple(value_cache.shape))
        kernel_check(key.dtype == key_cache.dtype and value.dtype == key_cache.dtype
                     and value_cache.dtype == key_cache.dtype, name, "dtypes",
                     f"all equal key_cache.dtype {key_cache.dtype}",
                     (str(key.dtype), str(value.dtype), str(value_cache.dtype)))
        kernel_check(row_elems in (n_heads * d, d), name, "row_elems",
                     f"be Hkv * d = {n_heads * d} or d = {d}", row_elems)
        rows = n_tok * n_heads * d // row_elems
        kernel_check(tuple(row_index.shape) == (rows, 1) and _index_dtype(row_index.dtype), name,
                     "row_index", f"be ({rows}, 1) int32 or uint32",
                     (tuple(row_index.shape), str(row_index.dtype)))
        row_bytes = row_elems * cache_itemsize(ops, key_cache.dtype, name)
        kernel_unsupported(_fp8_saturation(ops, key_cache.dtype) is None, name,
                           f"a {key_cache.dtype} block-KV cache",
                           "write fp8 caches in the (2, N, Hkv, B, d) layout (kv_cache_update_fp8)")
        n_cache = key_cache.shape[0] * key_cache.shape[1] * n_heads * d // row_elems
        _scatter_rows(ops, name, (key.reshape((rows, row_elems)), value.reshape((rows, row_elems))),
                      ((key_cache.reshape((n_cache, row_elems)), ()),
                       (value_cache.reshape((n_cache, row_elems)), ())),
                      row_index, None, 2 * row_bytes + 4, row_bytes, None)
        return key_cache, value_cache

    return kv_cache_update_blocks


kv_cache_update = KernelFamily(_build, KERNEL)
kv_cache_update_fp8 = KernelFamily(_build_fp8, KERNEL_FP8)
kv_cache_update_blocks = KernelFamily(_build_blocks, KERNEL_BLOCKS)


def _check_shapes(name, key, value, kv_cache, row_index):
    """Shape / index checks shared by both kernels; returns R = T * Hkv."""
    kernel_check(len(key.shape) == 3, name, "key", "be 3-D (T, Hkv, d)", tuple(key.shape))
    n_tok, n_heads, d = key.shape
    kernel_check(tuple(value.shape) == (n_tok, n_heads, d), name, "value.shape",
                 f"equal key.shape {(n_tok, n_heads, d)}", tuple(value.shape))
    kernel_check(len(kv_cache.shape) == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[2] == n_heads
                 and kv_cache.shape[4] == d, name, "kv_cache.shape", f"be (2, N, {n_heads}, B, {d})",
                 tuple(kv_cache.shape))
    rows = n_tok * n_heads
    kernel_check(tuple(row_index.shape) == (rows, 1), name, "row_index.shape",
                 f"be ({rows}, 1)", tuple(row_index.shape))
    kernel_check(_index_dtype(row_index.dtype), name, "row_index.dtype", "be int32 or uint32",
                 str(row_index.dtype))
    return rows


def _index_dtype(dtype) -> bool:
    from nki_kernels.ops import dtype_name

    return dtype_name(dtype) in ("int32", "uint32")


def _write_rows(ops, key, value, kv_cache, row_index, row_scale, bytes_per_tile, row_bytes,
                name=KERNEL):
    """The (2, N, Hkv, B, d) layout: (token, head) rows of d elements into the (2, N*Hkv*B, d)
    cache view (K half at leading index 0, V half at leading index 1); ``row_scale`` None = plain
    copy, else fp8 quantize."""
    d = key.shape[2]
    _, n_blocks, n_heads, block_size, _ = kv_cache.shape
    rows = key.shape[0] * n_heads
    # Free views: (token, head) rows of the inputs, and the cache with (N, Hkv, B) flattened.
    cache_rows = kv_cache.reshape((2, n_blocks * n_heads * block_size, d))
    _scatter_rows(ops, name, (key.reshape((rows, d)), value.reshape((rows, d))),
                  ((cache_rows, (0,)), (cache_rows, (1,))), row_index, row_scale, bytes_per_tile,
                  row_bytes, _fp8_saturation(ops, kv_cache.dtype))


def _scatter_rows(ops, name, rows_in, targets, row_index, row_scale, bytes_per_tile, row_bytes,
                  bound):
    """Chunk loop over the input rows ``rows_in`` = (K rows, V rows), 2-D (R, F) HBM views;
    row q goes to row ``row_index[q]`` of ``targets`` = ((K table, lead), (V table, lead))."""
    d = rows_in[0].shape[1]
    kernel_unsupported(row_bytes <= MAX_ROW_BYTES, name, f"a row of {d} elements ({row_bytes} "
                       "bytes: the head size, or Hkv * head size in the block-KV layout)",
                       f"keep d * itemsize <= {MAX_ROW_BYTES}")
    require_oob_skip(ops, name)
    ins = rows_in + (row_index, row_scale)
    run_row_tiles(ops, rows_in[0].shape[0], bytes_per_tile, CHUNK_BUDGET_BYTES,
                  lambda first, n_tiles, n: _write_chunk(ops, ins, targets, bound, n_tiles, first, n),
                  lambda start, n: _write_tail(ops, ins, targets, bound, start, n))


def _quantize(ops, x, inv_scale, bound, dtype):
    """fp8(clamp(x * inv_scale, -bound, bound)): ScalarE scale, VectorE clamp + cast."""
    y = ops.sbuf(x.shape, ops.float32)
    ops.activation(y, "copy", x, scale=inv_scale)
    q = ops.sbuf(x.shape, dtype)
    ops.tensor_scalar(q, y, "minimum", bound, op1="maximum", operand1=-bound)
    return q


def _write_chunk(ops, ins, targets, bound, n_tiles, first, n_chunk):
    """Tiles first .. first + n_chunk - 1 of the bulk rows (row p * n_tiles + t on partition p)."""
    key_rows, value_rows, row_index, row_scale = ins
    (k_table, k_lead), (v_table, v_lead) = targets
    d = key_rows.shape[1]
    idx = ops.sbuf((PMAX, n_chunk, 1), row_index.dtype)            # (128, n_chunk, 1) int32
    ops.load(idx, ops.row_block(row_index, first, n_tiles, PMAX, n_chunk))
    k = ops.sbuf((PMAX, n_chunk, d), key_rows.dtype)               # (128, n_chunk, d)
    ops.load(k, ops.row_block(key_rows, first, n_tiles, PMAX, n_chunk))
    v = ops.sbuf((PMAX, n_chunk, d), value_rows.dtype)
    ops.load(v, ops.row_block(value_rows, first, n_tiles, PMAX, n_chunk))
    if row_scale is not None:
        inv = ops.sbuf((PMAX, n_chunk, 2), ops.float32)            # (128, n_chunk, 2) fp32
        ops.load(inv, ops.row_block(row_scale, first, n_tiles, PMAX, n_chunk))
    for t in ops.parallel_range(n_chunk):
        k_out, v_out = k[:, t, :], v[:, t, :]
        if row_scale is not None:
            k_out = _quantize(ops, k_out, inv[:, t, 0:1], bound, k_table.dtype)
            v_out = _quantize(ops, v_out, inv[:, t, 1:2], bound, v_table.dtype)
        col = idx[:, t, :]
        ops.scatter(k_table, col, 0, k_out, lead=k_lead)
        ops.scatter(v_table, col, 0, v_out, lead=v_lead)


def _write_tail(ops, ins, targets, bound, start, n):
    """The last R % 128 rows, start + p on partition p."""
    key_rows, value_rows, row_index, row_scale = ins
    (k_table, k_lead), (v_table, v_lead) = targets
    d = key_rows.shape[1]
    idx = ops.sbuf((n, 1), row_index.dtype)                        # (n, 1) int32
    ops.load(idx, ops.rows(row_index, start, n))
    k = ops.sbuf((n, d), key_rows.dtype)
    ops.load(k, ops.rows(key_rows, start, n))
    v = ops.sbuf((n, d), value_rows.dtype)
    ops.load(v, ops.rows(value_rows, start, n))
    if row_scale is not None:
        inv = ops.sbuf((n, 2), ops.float32)                        # (n, 2) fp32
        ops.load(inv, ops.rows(row_scale, start, n))
        k = _quantize(ops, k, inv[:, 0:1], bound, k_table.dtype)
        v = _quantize(ops, v, inv[:, 1:2], bound, v_table.dtype)
    ops.scatter(k_table, idx, 0, k, lead=k_lead)
    ops.scatter(v_table, idx, 0, v, lead=v_lead)
