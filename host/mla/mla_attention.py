"""MLA paged attention: ``mla_paged_attention`` (user-facing) and the MLA overlay it builds.

The kernel is ``nki_kernels.mla.mla_attention.mla_paged_attention`` on grid ``[1, 1]`` (one latent KV
head). The host reuses the scheduled kernel's machinery (``host.scheduled.schedule.make_schedule``,
``host.scheduled.scheduled.pack_queries`` / ``unpack_output``) with ONE KV head whose G = H query heads
are query rows, head size D = R + P, and the context ``context_lens - query_lens``: under the MLA
convention (docs/layouts.md §12) the new tokens are already in the cache, so the schedule's "new
tokens" are the sequence's last ``query_lens`` cached tokens. Key rows that are not whole cache
rows below that context (a sequence's partly filled rows, new tokens included) become *overlay*
rows, which :func:`build_mla_overlay` copies from the cache with zeros past the sequence end, so
masks come from per-row bounds, tiles are pruned, padding moves no bytes and nothing unused in the
cache (block tails, entry padding, unreferenced blocks) reaches an output. Layouts:
docs/layouts.md §17.

Dimensions: S sequences, T tokens, H query heads, R = kv_lora_rank, P = qk_rope_head_dim,
cache (N, B, E) with E >= R + P, b' entries per gathered row (``host.scheduled.schedule.item_geometry``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from host._arrays import from_numpy_like, readonly, to_numpy
from host.launch import check_api, check_backend, item_parts_for, launch_kernel
from host.mla.mla import MAX_MLA_HEADS, MLA_DTYPES, MLAPlan, check_mla_inputs, mla_batch
from host.scheduled.schedule import AttentionSchedule, make_schedule
from host.scheduled.scheduled import item_queries, pack_queries, unpack_output
from host.validation import check_int, check_integer_array, check_power_of_two, fail
from nki_kernels.contract import MAX_BLOCK_SIZE, MAX_TILE_SIZE, MIN_BLOCK_SIZE, MIN_TILE_SIZE

__all__ = ["mla_paged_attention", "plan_mla_attention", "run_mla_attention", "MLAStepPlan",
           "build_mla_overlay", "mla_schedule", "mla_kernel_inputs", "mla_max_group_blocks"]

_INT32_MAX = np.iinfo(np.int32).max


def mla_schedule(plan, block_tables: np.ndarray, large_tile_size: int, max_group_blocks: int,
                 partial_tile_size="auto", item_parts: int = 1) -> AttentionSchedule:
    """The schedule of a validated :class:`host.MLAPlan`: one KV head, G = H, D = R + P, context
    ``context_lens - query_lens`` (the new tokens are the last cached ones); the partial phase's
    tile size as ``host.scheduled.schedule.make_schedule`` takes it (the kernel's ``PARTIAL_TILE_SZ`` must
    be the schedule's ``partial_tile_size``); ``item_parts``: 2 for both cores of an LNC=2
    launch (docs/layouts.md §16.3)."""
    return make_schedule(plan.query_lens, plan.context_lens - plan.query_lens, block_tables,
                         num_heads=plan.num_heads, num_kv_heads=1,
                         head_size=plan.kv_lora_rank + plan.qk_rope_head_dim,
                         block_size=plan.block_size, num_blocks=plan.num_blocks,
                         large_tile_size=large_tile_size, group_blocks_cap=max_group_blocks,
                         partial_tile_size=partial_tile_size, item_parts=item_parts)


def mla_max_group_blocks(plan, large_tile_size: int, mixed_precision: bool, itemsize: int) -> int:
    """128-row Q blocks per group (<= MLA_MAX_GROUP_BLOCKS) whose SBUF working set
    (``nki_kernels.mla.mla_sbuf``) fits trn1's SBUF, the smaller of the two targets; ``itemsize``:
    bytes per element of q and the cache.

    Raises:
        NotImplementedError: R > 512, or the working set does not fit for one 128-row block or
            for the largest decode-layout block (LARGE_TILE_SZ too large for this entry size and
            dtype).
    """
    from nki_kernels.contract import DECODE_MAX_ROWS, tile_geometry
    from nki_kernels.mla.mla_attention import MAX_VALUE_DIM, MLA_MAX_GROUP_BLOCKS
    from nki_kernels.mla.mla_sbuf import SBUF_USABLE, decode_chunk_cap, mla_group_blocks, mla_sbuf_bytes

    if plan.kv_lora_rank > MAX_VALUE_DIM:
        raise NotImplementedError(f"kv_lora_rank = {plan.kv_lora_rank} > {MAX_VALUE_DIM} is not "
                                  "supported (the value accumulator is one PSUM bank); split the "
                                  f"latent into pieces of <= {MAX_VALUE_DIM}")
    geo = tile_geometry(plan.block_size, large_tile_size)
    bp, nL = geo.bp, geo.nL
    D, kd = plan.kv_lora_rank + plan.qk_rope_head_dim, 2 if mixed_precision else itemsize
    shape = dict(loads=nL, tiled_block_size=bp, entry_size=plan.entry_size, key_width=D,
                 value_width=plan.kv_lora_rank, cache_itemsize=itemsize, kernel_itemsize=kd,
                 query_itemsize=itemsize)
    blocks = mla_group_blocks(nc_gen="gen2", max_blocks=MLA_MAX_GROUP_BLOCKS, rows=128, **shape)
    rows = DECODE_MAX_ROWS
    cap = decode_chunk_cap(key_width=D, rows=rows, kernel_itemsize=kd)
    decode = mla_sbuf_bytes(rows=rows, blocks=1, preload_cols=cap * rows, **shape)
    if blocks == 0 or decode > SBUF_USABLE["gen2"]:
        raise NotImplementedError(
            f"large_tile_size={large_tile_size} with {plan.entry_size}-element {plan.dtype} entries "
            f"(mixed_precision={mixed_precision}) does not fit the kernel's SBUF working set; use a "
            "smaller large_tile_size" + ("" if mixed_precision else " or mixed_precision=True"))
    return blocks


def build_mla_overlay(sched: AttentionSchedule, kv_cache: np.ndarray, block_tables: np.ndarray,
                      key_width: int) -> np.ndarray:
    """``(max(R_ov, 1), b' * E)`` in the cache dtype: overlay row r holds positions
    ``pos0 .. pos0 + b' - 1`` of sequence ``overlay_seq[r]`` (``pos0 = overlay_pos0[r]``), entry s
    at columns ``[s*E, (s+1)*E)``: elements ``[0, key_width)`` (key_width = R + P) of the cache
    entry of position ``pos0 + s`` when that position is below the sequence's cached length
    (schedule context + query), else 0; entry padding ``[key_width, E)`` is always 0. At least
    one (zero) row."""
    _, B, E = kv_cache.shape
    bp = sched.partial_tiled_block_size
    R_ov = sched.overlay_seq.shape[0]
    out = np.zeros((max(R_ov, 1), bp, E), dtype=kv_cache.dtype)
    if R_ov:
        seq = sched.overlay_seq[:, None]
        pos = sched.overlay_pos0[:, None] + np.arange(bp)[None, :]              # (R_ov, b')
        cached = pos < (sched.context_lens + sched.query_lens)[seq]
        r, s = np.nonzero(cached)
        p = pos[r, s]
        blk = block_tables[sched.overlay_seq[r], p // B]
        out[r, s, :key_width] = kv_cache[blk, p % B, :key_width]
    return out.reshape(max(R_ov, 1), bp * E)


def mla_kernel_inputs(cls, q: np.ndarray, kv_cache: np.ndarray, overlay: np.ndarray) -> tuple:
    """``(args, inputs)`` of one class launch: the positional kernel arguments (Q^T packed with
    one KV head, the cache, the overlay, the class metadata, rows, blocks) and the keyword
    inputs only decode-layout classes have (the per-item Q^T of both phases,
    ``host.scheduled.scheduled.item_queries``, and the partial items' one-partition mask bounds; empty
    for other classes, whose kernel inputs default to None)."""
    qt = pack_queries(cls, q, 1)
    inputs = {}
    if cls.decode_layout:
        inputs = dict(q_full=item_queries(cls, qt, cls.full, 1),
                      q_part=item_queries(cls, qt, cls.partial, 1), bounds_p=cls.partial.bounds)
    args = (qt, kv_cache, overlay, cls.partial.meta_i, cls.partial.meta_f, cls.full.meta_i,
            cls.full.meta_f, cls.rows, cls.blocks)
    return args, inputs


def mla_paged_attention(q: Any, kv_cache: Any, block_tables: Any, query_lens: Any,
                        context_lens: Any, *, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
                        softmax_scale: float | None = None, mixed_precision: bool = True,
                        large_tile_size: int = 2048, backend: str = "auto",
                        api: str | None = None, lnc: int | None = None) -> Any:
    """MLA attention of a flat batch of new tokens over a paged latent cache.

    Same arguments, convention and result as :func:`host.mla_paged_attention_ref` (the new tokens
    are already in the cache; ``context_lens`` counts them).

    Args:
        q: (T, H, R + P) float32/bfloat16/float16, 1 <= H <= 128, sequences contiguous and in
            order; the absorbed query ``[q_nope W_UK | q_pe]``.
        kv_cache: (N, B, E) in q's dtype, E >= R + P (entries ``[kv_c | k_pe | padding]``, e.g.
            from :func:`host.allocate_mla_cache`); B a power of two <= 256. Never modified.
        block_tables: (S, max_blocks) integer; row i's first ceil(context_lens[i] / B) entries.
        query_lens: (S,) >= 1 summing to T.  context_lens: (S,) >= query_lens.
        kv_lora_rank: R (1..512), the latent / value width.  qk_rope_head_dim: P >= 1.
        softmax_scale: default 1 / sqrt(R + P).
        mixed_precision: bf16 matmuls with fp32 statistics (True) or the input dtype (False).
        large_tile_size: keys per KV tile, a power of two in [512, 8192].
        backend: "auto" | "sim" | "neuron" (as :func:`host.paged_attention`).
        api: "legacy" | "nki" | None / "auto": the NKI API of the kernel
            (``nki_kernels.toolchain.resolve_api``: the installed toolchain, else the simulator
            target's API), validated with ``host.launch.check_api``.
        lnc: physical cores per launch, 1 or 2 (trn2 / trn3: each class's query groups split
            between the two cores of a logical core, the latent cache being one KV head,
            docs/layouts.md §16.3 "Item parts"); None: ``NEURON_LOGICAL_NC_CONFIG``, else the
            platform's (``nki_kernels.toolchain.Api.lnc``).

    Returns:
        (T, H, R) in q's dtype (a torch tensor if ``q`` was one).

    Raises:
        ValueError: any bad argument (named), before anything runs.
        NotImplementedError: an fp8 cache, R > 512, or a cache too large for int32 row ids.
        RuntimeError: backend="neuron" without the real Neuron toolchain.

    Pseudocode:
        plan = check_mla_inputs(...); sched = mla_schedule(plan, block_tables, LT)
        overlay = build_mla_overlay(sched, kv_cache, block_tables, R + P)
        for each class (decode / prefill): mla_paged_attention[1, 1](pack_queries(class, q, 1),
            kv_cache, overlay, class metadata, rows, blocks, options=MLAOptions(...)
            [, q_full=, q_part=, bounds_p= (decode layout)]); unpack_output(class, out, result)
    """
    batch = check_mla_inputs(q, kv_cache, block_tables, query_lens, context_lens,
                             kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
                             softmax_scale=softmax_scale)
    plan = _step_plan(batch, block_tables, mixed_precision=mixed_precision,
                      large_tile_size=large_tile_size, backend=backend, api=api, lnc=lnc)
    q_np, was_torch = to_numpy(q, "q")
    return from_numpy_like(_run(plan, q_np, to_numpy(kv_cache, "kv_cache")[0]), was_torch, like=q)


@dataclass(frozen=True, eq=False)
class MLAStepPlan:
    """The frozen plan of one MLA step (all layers): ``batch`` (the validated
    :class:`host.MLAPlan`: geometry, lengths, scale), the schedule (one KV head, G = H), the
    block tables (read-only int64), the kernel's keyword arguments (read-only mapping), backend,
    api and lnc (as given: None = ``Api.lnc``'s choice per launch, which the item parts of the
    schedule were cut for)."""

    batch: MLAPlan
    schedule: AttentionSchedule = field(repr=False)
    block_tables: np.ndarray = field(repr=False)
    kernel_kwargs: Mapping[str, Any] = field(repr=False)
    backend: str = "auto"
    api: str | None = None
    lnc: int | None = None


def plan_mla_attention(block_tables: Any, query_lens: Any, context_lens: Any, *, num_heads: int,
                       num_blocks: int, block_size: int, entry_size: int, dtype: Any,
                       kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
                       softmax_scale: float | None = None, mixed_precision: bool = True,
                       large_tile_size: int = 2048, backend: str = "auto",
                       api: str | None = None, lnc: int | None = None) -> MLAStepPlan:
    """Validate an MLA step once and build its frozen :class:`MLAStepPlan` (schedule, SBUF group
    size, kernel options), shared by every layer: ``run_mla_attention(plan, q, kv_cache)`` per
    layer. Arguments as :func:`mla_paged_attention`, with the tensors' geometry given instead:
    num_heads H (1..128), the cache's num_blocks N, block_size B and entry_size E (>= R + P),
    dtype (of q and the cache). ValueError naming the argument for anything invalid."""
    R = check_int("kv_lora_rank", kv_lora_rank, min_value=1)
    P = check_int("qk_rope_head_dim", qk_rope_head_dim, min_value=1)
    H = check_int("num_heads", num_heads, min_value=1, max_value=MAX_MLA_HEADS)
    N = check_int("num_blocks", num_blocks, min_value=1)
    B = check_power_of_two("block_size", block_size, lo=MIN_BLOCK_SIZE, hi=MAX_BLOCK_SIZE)
    E = check_int("entry_size", entry_size, min_value=R + P)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        fail("dtype", f"be one of {MLA_DTYPES}", repr(dtype))
    if dt.name not in MLA_DTYPES:
        fail("dtype", f"be one of {MLA_DTYPES}", dt.name)
    if N * B > _INT32_MAX:
        raise NotImplementedError(f"num_blocks * block_size = {N * B} exceeds the int32 "
                                  "row-index range; split the cache into smaller tensors")
    batch = mla_batch(block_tables, query_lens, context_lens, num_tokens=None, num_heads=H,
                      num_blocks=N, block_size=B, entry_size=E, kv_lora_rank=R,
                      qk_rope_head_dim=P, softmax_scale=softmax_scale, dtype=dt.name)
    return _step_plan(batch, block_tables, mixed_precision=mixed_precision,
                      large_tile_size=large_tile_size, backend=backend, api=api, lnc=lnc)


def _step_plan(batch: MLAPlan, block_tables: Any, *, mixed_precision, large_tile_size, backend,
               api, lnc=None) -> MLAStepPlan:
    """The step plan of a validated batch (options checked here)."""
    if not isinstance(mixed_precision, (bool, np.bool_)):
        fail("mixed_precision", "be a bool", repr(mixed_precision))
    check_backend(backend)
    api = check_api(api)
    # one latent head: two cores split each class's query groups (a bad lnc fails here)
    parts = item_parts_for(api, lnc, 1)
    LT = check_power_of_two("large_tile_size", large_tile_size, lo=MIN_TILE_SIZE, hi=MAX_TILE_SIZE)
    B = batch.block_size
    if B & (B - 1) or B > MAX_BLOCK_SIZE:
        fail("kv_cache", "have a block size (kv_cache.shape[1]) that is a power of two <= 256",
             f"block size {B}")
    bt = check_integer_array("block_tables", to_numpy(block_tables, "block_tables")[0], ndim=2)
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[batch.dtype]
    blocks = mla_max_group_blocks(batch, LT, bool(mixed_precision), itemsize)
    sched = mla_schedule(batch, bt, LT, blocks, item_parts=parts)
    if 2 * batch.num_blocks * max(sched.tiling_factor, sched.partial_tiling_factor) > _INT32_MAX:
        raise NotImplementedError("kv_cache: num_blocks * rows per block is beyond the int32 row-id "
                                  "range of the gathers; split the cache into smaller tensors")
    from nki_kernels.mla.mla_config import MLAOptions

    kwargs = MappingProxyType(dict(options=MLAOptions(
        kv_lora_rank=batch.kv_lora_rank, qk_rope_head_dim=batch.qk_rope_head_dim,
        softmax_scale=batch.softmax_scale, mixed_precision=bool(mixed_precision),
        LARGE_TILE_SZ=LT, PARTIAL_TILE_SZ=sched.partial_tile_size, item_parts=parts)))
    return MLAStepPlan(batch=batch, schedule=sched, block_tables=readonly(bt.copy()),
                       kernel_kwargs=kwargs, backend=backend, api=api, lnc=lnc)


def run_mla_attention(plan: MLAStepPlan, q: Any, kv_cache: Any) -> Any:
    """One layer of a planned MLA step: q (T, H, R + P) and kv_cache (N, B, E) in the plan's
    dtype -> (T, H, R) (torch in, torch out). A tensor that does not fit the plan is a
    ValueError naming it, the plan's shape / dtype and the value."""
    if not isinstance(plan, MLAStepPlan):
        fail("plan", "be an MLAStepPlan from host.plan_mla_attention", type(plan).__name__)
    b = plan.batch
    q_np, was_torch = to_numpy(q, "q")
    cache, _ = to_numpy(kv_cache, "kv_cache")
    for name, arr, shape in (("q", q_np, (b.num_tokens, b.num_heads,
                                          b.kv_lora_rank + b.qk_rope_head_dim)),
                             ("kv_cache", cache, (b.num_blocks, b.block_size, b.entry_size))):
        if arr.shape != shape:
            fail(name, f"have shape {shape} of the plan", f"shape {arr.shape}")
        if arr.dtype.name != b.dtype:
            fail(f"{name}.dtype", f"be the plan's {b.dtype}", arr.dtype.name)
    return from_numpy_like(_run(plan, q_np, cache), was_torch, like=q)


def _run(plan: MLAStepPlan, q: np.ndarray, kv_cache: np.ndarray) -> np.ndarray:
    """Overlay (from this layer's cache), per-class kernel inputs, launches, unpack."""
    from nki_kernels.mla.mla_attention import mla_paged_attention as kernel

    b = plan.batch
    cache = np.ascontiguousarray(kv_cache)
    overlay = build_mla_overlay(plan.schedule, cache, plan.block_tables,
                                b.kv_lora_rank + b.qk_rope_head_dim)
    result = np.zeros((b.num_tokens, b.num_heads, b.kv_lora_rank), dtype=q.dtype)
    for cls in plan.schedule.classes:
        args, inputs = mla_kernel_inputs(cls, q, cache, overlay)
        out = launch_kernel(kernel, args, {**plan.kernel_kwargs, **inputs}, grid_heads=1,
                            backend=plan.backend, api=plan.api, lnc=plan.lnc,
                            item_parts=cls.item_parts)
        unpack_output(cls, out, result)
    return result
