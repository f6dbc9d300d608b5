"""Block tables: the flat active table, the kernel's indirect-load transform, its inverse, and
the token order the vectorized KV load delivers. Spec: ``docs/layouts.md`` §3-§5.

Dimensions (see host/dense/plan.py): B block size, LT large tile size, M = LT // B blocks per tile,
Tf tiling factor, b' = B // Tf, L = M * Tf = max(M, 128) rows per tile, nL = L // 128 indirect
loads per tile (K and V each), n_tiles = num_large_tiles, Hkv KV heads.

    active_block_table(plan, block_tables)           (S, max_blocks) -> (num_active_blocks,) int32
    transform_block_tables(active, head_id=h, ...)   (n_tiles*M,)    -> (nL, 128, n_tiles) int32
    inverse_transform_block_tables(t, ...)           (nL, 128, n_tiles) -> ((n_tiles*M,), h)
    to_partition_first / from_partition_first        (nL, 128, n) <-> (128, nL, n)  (SBUF layout)
    load_column_tokens(...)                          K column -> tile-flat natural token index
    loaded_cache_slots(t, ...)                       K column -> cache slot block*B + offset
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host._arrays import from_numpy_like, to_numpy
from host.dense.plan import PagedAttentionPlan
from nki_kernels.contract import (MAX_BLOCK_SIZE, MAX_TILE_SIZE, MIN_BLOCK_SIZE, MIN_TILE_SIZE,
                                  PARTITIONS)
from nki_kernels.contract import tile_geometry as contract_tile_geometry
from host.validation import (check_index_range, check_int, check_integer_array,
                             check_power_of_two, check_shape, fail)

__all__ = [
    "active_block_table",
    "active_table_of",
    "check_block_tables",
    "transform_block_tables",
    "transform_block_tables_all_heads",
    "inverse_transform_block_tables",
    "to_partition_first",
    "from_partition_first",
    "tile_geometry",
    "load_column_tokens",
    "loaded_cache_slots",
]

_INT32_MAX = int(np.iinfo(np.int32).max)


def tile_geometry(block_size: int, large_tile_size: int) -> tuple[int, int, int, int]:
    """Validated ``(M, Tf, b', L)`` for a block size and large tile size (docs/layouts.md §3):
    ``nki_kernels.contract.tile_geometry`` after the range checks."""
    B = check_power_of_two("block_size", block_size, lo=MIN_BLOCK_SIZE, hi=MAX_BLOCK_SIZE)
    LT = check_power_of_two("large_tile_size", large_tile_size, lo=MIN_TILE_SIZE, hi=MAX_TILE_SIZE)
    g = contract_tile_geometry(B, LT)
    return g.M, g.T, g.bp, g.L


def check_block_tables(block_tables: Any, context_lens: np.ndarray, *, block_size: int,
                       num_blocks: int | None = None) -> np.ndarray:
    """Validated ``(S, max_blocks)`` int64 block tables for validated ``context_lens`` (S,).

    Row i's first ``ceil(context_lens[i] / block_size)`` entries must be block ids >= 0 (and
    < ``num_blocks`` when given) that fit int32; later entries are ignored (may be -1).
    Raises the ValueError naming ``block_tables`` (first offender shown).
    """
    arr, _ = to_numpy(block_tables, "block_tables")
    bt = check_integer_array("block_tables", arr, ndim=2)
    S = context_lens.shape[0]
    check_shape("block_tables", bt, (S, None), "(num_seqs, max_blocks)")
    cblocks = -(-context_lens // block_size)
    need = int(cblocks.max())
    if bt.shape[1] < need:
        i = int(np.argmax(cblocks))
        fail("block_tables", f"have at least ceil(context_lens[{i}]={int(context_lens[i])} / "
             f"block_size={block_size}) = {need} columns", f"shape {bt.shape}")
    seq, k = _used_entries(cblocks)
    used = bt[seq, k]
    if used.size and used.min() < 0:
        j = int(np.argmax(used < 0))
        fail("block_tables", "hold block ids >= 0 in the first ceil(context_lens/block_size) "
             "entries of each row", f"block_tables[{int(seq[j])}, {int(k[j])}] = {int(used[j])}")
    if num_blocks is not None:
        n = check_int("num_blocks", num_blocks, min_value=1)
        if used.size and used.max() >= n:
            j = int(np.argmax(used >= n))
            fail("block_tables", f"hold block ids < num_blocks={n} (inside the cache)",
                 f"block_tables[{int(seq[j])}, {int(k[j])}] = {int(used[j])}")
    if used.size and used.max() > _INT32_MAX:
        fail("block_tables", f"hold ids that fit int32 (<= {_INT32_MAX})", int(used.max()))
    return bt


def _used_entries(context_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sequence id, in-sequence block index) of every used block-table entry, in order."""
    offsets = np.concatenate(([0], np.cumsum(context_blocks)[:-1])).astype(np.int64)
    seq = np.repeat(np.arange(context_blocks.shape[0]), context_blocks)
    k = np.arange(int(context_blocks.sum())) - np.repeat(offsets, context_blocks)
    return seq, k


