"""Host planning: the immutable, validated description of one flat (continuous) batch.

Layouts and every formula used here are specified in ``docs/layouts.md``.

Dimensions
    S    number of sequences                      T    num_queries = sum(query_lens)
    B    block_size (tokens per cache block)       Qpad padded_queries = max(128, round_up(T, 128))
    LT   large_tile_size (context tokens per KV tile; vLLM's LARGE_TILE_SZ)
    M    blocks_per_tile = LT // B                 Tf   tiling_factor = 128 // M if M < 128 else 1
    b'   tiled_block_size = B // Tf                L    rows_per_tile = M * Tf = max(M, 128)

Example
    >>> p = make_plan([3, 1], [5, 0], block_size=4, large_tile_size=512)
    >>> p.padded_queries, p.context_blocks.tolist(), p.num_active_blocks, p.num_large_tiles
    (128, [2, 0], 128, 1)
    >>> p.tiling_factor, p.tiled_block_size, p.rows_per_tile
    (1, 4, 128)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from host._arrays import readonly
from host.validation import check_int, check_lens, check_power_of_two, fail
from nki_kernels.contract import (MAX_BLOCK_SIZE, MAX_TILE_SIZE, MIN_BLOCK_SIZE, MIN_TILE_SIZE,
                                  PARTITIONS, tile_geometry)

__all__ = [
    "PagedAttentionPlan",
    "make_plan",
    "round_up",
    "SUPPORTED_BLOCK_SIZES",
    "SUPPORTED_LARGE_TILE_SIZES",
    "PARTITIONS",
]

# Partitions (the kernel tiles Q and the block-table rows by 128), limits and the tile geometry
# are the host-kernel contract's (nki_kernels.contract), never re-derived here.
SUPPORTED_BLOCK_SIZES = tuple(1 << i for i in range(MIN_BLOCK_SIZE.bit_length() - 1,
                                                    MAX_BLOCK_SIZE.bit_length()))   # 1 .. 256
SUPPORTED_LARGE_TILE_SIZES = tuple(1 << i for i in range(MIN_TILE_SIZE.bit_length() - 1,
                                                         MAX_TILE_SIZE.bit_length()))  # 512 .. 8192
_INT32_MAX = np.iinfo(np.int32).max


def round_up(x: int, m: int) -> int:
    """Smallest multiple of ``m`` that is >= ``x`` (``x >= 0``, ``m >= 1``)."""
    return -(-int(x) // int(m)) * int(m)


@dataclass(frozen=True, eq=False)
class PagedAttentionPlan:
    """Frozen plan for one flat batch; validated in ``__post_init__``.

    Init fields
        query_lens (S,) int64, every entry >= 1: new (scheduled) tokens per sequence.
        context_lens (S,) int64, every entry >= 0: tokens already in the KV cache per sequence.
        block_size B: power of two in [1, 256].
        large_tile_size LT: power of two in [512, 8192] (>= B, so M = LT // B >= 2 and
            Tf = 128 // M divides B; see docs/layouts.md "Tiling").
        pad_queries_to: optional exact Qpad (shape bucket); multiple of 128, >= the minimum.
        pad_blocks_to: optional exact num_active_blocks (bucket); multiple of M, >= the minimum.

    Derived fields (all read-only)
        num_seqs S; num_queries T; padded_queries Qpad (= max(128, round_up(T, 128)) unless
        pad_queries_to); query_offsets (S,) exclusive cumsum of query_lens; context_blocks (S,)
        ceil(ctx_i / B); block_offsets (S,) exclusive cumsum of context_blocks; blocks_per_tile M;
        tiling_factor Tf; tiled_block_size b'; rows_per_tile L; num_active_blocks
        (= max(M, round_up(sum context_blocks, M)) unless pad_blocks_to); context_kv_len
        (= num_active_blocks * B); num_large_tiles (= context_kv_len // LT, always >= 1).
    """

    query_lens: Any
    context_lens: Any
    block_size: int
    large_tile_size: int = 2048
    pad_queries_to: int | None = None
    pad_blocks_to: int | None = None

    num_seqs: int = field(init=False)
    num_queries: int = field(init=False)
    padded_queries: int = field(init=False)
    query_offsets: np.ndarray = field(init=False, repr=False)
    context_blocks: np.ndarray = field(init=False, repr=False)
    block_offsets: np.ndarray = field(init=False, repr=False)
    blocks_per_tile: int = field(init=False)
    tiling_factor: int = field(init=False)
    tiled_block_size: int = field(init=False)
    rows_per_tile: int = field(init=False)
    num_active_blocks: int = field(init=False)
    context_kv_len: int = field(init=False)
    num_large_tiles: int = field(init=False)

    def __post_init__(self) -> None:
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)

        # Step 1: scalar parameters.
        B = check_power_of_two("block_size", self.block_size, lo=MIN_BLOCK_SIZE, hi=MAX_BLOCK_SIZE)
        LT = check_power_of_two("large_tile_size", self.large_tile_size,
                                lo=MIN_TILE_SIZE, hi=MAX_TILE_SIZE)
        put("block_size", B)
        put("large_tile_size", LT)
        # Both are powers of two and LT >= 512 > 256 >= B, so M >= 2 is a power of two and, when
        # M < 128, Tf = 128 // M divides B (B / Tf = LT / 128 >= 4). Checked, not assumed:
        geo = tile_geometry(B, LT)
        M, Tf = geo.M, geo.T
        if LT % B or B % Tf:  # pragma: no cover - unreachable with the ranges above
            fail("block_size", f"divide large_tile_size={LT} with {PARTITIONS}//M dividing it", B)

        # Step 2: length vectors (copied, int64, read-only).
        q = check_lens("query_lens", self.query_lens, min_value=1)
        if q.shape[0] == 0:
            fail("query_lens", "have at least one entry (one per sequence)", "0 entries")
        c = check_lens("context_lens", self.context_lens, min_value=0, length=q.shape[0],
                       length_arg="query_lens")
        q = readonly(np.array(q, dtype=np.int64))
        c = readonly(np.array(c, dtype=np.int64))
        put("query_lens", q)
        put("context_lens", c)

        # Step 3: query padding.
        T = int(q.sum())
        qpad_min = max(PARTITIONS, round_up(T, PARTITIONS))
        if self.pad_queries_to is None:
            qpad = qpad_min
        else:
            qpad = check_int("pad_queries_to", self.pad_queries_to)
            if qpad % PARTITIONS or qpad < qpad_min:
                fail("pad_queries_to", f"be a multiple of {PARTITIONS} and >= max(128, "
                     f"round_up(sum(query_lens)={T}, 128)) = {qpad_min}", repr(qpad))

        # Step 4: active blocks and large tiles (at least one tile even with no context).
        cblocks = -(-c // B)
        need = int(cblocks.sum())
        nab_min = max(M, round_up(need, M))
        if self.pad_blocks_to is None:
            nab = nab_min
        else:
            nab = check_int("pad_blocks_to", self.pad_blocks_to)
            if nab % M or nab < nab_min:
                fail("pad_blocks_to", f"be a multiple of blocks_per_tile={M} and >= "
                     f"max({M}, round_up(sum(ceil(context_lens/{B}))={need}, {M})) = {nab_min}",
                     repr(nab))
        ctx_len = nab * B
        if ctx_len + qpad > _INT32_MAX:
            fail("context_lens", f"give context_kv_len + padded_queries <= {_INT32_MAX} (int32 indices)",
                 f"{ctx_len} + {qpad}")

        put("num_seqs", int(q.shape[0]))
        put("num_queries", T)
        put("padded_queries", qpad)
        put("query_offsets", readonly(np.concatenate(([0], np.cumsum(q)[:-1])).astype(np.int64)))
        put("context_blocks", readonly(cblocks.astype(np.int64)))
        put("block_offsets", readonly(np.concatenate(([0], np.cumsum(cblocks)[:-1])).astype(np.int64)))
        put("blocks_per_tile", M)
        put("tiling_factor", Tf)
        put("tiled_block_size", geo.bp)
        put("rows_per_tile", geo.L)
        put("num_active_blocks", nab)
        put("context_kv_len", ctx_len)
        put("num_large_tiles", ctx_len // LT)
        assert self.rows_per_tile == max(M, PARTITIONS), "internal: L != max(M, 128)"
        assert self.num_large_tiles >= 1, "internal: no large tile"

    # Derived conveniences -------------------------------------------------------------------
    @property
    def seq_lens(self) -> np.ndarray:
        """(S,) int64 context_lens + query_lens."""
        return self.context_lens + self.query_lens

    @property
    def loads_per_tile(self) -> int:
        """ceil(L / 128): indirect DMAs per large tile for K (same for V)."""
        return self.rows_per_tile // PARTITIONS

    @property
    def num_query_tiles(self) -> int:
        """Qpad // 128."""
        return self.padded_queries // PARTITIONS

    # Equality / hashing over the init fields (arrays compared by value) ---------------------
    def _key(self) -> tuple:
        return (self.query_lens.tobytes(), self.context_lens.tobytes(), self.block_size,
                self.large_tile_size, self.padded_queries, self.num_active_blocks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PagedAttentionPlan):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def make_plan(query_lens: Any, context_lens: Any, *, block_size: int, large_tile_size: int = 2048,
              pad_queries_to: int | None = None, pad_blocks_to: int | None = None) -> PagedAttentionPlan:
    """Build and validate a :class:`PagedAttentionPlan` (lists, NumPy arrays or torch tensors)."""
    return PagedAttentionPlan(query_lens, context_lens, block_size, large_tile_size,
                              pad_queries_to, pad_blocks_to)
