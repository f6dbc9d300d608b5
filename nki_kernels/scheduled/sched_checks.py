"""Trace-time argument checks shared by the kernels that run ``host.scheduled.schedule`` items
(``nki_kernels.scheduled.scheduled_attention``, ``nki_kernels.mla.mla_attention``).

Plain Python on shapes and dtypes (no NKI calls); errors are worded by
``nki_kernels._assert.kernel_check``.
"""

from __future__ import annotations

import math

import numpy as np

from nki_kernels._assert import kernel_check
from nki_kernels.contract import MAX_TILE_SIZE, MIN_TILE_SIZE, PARTITIONS as B_P_SIZE, tile_geometry
from nki_kernels.ops import dtype_name


def check_phase_metadata(kernel, meta_pi, meta_pf, meta_fi, meta_ff, *, programs, columns):
    """Check the partial / full phase metadata of ``host.scheduled.schedule.PhaseArrays`` and return the
    item counts ``(items_p, items_f)``.

    Args:
        meta_pi, meta_pf, meta_fi, meta_ff: (programs, 128, I * ki) int32 and (128, I * kf)
            float32 per phase (I items, may be 0).
        programs: the leading axis of the int32 metadata (one row block per program / KV head).
        columns: ``columns(masked) -> (ki, kf)``, the metadata columns per item of a phase.
    """
    items = []
    for name_i, name_f, mi, mf, masked in (("meta_pi", "meta_pf", meta_pi, meta_pf, True),
                                           ("meta_fi", "meta_ff", meta_fi, meta_ff, False)):
        ki, kf = columns(masked)
        kernel_check(len(mi.shape) == 3 and mi.shape[0] == programs and mi.shape[1] == B_P_SIZE
                     and mi.shape[2] % ki == 0, kernel, f"{name_i}.shape",
                     f"be ({programs}, 128, items*{ki})", tuple(mi.shape))
        kernel_check(np.dtype(mi.dtype) == np.dtype(np.int32), kernel, f"{name_i}.dtype",
                     "be int32", np.dtype(mi.dtype).name)
        n = mi.shape[2] // ki
        kernel_check(tuple(mf.shape) == (B_P_SIZE, n * kf), kernel, f"{name_f}.shape",
                     f"be (128, items*{kf}) = {(B_P_SIZE, n * kf)}", tuple(mf.shape))
        kernel_check(np.dtype(mf.dtype) == np.dtype(np.float32), kernel, f"{name_f}.dtype",
                     "be float32", np.dtype(mf.dtype).name)
        items.append(n)
    return items[0], items[1]


def check_item_parts(kernel, parts, max_cores, items_f, items_p):
    """``options.item_parts``: an int in ``[1, max_cores]`` (the target's cores per launch)
    dividing both phases' item counts (the host's schedule in that many equal runs)."""
    kernel_check(type(parts) is int and 1 <= parts <= max_cores and items_p % parts == 0
                 and items_f % parts == 0, kernel, "item_parts",
                 f"be an int in [1, {max_cores}] (this target's cores per launch) dividing both "
                 f"phases' item counts ({items_f}, {items_p})", parts)
    return parts


def softmax_scale_value(kernel, softmax_scale, key_width):
    """``softmax_scale`` as a float: 1 / sqrt(key_width) when None, else a finite real number."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(key_width)
    kernel_check(isinstance(softmax_scale, (int, float)) and not isinstance(softmax_scale, bool)
                 and math.isfinite(float(softmax_scale)), kernel, "softmax_scale",
                 "be a finite real number or None", softmax_scale)
    return float(softmax_scale)


def tile_geometries(kernel, block_size, large_tile, partial_tile):
    """Check ``LARGE_TILE_SZ`` (a power of two in [MIN_TILE_SIZE, MAX_TILE_SIZE]) and
    ``PARTIAL_TILE_SZ`` (None = the large tile, or a power of two in [MIN_TILE_SIZE,
    LARGE_TILE_SZ]); return the full and the partial phase's ``contract.TileGeometry``."""
    LT = large_tile
    lo, hi = MIN_TILE_SIZE, MAX_TILE_SIZE
    kernel_check(isinstance(LT, int) and lo <= LT <= hi and (LT & (LT - 1)) == 0, kernel,
                 "LARGE_TILE_SZ", f"be a power of two in [{lo}, {hi}]", LT)
    LTp = LT if partial_tile is None else partial_tile
    kernel_check(isinstance(LTp, int) and lo <= LTp <= LT and (LTp & (LTp - 1)) == 0, kernel,
                 "PARTIAL_TILE_SZ", f"be None or a power of two in [{lo}, LARGE_TILE_SZ = {LT}]",
                 LTp)
    return tile_geometry(block_size, LT), tile_geometry(block_size, LTp)


def check_item_inputs(kernel, need):
    """Check the per-item inputs a decode-layout class needs: ``need`` is a sequence of ``(name,
    array or None, shape, dtype name, what)``, ``what`` the class that needs it (e.g. "a
    decode-layout class"); None is a ValueError saying what to pass."""
    for name, arr, want, dt, what in need:
        kernel_check(arr is not None, kernel, name, f"be given for {what}: a {dt} {want} array",
                     None)
        kernel_check(tuple(arr.shape) == want and dtype_name(arr.dtype) == dt, kernel, name,
                     f"be a {dt} {want} array (keys on partitions)",
                     (tuple(arr.shape), dtype_name(arr.dtype)))
