"""The host-kernel contract: every number and layout both sides must agree on, defined once.

Pure Python (no NKI, no NumPy): imported by ``host/`` (schedules, block tables, masks, launch
inputs) and by the kernels in ``nki_kernels/`` at trace time. A disagreement between the two
sides means wrong gathers, so nothing here may be re-derived elsewhere; docs/layouts.md §1,
§3 and §16 describe the layouts these values parametrise.

Contents:
    hardware tiles         PARTITIONS, PSUM_BANK_F32, STEP_KEYS
    online-softmax values  NEG_MASK, M_FLOOR, L_FLOOR
    limits                 block size, tile sizes, head sizes, Q rows / blocks, FP32_EXACT_INT
    budgets                STATE_BUDGET_BYTES, BLOCK_TABLE_BUDGET_BYTES, SBUF_USABLE
    tile geometry          :class:`TileGeometry`, :func:`tile_geometry`
    KV cache layouts       KV_LAYOUTS, :func:`cache_row_count`, :func:`main_cache_row`
    decode class / layout  DECODE_MAX_ROWS, :func:`decode_layout`
    metadata chunks        MAX_CHUNK, :func:`chunk_size`
    metadata columns       :class:`MetaLayout`, :func:`meta_layout` (scheduled and MLA kernels)
    per-row init columns   Q_INIT_COLUMNS and their offsets
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "PARTITIONS", "PSUM_BANK_F32", "STEP_KEYS", "NEG_MASK", "M_FLOOR", "L_FLOOR",
    "FP32_EXACT_INT", "MIN_BLOCK_SIZE", "MAX_BLOCK_SIZE", "MIN_TILE_SIZE", "MAX_TILE_SIZE",
    "MAX_HEAD_SIZE_DENSE", "MAX_HEAD_SIZE_SCHEDULED", "MAX_GROUP_BLOCKS", "STATE_BUDGET_BYTES",
    "BLOCK_TABLE_BUDGET_BYTES", "SBUF_USABLE", "TileGeometry", "tile_geometry", "DECODE_MAX_ROWS",
    "decode_layout", "MAX_CHUNK", "chunk_size", "MetaLayout", "meta_layout", "Q_INIT_COLUMNS",
    "Q_INIT_NEG_M", "Q_INIT_L", "Q_INIT_SLOPE", "Q_INIT_SLOPE_POS", "STATE_EXTRA_COLUMNS",
    "channel_slices", "KV_LAYOUTS", "FUSED", "BLOCK_KV", "cache_row_count", "main_cache_row",
]

# ---- hardware tiles ---------------------------------------------------------------------------
# SBUF / PSUM partitions; also the Q-tile height and the rows gathered per indirect KV DMA.
PARTITIONS = 128
# Free size of one PSUM bank in fp32 elements (2 KiB / partition): the widest score chunk a
# single QK^T matmul may produce, and the widest PSUM tile any kernel statement allocates.
PSUM_BANK_F32 = 512
# Keys per online-softmax step (query-rows steps): a large KV tile is folded in steps of at most
# STEP_KEYS keys, which bounds the per-step score / probability tiles to (128, 2048).
STEP_KEYS = 2048

# ---- online-softmax values --------------------------------------------------------------------
# Masked scores become NEG_MASK (not -inf: exp/max of -inf and inf - inf give NaN). The running
# row max m starts at M_FLOOR (kernels store -m), far above NEG_MASK and far below any real
# score, so exp(NEG_MASK - m) underflows to exactly 0 for every row, including rows that have
# seen no unmasked key yet. Hence an all-masked tile leaves m, l and o bit-for-bit unchanged,
# and a row masked everywhere ends with l = 0, o = 0, which the L_FLOOR clamp turns into 0.
NEG_MASK = -1.0e30
M_FLOOR = -1.0e29
# Any real row has l >= 1, so clamping l at L_FLOOR only affects fully masked rows; 2**-30
# keeps 1/l inside the ScalarE reciprocal range (2**42).
L_FLOOR = 2.0 ** -30

# ---- limits -----------------------------------------------------------------------------------
# Block ids travel through fp32 PE transposes in the dense kernel's block-table transform: exact
# only below 2**24 (checked against num_blocks * Hkv * tiling_factor).
FP32_EXACT_INT = 1 << 24
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 1, 256
MIN_TILE_SIZE, MAX_TILE_SIZE = 512, 8192          # LARGE_TILE_SZ and PARTIAL_TILE_SZ
MAX_HEAD_SIZE_DENSE = 128                         # one SBUF partition per channel
MAX_HEAD_SIZE_SCHEDULED = 512                     # QK^T accumulated over 128-channel slices
MAX_GROUP_BLOCKS = 64                             # 128-row Q blocks sharing one KV-tile load

# ---- budgets (bytes per partition) -------------------------------------------------------------
# Dense kernel: the per-(Q tile, head) online-softmax state and scaled Q of one group of Q tiles.
STATE_BUDGET_BYTES = 64 * 1024
# Dense kernel: the transformed block table (nL * n_tiles int32).
BLOCK_TABLE_BUDGET_BYTES = 64 * 1024
# Usable SBUF: trn1 (gen2) 192 KiB minus the 16 KiB compiler reserve; trn2 (gen3)
# nl.tile_size.total_available_sbuf_size.
SBUF_USABLE = {"gen2": 180224, "gen3": 212984}
# Cache-write kernels (reshape_and_cache, the MLA cache write): the largest row one partition
# holds; the host splits block-KV token rows above it into (token, head) rows.
CACHE_WRITE_MAX_ROW_BYTES = 16 * 1024


# ---- tile geometry ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TileGeometry:
    """Geometry of a KV tile of ``tile_size`` keys over a cache of ``block_size``-token blocks
    (docs/layouts.md §1, §3): M blocks per tile; T = 128 // M rows per block when M < 128, else 1
    (block-size tiling factor); bp = b' = block_size // T tokens per gathered row; L = M * T =
    max(M, 128) rows per tile; nL = L // 128 indirect loads per tile (each for K and for V);
    W = L * b' keys per tile."""

    block_size: int
    tile_size: int
    M: int
    T: int
    bp: int
    L: int
    nL: int

    @property
    def W(self) -> int:
        return self.L * self.bp

    def flat_rows(self, num_blocks: int, num_kv_heads: int) -> int:
        """Rows of the flat cache view ``(2, N * Hkv * T, b' * d)`` of this geometry."""
        return num_blocks * num_kv_heads * self.T


