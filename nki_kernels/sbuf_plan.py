"""SBUF budget of the flash paged-attention kernel: how many Q tiles share one pass over the KV.

Plain Python on shapes (no NKI calls), used by the kernel at trace time and by tests.

Per-partition SBUF bytes the kernel may keep live (a conservative sum: every phase counted):
    KV tiles       K (d, LT) + V (128, LT/128*d) in the kernel dtype, and the mask (128, LT)
                   bool, each twice (the next tile's loads overlap the current compute); V's
                   finite copy with its fault columns (128, LT/128*(d+1)) once
    load phase     one gathered row tile (128, b'*d) in the cache dtype, plus its kernel-dtype
                   copy when the dtypes differ
    compute phase  scores (128, step) fp32 + P and P^T (128, step) kernel dtype, step <= 2048
    block table    nL * n_tiles int32
    group state    per (Q tile, query head) slot: o and its fault column ((d + 1) * acc bytes)
                   + m, l (8) + scaled Q (128 * kd)
The group state gets what is left of the target's usable SBUF after the rest and a margin (at
most STATE_BUDGET_BYTES, at least one Q tile). When even one Q tile does not fit (fp32 kernel
dtype with LARGE_TILE_SZ=8192, mainly on trn1) the kernel still runs -- the compiler spills --
but warns, naming the bytes and the fix (a smaller LARGE_TILE_SZ or mixed precision).
"""

from __future__ import annotations

import warnings

from nki_kernels.contract import (PARTITIONS as B_P_SIZE, SBUF_USABLE,  # noqa: F401
                                  STATE_BUDGET_BYTES, STEP_KEYS)
from nki_kernels.dense.finite import value_stride
# Slack for the allocator (alignment, the small per-step (128, 1) tiles, PSUM-evacuation copies).
SBUF_MARGIN = 16 * 1024


class SbufBudgetWarning(ResourceWarning):
    """The estimated SBUF working set exceeds the target's usable SBUF (compiler spills)."""


def working_set_bytes(*, large_tile, head_size, tiled_block_size, kernel_itemsize, cache_itemsize):
    """Per-partition bytes of everything but the group state and the block table."""
    LT, d, bp = large_tile, head_size, tiled_block_size
    step = min(LT, STEP_KEYS)
    kv_tiles = 2 * (LT * kernel_itemsize + (LT // B_P_SIZE) * d * kernel_itemsize + LT) + \
        (LT // B_P_SIZE) * value_stride(d) * kernel_itemsize
    load = bp * d * cache_itemsize + (bp * d * kernel_itemsize if cache_itemsize != kernel_itemsize else 0)
    compute = 4 * step + 2 * step * kernel_itemsize
    return kv_tiles + load + compute


def q_tiles_per_group(*, nc_gen, n_q_tiles, heads_per_kv, large_tile, head_size, tiled_block_size,
                      kernel_itemsize, acc_itemsize, cache_itemsize, table_bytes, kernel):
    """Q tiles whose online-softmax state and scaled Q stay in SBUF together (>= 1)."""
    slot = value_stride(head_size) * acc_itemsize + 8 + B_P_SIZE * kernel_itemsize
    per_tile = heads_per_kv * slot
    fixed = working_set_bytes(large_tile=large_tile, head_size=head_size,
                              tiled_block_size=tiled_block_size, kernel_itemsize=kernel_itemsize,
                              cache_itemsize=cache_itemsize) + table_bytes + SBUF_MARGIN
    free = SBUF_USABLE[nc_gen] - fixed
    if free < per_tile:
        warnings.warn(
            f"{kernel}: LARGE_TILE_SZ={large_tile}, head size {head_size}, {heads_per_kv} query heads "
            f"per KV head, {kernel_itemsize}-byte kernel dtype on {nc_gen} need about "
            f"{fixed + per_tile} SBUF bytes per partition ({SBUF_USABLE[nc_gen]} usable): the "
            "compiler will spill; use a smaller LARGE_TILE_SZ or mixed_precision=True",
            SbufBudgetWarning, stacklevel=3)
        return 1
    return max(1, min(n_q_tiles, min(free, STATE_BUDGET_BYTES) // per_tile))
