"""How the cache-op kernels spread R independent rows over 128-partition DMAs.

Shared by the cache kernels (:mod:`nki_kernels.cache.kv_cache_update`,
:mod:`nki_kernels.cache.block_copy`, :mod:`nki_kernels.cache.mla_cache_update`): the tiling
arithmetic (plain Python on ints at trace time), the loop that runs a launch's tiles on its
cores (:func:`run_row_tiles`, device code on the op layer) and two trace-time checks (cache
dtype, toolchain support for indirect-DMA skipping).

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

Cores. A launch on the two physical cores of a trn2 logical core (current API, LNC=2) splits
the rows: core c takes R_c = ceil(R / 2) rows from row c * (R - R_c) (an odd R's middle row on
both) and tiles them as above (bulk row base + p * n_tiles + t, tail rows after them). The row
written by both cores gets the same bytes from both: every cache op's destinations are unique
and no source row is also a destination (host-validated), so each row's copy is idempotent.
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


def run_row_tiles(ops, rows: int, bytes_per_row_per_tile: int, budget_bytes: int, chunk,
                  tail) -> None:
    """Run a cache op's ``rows`` rows on this launch's cores (module docstring, "Cores"), each
    core tiling its share with :func:`plan_rows`: ``chunk(first, n_tiles, count)`` per chunk of
    full tiles (rows ``first + p * n_tiles + t``, ``t < count``), then ``tail(start, n)`` for
    the tail rows ``start .. start + n - 1``. ``first`` / ``start`` may hold ``nl.program_id``
    arithmetic (they enter HBM access offsets only). One core (legacy API, LNC=1): the plan of
    all rows, from row 0.

    The chunk loop is sequential: the scatter destinations are data-dependent (index tiles) and
    do not mention the chunk, so NKI's affine_range output-dependency rule (each iteration
    writes a different, index-visible location; err_unexpected_output_dependencies) cannot be
    shown statically; within a chunk the callers' tile loops are affine (the index subscript
    carries the tile, the form AWS kernels use)."""
    core, cores = ops.launch_core()
    own = -(-rows // cores)                      # this core's rows
    base = core * (rows - own)                   # its first one
    plan = plan_rows(own, bytes_per_row_per_tile, budget_bytes)
    for c in ops.sequential_range(plan.n_full_chunks):
        chunk(base + c * plan.chunk, plan.n_tiles, plan.chunk)
    if plan.last_chunk > 0:
        chunk(base + plan.n_full_chunks * plan.chunk, plan.n_tiles, plan.last_chunk)
    if plan.rem > 0:
        tail(base + plan.n_tiles * PMAX, plan.rem)


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
