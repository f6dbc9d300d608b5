"""Per-item pieces shared by the kernels that run ``host.scheduled.schedule`` items
(``nki_kernels.scheduled.scheduled_attention``, ``nki_kernels.mla.mla_attention``): the group's Q^T (gathered
per group, or preloaded per metadata chunk in the decode layout), its carried state, the fold of
one KV tile into every Q block's online-softmax state, and the state / output stores.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first). Metadata columns (``mi`` int32, ``mf`` fp32, one SBUF chunk of items;
``host.scheduled.schedule.PhaseArrays``): ``q_col + k`` the Q^T row of channel 128k + p of the
group (query-rows classes only), ``st_col`` / ``out_col`` the state / output row of query row p
of the group (group-major layouts: every block of the group side by side in one row, so one DMA
moves a group; docs/layouts.md "Scheduled kernel"), fp32 column ``cf`` the reset flag followed
by the mask bounds (masked items). Row
indices out of bounds skip the DMA (``oob_mode.skip``). The phases run full first (state to the
HBM scratch after a group's last full item), masked last (state loaded at a group's first masked
item, output after its last). The state of block j is ``st[:, j*(d+2) : (j+1)*(d+2)]``
(``nki_kernels.scheduled.sched_core``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nki_kernels.contract import (L_FLOOR, PARTITIONS as P, PSUM_BANK_F32, STATE_EXTRA_COLUMNS,
                                  channel_slices, state_row_sentinel)
from nki_kernels.ops import itemsize
from nki_kernels.scheduled.sched_core import (KVTile, StepConfig, flash_step, mask_form,
                                              step_bounds)
from nki_kernels.scheduled.sched_decode import decode_step
from nki_kernels.scheduled.sched_range import natural_order, offset_bounds_of, range_offset_bounds
from nki_kernels.scheduled.sched_tile import keys_by_dma
from nki_kernels.tile_ops import transpose_bank_cols, transpose_copies

# P^T copy engines of 128-row blocks (query-rows steps) when the caller does not choose, by
# NeuronCore generation and step kind: what balances VectorE (the row max; the mask select where
# there is one) against ScalarE (the exponentials; the mask distances) under the cost model
# (MODELED). A tuple is cycled over the copies of an item, block after block and step after
# step (``_rotated_p_evac``). On v2 (four fp32 copies of 512 keys per 2048-key step) full steps
# put one copy in three on VectorE, masked steps whose mask TensorE adds
# (sched_core.additive_mask_ok) one in four, masked steps that select on VectorE none; on v3
# (two 16-bit copies of 1024 keys per step) range_select and the max keep VectorE the busier
# engine wherever a launch has full tiles, so every copy is on ScalarE (launches without a full
# phase: P_EVAC_GEN3_MASKED_ONLY).
P_EVAC_GEN2 = ("scalar", "scalar", "vector")
# On v3, full steps whose chunk maxima fold on GpSimd (``StepConfig.pairwise_max``: batches
# without a decode class) and whose P^T is not by DMA (legacy API) send one copy in two to
# VectorE (MODELED, trn2 legacy API prefill 2K on 2K 4835 -> 4509 us; one in three 4555).
P_EVAC_GEN3_FOLDED = ("scalar", "vector")
# v2 masked steps whose mask TensorE adds: one copy in four on VectorE. Re-checked with the
# cost model's shared ports (a VectorE copy from PSUM holds both of VectorE's ports; MODELED,
# trn1, 2 + 30 / 4 x 512 + 60 / prefill 2K on 2K): these defaults 2947 / 9644 / 5008 us;
# every copy on ScalarE 2843 / 9913 / 5011; full steps one in two 2980 / 9610 / 5112.
P_EVAC_GEN2_ADDITIVE = ("scalar", "scalar", "scalar", "vector")
P_EVAC_GEN2_SELECT = "scalar"
P_EVAC_GEN3 = "scalar"
# v3 masked steps whose chunk maxima fold on GpSimd (no decode class) in a launch without a full
# phase (causal prefills on little or no cached context): the exponentials plus every P^T copy
# keep ScalarE 10-35 % above VectorE, so one copy in four (tiles of >= 2048 keys: one step per
# item, VectorE's per-step work spread widest) or in eight (1024-key tiles) goes to VectorE;
# 512-key tiles keep every copy on ScalarE. MODELED, trn2, both APIs, against every copy on
# ScalarE (docs/bench-prefill-choices.md, 14 prefill-only batches): 2048-key tiles 7.7-8.4 %
# faster, 1024-key tiles 3.6-4.0 %, bit-identical outputs. Tried while choosing: one in eight
# on 2048-key tiles 3.9-4.2 %, one in four on 1024-key tiles 1.0-3.5 %; on 512-key tiles one
# in eight -1.8 % to +1.0 % and one in four up to 5.3 % slower; launches with a full phase
# lose (VectorE binds there: one in four 2.8-3.7 % slower on the 2K prefill on 2K context).
P_EVAC_GEN3_MASKED_ONLY = ((2048, ("scalar", "scalar", "scalar", "vector")),
                           (1024, ("scalar",) * 7 + ("vector",)))
# The same steps in a launch with a full phase whose masked keys (partial items x partial tile)
# are at least its full keys (full items x full tile): the masked steps' exponentials and P^T
# copies keep ScalarE above VectorE's full-step row maxima, so one copy in eight goes to VectorE.
# MODELED, trn2, against every copy on ScalarE (current / legacy API): 3K on 3K (masked / full
# keys 1.5) 2.9 / 2.5 % faster, 768 on 3K (1.0) 2.5 / 2.1 %, 1536 on 3K (1.25) 1.5 % faster /
# 0.4 % slower; below 1.0 it loses (2K on 2K, 0.75, 0.9 %; 1K on 2K and 4 x 768 on 2K, 0.5,
# 1.8-2.3 %; 2K on 5K, 0.625, 2.2-2.4 %) and one in four loses more except on 3K on 3K. One in
# six against one in eight: 3K on 3K 0.4-0.8 % faster, 768 on 3K and 1536 on 3K 0.1-1.2 % slower.
P_EVAC_GEN3_MASKED_HEAVY = ("scalar",) * 7 + ("vector",)


def default_p_evac(nc_gen, *, masked, additive, folded=False, only_width=None,
                   masked_heavy=False):
    """The P^T copy engines of a 128-row query-rows step (see ``P_EVAC_*``; ``folded``: the
    step's chunk maxima fold on GpSimd; ``only_width``: the tile width of a masked phase that
    is its launch's only phase, else None; ``masked_heavy``: the step's launch has at least as
    many masked keys as full ones, :attr:`FoldConfig.masked_heavy`)."""
    if nc_gen != "gen2":
        if masked and folded and only_width is not None:
            for width, engines in P_EVAC_GEN3_MASKED_ONLY:
                if only_width >= width:
                    return engines
        elif masked and folded and masked_heavy:
            return P_EVAC_GEN3_MASKED_HEAVY
        return P_EVAC_GEN3_FOLDED if folded and not masked else P_EVAC_GEN3
    if not masked:
        return P_EVAC_GEN2
    return P_EVAC_GEN2_ADDITIVE if additive else P_EVAC_GEN2_SELECT


@dataclass(frozen=True)
class FoldConfig:
    """Static configuration of :func:`fold_tile` for one phase: ``step`` the steps'
    ``sched_core.StepConfig``; ``rows`` rows per Q block; ``blocks`` Q blocks per group;
    ``width`` keys per tile; ``step_keys`` keys per step; ``masked`` the phase builds masks;
    ``keys_on_partitions`` decode layout (``sched_decode``) instead of query rows
    (``sched_core``); ``only_phase`` the launch has no other phase with items (a masked phase
    without a full phase); ``masked_heavy`` a masked phase whose launch has at least as many
    masked keys as full ones (items x tile width per phase)."""

    step: StepConfig
    rows: int
    blocks: int
    width: int
    step_keys: int
    masked: bool
    keys_on_partitions: bool
    only_phase: bool = False
    masked_heavy: bool = False


def decode_step_keys(rows):
    """Keys per keys-on-partitions step: the most whose S^T (128, keys/128 * rows) fits one
    2 KiB PSUM bank (the phase takes at most its tile, ``min(W, ...)``). Not capped at the
    query-rows steps' ``STEP_KEYS``: a step's tiles here are (128, keys/128 * rows), and each
    step pays its max, transposed reduce, rescale and state update once, so the 4-row blocks of
    a decode batch with 4096-key tiles fold a tile in one step instead of two (MODELED, 32
    decodes 2K-8K: trn2 2603 -> 2516 us, trn1 3399 -> 3302 us)."""
    keys = P
    while (2 * keys // P) * rows <= PSUM_BANK_F32:
        keys *= 2
    return keys


def chunk_queries(ops, q_all, row0, head_size, col0, ncols, *, scale, kernel_dtype):
    """Decode layout: the Q^T of a metadata chunk's items, ``q_all`` rows ``[row0, row0 + d)``
    and columns ``[col0, col0 + ncols)`` (``host.scheduled.scheduled.item_queries``), one load per
    <= 128-channel slice, scaled into ``kernel_dtype``; returns the nd slices."""
    out = []
    for k in ops.static_range(channel_slices(head_size)):
        dk = min(P, head_size - k * P)
        q_ld = ops.sbuf((dk, ncols), q_all.dtype)
        ops.load(q_ld, q_all[ops.ds(row0 + k * P, dk), ops.ds(col0, ncols)])
        q_sc = ops.sbuf((dk, ncols), kernel_dtype)
        ops.tensor_scalar(q_sc, q_ld, "multiply", scale)
        out.append(q_sc)
    return out


def q_scale_engine(ops, q_dtype, kernel_dtype):
    """Engine of the per-item scaling of a group's Q^T (SBUF -> SBUF, every item): VectorE on
    NeuronCore-v3 when both dtypes are 16-bit (its 4x copy mode for 16-bit SBUF operands), else
    GpSimd (idle in query-rows steps), off ScalarE, which carries the exponentials."""
    if ops.nc_gen() != "gen2" and itemsize(q_dtype) == 2 and itemsize(kernel_dtype) == 2:
        return "vector"
    return "gpsimd"


def load_q_slices(ops, q_raw, query_t, mi, q_col, *, scale, kernel_dtype):
    """Query-rows classes: gather the group's Q^T into the persistent raw slices ``q_raw`` (nd
    SBUF tiles ``(dk, blocks*rows)``; one gather per slice from the group-major ``query_t``,
    every block of the group at once; rows whose index is out of bounds -- a group that does not
    start at this item -- keep their values) and return them scaled into ``kernel_dtype``."""
    scaled = []
    for k in ops.static_range(len(q_raw)):
        ops.gather(q_raw[k], query_t, mi, q_col + k)
        q_sc = ops.sbuf(q_raw[k].shape, kernel_dtype)
        ops.tensor_scalar(q_sc, q_raw[k], "multiply", scale,
                          engine=q_scale_engine(ops, q_raw[k].dtype, kernel_dtype))
        scaled.append(q_sc)
    return scaled


# A group's state reset by DMA (:class:`StateReset`) instead of the VectorE select takes one
# pass over the state per item off VectorE, and puts a gather per item (skipped unless the
# group starts: no bytes, but a descriptor) and the whole state per group start on the DMA
# queues. It pays where VectorE is the busiest engine and DMA has room (:func:`reset_by_dma`):
# NeuronCore-v3+ without a decode class (its cache gathers keep DMA the busiest engine), a full
# phase (the full steps' row maxima keep VectorE above ScalarE, which carries the masked steps'
# P^T copies) and, where K^T arrives by DMA transposes (current API), groups of at least this
# many Q blocks: VectorE's work per full tile grows with the group, the tile's gathers do not,
# and at 16 blocks the two were level.
# MODELED, 20 prefill-only batches (docs/bench-prefill-choices.md): trn2 current API with a
# full phase, groups of 4-16 blocks 2.0-6.2 % slower by DMA, 20-48 blocks 1.1-5.4 % faster;
# legacy API with a full phase 1.1-4.1 % faster; without a full phase -0.4 % to +3.5 % on both.
RESET_BY_DMA_MIN_BLOCKS = 20
# The same where the items of each KV head are cut between the two cores of an LNC-2 launch
# (item parts: an odd Hkv), whose host halves the groups so both cores get some. MODELED, trn2
# current API, H = 4, Hkv = 1, LNC 2, DMA against select: 12- and 16-block groups 4.7-5.5 %
# faster (2K on 2K 249 -> 236 us, 2K on 4K 374 -> 356, 1536 on 2K 190 -> 180), 8 blocks 2.8-
# 4.8 % slower (1K on 2K, 1K on 4K), 4 blocks 4.5 % slower (512 on 4K), 24 blocks 0.6 % slower
# (3K on 3K).
RESET_BY_DMA_MIN_BLOCKS_PARTS = 12
# NeuronCore-v2 (trn1): VectorE and GpSimd share an SBUF port, which binds these launches; the
# DMA trades the select's VectorE pass for descriptor work on GpSimd and pays where the selects
# are a large share of VectorE: no full phase (the full items' wide tiles dilute them) and
# partial tiles of at most this many keys (a select per item whatever the item's width), in
# launches of at least two KV heads (the table write's round trip before the first reset is
# exposed once per launch, about 4 us, against about 5 us of the port saved per KV head of a
# 1K prefill). MODELED, trn1 (docs/bench-prefill-choices.md), DMA against select: 1K on 0
# 848 -> 820 us (Hkv = 8), 216 -> 212 (Hkv = 2), Hkv = 1 level; 1536 on 1K 4.9 % faster,
# 4 x 256 on 0 3.4 %, 2K on 2K with a 1024-key window (16-block groups, twelve items) 0.1 %
# slower; 1024- and 2048-key tiles 0.3-1.2 % slower (2K on 1K, 3K on 0, 1K on 1K); with a
# full phase and 512-key partial tiles 0.3-0.7 % slower on four batches of five.
RESET_BY_DMA_GEN2_MAX_KEYS = 512


def reset_by_dma(ops, cfg, num_kv_heads) -> bool:
    """Whether the kernel of ``cfg`` (``sched_config.SchedConfig``), launched over
    ``num_kv_heads`` KV heads, resets group states by DMA (:class:`StateReset`) rather than a
    VectorE select (see :data:`RESET_BY_DMA_MIN_BLOCKS`, :data:`RESET_BY_DMA_MIN_BLOCKS_PARTS`
    and :data:`RESET_BY_DMA_GEN2_MAX_KEYS`): a trace-time choice of the target, the API and the
    launch's static shapes."""
    if not cfg.opts.prefill_only or cfg.decode:
        return False
    if ops.nc_gen() == "gen2":
        return (cfg.full.items == 0 and cfg.partial.geo.W <= RESET_BY_DMA_GEN2_MAX_KEYS
                and num_kv_heads >= 2)
    if cfg.full.items == 0:
        return False
    least = RESET_BY_DMA_MIN_BLOCKS if cfg.opts.item_parts == 1 else RESET_BY_DMA_MIN_BLOCKS_PARTS
    return cfg.blocks >= least or not keys_by_dma(ops, cfg, cfg.full)