def active_block_table(plan: PagedAttentionPlan, block_tables: Any, *,
                       num_blocks: int | None = None) -> Any:
    """Concatenate each sequence's first ``ceil(ctx_i / B)`` block ids; pad with 0.

    Args:
        plan: the batch plan.
        block_tables: (S, max_blocks) integer; row i lists sequence i's blocks in token order.
            Entries past ``plan.context_blocks[i]`` are ignored (may be -1 or anything).
        num_blocks: if given, the used ids must lie in [0, num_blocks) (the cache size).
    Returns:
        (plan.num_active_blocks,) int32. Entry ``plan.block_offsets[i] + k`` = block_tables[i, k];
        entries past ``sum(context_blocks)`` are 0 (a valid id; the mask hides those tokens).
        A torch tensor if ``block_tables`` was one.
    """
    arr, was_torch = to_numpy(block_tables, "block_tables")
    bt = check_block_tables(arr, plan.context_lens, block_size=plan.block_size,
                            num_blocks=num_blocks)
    return from_numpy_like(active_table_of(plan, bt), was_torch, like=block_tables)


def active_table_of(plan: PagedAttentionPlan, block_tables: np.ndarray) -> np.ndarray:
    """:func:`active_block_table` of block tables already checked by
    :func:`check_block_tables`: (plan.num_active_blocks,) int32 (read-write)."""
    seq, k = _used_entries(plan.context_blocks)
    out = np.zeros(plan.num_active_blocks, dtype=np.int32)
    out[:seq.shape[0]] = block_tables[seq, k]
    return out


def _check_active(active_table: Any, M: int) -> np.ndarray:
    bt = check_integer_array("active_table", active_table, ndim=1)
    if bt.shape[0] == 0 or bt.shape[0] % M:
        fail("active_table", f"have a positive multiple of blocks_per_tile={M} entries",
             f"{bt.shape[0]} entries")
    check_index_range("active_table", bt, upper=_INT32_MAX, what="block ids")
    return bt


