"""Constants shared by the flash paged-attention kernel modules.

Plain Python numbers (no NKI import), so host code and tests can use them too.
"""

from __future__ import annotations

# SBUF / PSUM partitions; also the Q-tile height and the rows gathered per indirect KV DMA.
B_P_SIZE = 128
# Free size of one PSUM bank in fp32 elements (2 KiB / partition): the widest score chunk a
# single QK^T matmul may produce, and the widest PSUM tile any kernel statement allocates.
B_F_SIZE = 512

# Keys per online-softmax step: a large KV tile (or an active window) is folded in steps of at
# most STEP_KEYS keys, which bounds the per-step score / probability tiles to (128, 2048)
# whatever LARGE_TILE_SZ is (the role of vLLM's REDUCTION_TILE).
STEP_KEYS = 2048

# Masked scores are replaced by NEG_MASK (not -inf: exp/max of -inf and inf - inf give NaN).
# The running row max m starts at M_FLOOR (the kernel stores -m), which is far above NEG_MASK
# and far below any real score, so exp(NEG_MASK - m) underflows to exactly 0 for every row --
# including rows that have seen no unmasked key yet (their m is still M_FLOOR). Consequences,
# by construction:
#   * an all-masked tile leaves m, l and o bit-for-bit unchanged (alpha = exp(0) = 1, P = 0);
#   * a row that is masked everywhere (query padding) ends with l = 0 and o = 0, and the
#     epilogue's L_FLOOR clamp turns 0 / max(0, L_FLOOR) into an exact 0 output.
NEG_MASK = -1.0e30
M_FLOOR = -1.0e29
# Any real row has l >= 1 (its maximum contributes exp(0) = 1), so clamping l at L_FLOOR only
# affects fully masked rows. 2**-30 keeps 1/l inside the ScalarE reciprocal range (2**42).
L_FLOOR = 2.0 ** -30

# Upper bound on the SBUF bytes per partition for the per-(Q tile, head) online-softmax state and
# the scaled Q of one group of Q tiles (o: d*acc bytes, m and l: 8 bytes, Q: 128*kernel bytes per
# slot); nki_kernels.sbuf_plan lowers it to what the target's SBUF leaves free. Larger query
# batches are processed in several groups, each re-reading the KV tiles.
STATE_BUDGET_BYTES = 64 * 1024

# SBUF bytes per partition for the transformed block table (nL * n_tiles int32 = context length
# / (32 * block_size) bytes when M >= 128): 64 KiB holds 2M context tokens at block_size 1.
BLOCK_TABLE_BUDGET_BYTES = 64 * 1024

# Block ids travel through fp32 PE transposes in the in-kernel block-table transform: exact only
# below 2**24. The kernel checks num_blocks * Hkv * tiling_factor against this bound.
FP32_EXACT_INT = 1 << 24

# Supported ranges (checked by the kernel and the host wrapper).
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 1, 256
MIN_LARGE_TILE, MAX_LARGE_TILE = 512, 8192
MAX_HEAD_SIZE = 128


def tile_geometry(block_size: int, large_tile_size: int) -> tuple[int, int, int, int, int]:
    """``(M, T, b', L, n_loads)`` for a block size and large tile size (powers of two).

    M = LARGE_TILE_SZ // block_size blocks per large tile; T = 128 // M if M < 128 else 1
    (block-size tiling factor); b' = block_size // T tokens per gathered row; L = M * T =
    max(M, 128) rows per tile; n_loads = L // 128 indirect DMAs per tile (for K, and for V).
    """
    M = large_tile_size // block_size
    T = B_P_SIZE // M if M < B_P_SIZE else 1
    L = M * T
    return M, T, block_size // T, L, L // B_P_SIZE


# Scheduled kernel: classes of single Q blocks of at most this many rows (decode: the G query
# heads x new tokens of one sequence) use the decode layout: every item's Q^T is preloaded with
# its chunk's metadata and the per-row mask bounds are laid along the free axis.
DECODE_LAYOUT_MAX_ROWS = 64


def decode_layout(rows: int, blocks: int, alibi: bool = False) -> bool:
    """Whether a scheduled-kernel class uses the decode layout (see DECODE_LAYOUT_MAX_ROWS);
    ``alibi`` does not change it (the decode step adds the bias per (key chunk x row) column)."""
    return rows <= DECODE_LAYOUT_MAX_ROWS and blocks == 1
