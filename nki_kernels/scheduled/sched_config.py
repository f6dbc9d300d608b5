"""Static configuration of the scheduled paged-attention kernel: its launch options, its
validated geometry per phase, its HBM inputs and on-chip state (frozen dataclasses), and the
trace-time checks that build them.

Plain Python on shapes and dtypes; the op layer ``ops`` is passed in only for the kernel dtype
and the target's generation (``ops.bfloat16``, ``ops.nc_gen()``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.contract import (BLOCK_KV, KV_LAYOUTS, MAX_BLOCK_SIZE, MAX_GROUP_BLOCKS,
                                  MAX_HEAD_SIZE_SCHEDULED, MIN_BLOCK_SIZE, PARTITIONS as P,
                                  Q_INIT_COLUMNS, STEP_KEYS, MetaLayout, TileGeometry,
                                  cache_row_count, channel_slices, decode_layout, meta_layout)
from nki_kernels.ops import dtype_name, itemsize
from nki_kernels.sbuf_plan import SbufBudgetWarning
from nki_kernels.scheduled.sched_checks import (check_item_inputs, check_item_parts,
                                                check_phase_metadata,
                                      softmax_scale_value, tile_geometries)
from nki_kernels.scheduled.sched_core import StepConfig
from nki_kernels.scheduled.sched_item import FoldConfig, decode_step_keys
from nki_kernels.scheduled.sched_plan import SBUF_USABLE, working_set_bytes

KERNEL = "scheduled_paged_attention"
MAX_D = MAX_HEAD_SIZE_SCHEDULED
_FLOAT = ("float32", "bfloat16", "float16")
# An fp8 cache (K^T by identity matmuls, their PSUM copies on ScalarE) whose full phase has at
# least this many items per partial item: ScalarE is the busiest engine (long contexts), so the
# full-phase decode steps' small copies go to VectorE (MODELED: fp8 32K decode 0.92x the time;
# at 4K, one full item per partial item, VectorE is the busier engine and they stay).
FULL_HEAVY = 4
_FP8 = ("float8_e4m3", "float8_e5m2")


@dataclass(frozen=True)
class SchedOptions:
    """Static options of a launch (the same for every class of a batch).

    softmax_scale: default 1/sqrt(d).
    mixed_precision: True: bf16 matmul inputs and probabilities; False: the input dtype.
        Scores, statistics and the output accumulator are fp32 either way.
    LARGE_TILE_SZ: keys per full-phase KV tile before block-size tiling (power of
        two, 512..8192).
    PARTIAL_TILE_SZ: the same for the partial phase (power of two,
        512..LARGE_TILE_SZ; None: LARGE_TILE_SZ). The partial phase's rows, overlay rows and
        tile-local key indices are those of this geometry (b'_p tokens per row, nL_p loads).
    logits_soft_cap: None or c > 0: scores become c * tanh(s / c) before masking.
    alibi: add ``slope * (key position - query position)`` to the scores before the soft-cap.
    row_init: start each group's rows from ``q_init`` (sinks, ALiBi) instead of
        (-M_FLOOR, 0); the metadata then carries the ``ini`` columns.
    windowed: False promises that every row's visible keys start at or before each tile it
        meets (no sliding window): masks then test only the upper bound (cheaper). The host
        sets it to ``sliding_window is not None``; the steps read the same flag
        (``sched_core.StepConfig.windowed``).
    kv_layout: the cache layout (``contract.KV_LAYOUTS``): "fused", one ``kv_cache``
        (2, N, Hkv, B, d); "block_kv", vLLM's key cache (N, B, Hkv, d) as ``kv_cache`` and its
        value cache as ``value_cache`` (read in place; only the gathers' access patterns and
        the metadata's row ids differ, docs/layouts.md §18).
    prefill_only: the launch's class is a prefill class (the host's ``class_sequences``; each
        class is its own launch), so the DMA queues and GpSimd have room that a decode class
        would use (streaming the cache, zeroing V tiles, generating descriptors): the
        query-rows steps move work there where
        the API offers it -- P^T by SBUF -> SBUF DMA transposes
        (``sched_core.StepConfig.probs_by_dma``), the chunks' row maxima combined on
        GpSimd (``StepConfig.pairwise_max``) and, where VectorE (or on NeuronCore-v2 its
        SBUF port) binds, a group's state reset by DMA instead of a VectorE select
        (``sched_item.reset_by_dma``).
    item_parts: 1, or the physical cores of an LNC=2 launch whose host schedule is cut in that
        many item parts (any Hkv; docs/layouts.md §16.3): every phase's items are
        ``item_parts`` equal runs, core c runs run c of every KV head
        (``ops.item_part``); 1 leaves the cores to split the KV heads (``ops.kv_heads``).
    nested_rows: the host's promise (``host.scheduled.row_nesting``, checked on the metadata)
        that in every KV head and item part each real partial item's gathers write every KV
        tile row an earlier one wrote: the partial phase then zeroes its K / V tiles once per
        head and part instead of before every item (``sched_tile.nested_tiles``). False (the
        default) is always safe; True on metadata that breaks the promise lets a stale row of
        another sequence into an item's tile.
    fresh_items: (full, partial): the host's promise (``host.scheduled.fresh_items``, checked
        on the metadata) that in that phase every item that stores anything starts its group
        and no item loads a state: decode-layout items then read their group's initial values
        from the init tile at their first step instead of selecting them into the state
        (``scheduled_attention.fresh_start``). (False, False) (the default) is always safe.
    """

    softmax_scale: float | None = None
    mixed_precision: bool = True
    LARGE_TILE_SZ: int = 2048
    PARTIAL_TILE_SZ: int | None = None
    logits_soft_cap: float | None = None
    alibi: bool = False
    row_init: bool = False
    windowed: bool = True
    kv_layout: str = "fused"
    prefill_only: bool = False
    item_parts: int = 1
    nested_rows: bool = False
    fresh_items: tuple = (False, False)


@dataclass(frozen=True)
class CacheRows:
    """A phase's cache as gather tables (docs/layouts.md §16.1, §18): K from ``tables[0]`` at
    ``leads[0]``, V from ``tables[1]`` at ``leads[1]``; a row id names b' tokens of one KV head,
    token s of head h at columns ``h*head_col + s*step`` (``tokens`` pieces per gather: 1 when
    the b' tokens are contiguous). Fused: one view (2, N*Hkv*T, b'*d), leads (0,), (1,),
    head_col 0, one piece. Block-KV: the key and the value cache as (N*T, b'*Hkv*d) each, no
    leads, step Hkv*d, head_col d (b' pieces of d elements, one when Hkv = 1)."""

    tables: tuple
    leads: tuple
    step: int
    head_col: int
    tokens: int

    @property
    def dtype(self):
        return self.tables[0].dtype


@dataclass(frozen=True)
class Phase:
    """One phase of a launch: ``masked`` (partial items) or not (full items), its tile
    geometry, item count, metadata columns, layout, keys per step and cache rows
    (:class:`CacheRows`)."""

    masked: bool
    geo: TileGeometry
    items: int
    meta: MetaLayout
    keys_on_partitions: bool
    step_keys: int
    kv: CacheRows


@dataclass(frozen=True)
class SchedConfig:
    """The launch's static configuration (validated): head size d (nd channel slices), kernel
    dtype kd, whether an fp8 cache feeds TensorE as is (``fp8_direct``), softmax scale, rows per
    Q block, Q blocks per group, the options, whether the class uses the decode layout, and the
    two phases."""

    d: int
    nd: int
    kd: Any
    fp8_direct: bool
    scale: float
    rows: int
    blocks: int
    opts: SchedOptions
    decode: bool
    full: Phase
    partial: Phase

    def phase(self, masked: bool) -> Phase:
        return self.partial if masked else self.full

    def step_config(self, phase: Phase, keys_by_dma: bool = False) -> StepConfig:
        """``keys_by_dma``: the phase's K^T arrives by DMA transpose (``sched_tile.keys_by_dma``),
        so ScalarE has no K^T PSUM copies and takes the decode step's small copies; an fp8
        cache's full phase with FULL_HEAVY full items per partial item puts them on VectorE."""
        copy_engine = None
        if phase.keys_on_partitions and keys_by_dma:
            copy_engine = "scalar"
        elif (phase.keys_on_partitions and self.fp8_direct and not phase.masked
              and self.full.items >= FULL_HEAVY * max(self.partial.items, 1)):
            copy_engine = "vector"
        # the partial items of keys-on-partitions phases on the PE-transpose path zero their KV
        # tiles on GpSimd (and their steps are small): their state operations stay off GpSimd
        state_engine = ("gpsimd" if not (phase.keys_on_partitions and phase.masked
                                         and not keys_by_dma) else None)
        return StepConfig(d=self.d, kernel_dtype=self.kd, soft_cap=self.opts.logits_soft_cap,
                          windowed=self.opts.windowed, tiled_block_size=phase.geo.bp,
                          copy_engine=copy_engine, state_engine=state_engine,
                          probs_by_dma=self.opts.prefill_only,
                          pairwise_max=self.opts.prefill_only)

    def fold_config(self, phase: Phase, keys_by_dma: bool = False) -> FoldConfig:
        return FoldConfig(step=self.step_config(phase, keys_by_dma), rows=self.rows,
                          blocks=self.blocks,
                          width=phase.geo.W, step_keys=phase.step_keys, masked=phase.masked,
                          keys_on_partitions=phase.keys_on_partitions,
                          only_phase=phase.masked and self.full.items == 0,
                          masked_heavy=phase.masked and (self.partial.items * self.partial.geo.W
                                                         >= self.full.items * self.full.geo.W))


@dataclass(frozen=True)
class Inputs:
    """The kernel's HBM tensors (layouts in :func:`scheduled_paged_attention`), with the output
    and the state scratch."""

    query_t: Any
    q_items: tuple        # (full, partial) decode layout: preloaded Q^T per item, else None
    i_items: tuple        # (full, partial) decode layout with row_init: init rows, else None
    bounds_p: Any         # decode layout: the partial items' one-partition bounds, else None
    q_init: Any
    overlay: Any
    meta_i: tuple         # (full, partial)
    meta_f: tuple         # (full, partial)
    out: Any
    state: Any


@dataclass(frozen=True)
class GroupTiles:
    """Persistent SBUF tiles of one KV head: per block j, columns ``[j*sw, (j+1)*sw)`` of
    ``st`` hold o (d), -m, l of the current group; ``init`` the same for a group start; ``al``
    the ALiBi slope and slope * query position per block; ``q_raw`` the raw Q^T slices."""

    st: Any
    init: Any
    al: Any
    q_raw: tuple


@dataclass(frozen=True)
class Constants:
    """Static tiles built once per kernel: key indices per phase (``kidx[masked]``: full, partial),
    the decode
    constants, the identities of an fp8 cache, the partial phase's additive-mask diagonal."""

    kidx: tuple
    consts: Any
    eye: Any
    mask_eye: Any = None      # partial query-rows items: sched_core.mask_eye_tile, or None
    ones: Any = None          # query-rows classes: (128, 2) ones of the kernel dtype (row sums)
    reset: Any = None         # v3+, no decode class: sched_item.StateReset (reset by DMA)


@dataclass(frozen=True)
class Chunk:
    """One metadata chunk of a phase in SBUF: ``mi`` int32 / ``mf`` fp32 columns, the items'
    resets (flags as predicates, ``ops.flags``; with ``Constants.reset`` the reset DMAs' row
    ids, ``sched_item.reset_ids``), and in the decode layout the chunk's scaled Q^T
    slices, bounds (masked) and init rows (row_init)."""

    mi: Any
    mf: Any
    resets: Any = None
    q: Any = None
    bounds: Any = None
    init: Any = None


def cache_dims(kv_cache, value_cache, opts) -> tuple:
    """``(N, B, Hkv, d)`` of the cache in the layout ``opts.kv_layout`` names, checked: fused
    ``kv_cache`` (2, N, Hkv, B, d) and no ``value_cache``; block-KV ``kv_cache`` the key cache
    (N, B, Hkv, d) and ``value_cache`` the value cache of the same shape and dtype."""
    ck = lambda cond, arg, constraint, got: kernel_check(cond, KERNEL, arg, constraint, got)  # noqa: E731
    ck(isinstance(opts, SchedOptions), "options", "be a SchedOptions", type(opts).__name__)
    ck(opts.kv_layout in KV_LAYOUTS, "kv_layout", f"be one of {KV_LAYOUTS}", opts.kv_layout)
    shape = tuple(kv_cache.shape)
    if opts.kv_layout == BLOCK_KV:
        ck(len(shape) == 4, "kv_cache.shape",
           "be the key cache (num_blocks, block_size, Hkv, d) with kv_layout='block_kv'", shape)
        ck(value_cache is not None and tuple(value_cache.shape) == shape
           and dtype_name(value_cache.dtype) == dtype_name(kv_cache.dtype), "value_cache",
           f"be the value cache, shape {shape} and dtype {dtype_name(kv_cache.dtype)} of the key "
           "cache (kv_layout='block_kv')",
           None if value_cache is None else (tuple(value_cache.shape),
                                             dtype_name(value_cache.dtype)))
        N, B, Hkv, d = shape
        return N, B, Hkv, d
    ck(value_cache is None, "value_cache", "be None with kv_layout='fused' (K and V are "
       "kv_cache[0] and kv_cache[1])", "an array")
    ck(len(shape) == 5 and shape[0] == 2, "kv_cache.shape",
       "be (2, num_blocks, Hkv, block_size, d)", shape)
    _, N, Hkv, B, d = shape
    return N, B, Hkv, d


def cache_rows(kv_cache, value_cache, geo: TileGeometry, opts, dims) -> CacheRows:
    """The :class:`CacheRows` of a phase of geometry ``geo`` (views only, no data movement)."""
    N, _, Hkv, d = dims
    bp = geo.bp
    if opts.kv_layout == BLOCK_KV:
        shape = (cache_row_count(BLOCK_KV, N, Hkv, geo.T), bp * Hkv * d)
        return CacheRows(tables=(kv_cache.reshape(shape), value_cache.reshape(shape)),
                         leads=((), ()), step=Hkv * d, head_col=d, tokens=1 if Hkv == 1 else bp)
    flat = kv_cache.reshape((2, geo.flat_rows(N, Hkv), bp * d))
    return CacheRows(tables=(flat, flat), leads=((0,), (1,)), step=d, head_col=0, tokens=1)


def configure(ops, ins: Inputs, kv_cache, rows, blocks, opts, value_cache=None) -> SchedConfig:
    """Validate every input and return the static configuration."""
    ck = lambda cond, arg, constraint, got: kernel_check(cond, KERNEL, arg, constraint, got)  # noqa: E731
    dims = cache_dims(kv_cache, value_cache, opts)
    N, B, Hkv, d = dims
    query_t, q_init, overlay = ins.query_t, ins.q_init, ins.overlay
    q_dt, cache_dt = dtype_name(query_t.dtype), dtype_name(kv_cache.dtype)
    block_kv = opts.kv_layout == BLOCK_KV
    d_arg, b_arg = (("kv_cache.shape[3] (head size d)", "kv_cache.shape[1] (block_size)")
                    if block_kv else ("kv_cache.shape[4] (head size d)",
                                      "kv_cache.shape[3] (block_size)"))
    ck(1 <= d <= MAX_D, d_arg, f"be in [1, {MAX_D}]", d)
    ck(q_dt in _FLOAT, "query_t.dtype", f"be one of {_FLOAT}", q_dt)
    fp8 = cache_dt in _FP8
    kernel_unsupported(not (fp8 and block_kv), KERNEL, f"a {cache_dt} block-KV cache",
                       "use the fused (2, N, Hkv, B, d) layout for fp8 caches")
    kernel_unsupported(fp8 or cache_dt == q_dt, KERNEL,
                       f"a kv_cache of dtype {cache_dt} with {q_dt} queries",
                       f"use the query dtype or an fp8 cache ({_FP8})")
    ck(1 <= rows <= P, "query_t.shape[1] (rows per Q block)", f"be in [1, {P}]", rows)
    ck(isinstance(blocks, int) and 1 <= blocks <= MAX_GROUP_BLOCKS, "blocks",
       f"be an int in [1, {MAX_GROUP_BLOCKS}]", blocks)
    ck(MIN_BLOCK_SIZE <= B <= MAX_BLOCK_SIZE and (B & (B - 1)) == 0, b_arg,
       f"be a power of two in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]", B)
    g_full, g_part = tile_geometries(KERNEL, B, opts.LARGE_TILE_SZ, opts.PARTIAL_TILE_SZ)
    ck(len(overlay.shape) == 3 and overlay.shape[0] == 2 and overlay.shape[2] == g_part.bp * d
       and overlay.shape[1] % Hkv == 0, "overlay.shape",
       f"be (2, Hkv*R_ov, b'_p*d) = (2, {Hkv}*R_ov, {g_part.bp * d})", tuple(overlay.shape))
    ck(isinstance(opts.mixed_precision, bool), "mixed_precision", "be a bool",
       opts.mixed_precision)
    kd = ops.bfloat16 if opts.mixed_precision else query_t.dtype
    ov_dt = dtype_name(kd) if fp8 else cache_dt
    ck(dtype_name(overlay.dtype) == ov_dt, "overlay.dtype",
       f"equal {ov_dt} (the kv_cache dtype; the kernel dtype for an fp8 cache)",
       dtype_name(overlay.dtype))
    ngroups = query_t.shape[0] // (Hkv * d)
    want = (Hkv * ngroups * rows, blocks * Q_INIT_COLUMNS)
    ck(tuple(q_init.shape) == want and dtype_name(q_init.dtype) == "float32", "q_init",
       f"be a float32 array of shape (Hkv*ngroups*rows, blocks*4) = {want}",
       (tuple(q_init.shape), dtype_name(q_init.dtype)))
    ck(isinstance(opts.alibi, bool), "alibi", "be a bool", opts.alibi)
    ck(isinstance(opts.row_init, bool) and (opts.row_init or not opts.alibi), "row_init",
       "be a bool, True when alibi is", opts.row_init)
    ck(isinstance(opts.windowed, bool), "windowed", "be a bool", opts.windowed)
    decode = decode_layout(rows, blocks)
    layouts = {masked: meta_layout(loads=(g_part if masked else g_full).nL, blocks=blocks,
                                   head_size=d, masked=masked, alibi=opts.alibi,
                                   row_init=opts.row_init, keys_on_partitions=decode)
               for masked in (False, True)}
    items_p, items_f = check_phase_metadata(
        KERNEL, ins.meta_i[1], ins.meta_f[1], ins.meta_i[0], ins.meta_f[0], programs=Hkv,
        columns=lambda masked: (layouts[masked].ki, layouts[masked].kf))
    check_item_parts(KERNEL, opts.item_parts, ops.max_lnc(), items_f, items_p)
    scale = softmax_scale_value(KERNEL, opts.softmax_scale, d)
    soft_cap = opts.logits_soft_cap
    ck(soft_cap is None or (isinstance(soft_cap, (int, float)) and not isinstance(soft_cap, bool)
                            and math.isfinite(float(soft_cap)) and soft_cap > 0),
       "logits_soft_cap", "be None or a finite number > 0", soft_cap)
    _check_decode_inputs(ins, decode, opts.row_init, Hkv, d, rows, (items_f, items_p), q_dt)
    # Keys on partitions (sched_decode) for decode-layout classes; query rows on partitions
    # (sched_core) for 128-row classes (per-step overheads amortize over 2048-key steps and
    # their masks take one ScalarE pass). (Measured on the cost model: keys on partitions for the
    # full items of 128-row blocks was slower, per-step small ops dominate.)
    step_keys = decode_step_keys(rows) if decode else STEP_KEYS
    full, partial = (Phase(masked=masked, geo=geo, items=n, meta=layouts[masked],
                           keys_on_partitions=decode, step_keys=min(geo.W, step_keys),
                           kv=cache_rows(kv_cache, value_cache, geo, opts, dims))
                     for masked, geo, n in ((False, g_full, items_f), (True, g_part, items_p)))
    # fp8 rows straight into TensorE when the other operand is 16-bit (float32 matmul operands
    # must both be float32: an fp8 cache with a float32 kernel dtype is converted on chip)
    cfg = SchedConfig(d=d, nd=channel_slices(d), kd=kd, fp8_direct=fp8 and itemsize(kd) == 2,
                      scale=scale, rows=rows, blocks=blocks, opts=opts, decode=decode,
                      full=full, partial=partial)
    check_sbuf(ops, cfg, kv_cache, query_t, B)
    return cfg


def _check_decode_inputs(ins, decode, row_init, Hkv, d, rows, items, q_dt):
    """Decode-layout classes need the per-item Q^T of both phases (``items = (full, partial)``
    item counts), the partial items' bounds and, with ``row_init``, the per-item init rows;
    other classes read none of them (None)."""
    if not decode:
        return
    cls, init = "a decode-layout class", "a decode-layout class with row_init"
    need = (("q_full", ins.q_items[0], (Hkv * d, items[0] * rows), q_dt, cls),
            ("q_part", ins.q_items[1], (Hkv * d, items[1] * rows), q_dt, cls),
            ("bounds_p", ins.bounds_p, (1, items[1] * 2 * rows), "float32", cls))
    if row_init:
        need += (("i_full", ins.i_items[0], (Hkv * rows, items[0] * Q_INIT_COLUMNS), "float32",
                  init),
                 ("i_part", ins.i_items[1], (Hkv * rows, items[1] * Q_INIT_COLUMNS), "float32",
                  init))
    check_item_inputs(KERNEL, need)


def sbuf_need(ops, cfg, kv_cache, query_t, block_size) -> tuple:
    """``(need, usable)``: the estimated per-partition SBUF working set of the kernel of ``cfg``
    (``nki_kernels.scheduled.sched_plan.working_set_bytes``) and the target's usable SBUF."""
    return working_set_bytes(
        nc_gen="gen2" if ops.nc_gen() == "gen2" else "gen3", block_size=block_size,
        large_tile=cfg.opts.LARGE_TILE_SZ, head_size=cfg.d, rows=cfg.rows, blocks=cfg.blocks,
        cache_itemsize=itemsize(kv_cache.dtype), query_itemsize=itemsize(query_t.dtype),
        kernel_itemsize=itemsize(cfg.kd), keys_on_partitions=cfg.decode)


def check_sbuf(ops, cfg, kv_cache, query_t, block_size):
    """Warn (``SbufBudgetWarning``, as the dense kernel) when the estimated working set
    (:func:`sbuf_need`) exceeds the target's usable SBUF: the kernel still runs (the
    compiler spills) but the message names the fix."""
    gen = "gen2" if ops.nc_gen() == "gen2" else "gen3"
    need, usable = sbuf_need(ops, cfg, kv_cache, query_t, block_size)
    if need <= usable:
        return
    warnings.warn(f"{KERNEL}: a working set of about {need} SBUF bytes per partition ({gen}: "
                  f"{cfg.blocks} Q block(s) of {cfg.rows} rows per group, head size {cfg.d}, "
                  f"LARGE_TILE_SZ={cfg.opts.LARGE_TILE_SZ}) exceeds the {SBUF_USABLE[gen]} "
                  "usable: the compiler will spill; use a smaller LARGE_TILE_SZ or "
                  "mixed_precision=True", SbufBudgetWarning, stacklevel=4)
