"""SBUF budget of the MLA paged-attention kernel (``nki_kernels/mla/mla_attention.py``).

Plain Python on shapes (no NKI calls): the kernel checks it at trace time, the host uses it to
choose how many 128-row Q blocks share one KV-tile load, and tests compare it with the
simulator's measured peak.

Per-partition bytes the kernel keeps live (an upper bound, every phase counted at once):
    KV rows       (128, nL*b'*E) in the cache dtype, plus its kernel-dtype copy when they differ
    K^T           nd slices (<= 128, W) in the kernel dtype
    key index     (rows, W) fp32 (masked items)
    one step      scores / |t - c| / mask (3 x 4 B) and P (kernel dtype), P^T (<= step*kd),
                  step = min(W, 2048) keys
    per Q block   o, -m, l and their reset copy (2 x (R + 2) x 4 B), Q^T raw + scaled
                  (nd x rows x (q + kd) B), its metadata columns for a 64-item chunk
    one block     the state update's two (rows, R) fp32 temporaries and the output tile
    decode layout the metadata chunk's preloaded Q^T: ``preload_cols`` columns scaled (nd slices,
                  kernel dtype) plus one raw slice (query dtype)
    slack         4 KiB for the (rows, <= 16) statistics tiles
"""

from __future__ import annotations

from nki_kernels.contract import MAX_CHUNK as MAX_CHUNK_ITEMS  # noqa: F401 (items per chunk)
from nki_kernels.contract import PARTITIONS as B_P_SIZE
from nki_kernels.contract import SBUF_USABLE, STEP_KEYS
SLACK = 4 * 1024
# Decode layout: bytes per partition of a metadata chunk's scaled Q^T (all channel slices); the
# chunk is cut to fit (``decode_chunk_cap``).
DECODE_Q_BYTES = 16 * 1024


def decode_chunk_cap(*, key_width, rows, kernel_itemsize):
    """Most items (a power of two <= 64) of a decode-layout metadata chunk whose preloaded, scaled
    Q^T takes at most DECODE_Q_BYTES per partition (nd slices of chunk * rows columns)."""
    nd = -(-key_width // B_P_SIZE)
    cap = MAX_CHUNK_ITEMS
    while cap > 1 and nd * cap * rows * kernel_itemsize > DECODE_Q_BYTES:
        cap //= 2
    return cap


def mla_sbuf_bytes(*, loads, tiled_block_size, entry_size, key_width, value_width, rows, blocks,
                   cache_itemsize, kernel_itemsize, query_itemsize, preload_cols=0):
    """Upper bound of the kernel's live SBUF bytes per partition (module docstring)."""
    bp, E, D, R = tiled_block_size, entry_size, key_width, value_width
    W = loads * B_P_SIZE * bp
    step = min(W, STEP_KEYS)
    nd = -(-D // B_P_SIZE)
    kv = loads * bp * E * cache_itemsize
    if cache_itemsize != kernel_itemsize:
        kv += loads * bp * E * kernel_itemsize
    fixed = kv + nd * W * kernel_itemsize + 4 * W + 12 * step + 2 * step * kernel_itemsize \
        + 8 * R + R * query_itemsize + SLACK
    fixed += preload_cols * (nd * kernel_itemsize + query_itemsize)
    meta = 4 * MAX_CHUNK_ITEMS * (2 * loads + 1 + blocks * (nd + 4))
    per_block = 8 * (R + 2) + nd * rows * (query_itemsize + kernel_itemsize)
    return fixed + meta + blocks * per_block


def mla_group_blocks(*, nc_gen, max_blocks, **shape):
    """Most Q blocks (<= max_blocks) whose :func:`mla_sbuf_bytes` fits the usable SBUF of
    ``nc_gen`` ("gen2" / "gen3"); 0 when not even one does. ``shape``: the other keywords of
    :func:`mla_sbuf_bytes` except ``blocks``."""
    for blocks in range(max_blocks, 0, -1):
        if mla_sbuf_bytes(blocks=blocks, **shape) <= SBUF_USABLE[nc_gen]:
            return blocks
    return 0
