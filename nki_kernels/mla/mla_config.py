"""Static configuration of the MLA paged-attention kernel: its launch options, its validated
geometry per phase, its HBM inputs and on-chip tiles (frozen dataclasses), and the trace-time
checks that build them (``nki_kernels/mla/mla_attention.py`` runs them).

Plain Python on shapes and dtypes; the op layer ``ops`` is passed in only for the kernel dtype
and the target's generation (``ops.bfloat16``, ``ops.nc_gen()``). Dimensions as in
:mod:`nki_kernels.mla.mla_attention` (R, P, D = R + P, E, N, B, rows, blocks, T, b', nL, W).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.contract import (PARTITIONS as P, PSUM_BANK_F32, STEP_KEYS, MetaLayout,
                                  TileGeometry, channel_slices, decode_layout, meta_layout)
from nki_kernels.mla.mla_sbuf import MAX_CHUNK_ITEMS, SBUF_USABLE, decode_chunk_cap, mla_sbuf_bytes
from nki_kernels.ops import dtype_name, itemsize
from nki_kernels.scheduled.sched_checks import (check_item_inputs, check_item_parts,
                                                check_phase_metadata,
                                      softmax_scale_value, tile_geometries)
from nki_kernels.scheduled.sched_core import StepConfig
from nki_kernels.scheduled.sched_item import FoldConfig, decode_step_keys

KERNEL = "mla_paged_attention"
# Q blocks sharing one KV-tile load, at most (fewer when nki_kernels.mla.mla_sbuf says they do not
# fit): per 128-row block the group keeps o (R fp32), m, l and D channels of Q^T (raw + scaled)
# in SBUF, ~6.6 KiB per partition at R = 512, D = 576 with bf16 Q.
MLA_MAX_GROUP_BLOCKS = 8
MAX_VALUE_DIM = PSUM_BANK_F32     # R: PV accumulates (rows, R) fp32 in one PSUM bank
_FLOAT = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class MLAOptions:
    """Static options of a launch (the same for every class of a batch).

    kv_lora_rank: R (1..512), the value width.  qk_rope_head_dim: P >= 0.
    softmax_scale: default 1 / sqrt(R + P).
    mixed_precision: True: bf16 matmul inputs and probabilities; False: the input dtype.
        Scores, statistics and the output accumulator are fp32 either way.
    LARGE_TILE_SZ: keys per full-phase KV tile before block-size tiling (power of two,
        512..8192).
    PARTIAL_TILE_SZ: the same for the partial phase (power of two, 512..LARGE_TILE_SZ; None:
        LARGE_TILE_SZ); its rows (b'_p entries) and overlay rows are of this geometry.
    item_parts: 1, or the physical cores of an LNC=2 launch: the host's schedule cut in that
        many item parts (docs/layouts.md §16.3), core c running part c (``ops.item_part``).
    """

    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    softmax_scale: float | None = None
    mixed_precision: bool = True
    LARGE_TILE_SZ: int = 2048
    PARTIAL_TILE_SZ: int | None = None
    item_parts: int = 1


@dataclass(frozen=True)
class MLAPhase:
    """One phase of a launch: ``masked`` (partial items) or not (full items), its tile geometry,
    item count, metadata columns, keys per step, and the flat cache view ``(N*T, b'*E)`` its
    main rows index (row ``rw = b' * E`` elements: b' whole entries)."""

    masked: bool
    geo: TileGeometry
    items: int
    meta: MetaLayout
    step_keys: int
    rw: int
    kv_flat: Any


@dataclass(frozen=True)
class MLAConfig:
    """The launch's static configuration (validated): R value width, D = R + P key width (nd
    channel slices), E entry size, kernel dtype kd, softmax scale, rows per Q block, Q blocks per
    group, whether the class uses the decode layout (keys on partitions), items per metadata
    chunk at most, the cache dtype and the two phases."""

    R: int
    D: int
    E: int
    nd: int
    kd: Any
    scale: float
    rows: int
    blocks: int
    decode: bool
    chunk_cap: int
    parts: int
    cache_dtype: Any
    full: MLAPhase
    partial: MLAPhase

    def fold_config(self, phase: MLAPhase) -> FoldConfig:
        """The fold of a phase: V read in place at the stride E; no sliding window (every row's
        visible keys start at position 0); P^T copies of 128-row blocks split 2:1 between
        ScalarE and VectorE (ScalarE also copies the K^T of D-wide entries, the busier engine,
        so the mask's |x| goes to VectorE too: ``side_engine``)."""
        p_evac = ("scalar", "scalar", "vector") if self.rows == P else None
        step = StepConfig(d=self.R, kernel_dtype=self.kd, v_stride=self.E, windowed=False,
                          tiled_block_size=phase.geo.bp, p_evac=p_evac, side_engine="vector")
        return FoldConfig(step=step, rows=self.rows, blocks=self.blocks, width=phase.geo.W,
                          step_keys=phase.step_keys, masked=phase.masked,
                          keys_on_partitions=self.decode)


@dataclass(frozen=True)
class MLAInputs:
    """The kernel's HBM tensors (layouts in ``mla_attention.mla_paged_attention``), with the
    output and the state scratch; per-phase pairs are ``(full, partial)``."""

    query_t: Any
    overlay: Any
    q_items: tuple        # decode layout: preloaded Q^T per item (None otherwise)
    bounds_p: Any         # decode layout: the partial items' one-partition bounds
    meta_i: tuple
    meta_f: tuple
    out: Any
    state: Any


@dataclass(frozen=True)
class MLATiles:
    """Tiles built once per kernel: per block j, columns ``[j*(R+2), (j+1)*(R+2))`` of ``st``
    hold o (R), -m, l of the current group and ``init`` the same for a group start; ``q_raw``
    the raw Q^T slices; ``x_rows`` the KV rows of an item (zeroed once); ``kidx`` the key index
    per phase (full, partial); ``consts`` the decode constants (decode layout)."""

    st: Any
    init: Any
    q_raw: tuple
    x_rows: Any
    kidx: tuple
    consts: Any


@dataclass(frozen=True)
class MLAChunk:
    """One metadata chunk of a phase in SBUF: ``mi`` int32 / ``mf`` fp32 columns, and in the
    decode layout the chunk's scaled Q^T slices (``q``) and, masked, its bounds."""

    mi: Any
    mf: Any
    q: Any = None
    bounds: Any = None


def configure(ops, ins: MLAInputs, kv_cache, rows, blocks, opts) -> MLAConfig:
    """Validate every input and return the static configuration."""
    ck = lambda cond, arg, constraint, got: kernel_check(cond, KERNEL, arg, constraint, got)  # noqa: E731
    ck(isinstance(opts, MLAOptions), "options", "be an MLAOptions", type(opts).__name__)
    R, Pr = opts.kv_lora_rank, opts.qk_rope_head_dim
    query_t, overlay = ins.query_t, ins.overlay
    ck(isinstance(R, int) and isinstance(Pr, int) and 1 <= R <= MAX_VALUE_DIM and Pr >= 0,
       "kv_lora_rank, qk_rope_head_dim",
       f"be ints with 1 <= kv_lora_rank <= {MAX_VALUE_DIM}, qk_rope_head_dim >= 0", (R, Pr))
    D = R + Pr
    ck(len(query_t.shape) == 2 and query_t.shape[0] % D == 0 and query_t.shape[0] > 0,
       "query_t.shape", f"be (ngroups*D, blocks*rows) with D = R + P = {D}", tuple(query_t.shape))
    ck(len(kv_cache.shape) == 3, "kv_cache.shape", "be (num_blocks, block_size, E)",
       tuple(kv_cache.shape))
    N, B, E = kv_cache.shape
    ck(E >= D, "kv_cache.shape[2] (entry size E)", f"be >= kv_lora_rank + qk_rope_head_dim = {D}", E)
    q_dt, c_dt = dtype_name(query_t.dtype), dtype_name(kv_cache.dtype)
    ck(q_dt in _FLOAT, "query_t.dtype", f"be one of {_FLOAT}", q_dt)
    kernel_unsupported(c_dt == q_dt, KERNEL, f"a kv_cache of dtype {c_dt} with {q_dt} queries",
                       "cast the cache or the queries")
    ck(isinstance(rows, int) and 1 <= rows <= P, "rows", "be an int in [1, 128]", rows)
    ck(isinstance(blocks, int) and 1 <= blocks <= MLA_MAX_GROUP_BLOCKS, "blocks",
       f"be an int in [1, {MLA_MAX_GROUP_BLOCKS}]", blocks)
    ck(B >= 1 and (B & (B - 1)) == 0 and B <= 256, "kv_cache.shape[1] (block_size)",
       "be a power of two in [1, 256]", B)
    g_full, g_part = tile_geometries(KERNEL, B, opts.LARGE_TILE_SZ, opts.PARTIAL_TILE_SZ)
    ck(tuple(query_t.shape[1:]) == (blocks * rows,), "query_t.shape[1]",
       f"equal blocks * rows = {blocks * rows}", tuple(query_t.shape))
    ck(len(overlay.shape) == 2 and overlay.shape[1] == g_part.bp * E and overlay.shape[0] >= 1,
       "overlay.shape", f"be (R_ov >= 1, b'_p*E) = (R_ov, {g_part.bp * E})", tuple(overlay.shape))
    ck(dtype_name(overlay.dtype) == c_dt, "overlay.dtype", f"equal kv_cache.dtype ({c_dt})",
       dtype_name(overlay.dtype))
    decode = decode_layout(rows, blocks)
    layouts = {masked: meta_layout(loads=(g_part if masked else g_full).nL, blocks=blocks,
                                   head_size=D, masked=masked, keys_on_partitions=decode)
               for masked in (False, True)}
    items_p, items_f = check_phase_metadata(
        KERNEL, ins.meta_i[1], ins.meta_f[1], ins.meta_i[0], ins.meta_f[0], programs=1,
        columns=lambda masked: (layouts[masked].ki, layouts[masked].kf))
    _check_decode_inputs(ins, decode, D, rows, (items_f, items_p), q_dt)
    parts = check_item_parts(KERNEL, opts.item_parts, ops.max_lnc(), items_f, items_p)
    scale = softmax_scale_value(KERNEL, opts.softmax_scale, D)
    ck(isinstance(opts.mixed_precision, bool), "mixed_precision", "be a bool",
       opts.mixed_precision)
    kd = ops.bfloat16 if opts.mixed_precision else query_t.dtype
    kds = itemsize(kd)
    cap = (decode_chunk_cap(key_width=D, rows=rows, kernel_itemsize=kds) if decode
           else MAX_CHUNK_ITEMS)
    gen = "gen2" if ops.nc_gen() == "gen2" else "gen3"
    need = mla_sbuf_bytes(loads=g_full.nL, tiled_block_size=g_full.bp, entry_size=E, key_width=D,
                          value_width=R, rows=rows, blocks=blocks, cache_itemsize=itemsize(c_dt),
                          kernel_itemsize=kds, query_itemsize=itemsize(q_dt),
                          preload_cols=cap * rows if decode else 0)
    kernel_unsupported(need <= SBUF_USABLE[gen], KERNEL,
                       f"LARGE_TILE_SZ={opts.LARGE_TILE_SZ} with E={E}, {blocks} Q blocks of "
                       f"{rows} rows and {dtype_name(kd)} compute ({need} SBUF bytes per "
                       f"partition, {SBUF_USABLE[gen]} usable on {gen})",
                       "use a smaller LARGE_TILE_SZ, fewer Q blocks per group or mixed precision")
    step_keys = decode_step_keys(rows) if decode else STEP_KEYS
    full, partial = (MLAPhase(masked=masked, geo=geo, items=n, meta=layouts[masked],
                              step_keys=min(geo.W, step_keys), rw=geo.bp * E,
                              kv_flat=kv_cache.reshape((geo.flat_rows(N, 1), geo.bp * E)))
                     for masked, geo, n in ((False, g_full, items_f), (True, g_part, items_p)))
    return MLAConfig(R=R, D=D, E=E, nd=channel_slices(D), kd=kd, scale=scale, rows=rows,
                     blocks=blocks, decode=decode, chunk_cap=cap, parts=parts,
                     cache_dtype=kv_cache.dtype,
                     full=full, partial=partial)


def _check_decode_inputs(ins, decode, D, rows, items, q_dt):
    """Decode-layout classes need the per-item Q^T of both phases (``items = (full, partial)``
    item counts) and the partial items' bounds; other classes read none of them (None)."""
    if decode:
        cls = "a decode-layout class"
        check_item_inputs(KERNEL, (("q_full", ins.q_items[0], (D, items[0] * rows), q_dt, cls),
                                   ("q_part", ins.q_items[1], (D, items[1] * rows), q_dt, cls),
                                   ("bounds_p", ins.bounds_p, (1, items[1] * 2 * rows),
                                    "float32", cls)))
