"""SBUF budget of the scheduled paged-attention kernel (plain Python on shapes, no NKI calls).

Used by the host schedule (how many 128-row Q blocks one group may hold) and by the kernel at
trace time (a working set that cannot fit is refused with the fix named). Conservative
per-partition bytes, every phase counted:

    KV rows        K and V gathered rows (128, W*d/128) in the cache dtype (the full phase's
                   persistent tiles or the partial phase's zeroed ones, whose partial tiles are
                   no larger: one phase at a time), plus kernel-dtype tiles when the dtypes
                   differ (converted copies, or an fp8 cache's 16-bit overlay tiles)
    K^T            nd slices (<= 128 channels, W) in the kernel dtype
    step tiles     query rows: scores, mask distance fp32 + predicate + P, P^T (step <= 2048);
                   keys on partitions: small (per (128-key chunk x row) column)
    key index      (rows, W) fp32 (query rows) or (128, W/128) fp32 (keys on partitions)
    per block      state + init (d + 2 fp32 each), raw and scaled Q^T columns
    metadata       one chunk (<= 64 items) of int32 / fp32 columns
"""

from __future__ import annotations

from nki_kernels.contract import (MAX_CHUNK, PARTITIONS as B_P_SIZE, SBUF_USABLE,  # noqa: F401
                                  STEP_KEYS, channel_slices, decode_layout, meta_layout,
                                  tile_geometry)

# Allocator slack.
SBUF_MARGIN = 8 * 1024


def fixed_bytes(*, block_size, large_tile, head_size, cache_itemsize, kernel_itemsize,
                keys_on_partitions, rows):
    """Per-partition bytes that do not grow with the number of Q blocks in a group."""
    g = tile_geometry(block_size, large_tile)
    W, nL = g.W, g.nL
    d = head_size
    nd = channel_slices(d)
    row_elems = W * d // B_P_SIZE
    kv = 2 * row_elems * cache_itemsize      # one phase's K and V rows live at a time
    if cache_itemsize != kernel_itemsize:
        kv += 2 * row_elems * kernel_itemsize
    kt = nd * W * kernel_itemsize
    if keys_on_partitions:
        step = (W // B_P_SIZE) * rows
        steps = 4 * step * 4 + 2 * step * kernel_itemsize
        kidx = 4 * (W // B_P_SIZE)
    else:
        step = min(W, STEP_KEYS)
        steps = step * (4 + 4 + 1) + 2 * step * kernel_itemsize
        kidx = 4 * W
    meta = MAX_CHUNK * 4 * (2 * nL + 4 * nd + 8)
    return kv + kt + steps + kidx + meta


def block_bytes(*, head_size, rows, query_itemsize, kernel_itemsize):
    """Per-partition bytes of one Q block of a group (state, init, raw and scaled Q^T: one
    tile per <= 128-channel slice, each on the same partitions)."""
    nd = channel_slices(head_size)
    return 2 * 4 * (head_size + 2) + nd * rows * (query_itemsize + kernel_itemsize)


def max_group_blocks(*, nc_gen, block_size, large_tile, head_size, rows, cache_itemsize,
                     query_itemsize, kernel_itemsize, keys_on_partitions=False):
    """Largest number of Q blocks one group may hold on ``nc_gen`` (0: not even one fits)."""
    free = (SBUF_USABLE[nc_gen] - SBUF_MARGIN
            - fixed_bytes(block_size=block_size, large_tile=large_tile, head_size=head_size,
                          cache_itemsize=cache_itemsize, kernel_itemsize=kernel_itemsize,
                          keys_on_partitions=keys_on_partitions, rows=rows))
    per = block_bytes(head_size=head_size, rows=rows, query_itemsize=query_itemsize,
                      kernel_itemsize=kernel_itemsize)
    return max(0, free // per)


def meta_columns(*, loads, blocks, head_size, masked, alibi=False, row_init=False, rows=None):
    """``(ki, kf)`` of :func:`nki_kernels.contract.meta_layout` (``rows`` given: a decode-layout
    class, ``contract.decode_layout``, has no bounds / ini / q columns)."""
    m = meta_layout(loads=loads, blocks=blocks, head_size=head_size, masked=masked, alibi=alibi,
                    row_init=row_init,
                    keys_on_partitions=rows is not None and decode_layout(rows, blocks))
    return m.ki, m.kf


def working_set_bytes(*, nc_gen, block_size, large_tile, head_size, rows, blocks, cache_itemsize,
                      query_itemsize, kernel_itemsize, keys_on_partitions=False) -> tuple:
    """``(need, usable)``: per-partition bytes of one class's working set (:func:`fixed_bytes`
    plus ``blocks`` x :func:`block_bytes`) and what ``nc_gen`` leaves usable after the margin."""
    need = (fixed_bytes(block_size=block_size, large_tile=large_tile, head_size=head_size,
                        cache_itemsize=cache_itemsize, kernel_itemsize=kernel_itemsize,
                        keys_on_partitions=keys_on_partitions, rows=rows)
            + blocks * block_bytes(head_size=head_size, rows=rows, query_itemsize=query_itemsize,
                                   kernel_itemsize=kernel_itemsize))
    return need, SBUF_USABLE[nc_gen] - SBUF_MARGIN
