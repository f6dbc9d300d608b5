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

from nki_kernels.constants import B_P_SIZE, decode_layout, tile_geometry

# Usable SBUF bytes per partition (as nki_kernels.sbuf_plan) and the allocator slack.
SBUF_USABLE = {"gen2": 180224, "gen3": 212984}
SBUF_MARGIN = 8 * 1024
MAX_CHUNK = 64


def fixed_bytes(*, block_size, large_tile, head_size, cache_itemsize, kernel_itemsize,
                keys_on_partitions, rows):
    """Per-partition bytes that do not grow with the number of Q blocks in a group."""
    _, _, bp, L, nL = tile_geometry(block_size, large_tile)
    W = L * bp
    d = head_size
    nd = -(-d // B_P_SIZE)
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
        step = min(W, 2048)
        steps = step * (4 + 4 + 1) + 2 * step * kernel_itemsize
        kidx = 4 * W
    meta = MAX_CHUNK * 4 * (2 * nL + 4 * nd + 8)
    return kv + kt + steps + kidx + meta


def block_bytes(*, head_size, rows, query_itemsize, kernel_itemsize):
    """Per-partition bytes of one Q block of a group (state, init, raw and scaled Q^T: one
    tile per <= 128-channel slice, each on the same partitions)."""
    nd = -(-head_size // B_P_SIZE)
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
    """``(ki, kf)``: int32 and fp32 metadata columns per item of a scheduled-kernel phase
    (``host.schedule.PhaseArrays``); decode-layout classes (``constants.decode_layout``) keep
    their bounds in a separate one-partition array, not in meta_f, and their row init values in
    per-item arrays preloaded per chunk (no ``ini`` columns)."""
    nd = -(-head_size // B_P_SIZE)
    kop = rows is not None and decode_layout(rows, blocks, alibi)
    ki = ((2 * loads if masked else loads) + (0 if kop else blocks * nd) + blocks
          + (blocks if masked else 0) + (blocks if row_init and not kop else 0))
    kf = 1 + (2 * blocks if masked and not kop else 0) + (1 if alibi else 0)
    return ki, kf