@dataclass(frozen=True)
class StateReset:
    """A group's state reset as a DMA instead of a select, no compute engine touching the
    state (query-rows classes where :func:`reset_by_dma` picks it): ``table`` (cores, rows,
    blocks * (d + 2)) fp32 private HBM holds the initial state of every row
    (:func:`state_reset_table`, one slab per physical core);
    ``p_oob`` (128, 1) fp32 holds ``p + oob`` (``oob`` = ``contract.state_row_sentinel(rows)``,
    past every slab), from which :func:`reset_ids` builds each chunk's row ids."""

    table: object
    p_oob: object
    oob: float


def state_reset_table(ops, init, core):
    """:class:`StateReset` of the kernel: a private HBM table of ``init``'s rows (rows,
    blocks * (d + 2)) fp32, one slab per physical core of the launch, written once from ``init``
    into this core's slab (one scatter)."""
    rows, width = init.shape
    f32 = ops.float32
    table = ops.ndarray((ops.launch_core()[1], rows, width), dtype=f32, buffer=ops.PRIVATE_HBM)
    oob = float(state_row_sentinel(rows))
    p_oob = ops.sbuf((P, 1), f32)
    ops.iota(p_oob, step=0, offset=int(oob), partition_step=1)
    p_ids = ops.sbuf((P, 1), ops.int32)
    ops.iota(p_ids, step=0, partition_step=1)
    ops.scatter(table, p_ids, 0, init, lead=(core,))
    return StateReset(table=table, p_oob=p_oob, oob=oob)


