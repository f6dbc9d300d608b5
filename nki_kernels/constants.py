"""Names the kernels and the host used before :mod:`nki_kernels.contract` existed.

Every value is the contract's object (nothing is defined here); new code imports
``nki_kernels.contract`` directly. Kept so that callers switch one at a time.
"""

from __future__ import annotations

from nki_kernels import contract as _c
from nki_kernels.contract import (BLOCK_TABLE_BUDGET_BYTES, FP32_EXACT_INT, L_FLOOR,  # noqa: F401
                                  M_FLOOR, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, NEG_MASK,
                                  STATE_BUDGET_BYTES, STEP_KEYS)

B_P_SIZE = _c.PARTITIONS
B_F_SIZE = _c.PSUM_BANK_F32
MIN_LARGE_TILE, MAX_LARGE_TILE = _c.MIN_TILE_SIZE, _c.MAX_TILE_SIZE
MAX_HEAD_SIZE = _c.MAX_HEAD_SIZE_DENSE
DECODE_LAYOUT_MAX_ROWS = _c.DECODE_MAX_ROWS


def tile_geometry(block_size: int, large_tile_size: int) -> tuple[int, int, int, int, int]:
    """``(M, T, b', L, n_loads)`` of :func:`nki_kernels.contract.tile_geometry` as a tuple."""
    g = _c.tile_geometry(block_size, large_tile_size)
    return g.M, g.T, g.bp, g.L, g.nL


def decode_layout(rows: int, blocks: int, alibi: bool = False) -> bool:
    """:func:`nki_kernels.contract.decode_layout`; ``alibi`` is accepted for old callers and has
    no effect (the decode layout does not depend on it)."""
    del alibi
    return _c.decode_layout(rows, blocks)
