"""Kernel inputs and launch for the scheduled paged-attention kernel.

``run_scheduled`` is what ``host.paged_attention(kernel="scheduled")`` calls after validating
its arguments: it builds the schedule (``host.schedule``), the overlay of key rows that are not
whole cached-context rows, the packed Q^T blocks of every class, launches
``nki_kernels.scheduled_attention.scheduled_paged_attention`` once per class on grid
``[1, Hkv]`` and scatters the packed output back to ``(T, H, d)``. Layouts: docs/layouts.md
("Scheduled kernel").
"""

from __future__ import annotations

import numpy as np

from host.schedule import AttentionSchedule, ClassSchedule, make_schedule

__all__ = ["run_scheduled", "build_overlay", "pack_queries", "unpack_output", "kernel_inputs"]


def build_overlay(sched: AttentionSchedule, kv_cache: np.ndarray, key: np.ndarray,
                  value: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
    """``(2, Hkv * R_ov, b' * d)`` in the cache dtype: overlay row ``h * R_ov + r`` holds key row
    r of ``sched`` (b' consecutive positions of one sequence) for KV head h: cached positions are
    copied from ``kv_cache``, new-token positions from ``key`` / ``value`` (cast to the cache
    dtype), positions past the sequence end are 0. At least one (zero) row per head."""
    _, _, Hkv, B, d = kv_cache.shape
    bp = sched.tiled_block_size
    R = sched.overlay_seq.shape[0]
    out = np.zeros((2, Hkv, max(R, 1), bp, d), dtype=kv_cache.dtype)
    if R:
        seq = sched.overlay_seq[:, None]
        pos = sched.overlay_pos0[:, None] + np.arange(bp)[None, :]          # (R, b')
        c = sched.context_lens[seq]
        keys = c + sched.query_lens[seq]
        tok_off = np.concatenate(([0], np.cumsum(sched.query_lens)[:-1]))[seq]
        cached = pos < c
        new = (pos >= c) & (pos < keys)
        blk = block_tables[seq, np.where(cached, pos // B, 0)]
        cs = np.nonzero(cached)
        src = kv_cache[:, blk[cs], :, (pos % B)[cs], :]                     # (n, 2, Hkv, d)
        out[:, :, cs[0], cs[1], :] = np.moveaxis(src, 0, 2)
        ns = np.nonzero(new)
        tok = (tok_off + pos - c)[ns]
        out[0][:, ns[0], ns[1], :] = key[tok].astype(kv_cache.dtype).transpose(1, 0, 2)
        out[1][:, ns[0], ns[1], :] = value[tok].astype(kv_cache.dtype).transpose(1, 0, 2)
    return np.ascontiguousarray(out.reshape(2, Hkv * max(R, 1), bp * d))


def pack_queries(cls: ClassSchedule, query: np.ndarray, num_kv_heads: int) -> np.ndarray:
    """``(Hkv * nblk * d, rows)``: row ``(h*nblk + b)*d + ch``, column p = channel ch of query
    row p of Q block b for KV head h, i.e. ``query[token, h*G + g, ch]`` (0 for padding rows)."""
    T, H, d = query.shape
    G = H // num_kv_heads
    tok, g = cls.row_token, cls.row_head
    real = tok >= 0
    packed = np.zeros((num_kv_heads, tok.shape[0], d), dtype=query.dtype)
    for h in range(num_kv_heads):
        packed[h, real] = query[tok[real], h * G + g[real]]
    packed = packed.reshape(num_kv_heads, cls.num_blocks, cls.rows, d).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(packed.reshape(num_kv_heads * cls.num_blocks * d, cls.rows))


def unpack_output(cls: ClassSchedule, out: np.ndarray, result: np.ndarray) -> None:
    """Scatter the kernel output ``(Hkv * nblk * rows, d)`` into ``result (T, H, d)`` in place."""
    Hkv = out.shape[0] // (cls.num_blocks * cls.rows)
    G = result.shape[1] // Hkv
    o = np.asarray(out).reshape(Hkv, cls.num_blocks * cls.rows, -1)
    tok, g = cls.row_token, cls.row_head
    real = tok >= 0
    for h in range(Hkv):
        result[tok[real], h * G + g[real]] = o[h, real]


def kernel_inputs(cls: ClassSchedule, query_t: np.ndarray, kv_cache: np.ndarray,
                  overlay: np.ndarray) -> tuple:
    """Positional kernel arguments of one class launch."""
    return (query_t, kv_cache, overlay, cls.partial.meta_i, cls.partial.meta_f, cls.full.meta_i,
            cls.full.meta_f, cls.rows, cls.blocks)


def run_scheduled(query, key, value, kv_cache, block_tables, query_lens, context_lens, *, scale,
                  mixed_precision, large_tile_size, launch, sliding_window=None,
                  logits_soft_cap=None) -> np.ndarray:
    """Validated NumPy inputs in, ``(T, H, d)`` out (query dtype). ``launch(kernel, args,
    kwargs, grid_heads)`` runs a kernel and returns its output as NumPy."""
    from nki_kernels.scheduled_attention import scheduled_paged_attention

    T, H, d = query.shape
    _, N, Hkv, B, _ = kv_cache.shape
    sched = make_schedule(query_lens, context_lens, block_tables, num_heads=H, num_kv_heads=Hkv,
                          head_size=d, block_size=B, num_blocks=N,
                          large_tile_size=large_tile_size, sliding_window=sliding_window)
    overlay = build_overlay(sched, kv_cache, key, value, block_tables)
    result = np.zeros((T, H, d), dtype=query.dtype)
    kwargs = dict(softmax_scale=scale, mixed_precision=mixed_precision,
                  LARGE_TILE_SZ=large_tile_size, logits_soft_cap=logits_soft_cap)
    for cls in sched.classes:
        qt = pack_queries(cls, query, Hkv)
        out = launch(scheduled_paged_attention, kernel_inputs(cls, qt, kv_cache, overlay), kwargs, Hkv)
        unpack_output(cls, out, result)
    return result
