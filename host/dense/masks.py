"""Attention masks for the flat batch (kernel input) and vLLM's context-mask reorder.
Spec: ``docs/layouts.md`` §6-§7.

    context_mask(plan)          bool (Qpad, ctx)        natural token order
    active_mask(plan)           bool (Qpad, Qpad)       block-diagonal causal, bottom-right aligned
    reorder_context_mask(m, LT, B) / inverse_reorder_context_mask(m, LT, B)   (Q, ctx + Q)
    build_attention_mask(plan)  bool (Qpad, ctx + Qpad) == reorder(concat(context, active))

``ctx`` is ``plan.context_kv_len``. Row r belongs to sequence ``query_seq_ids(plan)[r]`` (-1 for
padding rows, which see nothing). Context column u (natural order) is a real token of sequence
``context_seq_ids(plan)[u]`` or -1 (padding inside a last block, or padding blocks).

The dense mask is O(Qpad * ctx) bytes; builders here allocate it with ``np.zeros`` and write only
each sequence's band (its rows x the large tiles its context spans), so building costs
O(sum_i q_i * (ctx_i + 2 LT)) writes plus untouched zero pages. A per-sequence loop is used for
those band writes: each sequence is one rectangle of rows, and a vectorised alternative would
have to touch all Qpad * ctx entries.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host._arrays import from_numpy_like, to_numpy
from host.dense.block_tables import tile_geometry
from host.dense.plan import PARTITIONS, PagedAttentionPlan
from host.validation import check_int, check_ndim, fail

__all__ = [
    "query_seq_ids",
    "context_seq_ids",
    "context_row_ranges",
    "context_mask",
    "active_mask",
    "context_token_order",
    "reorder_context_mask",
    "inverse_reorder_context_mask",
    "build_attention_mask",
]


def query_seq_ids(plan: PagedAttentionPlan) -> np.ndarray:
    """(Qpad,) int64: sequence of each (padded) query row, -1 for padding rows."""
    out = np.full(plan.padded_queries, -1, dtype=np.int64)
    out[: plan.num_queries] = np.repeat(np.arange(plan.num_seqs), plan.query_lens)
    return out


def context_seq_ids(plan: PagedAttentionPlan) -> np.ndarray:
    """(context_kv_len,) int64 in natural order: sequence owning each real context token, else -1."""
    B = plan.block_size
    out = np.full(plan.context_kv_len, -1, dtype=np.int64)
    span = plan.context_blocks * B                          # tokens reserved per sequence
    total = int(span.sum())
    seq = np.repeat(np.arange(plan.num_seqs), span)
    pos = np.arange(total) - np.repeat(plan.block_offsets * B, span)   # token index in the sequence
    out[:total] = np.where(pos < plan.context_lens[seq], seq, -1)
    return out


def context_row_ranges(plan: PagedAttentionPlan) -> tuple[np.ndarray, np.ndarray]:
    """Compact context mask: (start, end) (Qpad,) int64, row r sees natural columns [start, end).

    Padding rows and rows of sequences without context get an empty range (start == end).
    Together with :func:`query_seq_ids` this is the O(Qpad) form of the O(Qpad * ctx) mask.
    """
    start = np.zeros(plan.padded_queries, dtype=np.int64)
    end = np.zeros(plan.padded_queries, dtype=np.int64)
    T = plan.num_queries
    a = plan.block_offsets * plan.block_size
    start[:T] = np.repeat(a, plan.query_lens)
    end[:T] = np.repeat(a + plan.context_lens, plan.query_lens)
    return start, end


def context_mask(plan: PagedAttentionPlan) -> np.ndarray:
    """bool (Qpad, context_kv_len), natural token order (NOT reordered).

    ``mask[r, u]`` is True iff row r is a real query of sequence i and column u is one of the
    ``context_lens[i]`` real context tokens of sequence i (columns ``block_offsets[i]*B + k``).
    """
    out = np.zeros((plan.padded_queries, plan.context_kv_len), dtype=bool)
    a = plan.block_offsets * plan.block_size
    for r0, q, c0, n in zip(plan.query_offsets.tolist(), plan.query_lens.tolist(),
                            a.tolist(), plan.context_lens.tolist()):
        out[r0:r0 + q, c0:c0 + n] = True
    return out


def active_mask(plan: PagedAttentionPlan) -> np.ndarray:
    """bool (Qpad, Qpad): block-diagonal over sequences, causal within each.

    Row ``query_offsets[i] + a`` sees columns ``query_offsets[i] + b`` for ``b <= a``: the new
    keys of sequence i follow its context, so bottom-right alignment of the (q_i, ctx_i + q_i)
    score block gives plain lower-triangular on the new-token part. Padding rows see nothing.
    """
    Q = plan.padded_queries
    out = np.zeros((Q, Q), dtype=bool)
    for r0, q in zip(plan.query_offsets.tolist(), plan.query_lens.tolist()):
        out[r0:r0 + q, r0:r0 + q] = np.tri(q, dtype=bool)
    return out


def _split_mask(mask: Any, large_tile_size: int, block_size: int):
    arr, was_torch = to_numpy(mask, "mask")
    check_ndim("mask", arr, 2)
    _, _, bp, L = tile_geometry(block_size, large_tile_size)
    Q, cols = arr.shape
    ctx = cols - Q
    LT = int(large_tile_size)
    if ctx < 0 or ctx % LT:
        fail("mask", f"have shape (Q, ctx + Q) with ctx a multiple of LARGE_TILE_SZ={LT}",
             f"shape {arr.shape} (ctx = {ctx})")
    return arr, was_torch, Q, ctx, bp, L


def reorder_context_mask(mask: Any, LARGE_TILE_SZ: int, block_size: int) -> Any:
    """vLLM's ``reorder_context_mask``: permute context columns into the kernel's load order.

    Input ``(Q, ctx + Q)`` (any dtype), ctx a multiple of LARGE_TILE_SZ. The context part is
    viewed as ``(Q, ctx/LT, L/128, 128, b')``, the last two axes are swapped and flattened back:
    ``new[:, j*LT + g*128*b' + s*128 + p] = old[:, j*LT + g*128*b' + p*b' + s]``. The last Q
    (active) columns are copied unchanged. Identity when b' == 1. Always returns a new array
    (vLLM returns the input object itself in the identity case). torch in, torch out.
    Inverse: :func:`inverse_reorder_context_mask`.
    """
    arr, was_torch, Q, ctx, bp, L = _split_mask(mask, LARGE_TILE_SZ, block_size)
    out = np.empty_like(arr)
    view = arr[:, :ctx].reshape(Q, ctx // LARGE_TILE_SZ, L // PARTITIONS, PARTITIONS, bp)
    out[:, :ctx] = view.transpose(0, 1, 2, 4, 3).reshape(Q, ctx)
    out[:, ctx:] = arr[:, ctx:]
    return from_numpy_like(out, was_torch, like=mask)


def inverse_reorder_context_mask(mask: Any, LARGE_TILE_SZ: int, block_size: int) -> Any:
    """Undo :func:`reorder_context_mask`: view ``(Q, ctx/LT, L/128, b', 128)``, swap back."""
    arr, was_torch, Q, ctx, bp, L = _split_mask(mask, LARGE_TILE_SZ, block_size)
    out = np.empty_like(arr)
    view = arr[:, :ctx].reshape(Q, ctx // LARGE_TILE_SZ, L // PARTITIONS, bp, PARTITIONS)
    out[:, :ctx] = view.transpose(0, 1, 2, 4, 3).reshape(Q, ctx)
    out[:, ctx:] = arr[:, ctx:]
    return from_numpy_like(out, was_torch, like=mask)


def context_token_order(context_kv_len: int, LARGE_TILE_SZ: int, block_size: int) -> np.ndarray:
    """(context_kv_len,) int64: natural token index held by each reordered context column,
    i.e. ``reorder_context_mask`` applied to ``arange`` (``new[:, c] = old[:, order[c]]``)."""
    n = check_int("context_kv_len", context_kv_len, min_value=0)
    ids = np.arange(n, dtype=np.int64)[None, :]
    padded = np.concatenate([ids, np.zeros((1, 1), dtype=np.int64)], axis=1)   # Q = 1 active col
    return reorder_context_mask(padded, LARGE_TILE_SZ, block_size)[0, :n]


def build_attention_mask(plan: PagedAttentionPlan, *, out: np.ndarray | None = None) -> np.ndarray:
    """The kernel's mask input: bool (Qpad, context_kv_len + Qpad), context part reordered.

    Equal to ``reorder_context_mask(concat([context_mask(plan), active_mask(plan)], 1), LT, B)``
    but built directly: for each sequence, one row pattern over the large tiles its context
    spans (natural token of reordered column c via the tile-local order), broadcast to its rows.

    ``out``: optional preallocated writable bool NumPy array of that shape (e.g. reused across
    steps of one shape bucket); it is cleared and filled and returned. A fresh dense buffer
    costs page faults on first touch (NumPy maps large arrays with huge pages, so even the band
    writes fault in most of it); reusing one costs a memset instead.
    """
    Q, ctx, LT = plan.padded_queries, plan.context_kv_len, plan.large_tile_size
    if out is None:
        out = np.zeros((Q, ctx + Q), dtype=bool)
    else:
        if not isinstance(out, np.ndarray) or out.dtype != bool or out.shape != (Q, ctx + Q) \
                or not out.flags.writeable:
            fail("out", f"be a writable bool NumPy array of shape (padded_queries, context_kv_len + "
                 f"padded_queries) = {(Q, ctx + Q)}",
                 f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}")
        out.fill(False)
    tau = context_token_order(LT, LT, plan.block_size)      # tile-local order, (LT,)
    identity = plan.tiled_block_size == 1
    a = plan.block_offsets * plan.block_size
    for r0, q, c0, n in zip(plan.query_offsets.tolist(), plan.query_lens.tolist(),
                            a.tolist(), plan.context_lens.tolist()):
        if n:
            if identity:
                out[r0:r0 + q, c0:c0 + n] = True
            else:
                j0, j1 = c0 // LT, (c0 + n - 1) // LT + 1
                tok = (np.arange(j0, j1)[:, None] * LT + tau[None, :]).reshape(-1)
                out[r0:r0 + q, j0 * LT:j1 * LT] = (tok >= c0) & (tok < c0 + n)
        out[r0:r0 + q, ctx + r0:ctx + r0 + q] = np.tri(q, dtype=bool)
    return out
