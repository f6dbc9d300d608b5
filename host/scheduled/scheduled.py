"""Kernel inputs of the scheduled paged-attention kernel (one launch per class of a schedule,
or a mixed batch's two classes in one pair launch, :func:`pair_launch_args`).

Step-constant (built once per step by ``host.plan_paged_attention``): the per-row initial values
(:func:`row_init`), their per-item form for keys-on-partitions classes (:func:`item_row_init`),
gathered in a :class:`ClassLaunch`. Per layer (``host.run_paged_attention``): the overlay of key
rows that are not whole cached-context rows (:func:`build_overlay`), the packed Q^T blocks of
every class (:func:`pack_queries`, :func:`item_queries`), the positional arguments of
``nki_kernels.scheduled.scheduled_attention.scheduled_paged_attention`` (:func:`launch_args`, grid
``[1, Hkv]``: positional arguments, and the keyword inputs only keys-on-partitions classes
have) and the scatter of its output back to ``(T, H, d)`` (:func:`unpack_output`).
Layouts: docs/layouts.md ("Scheduled kernel").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from host._arrays import readonly
from host.cache.block_kv import cached_tokens, is_block_kv, kv_dims
from host.scheduled.schedule import AttentionSchedule, ClassSchedule
from nki_kernels.contract import (M_FLOOR, Q_INIT_COLUMNS, Q_INIT_L, Q_INIT_NEG_M, Q_INIT_SLOPE,
                                  Q_INIT_SLOPE_POS)

__all__ = ["build_overlay", "pack_queries", "unpack_output", "kernel_inputs", "row_init",
           "item_queries", "item_row_init", "ClassLaunch", "class_launch", "launch_args",
           "pair_launch_args",
           "group_major", "block_major"]


def group_major(x: Any, blocks: int) -> Any:
    """Block-major ``(Hkv, nblk, a, b)`` -> the kernel's group-major ``(Hkv * ngroups * a,
    blocks * b)`` (nblk = ngroups * blocks): row ``(h*ngroups + g)*a + i`` holds row i of the
    ``blocks`` blocks ``g*blocks + j`` of group g side by side, ``[j*b, (j+1)*b)``, so one DMA
    moves a group (docs/layouts.md "Scheduled kernel"). NumPy arrays or torch tensors; with
    ``blocks == 1`` only a reshape. Inverse: :func:`block_major`."""
    Hkv, nblk, a, b = x.shape
    g5 = _swap_block_axis(x.reshape(Hkv, nblk // blocks, blocks, a, b))
    return g5.reshape(Hkv * (nblk // blocks) * a, blocks * b)


def block_major(y: Any, num_kv_heads: int, blocks: int, a: int, b: int) -> Any:
    """Inverse of :func:`group_major`: ``(Hkv * ngroups * a, blocks * b)`` -> ``(Hkv, nblk, a,
    b)``."""
    ngroups = y.shape[0] // (num_kv_heads * a)
    g5 = _swap_block_axis(y.reshape(num_kv_heads, ngroups, a, blocks, b))
    return g5.reshape(num_kv_heads, ngroups * blocks, a, b)


def _swap_block_axis(x5: Any) -> Any:
    """Axes 2 and 3 of a 5-D array or tensor swapped (NumPy ``transpose``, torch ``permute``)."""
    return (x5.permute if hasattr(x5, "permute") else x5.transpose)(0, 1, 3, 2, 4)


def build_overlay(sched: AttentionSchedule, kv_cache: Any, key: np.ndarray,
                  value: np.ndarray, block_tables: np.ndarray, *, dtype=None,
                  kv_scale: tuple | None = None) -> np.ndarray:
    """``(2, Hkv * R_ov, b'_p * d)``: overlay row ``h * R_ov + r`` holds key row r of ``sched``
    (b'_p consecutive positions of one sequence, the partial phase's rows) for KV head h: cached positions are copied from
    ``kv_cache`` (a fused (2, N, Hkv, B, d) cache or a block-KV (key_cache, value_cache) pair,
    ``host.cache.block_kv.cached_tokens``), new-token positions from ``key`` / ``value``, positions
    past the sequence end are 0. At least one (zero) row per head.

    ``dtype``: the overlay dtype (default the cache dtype). ``kv_scale``: for an fp8 cache,
    ``(k_scale, v_scale)`` (Hkv,) -- cached values are dequantized (times the scale) and every
    value is then divided by the scale, i.e. the overlay holds K / k_scale and V / v_scale like
    the cache does, in ``dtype`` (the host multiplies the scales back into q and the output)."""
    _, B, Hkv, d = kv_dims(kv_cache)
    bp = sched.partial_tiled_block_size
    R = sched.overlay_seq.shape[0]
    dt = (kv_cache[0] if is_block_kv(kv_cache) else kv_cache).dtype if dtype is None \
        else np.dtype(dtype)
    out = np.zeros((2, Hkv, max(R, 1), bp, d), dtype=dt)
    if R:
        seq = sched.overlay_seq[:, None]
        pos = sched.overlay_pos0[:, None] + np.arange(bp)[None, :]          # (R, b')
        c = sched.context_lens[seq]
        keys = c + sched.query_lens[seq]
        tok_off = np.concatenate(([0], np.cumsum(sched.query_lens)[:-1]))[seq]
        cached = pos < c
        new = (pos >= c) & (pos < keys)
        cs = np.nonzero(cached)
        blk = block_tables[seq[cs[0], 0], (pos // B)[cs]]                   # cached positions only
        src = cached_tokens(kv_cache, blk, (pos % B)[cs])                   # (2, n, Hkv, d)
        out[:, :, cs[0], cs[1], :] = np.moveaxis(src, 1, 2).astype(dt)
        ns = np.nonzero(new)
        tok = (tok_off + pos - c)[ns]
        kn = key[tok].astype(np.float32).transpose(1, 0, 2)                  # (Hkv, n, d)
        vn = value[tok].astype(np.float32).transpose(1, 0, 2)
        if kv_scale is not None:
            kn = kn / kv_scale[0][:, None, None]
            vn = vn / kv_scale[1][:, None, None]
        out[0][:, ns[0], ns[1], :] = kn.astype(dt)
        out[1][:, ns[0], ns[1], :] = vn.astype(dt)
    return np.ascontiguousarray(out.reshape(2, Hkv * max(R, 1), bp * d))


def pack_queries(cls: ClassSchedule, query: np.ndarray, num_kv_heads: int,
                 k_scale: np.ndarray | None = None) -> np.ndarray:
    """The Q^T blocks in the kernel's group-major layout (:func:`group_major`), ``(Hkv * ngroups
    * d, blocks * rows)``: row ``(h*ngroups + g)*d + ch``, column ``j*rows + p`` = channel ch of
    query row p of Q block ``b = g*blocks + j`` for KV head h, i.e. ``query[token, h*G + g',
    ch]`` (0 for padding rows); times ``k_scale[h]`` when given (fp8 caches: q . (k8 * s) =
    (q * s) . k8)."""
    T, H, d = query.shape
    G = H // num_kv_heads
    tok, g = cls.row_token, cls.row_head
    real = tok >= 0
    heads = np.arange(num_kv_heads)[:, None] * G + np.where(real, g, 0)[None, :]
    # without scales the gather and the transpose move raw bytes (``item_queries``)
    src = query if k_scale is not None else query.view(f"u{query.dtype.itemsize}")
    packed = src[np.where(real, tok, 0)[None, :], heads]          # (Hkv, n, d): one gather
    packed[:, ~real] = 0
    if k_scale is not None:
        packed = (packed.astype(np.float32) * k_scale[:, None, None]).astype(query.dtype)
    packed = packed.reshape(num_kv_heads, cls.num_blocks, cls.rows, d).transpose(0, 1, 3, 2)
    out = np.ascontiguousarray(group_major(packed, cls.blocks))
    return out.view(query.dtype)


def row_init(cls: ClassSchedule, num_heads: int, num_kv_heads: int, *, sinks=None,
             alibi_slopes=None) -> np.ndarray:
    """``(Hkv * ngroups * rows, blocks * 4)`` float32, group-major (:func:`group_major`): row
    ``(h*ngroups + g)*rows + p``, columns ``[j*4, j*4 + 4)`` for query row p of Q block
    ``g*blocks + j``: initial -m and l (``-M_FLOOR, 0``; with an attention sink ``-sink, 1``:
    the sink's exp(sink - m) is the starting sum), ALiBi slope and slope * query position (0
    without ALiBi)."""
    G = num_heads // num_kv_heads
    n = cls.row_token.shape[0]
    init = np.zeros((num_kv_heads, n, Q_INIT_COLUMNS), np.float32)
    init[:, :, Q_INIT_NEG_M] = -M_FLOOR
    real = cls.row_token >= 0
    for h in range(num_kv_heads):
        heads = h * G + cls.row_head[real]
        if sinks is not None:
            init[h, real, Q_INIT_NEG_M] = -sinks[heads]
            init[h, real, Q_INIT_L] = 1.0
        if alibi_slopes is not None:
            init[h, real, Q_INIT_SLOPE] = alibi_slopes[heads]
            init[h, real, Q_INIT_SLOPE_POS] = alibi_slopes[heads] * cls.row_pos[real]
    init = init.reshape(num_kv_heads, cls.num_blocks, cls.rows, Q_INIT_COLUMNS)
    return np.ascontiguousarray(group_major(init, cls.blocks))


def unpack_output(cls: ClassSchedule, out: np.ndarray, result: np.ndarray,
                  v_scale: np.ndarray | None = None) -> None:
    """Scatter the kernel output (group-major ``(Hkv * ngroups * rows, blocks * d)``,
    :func:`group_major`) into ``result (T, H, d)`` in place (times ``v_scale[h]`` when given:
    fp8 caches hold V / v_scale)."""
    d = out.shape[1] // cls.blocks
    Hkv = out.shape[0] * cls.blocks // (cls.num_blocks * cls.rows)
    G = result.shape[1] // Hkv
    o = block_major(np.asarray(out), Hkv, cls.blocks, cls.rows, d).reshape(
        Hkv, cls.num_blocks * cls.rows, d)
    tok, g = cls.row_token, cls.row_head
    real = tok >= 0
    for h in range(Hkv):
        rows = o[h, real]
        if v_scale is not None:
            rows = (rows.astype(np.float32) * v_scale[h]).astype(result.dtype)
        result[tok[real], h * G + g[real]] = rows


def item_queries(cls: ClassSchedule, query_t: np.ndarray, phase,
                 num_kv_heads: int) -> np.ndarray | None:
    """Keys-on-partitions classes: ``(Hkv * d, items * rows)``, column ``t*rows + r`` of row
    ``h*d + ch`` = channel ch of row r of the Q^T block of item t of ``phase`` for KV head h
    (zeros for padding items); None for other classes (the kernel has no such input)."""
    if not cls.decode_layout:
        return None
    rows, nblk = cls.rows, cls.num_blocks
    d = query_t.shape[0] // (num_kv_heads * nblk)
    # the gather moves raw bytes (an unsigned view of the same width: NumPy's strided copies of
    # ml_dtypes' bfloat16 / fp8 are per-element loops); zero bits are 0.0 in every float dtype
    raw = query_t.view(f"u{query_t.dtype.itemsize}")
    q4t = raw.reshape(num_kv_heads, nblk, d, rows).transpose(0, 2, 1, 3)   # (Hkv, d, nblk, rows)
    blk = phase.item_block
    sel = q4t[:, :, np.maximum(blk, 0)]          # one gather, already in the output order
    sel[:, :, blk < 0] = 0
    return sel.reshape(num_kv_heads * d, blk.shape[0] * rows).view(query_t.dtype)


def item_row_init(cls: ClassSchedule, q_init: np.ndarray, phase, num_kv_heads: int) -> np.ndarray:
    """Keys-on-partitions classes: ``(Hkv * rows, items * 4)`` float32, row ``h*rows + p``,
    columns ``[t*4, t*4 + 4)`` = the ``q_init`` row of query row p of item t's Q block for KV
    head h (``-M_FLOOR, 0, 0, 0`` for padding items). Keys-on-partitions classes only."""
    rows, nblk = cls.rows, cls.num_blocks
    q4 = q_init.reshape(num_kv_heads, nblk, rows, Q_INIT_COLUMNS)
    blk = phase.item_block
    pad = np.zeros(Q_INIT_COLUMNS, np.float32)
    pad[Q_INIT_NEG_M] = -M_FLOOR
    sel = np.where(blk[None, :, None, None] >= 0, q4[:, np.maximum(blk, 0)], pad)
    return np.ascontiguousarray(sel.astype(np.float32).transpose(0, 2, 1, 3)
                                .reshape(num_kv_heads * rows, blk.shape[0] * Q_INIT_COLUMNS))


@dataclass(frozen=True, eq=False)
class ClassLaunch:
    """Step-constant inputs of one scheduled-kernel launch (one class of sequences).

    q_init: (Hkv * nblk * rows, 4) float32 per-row initial values (:func:`row_init`);
    init_full / init_part: keys-on-partitions classes with ``row_init``: the per-item rows of
    q_init for the full / partial phase (:func:`item_row_init`), else None; bounds: the partial
    phase's one-partition mask bounds (keys-on-partitions classes), else None. None inputs are
    not passed to the kernel (its defaults).
    """

    cls: ClassSchedule
    q_init: np.ndarray = field(repr=False)
    init_full: np.ndarray | None = field(default=None, repr=False)
    init_part: np.ndarray | None = field(default=None, repr=False)
    bounds: np.ndarray | None = field(default=None, repr=False)


def class_launch(cls: ClassSchedule, q_init: np.ndarray, *, row_init: bool = False) -> ClassLaunch:
    """The step-constant inputs of one class launch, from its ``q_init`` (:func:`row_init`);
    ``row_init``: the launch starts its rows from ``q_init`` (sinks, ALiBi:
    ``SchedOptions.row_init``), so keys-on-partitions classes get its per-item form."""
    init = readonly(np.asarray(q_init, np.float32))
    full = part = bounds = None
    if cls.decode_layout:
        bounds = cls.partial.bounds
        if row_init:
            full = readonly(item_row_init(cls, init, cls.full, _kv_heads(cls, init)))
            part = readonly(item_row_init(cls, init, cls.partial, _kv_heads(cls, init)))
    return ClassLaunch(cls=cls, q_init=init, init_full=full, init_part=part, bounds=bounds)


def _kv_heads(cls: ClassSchedule, q_init: np.ndarray) -> int:
    return q_init.shape[0] * cls.blocks // (cls.num_blocks * cls.rows)


def launch_args(launch: ClassLaunch, query_t: np.ndarray, kv_cache: np.ndarray,
                overlay: np.ndarray, item_q: tuple | None = None) -> tuple[tuple, dict]:
    """``(args, inputs)`` of one class launch: the positional kernel arguments (this layer's
    packed Q^T, :func:`pack_queries`, the step-constant ``q_init``, the cache in its kernel view,
    the overlay, the class metadata, rows, blocks) and the keyword inputs only keys-on-partitions
    classes have: ``q_full`` / ``q_part`` (:func:`item_queries`), ``bounds_p`` and, with
    row_init, ``i_full`` / ``i_part`` (empty for other classes: the kernel's None defaults).
    ``item_q``: the per-item Q^T of the full and partial phase when the caller built them
    (device tensors; None for other classes)."""
    cls = launch.cls
    args = (query_t, launch.q_init, kv_cache, overlay, cls.partial.meta_i, cls.partial.meta_f,
            cls.full.meta_i, cls.full.meta_f, cls.blocks)
    if not cls.decode_layout:
        return args, {}
    Hkv = kv_cache.shape[2]
    if item_q is None:
        item_q = (item_queries(cls, query_t, cls.full, Hkv),
                  item_queries(cls, query_t, cls.partial, Hkv))
    inputs = dict(q_full=item_q[0], q_part=item_q[1], bounds_p=launch.bounds)
    if launch.init_full is not None:
        inputs.update(i_full=launch.init_full, i_part=launch.init_part)
    return args, inputs


def kernel_inputs(cls: ClassSchedule, query_t: np.ndarray, q_init: np.ndarray,
                  kv_cache: np.ndarray, overlay: np.ndarray, *,
                  row_init: bool = False) -> tuple[tuple, dict]:
    """``(args, inputs)`` of one class launch (:func:`class_launch` + :func:`launch_args`)."""
    return launch_args(class_launch(cls, q_init, row_init=row_init), query_t, kv_cache, overlay)


def pair_launch_args(first: tuple, second: tuple) -> tuple[tuple, dict]:
    """``(args, inputs)`` of ``nki_kernels.scheduled.scheduled_pair.scheduled_pair_attention``
    from two classes' :func:`launch_args` (both on the same cache): the first class's Q^T,
    q_init, overlay and metadata, the second's, the cache, both ``blocks``; the keyword inputs
    of the second class with the suffix ``_b``."""
    (a, in_a), (b, in_b) = first, second
    per_class = lambda x: (x[0], x[1], x[3], x[4], x[5], x[6], x[7])  # noqa: E731
    args = (*per_class(a), *per_class(b), a[2], a[8], b[8])
    return args, {**in_a, **{f"{n}_b": v for n, v in in_b.items()}}
