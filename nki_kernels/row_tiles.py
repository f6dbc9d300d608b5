"""How the cache-op kernels spread R independent rows over 128-partition DMAs.

Pure Python arithmetic shared by :mod:`nki_kernels.cache.kv_cache_update` and
:mod:`nki_kernels.cache.block_copy` (no NKI calls; it runs at trace time on plain ints), plus two
trace-time checks (cache dtype, toolchain support for indirect-DMA skipping).

Every row of a cache op carries its own destination (and source) index, so the order in
which rows are assigned to partitions is free. We pick the order that makes the *direct*
loads contiguous per partition:

    R = 128 * n_tiles + rem
    bulk rows   q = p * n_tiles + t     (partition p = 0..127, tile t = 0..n_tiles-1)
    tail rows   q = 128 * n_tiles + p   (partition p = 0..rem-1), one extra tile if rem > 0

Bulk tiles are grouped into chunks of ``chunk`` tiles; one chunk's per-row inputs
(payload rows and/or indices) are loaded with ONE direct DMA of shape
(128, chunk, row_elems): partition p reads the contiguous run of rows
p*n_tiles + first .. p*n_tiles + first + chunk - 1, i.e. one descriptor per partition.
The indirect stores/gathers then move one tile (128 rows) per DMA instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

from nki_kernels.contract import PARTITIONS

PMAX = PARTITIONS  # partitions per tile (nl.tile_size.pmax on trn1 and trn2)


@dataclass(frozen=True)
class RowTiling:
    """Tiling of ``rows`` rows into full 128-row tiles grouped in chunks, plus a tail tile.

    Attributes:
        rows: R, number of rows.
        n_tiles: R // 128, full tiles (bulk rows q = p * n_tiles + t).
        rem: R % 128, rows of the tail tile (0 = no tail tile).
        chunk: full tiles per chunk (>= 1; == n_tiles when everything fits the budget).
        n_full_chunks: n_tiles // chunk.
        last_chunk: n_tiles % chunk, tiles of the trailing short chunk (0 = none).
    """

    rows: int
    n_tiles: int
    rem: int
    chunk: int
    n_full_chunks: int
    last_chunk: int

    @property
    def n_chunks(self) -> int:
        """Chunks including the trailing short one."""
        return self.n_full_chunks + (1 if self.last_chunk else 0)

    @property
    def indirect_tiles(self) -> int:
        """Tiles moved by indirect DMAs: ceil(R / 128)."""
        return self.n_tiles + (1 if self.rem else 0)


def plan_rows(rows: int, bytes_per_row_per_tile: int, budget_bytes: int) -> RowTiling:
    """Tile ``rows`` rows; a chunk holds at most ``budget_bytes`` per partition.

    ``bytes_per_row_per_tile`` is what one tile adds to a partition's chunk buffers
    (e.g. K row + V row + index for the cache write).
    """
    if rows < 0 or bytes_per_row_per_tile <= 0 or budget_bytes <= 0:
        raise ValueError(f"plan_rows: invalid arguments rows={rows}, "
                         f"bytes_per_row_per_tile={bytes_per_row_per_tile}, budget_bytes={budget_bytes}")
    n_tiles, rem = divmod(rows, PMAX)
    chunk = max(1, min(n_tiles, budget_bytes // bytes_per_row_per_tile)) if n_tiles else 1
    n_full_chunks, last_chunk = divmod(n_tiles, chunk)
    return RowTiling(rows, n_tiles, rem, chunk, n_full_chunks, last_chunk)


def cache_itemsize(ops, dtype, kernel: str) -> int:
    """Bytes per element of a supported KV-cache dtype, checked at trace time (either API: ``ops``
    is the kernel's op layer, ``nki_kernels.ops.legacy`` / ``.current``).

    float32, bfloat16, float16, and the NKI fp8 types float8_e4m3 / float8_e5m2 (a vLLM
    float8_e4m3fn cache is passed as its float8_e4m3 byte view; docs/attention-variants.md).
    """
    from nki_kernels._assert import kernel_unsupported
    from nki_kernels.ops import dtype_name, itemsize

    name = dtype_name(dtype)
    kernel_unsupported(name in CACHE_DTYPES, kernel, f"cache dtype {name}",
                       "use a float32, bfloat16, float16, float8_e4m3 or float8_e5m2 cache (pass a "
                       "float8_e4m3fn cache as its float8_e4m3 byte view)")
    return itemsize(name)


CACHE_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2")


def require_oob_skip(ops, kernel: str) -> None:
    """NotImplementedError on a toolchain whose indirect DMAs cannot skip out-of-bounds rows.

    The cache-write kernels skip padding rows with ``oob_mode.skip`` DMAs. On the legacy API
    ``oob_mode`` (with ``dge_mode`` and ``dst_rmw_op``) arrived in Neuron SDK 2.23 (NKI release
    notes 2.23); the 2.21 / 2.22 ``nki.isa`` has neither ``oob_mode`` nor the keyword
    (``dma_copy(src, dst)``); the current API always has it. A feature check on the toolchain in
    use (``ops.has_oob_skip()``), so an old compiler fails with a message instead of an
    AttributeError deep in the kernel.
    """
    from nki_kernels._assert import kernel_unsupported

    kernel_unsupported(ops.has_oob_skip(), kernel,
                       "this NKI toolchain (nki.isa has no oob_mode: indirect-DMA out-of-bounds "
                       "skipping needs neuronx-cc from Neuron SDK 2.23)",
                       "upgrade to Neuron SDK >= 2.23")