def _transform(bt: np.ndarray, heads: np.ndarray, Hkv: int, M: int, Tf: int, L: int) -> np.ndarray:
    """(n_tiles*M,) ids, (nh,) heads -> (nh, L//128, 128, n_tiles) int32 row ids of the flat view.

    Uses idx = (bt*Hkv + h)*Tf + t = (bt*Hkv*Tf + t) + h*Tf: the head-independent part is built
    and transposed to (L, n_tiles) once, then each head is a broadcast add (callers have checked
    that every id fits int32).
    """
    n_tiles = bt.shape[0] // M
    base = bt.astype(np.int32).reshape(n_tiles, M, 1) * np.int32(Hkv * Tf) + np.arange(Tf, dtype=np.int32)
    base_t = np.ascontiguousarray(base.reshape(n_tiles, L).T)                     # [q, j], q = m*Tf + t
    out = base_t[None, :, :] + (heads.astype(np.int32) * np.int32(Tf))[:, None, None]
    return out.reshape(len(heads), L // PARTITIONS, PARTITIONS, n_tiles)         # q = l*128 + p


def _check_heads_fit(bt: np.ndarray, Hkv: int, Tf: int) -> None:
    top = (int(bt.max()) * Hkv + Hkv) * Tf - 1
    if top > _INT32_MAX:
        fail("active_table", f"give flat-view row ids (blk*{Hkv} + head)*{Tf} + t <= {_INT32_MAX}",
             f"max block id {int(bt.max())}")


def transform_block_tables(active_table: Any, *, num_kv_heads: int, head_id: int,
                           block_size: int, large_tile_size: int) -> Any:
    """Host reference of the kernel's block-table transform for one KV head (layouts.md §4).

    Args:
        active_table: (n_tiles * M,) integer flat active block table.
    Returns:
        int32 (nL, 128, n_tiles) with ``out[l, p, j] = (bt[j*M + q // Tf]*Hkv + head_id)*Tf + q % Tf``,
        ``q = l*128 + p``: rows of the flattened cache view (N*Hkv*Tf, b'*d). Inverse:
        :func:`inverse_transform_block_tables`. torch in, torch out.
    """
    arr, was_torch = to_numpy(active_table, "active_table")
    M, Tf, _, L = tile_geometry(block_size, large_tile_size)
    Hkv = check_int("num_kv_heads", num_kv_heads, min_value=1)
    h = check_int("head_id", head_id, min_value=0, max_value=Hkv - 1)
    bt = _check_active(arr, M)
    _check_heads_fit(bt, Hkv, Tf)
    out = _transform(bt, np.array([h]), Hkv, M, Tf, L)[0]
    return from_numpy_like(out, was_torch, like=active_table)


def transform_block_tables_all_heads(active_table: Any, *, num_kv_heads: int, block_size: int,
                                     large_tile_size: int) -> Any:
    """All KV heads at once: int32 (Hkv, nL, 128, n_tiles); ``[h]`` equals the single-head form."""
    arr, was_torch = to_numpy(active_table, "active_table")
    M, Tf, _, L = tile_geometry(block_size, large_tile_size)
    Hkv = check_int("num_kv_heads", num_kv_heads, min_value=1)
    bt = _check_active(arr, M)
    _check_heads_fit(bt, Hkv, Tf)
    out = _transform(bt, np.arange(Hkv), Hkv, M, Tf, L)
    return from_numpy_like(out, was_torch, like=active_table)


def inverse_transform_block_tables(transformed: Any, *, num_kv_heads: int, block_size: int,
                                   large_tile_size: int) -> tuple[Any, int]:
    """Invert :func:`transform_block_tables`: (nL, 128, n_tiles) -> ((n_tiles*M,) int32, head_id).

    Raises ValueError if ``transformed`` is not the image of some table under the transform
    (sub-block ids not ``q % Tf``, sub-blocks of one block disagreeing, or mixed heads).
    """
    arr, was_torch = to_numpy(transformed, "transformed")
    M, Tf, _, L = tile_geometry(block_size, large_tile_size)
    Hkv = check_int("num_kv_heads", num_kv_heads, min_value=1)
    t = check_integer_array("transformed", arr, ndim=3)
    check_shape("transformed", t, (L // PARTITIONS, PARTITIONS, None), "(L/128, 128, num_large_tiles)")
    check_index_range("transformed", t, upper=_INT32_MAX, what="flat-view row ids")
    n_tiles = t.shape[2]
    rows = t.transpose(2, 0, 1).reshape(n_tiles, M, Tf)                     # [j, m, t]
    if not np.array_equal(rows % Tf, np.broadcast_to(np.arange(Tf), rows.shape)):
        fail("transformed", f"hold row ids whose value mod tiling_factor={Tf} is the sub-block "
             "index q % tiling_factor", "other values")
    fused = rows // Tf
    if not (fused == fused[:, :, :1]).all():
        fail("transformed", "give the same (block, head) to all sub-blocks of one block", "mismatch")
    fused = fused[:, :, 0]
    heads = fused % Hkv
    if not (heads == heads.flat[0]).all():
        fail("transformed", f"encode a single KV head (row // {Tf} mod num_kv_heads={Hkv})",
             f"heads {np.unique(heads)[:8].tolist()}")
    bt = (fused // Hkv).reshape(-1).astype(np.int32)
    return from_numpy_like(bt, was_torch, like=transformed), int(heads.flat[0])


def to_partition_first(transformed: Any) -> Any:
    """(nL, 128, n_tiles) -> (128, nL, n_tiles): the kernel's SBUF layout (partition dim first,
    no block dimensions). Inverse: :func:`from_partition_first`."""
    arr, was_torch = to_numpy(transformed, "transformed")
    check_shape("transformed", arr, (None, PARTITIONS, None), "(L/128, 128, num_large_tiles)")
    return from_numpy_like(np.ascontiguousarray(arr.transpose(1, 0, 2)), was_torch, like=transformed)


def from_partition_first(sbuf_table: Any) -> Any:
    """(128, nL, n_tiles) -> (nL, 128, n_tiles). Inverse of :func:`to_partition_first`."""
    arr, was_torch = to_numpy(sbuf_table, "sbuf_table")
    check_shape("sbuf_table", arr, (PARTITIONS, None, None), "(128, L/128, num_large_tiles)")
    return from_numpy_like(np.ascontiguousarray(arr.transpose(1, 0, 2)), was_torch, like=sbuf_table)


def _column_decomposition(LT: int, bp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K column c in [0, LT) -> (l, s, p) with c = l*128*b' + s*128 + p."""
    c = np.arange(LT)
    chunk = PARTITIONS * bp
    r = c % chunk
    return c // chunk, r // PARTITIONS, r % PARTITIONS


def load_column_tokens(num_large_tiles: int, *, block_size: int, large_tile_size: int) -> np.ndarray:
    """Token delivered at each K column by the vectorized load, as a natural (flat, tile-major)
    token index ``j*LT + tau`` with ``tau = l*128*b' + p*b' + s`` for column
    ``c = l*128*b' + s*128 + p`` of tile j (layouts.md §5). Shape (num_large_tiles * LT,) int64.

    Computed from the load formula alone (not from the mask reorder); tests check that it equals
    the permutation :func:`host.dense.masks.reorder_context_mask` applies.
    """
    n = check_int("num_large_tiles", num_large_tiles, min_value=1)
    _, _, bp, _ = tile_geometry(block_size, large_tile_size)
    LT = int(large_tile_size)
    l, s, p = _column_decomposition(LT, bp)
    tau = l * PARTITIONS * bp + p * bp + s
    return (np.arange(n)[:, None] * LT + tau[None, :]).reshape(-1)


def loaded_cache_slots(transformed: Any, *, num_kv_heads: int, block_size: int,
                       large_tile_size: int) -> np.ndarray:
    """Cache slot ``block*B + offset`` of the token the load puts at each K column.

    Derived from the transformed table only: column c = l*128*b' + s*128 + p of tile j reads
    row ``r = transformed[l, p, j]`` of the flat view, element group s; that row is
    (block = r // Tf // Hkv, head = r // Tf % Hkv, sub-block t = r % Tf), so the token is
    offset ``t*b' + s`` of that block. Returns (num_large_tiles * LT,) int64, tile-major.
    """
    arr, _ = to_numpy(transformed, "transformed")
    M, Tf, bp, L = tile_geometry(block_size, large_tile_size)
    Hkv = check_int("num_kv_heads", num_kv_heads, min_value=1)
    t = check_integer_array("transformed", arr, ndim=3)
    check_shape("transformed", t, (L // PARTITIONS, PARTITIONS, None), "(L/128, 128, num_large_tiles)")
    B, LT = int(block_size), int(large_tile_size)
    l, s, p = _column_decomposition(LT, bp)
    rows = t[l, p, :]                                    # (LT, n_tiles)
    block = rows // Tf // Hkv
    offset = (rows % Tf) * bp + s[:, None]
    return (block * B + offset).T.reshape(-1)