def reset_ids(ops, reset: StateReset, mf, col, stride, count):
    """``(128, count)`` int32 row ids of a chunk's resets: column t is ``p`` where the fp32 flag
    ``mf[:, col + t * stride]`` is 1 (item t starts a group), else ``p + oob`` (out of bounds:
    the reset DMA is skipped); one GpSimd instruction per chunk."""
    ids = ops.sbuf((P, count), ops.int32)
    ops.tensor_scalar(ids, ops.free_view(mf, ((stride, count),), col0=col), "multiply",
                      -reset.oob, op1="add", operand1=reset.p_oob, engine="gpsimd")
    return ids


def reset_state(ops, st, reset: StateReset, ids, it, core):
    """Item ``it``'s reset: every row of ``st`` (rows, blocks * (d + 2)) fp32 from the initial
    table if the item starts a group, else nothing (one gather; skipped rows keep ``st``). A DMA
    overwrite, like the select it replaces: a stale NaN cannot leak into the new group."""
    ops.gather(st, reset.table, ids, it, lead=(core,))


def load_state(ops, st, mi, st_col, state, core=0):
    """Masked items: the group's state ``st`` (rows, blocks * (d + 2)) fp32 from this core's
    slab ``state[core]`` of the scratch (one row per query row of the group, every block's
    d + 2 columns side by side, left by the full phase): one gather, skipped unless the group
    starts here and had full items."""
    ops.gather(st, state, mi, st_col, lead=(core,))


