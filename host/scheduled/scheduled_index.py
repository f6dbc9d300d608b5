"""The scheduled kernel's per-layer inputs as gathers: index arrays for callers whose tensors stay
on a device (``host.serving.torch_neuron``), where the NumPy builders of ``host.scheduled.scheduled`` cannot run.

Each function returns int64 indices (plain NumPy, from the schedule alone) such that one gather
(``src[index]``) of a flattened source reproduces the NumPy builder exactly; tests check the
equality (tests/host/test_scheduled_index.py). Sources (Hkv KV heads, T tokens, H heads, d
head size, N blocks, B block size):

    query rows    query.reshape(T*H, d) + one zero row           -> query_index  (pack_queries)
    overlay rows  cat(kv_cache.reshape(2, N*Hkv*B, d), new K/V (2, T*Hkv, d), zeros (2, 1, d))
                                                                 -> overlay_index (build_overlay)
    output rows   result.reshape(T*H, d)[output_index[real]] = out[real]   (unpack_output)
"""

from __future__ import annotations

import numpy as np

from host.scheduled.schedule import AttentionSchedule, ClassSchedule

__all__ = ["query_index", "overlay_index", "output_index"]


def query_index(cls: ClassSchedule, num_heads: int, num_kv_heads: int, num_tokens: int) -> np.ndarray:
    """(Hkv, nblk * rows): row ``tok*H + h*G + g`` of ``query.reshape(T*H, d)`` for query row
    (token tok, head g of KV head h), ``T*H`` (the appended zero row) for padding rows.
    ``qflat[index]`` reshaped (Hkv, nblk, rows, d) -> permuted (0, 1, 3, 2) -> (Hkv*nblk*d,
    rows) is ``host.scheduled.scheduled.pack_queries`` (without fp8 scales)."""
    G = num_heads // num_kv_heads
    tok, g = cls.row_token, cls.row_head
    heads = np.arange(num_kv_heads)[:, None] * G + g[None, :]
    return np.where(tok[None, :] >= 0, tok[None, :] * num_heads + heads, num_tokens * num_heads)


def output_index(cls: ClassSchedule, num_heads: int, num_kv_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, dst)``: the kernel output rows (of ``out.reshape(Hkv*nblk*rows, d)``) that are
    real and the rows ``tok*H + h*G + g`` of ``result.reshape(T*H, d)`` they go to
    (``host.scheduled.scheduled.unpack_output``)."""
    G = num_heads // num_kv_heads
    tok, g = cls.row_token, cls.row_head
    n = tok.shape[0]
    real = np.flatnonzero(tok >= 0)
    h = np.arange(num_kv_heads)[:, None]
    rows = (h * n + real[None, :]).reshape(-1)
    dst = (tok[real][None, :] * num_heads + h * G + g[real][None, :]).reshape(-1)
    return rows, dst


def overlay_index(sched: AttentionSchedule, block_tables: np.ndarray, *, num_blocks: int,
                  num_tokens: int) -> np.ndarray:
    """(Hkv * R, b'_p) rows of the overlay source (module docstring) for overlay row
    ``h * R + r`` (R = max(R_ov, 1)), position s: the cache row ``(blk*Hkv + h)*B + pos % B``
    of a cached position, ``N*Hkv*B + tok*Hkv + h`` of a new token, the zero row past the
    sequence end. Gathering both halves and reshaping to (2, Hkv*R, b'_p*d) is
    ``host.scheduled.scheduled.build_overlay`` for a non-fp8 cache."""
    Hkv, B = sched.num_kv_heads, sched.block_size
    bp = sched.partial_tiled_block_size
    R = sched.overlay_seq.shape[0]
    zero = num_blocks * Hkv * B + num_tokens * Hkv
    idx = np.full((Hkv, max(R, 1), bp), zero, np.int64)
    if R:
        seq = sched.overlay_seq[:, None]
        pos = sched.overlay_pos0[:, None] + np.arange(bp)[None, :]
        c = sched.context_lens[seq]
        keys = c + sched.query_lens[seq]
        tok_off = np.concatenate(([0], np.cumsum(sched.query_lens)[:-1]))[seq]
        cached = pos < c
        new = (pos >= c) & (pos < keys)
        blk = np.where(cached, block_tables[np.broadcast_to(seq, pos.shape),
                                            np.where(cached, pos // B, 0)], 0)
        tok = tok_off + pos - c
        h = np.arange(Hkv)[:, None, None]
        idx = np.where(cached[None], (blk[None] * Hkv + h) * B + pos[None] % B,
                       np.where(new[None], num_blocks * Hkv * B + tok[None] * Hkv + h, zero))
    return idx.reshape(Hkv * max(R, 1), bp)
