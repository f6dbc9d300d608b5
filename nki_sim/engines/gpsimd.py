"""GpSimd ops with affine index patterns: ``iota`` and ``affine_select``.

The affine value at ``dst[p, i1, .., ik]`` is ``offset + p * channel_multiplier +
sum(step_j * i_j)`` for ``pattern = [[step_1, n_1], .., [step_k, n_k]]`` (int32 math).
"""

from __future__ import annotations

import numpy as np

from ..alu import ALU
from .common import emit, operand, write_dst


def affine_values(P: int, pattern, offset: int, channel_multiplier: int) -> np.ndarray:
    """int64 array of shape ``(P, n_1, .., n_k)`` of the affine expression."""
    shape = (P,) + tuple(int(n) for _, n in pattern)
    v = np.full(shape, int(offset), dtype=np.int64)
    v += (np.arange(P, dtype=np.int64) * int(channel_multiplier)).reshape((P,) + (1,) * len(pattern))
    for j, (step, n) in enumerate(pattern):
        sh = [1] * len(shape)
        sh[j + 1] = int(n)
        v += (np.arange(int(n), dtype=np.int64) * int(step)).reshape(sh)
    return v


def iota(dst, pattern, offset=0, channel_multiplier=0, *, name="") -> None:
    P = dst.shape[0]
    v = affine_values(P, pattern, offset, channel_multiplier)
    v = ((v + 2 ** 31) % 2 ** 32) - 2 ** 31           # int32 arithmetic wraps
    write_dst(dst, v.reshape(dst.shape), "iota")
    emit("gpsimd", "iota", (), dst, name=name)


def affine_select(dst, pattern, channel_multiplier, on_true, on_false_value, *, cmp="equal",
                  offset=0, name="") -> None:
    """``dst = cmp(affine, 0) ? on_true : on_false_value`` (fp32 select)."""
    P = dst.shape[0]
    a = operand(on_true, "on_true_tile", "affine_select", True)
    pred = ALU[cmp][0](affine_values(P, pattern, offset, channel_multiplier), 0).reshape(dst.shape)
    r = np.where(pred, np.asarray(a.v, np.float32).reshape(dst.shape), np.float32(on_false_value))
    write_dst(dst, r, "affine_select", inputs=(a,))
    emit("gpsimd", "affine_select", (a,), dst, name=name)