def tile_geometry(block_size: int, tile_size: int) -> TileGeometry:
    """:class:`TileGeometry` for a block size and tile size (powers of two; callers validate)."""
    M = tile_size // block_size
    T = PARTITIONS // M if M < PARTITIONS else 1
    L = M * T
    return TileGeometry(block_size, tile_size, M, T, block_size // T, L, L // PARTITIONS)


# ---- KV cache layouts (docs/layouts.md §16.1, §18) ----------------------------------------------
# "fused": one (2, N, Hkv, B, d) cache ([0] = K, [1] = V), gathered through the view
#     (2, N*Hkv*T, b'*d): row (blk*Hkv + h)*T + t = b' contiguous tokens of one (block, head).
# "block_kv": vLLM's (N, B, Hkv, d) key cache and value cache, each gathered through the view
#     (N*T, b'*Hkv*d): row blk*T + t = b' tokens of every head; head h's token s of the row at
#     columns [s*Hkv*d + h*d, +d) (the row id does not depend on the head).
FUSED, BLOCK_KV = "fused", "block_kv"
KV_LAYOUTS = (FUSED, BLOCK_KV)


def cache_row_count(kv_layout: str, num_blocks: int, num_kv_heads: int, tiling_factor: int) -> int:
    """Rows of one gather view of the cache (above): ``2*N*Hkv*T`` fused (both halves: the
    sentinel row id must lie past the V half too), ``N*T`` block-KV (K and V views separate).
    Every id ``>=`` this is out of bounds (skipped) whichever view or half it indexes."""
    if kv_layout == BLOCK_KV:
        return num_blocks * tiling_factor
    return 2 * num_blocks * num_kv_heads * tiling_factor


def main_cache_row(kv_layout: str, block, sub, head, num_kv_heads: int, tiling_factor: int):
    """Row id of sub-block ``sub`` of cache block ``block`` for KV head ``head`` in the gather
    view of ``kv_layout`` (ints or integer arrays, broadcast): ``(block*Hkv + head)*T + sub``
    fused, ``block*T + sub`` block-KV (the head is a column offset there)."""
    if kv_layout == BLOCK_KV:
        return block * tiling_factor + sub          # the same row for every head
    return (block * num_kv_heads + head) * tiling_factor + sub


def channel_slices(head_size: int) -> int:
    """nd = ceil(d / 128): <= 128-channel slices of a head (one SBUF tile each)."""
    return -(-head_size // PARTITIONS)


# ---- decode class and layout ------------------------------------------------------------------
# Sequences with G * q_len <= DECODE_MAX_ROWS query rows form the decode class (one Q block of a
# power-of-two number of rows <= this); its single-block Q blocks use the decode layout (keys on
# partitions): every item's Q^T is preloaded with its chunk's metadata and the per-row mask
# bounds lie along the free axis. One threshold for both decisions.
DECODE_MAX_ROWS = 64


def decode_layout(rows: int, blocks: int) -> bool:
    """Whether a scheduled-kernel class (``rows`` rows per Q block, ``blocks`` blocks per group)
    uses the decode layout (keys on partitions)."""
    return rows <= DECODE_MAX_ROWS and blocks == 1


# ---- metadata chunks --------------------------------------------------------------------------
MAX_CHUNK = 64              # items whose metadata one DMA preloads


def chunk_size(items: int) -> int:
    """Items per metadata chunk: the largest power of two <= MAX_CHUNK dividing ``items``
    (1 for 0 items)."""
    if items == 0:
        return 1
    return min(items & -items, MAX_CHUNK)


# ---- per-row init values and the state scratch -------------------------------------------------
# q_init rows (float32): initial -m, initial l, ALiBi slope, slope * query position.
Q_INIT_COLUMNS = 4
Q_INIT_NEG_M, Q_INIT_L, Q_INIT_SLOPE, Q_INIT_SLOPE_POS = 0, 1, 2, 3
# A state row is o (d fp32) followed by -m and l.
STATE_EXTRA_COLUMNS = 2
# The state scratch holds one slab of (groups x rows) state rows per physical core of a launch
# (at most MAX_LAUNCH_CORES), so the cores never share rows whether private HBM is per core or
# per logical core; a skipped state DMA's row id is past every slab (twice the rows of all).
MAX_LAUNCH_CORES = 2


def state_row_sentinel(num_rows: int) -> int:
    """Row id of a skipped state load / store for a scratch of ``num_rows`` rows per slab."""
    return 2 * MAX_LAUNCH_CORES * max(num_rows, 1)


# ---- metadata columns -------------------------------------------------------------------------
@dataclass(frozen=True)
class MetaLayout:
    """Metadata columns per item of one phase of a schedule-driven kernel
    (``host.scheduled.schedule.PhaseArrays``; docs/layouts.md §16.4).

    int32 columns (``ki`` per item), per partition p:
        ``kv + l``            l < loads: main-cache row of load l (flat view) or out of bounds
        ``ov + l``            masked phases, l < loads: overlay row or out of bounds
        ``q + k``             query-rows classes: Q^T row of channel 128k + p of the group
                              (every block's rows side by side: group-major, docs/layouts.md)
        ``st``                state row of query row p of the group, every block's d + 2
                              columns side by side (store: full phase; load: masked phase)
        ``out``               masked phases: output row of query row p of the group
        ``ini``               row_init on query-rows classes: q_init row of query row p
    fp32 columns (``kf`` per item):
        ``reset``             1.0 at a group's first item
        ``bounds + 2j``       masked query-rows phases: c, r of block j (row sees |t - c| < r)
        ``k0``                ALiBi: first key position of the tile (the last column)
    Absent columns are None.
    """

    ki: int
    kf: int
    kv: int
    ov: int | None
    q: int | None
    st: int
    out: int | None
    ini: int | None
    reset: int
    bounds: int | None
    k0: int | None


def meta_layout(*, loads: int, blocks: int, head_size: int, masked: bool, alibi: bool = False,
                row_init: bool = False, keys_on_partitions: bool = False) -> MetaLayout:
    """The :class:`MetaLayout` of a phase with ``loads`` loads per tile; decode-layout classes
    (``keys_on_partitions``) keep their bounds in a separate one-partition array and their row
    init values and Q^T in per-item arrays preloaded per chunk (no bounds / ini / q columns)."""
    nd = channel_slices(head_size)
    kop = keys_on_partitions
    col = loads
    ov = None
    if masked:
        ov, col = col, col + loads
    # one column per item and channel slice (Q^T), per item (state, output, init): a group's
    # blocks sit side by side in every row of the group-major layouts, one DMA moves them all
    q = None if kop else col
    st = col + (0 if kop else nd)
    out = st + 1 if masked else None
    end = st + 1 + (1 if masked else 0)
    ini = end if (row_init and not kop) else None
    ki = end + (1 if ini is not None else 0)
    bounds = 1 if (masked and not kop) else None
    kf = 1 + (2 * blocks if bounds is not None else 0)
    k0 = None
    if alibi:
        k0, kf = kf, kf + 1
    return MetaLayout(ki=ki, kf=kf, kv=0, ov=ov, q=q, st=st, out=out, ini=ini, reset=0,
                      bounds=bounds, k0=k0)