def fold_tile(ops, fc: FoldConfig, q_slices, tile: KVTile, st, mf, cf, *, consts=None,
              chunk_bounds=None, it=0, alibi_of=None, init=None):
    """Fold the tile's ``fc.width`` keys into every block's state, ``fc.step_keys`` per step.

    Keys on partitions (decode layout): ``sched_decode.decode_step`` with ``consts``
    (``decode_constants``); a masked item's bounds are its ``2 * rows`` columns of the chunk's
    one-partition ``chunk_bounds`` (c_q then r_q; item ``it`` of the chunk), broadcast to every
    partition by a ones matmul (``fc.step.windowed`` False: c_q + r_q only, the upper bound).
    Otherwise ``sched_core.flash_step`` per block, block j's bounds in fp32 columns ``cf + 1 + 2j``, ``cf + 2 + 2j`` of ``mf``. ``alibi_of(j)``: None or a function
    giving block j's ``(slope, off)`` ``(rows, 1)`` tiles (in the decode layout broadcast along
    the free axis first). P^T copies of 128-row blocks default to :func:`default_p_evac` when
    ``fc.step.p_evac`` is None. ``init``: None, or (keys on partitions) the group's initial
    state tile, which the first step reads instead of ``st``
    (``scheduled_attention.fresh_start``).
    """
    rows, blocks, d = fc.rows, fc.blocks, fc.step.d
    sw = d + STATE_EXTRA_COLUMNS
    n_steps = fc.width // fc.step_keys
    if fc.keys_on_partitions:
        for j in ops.static_range(blocks):
            bounds = None
            if fc.masked and not fc.step.windowed:
                # every row's range starts at or before the tile: only c + r is needed, summed
                # by the broadcast matmuls themselves (exact: fp32 integers and halves)
                t_ps = ops.psum((P, rows), ops.float32)
                for i in ops.static_range(2):
                    ops.matmul(t_ps, consts.ones_f,
                               chunk_bounds[0:1, ops.ds((it * 2 + i) * rows, rows)],
                               accumulate=i > 0)
                if consts.mask_eye is not None:     # the additive mask's compare reads PSUM
                    bounds = (t_ps, None)
                else:
                    top = ops.sbuf((P, rows), ops.float32)
                    ops.copy(top, t_ps, engine=fc.step.copy_engine)
                    bounds = (top, None)
            elif fc.masked:            # the item's bounds broadcast to every partition
                b_ps = ops.psum((P, 2 * rows), ops.float32)
                ops.matmul(b_ps, consts.ones_f, chunk_bounds[0:1, ops.ds(it * 2 * rows, 2 * rows)])
                b_sb = ops.sbuf((P, 2 * rows), ops.float32)
                ops.copy(b_sb, b_ps, engine=fc.step.copy_engine)
                bounds = (b_sb[:, ops.ds(0, rows)], b_sb[:, ops.ds(rows, rows)])
            alibi = None
            if alibi_of is not None:       # (slope, off) of every row on every key partition
                alibi = _rows_to_free_axis(ops, alibi_of(j), rows, consts)
            for s0 in ops.static_range(n_steps):
                decode_step(ops, fc.step, [q[:, ops.ds(j * rows, rows)] for q in q_slices], tile,
                            st, j * sw, k0=s0 * fc.step_keys, width=fc.step_keys, consts=consts,
                            bounds=bounds, alibi=alibi, prev=init if s0 == 0 else None)
        return
    step = fc.step
    if ops.nc_gen() == "gen2" and not step.max_evacuates:
        # VectorE and ScalarE take turns on PSUM: read the scores there once (StepConfig)
        step = dataclasses.replace(step, max_evacuates=True)
    if step.p_evac is None and rows == P:
        step = dataclasses.replace(step, p_evac=default_p_evac(
            ops.nc_gen(), masked=fc.masked, additive=tile.mask_eye is not None,
            folded=step.pairwise_max, only_width=fc.width if fc.only_phase else None,
            masked_heavy=fc.masked_heavy))
    derived = None
    by_offset = False
    if fc.masked:
        # what the masks derive from every block's bounds, for the whole item at once (the
        # blocks' (c, r) columns alternate: stride-2 views)
        form = mask_form(ops, step, tile)
        derived = step_bounds(ops, step, form,
                              ops.free_view(mf, ((2, blocks),), col0=cf + 1),
                              ops.free_view(mf, ((2, blocks),), col0=cf + 2))
        bp = step.tiled_block_size
        # range form in tiled key order (b' too large for natural order, sched_range.natural_order):
        # the bounds of every key offset s < b' once per item (2 b' instructions) instead of
        # two per block and step, when that is fewer
        by_offset = (form == "range" and not natural_order(ops, bp, fc.step_keys)
                     and bp <= blocks * n_steps)
        if by_offset:
            derived = range_offset_bounds(ops, *derived, bp)
    # P^T copies per step (the 128-key blocks of one PSUM bank share one copy)
    copies = transpose_copies(fc.step_keys // P, P, transpose_bank_cols(ops, step.kernel_dtype))
    for j in ops.static_range(blocks):
        bounds = None
        if fc.masked:
            bounds = (mf[0:rows, ops.ds(cf + 1 + 2 * j, 1)], mf[0:rows, ops.ds(cf + 2 + 2 * j, 1)])
        dj = None
        if by_offset:
            dj = offset_bounds_of(ops, derived, j, blocks, bp, rows)
        elif derived is not None:
            dj = tuple(t[0:rows, ops.ds(j, 1)] for t in derived)
        alibi = alibi_of(j) if alibi_of is not None else None
        for s0 in ops.static_range(n_steps):
            flash_step(ops, _rotated_p_evac(step, (j * n_steps + s0) * copies),
                       [q[:, ops.ds(j * rows, rows)] for q in q_slices], tile, st,
                       j * sw, k0=s0 * fc.step_keys, width=fc.step_keys, bounds=bounds,
                       alibi=alibi, derived=dj)


def _rotated_p_evac(step, offset):
    """``step`` whose P^T copy-engine cycle (a tuple ``p_evac``) starts ``offset`` copies in:
    a cycle longer than one step's copies runs on across the item's blocks and steps (static
    offsets; a single engine name is returned as is)."""
    ev = step.p_evac
    if not isinstance(ev, tuple) or offset % len(ev) == 0:
        return step
    k = offset % len(ev)
    return dataclasses.replace(step, p_evac=ev[k:] + ev[:k])


def _rows_to_free_axis(ops, cols, rows, consts):
    """Decode layout: per-row ``(rows, 1)`` fp32 columns (rows on partitions) -> ``(128, rows)``
    fp32 tiles holding row q's value in column q of every partition (PE transposes into one
    one-partition row, then a ones matmul broadcasts it; all fp32, exact)."""
    n = len(cols)
    row_ps = ops.psum((1, n * rows), ops.float32)
    for i, col in enumerate(cols):
        ops.transpose(row_ps[:, ops.ds(i * rows, rows)], col)
    row = ops.sbuf((1, n * rows), ops.float32)
    ops.copy(row, row_ps)
    bc_ps = ops.psum((P, n * rows), ops.float32)
    ops.matmul(bc_ps, consts.ones_f, row)
    bc = ops.sbuf((P, n * rows), ops.float32)
    ops.copy(bc, bc_ps)
    return tuple(bc[:, ops.ds(i * rows, rows)] for i in range(n))


def store_blocks(ops, st, mi, col, out, state, *, rows, blocks, d, masked, engine=None, core=0):
    """Full items: the group's state ``st`` to this core's slab ``state[core]`` of the scratch
    (one scatter, state column ``col``; skipped unless this is the group's last full item). Masked items: ``o / max(l,
    L_FLOOR)`` of every block side by side, ``(rows, blocks * d)``, to the group-major ``out``
    (one scatter, output column ``col``; skipped unless the group ends here; the divisors of all
    blocks in one pass, the division on ``engine``: ``ops.floored_divisors`` /
    ``ops.divide_by``)."""
    if not masked:
        ops.scatter(state, mi, col, st, lead=(core,))
        return
    sw = d + STATE_EXTRA_COLUMNS
    # every block's max(l, L_FLOOR) (current API: its reciprocal) at once
    div = ops.sbuf((rows, blocks), ops.float32)
    ops.floored_divisors(div, ops.free_view(st, ((sw, blocks),), col0=d + 1), L_FLOOR,
                         engine=engine)
    o_tile = ops.sbuf((rows, blocks * d), out.dtype)
    for j in ops.static_range(blocks):
        ops.divide_by(o_tile[:, ops.ds(j * d, d)], st[:, ops.ds(j * sw, d)], div[:, ops.ds(j, 1)],
                      engine=engine)
    ops.scatter(out, mi, col, o_tile)
