"""Plan once per step: ``plan_paged_attention`` -> a frozen :class:`AttentionPlan`.

A serving step runs the same batch (lengths, block tables) through every layer of a model; only
the layer's tensors (query, new K/V, its cache) differ. Everything that depends on the batch
alone is built here once, validated once, and frozen: for the scheduled kernel one schedule
per class of sequences (``host.scheduled.schedule``; decode and prefill classes each get their own
tile sizes) with its step-constant kernel inputs (metadata, per-row initial values, mask
bounds) and launch options, or, for the dense kernel, the active block table and the dense mask (GQA
packing decided). ``host.run_paged_attention(plan, query, key, value, kv_cache)`` then builds
only the per-layer tensors (``host/attention.py``). Plans are immutable (frozen dataclasses,
read-only arrays), so one plan may be shared by the threads that run a step's layers.

Dimensions: S sequences, T = sum(query_lens) tokens, H / Hkv query / KV heads, d head size,
N cache blocks, B block size; layouts in docs/layouts.md.

    >>> import numpy as np
    >>> plan = plan_paged_attention(np.array([[0, 1], [2, -1]]), [3, 1], [20, 5], num_heads=4,
    ...                             num_kv_heads=2, head_size=32, block_size=16, num_blocks=4,
    ...                             dtype="float32")
    >>> plan.kernel, plan.num_tokens, [part.launch.cls.kind for part in plan.parts]
    ('scheduled', 4, ['decode'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from host._arrays import readonly, to_numpy
from host.dense.block_tables import active_table_of, check_block_tables
from host.fp8 import is_fp8_cache_dtype
from host.dense.gqa_packing import choose_gqa_packing, packed_attention_mask
from host.launch import check_api, check_backend, check_lnc, item_parts_for
from host.dense.masks import build_attention_mask
from host.dense.plan import PagedAttentionPlan, make_plan
from host.scheduled.schedule import (AttentionSchedule, auto_large_tile, build_schedule,
                                    class_sequences)
from host.scheduled.schedule_items import AUTO_LARGE_TILE
from host.scheduled.scheduled import ClassLaunch, class_launch, row_init
from host.validation import (check_int, check_lens, check_power_of_two, check_softmax_scale,
                             fail, summarize)
from host.variants import AttentionVariants, make_variants
from nki_kernels.contract import (BLOCK_KV, FUSED, KV_LAYOUTS, MAX_BLOCK_SIZE, MAX_HEAD_SIZE_DENSE,
                                  MAX_HEAD_SIZE_SCHEDULED, MAX_TILE_SIZE, MIN_BLOCK_SIZE,
                                  MIN_TILE_SIZE)
from nki_kernels.scheduled.sched_plan import working_set_bytes

__all__ = ["AttentionPlan", "ClassPlan", "DenseInputs", "plan_paged_attention", "class_launches",
           "KERNELS", "GQA_PACKING", "DTYPES", "MAX_HEAD_SIZE", "LAYER_VALUES", "KV_LAYOUTS",
           "check_attention_options", "check_kv_layout", "layer_launches", "pair_fits",
           "FUSE_CLASSES"]

KERNELS = ("scheduled", "dense")
GQA_PACKING = ("auto", True, False)
DTYPES = ("float32", "bfloat16", "float16")
# Largest head size per kernel: the dense kernel keeps one SBUF partition per channel, the
# scheduled kernel accumulates QK^T over 128-channel slices.
MAX_HEAD_SIZE = MappingProxyType({"dense": MAX_HEAD_SIZE_DENSE, "scheduled": MAX_HEAD_SIZE_SCHEDULED})

# A prefill class launched alone (no decode class, or FUSE_CLASSES off / not fitting) has the
# DMA queues and GpSimd to itself: its query-rows steps move work there
# (SchedOptions.prefill_only). As two launches one after the other, MODELED, trn2
# current API / trn2 legacy / trn1, us: 2 + 30 decodes 2201 -> 2091 / 2548 -> 2474 / 2950 ->
# 2955, 4 x 512 + 60 decodes 8436 -> 8261 / 9106 -> 8868 / 10820 -> 10827 (batches without a
# decode class had it before: prefill 2K on 2K trn2 current 4527 -> 3755 when it came).
PREFILL_CLASS_OFFLOAD = True

# A plan with a decode class and a prefill class runs them as ONE launch whose item loops
# interleave the two (nki_kernels.scheduled.scheduled_pair: the decode items' gathers beside
# the prefill items' compute) when both working sets fit the SBUF together (NeuronCore-v2's,
# the smaller); the prefill class then shares the DMA queues and GpSimd, so it does not offload
# (PREFILL_CLASS_OFFLOAD applies to prefill classes launched alone). MODELED, two launches ->
# one pair launch, trn2 current API / trn2 legacy / trn1, us: 2 + 30 decodes 2091 -> 1773 /
# 2474 -> 2451 / 2955 -> 2921, 4 x 512 + 60 decodes 8261 -> 6084 / 8868 -> 8657 / 10827 -> 9334
# (docs/performance.md; the pair launch with the prefill offload: 4 x 512 + 60 6089 -> 6447).
FUSE_CLASSES = True

# Variant values that may differ per layer (run_paged_attention keywords).
LAYER_VALUES = ("alibi_slopes", "sinks", "k_scale", "v_scale")
_VARIANT_OPTIONS = ("sliding_window", "logits_soft_cap", "alibi_slopes", "sinks", "k_scale",
                    "v_scale")


@dataclass(frozen=True, eq=False)
class DenseInputs:
    """Step-constant inputs of the dense kernel: the batch plan it runs (``query_lens * G`` when
    GQA-packed), whether the G query heads of a KV head are packed as rows, the active block
    table (num_active_blocks,) int32 and the (Qpad, ctx + Qpad) bool mask (both read-only)."""

    batch: PagedAttentionPlan
    gqa_packed: bool
    active_table: np.ndarray = field(repr=False)
    mask: np.ndarray = field(repr=False)


@dataclass(frozen=True, eq=False)
class ClassPlan:
    """One class of a scheduled-kernel plan, one launch: the class's own schedule (its sequences
    only, ``build_schedule(..., seqs=...)``: its own large and partial tile sizes and overlay
    rows), its step-constant launch inputs and the launch's keyword arguments (``options``:
    ``SchedOptions``, read-only mapping)."""

    schedule: AttentionSchedule = field(repr=False)
    launch: ClassLaunch = field(repr=False)
    kernel_kwargs: Mapping[str, Any] = field(repr=False)

    @property
    def large_tile_size(self) -> int:
        return self.schedule.large_tile_size

    @property
    def partial_tile_size(self) -> int:
        return self.schedule.partial_tile_size


@dataclass(frozen=True, eq=False)
class AttentionPlan:
    """The frozen plan of one step (module docstring); built by :func:`plan_paged_attention`.

    Geometry: num_heads H, num_kv_heads Hkv, head_size d, block_size B, num_blocks N, dtype
    (query / key / value dtype name), kv_cache_dtype (cache dtype name), kv_layout ("fused":
    one (2, N, Hkv, B, d) cache; "block_kv": vLLM's (key_cache, value_cache) pair of
    (N, B, Hkv, d) caches, docs/layouts.md §18), num_tokens T,
    query_lens / context_lens (S,) int64 read-only. Kernel configuration: kernel, backend, api
    (None = resolved per launch by ``nki_kernels.toolchain.resolve_api``; "legacy" | "nki"), lnc
    (physical cores per launch, None = ``Api.lnc``'s choice per launch),
    softmax_scale (resolved), mixed_precision, large_tile_size (dense: the kernel's; scheduled:
    the largest of its classes' tiles), variants (validated ``host.variants.AttentionVariants``).
    Scheduled kernel: parts (one :class:`ClassPlan` per class: schedule, launch inputs and
    keyword arguments), fused (True: the two classes run as one launch, their items
    interleaved, ``nki_kernels.scheduled.scheduled_pair``; :data:`FUSE_CLASSES`),
    block_tables (S, max_blocks) int64 read-only (the overlays read it per
    layer). Dense kernel: dense (:class:`DenseInputs`), kernel_kwargs (its keyword arguments,
    read-only mapping).
    """

    kernel: str
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_blocks: int
    dtype: str
    kv_cache_dtype: str
    num_tokens: int
    query_lens: np.ndarray = field(repr=False)
    context_lens: np.ndarray = field(repr=False)
    softmax_scale: float = 0.0
    mixed_precision: bool = False
    large_tile_size: int = 2048
    backend: str = "auto"
    api: str | None = None
    lnc: int | None = None
    variants: AttentionVariants | None = None
    kernel_kwargs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    parts: tuple = field(default=(), repr=False)
    block_tables: np.ndarray | None = field(default=None, repr=False)
    dense: DenseInputs | None = field(default=None, repr=False)
    kv_layout: str = FUSED
    fused: bool = False

    @property
    def num_seqs(self) -> int:
        return int(self.query_lens.shape[0])

    @property
    def is_fp8(self) -> bool:
        return self.variants is not None and self.variants.is_fp8

    @property
    def kernel_dtype(self) -> np.dtype:
        """The matmul-input dtype: bf16 in mixed precision, else the query dtype."""
        return np.dtype("bfloat16") if self.mixed_precision else np.dtype(self.dtype)


def check_attention_options(*, kernel: Any, num_heads: int, num_kv_heads: int, head_size: int,
                            num_blocks: int, mixed_precision: Any, backend: Any,
                            gqa_packing: Any) -> None:
    """The option checks every paged-attention entry point shares (ValueError naming the
    argument; NotImplementedError for gqa_packing=False with the scheduled kernel)."""
    if not isinstance(kernel, str) or kernel not in KERNELS:
        fail("kernel", f"be one of {KERNELS}", repr(kernel))
    H, Hkv, d, N = num_heads, num_kv_heads, head_size, num_blocks
    if Hkv < 1 or N < 1:
        fail("kv_cache", "have num_blocks >= 1 and Hkv >= 1", f"N={N}, Hkv={Hkv}")
    if H % Hkv:
        fail("query", f"have a head count divisible by num_kv_heads={Hkv}", f"H = {H}")
    max_d = MAX_HEAD_SIZE[kernel]
    if not 1 <= d <= max_d:
        what = ("the dense kernel keeps one SBUF partition per channel" if kernel == "dense"
                else "the scheduled kernel accumulates QK^T over 128-channel slices")
        fail("head size d", f"be in [1, {max_d}] ({what})", d)
    if not isinstance(mixed_precision, (bool, np.bool_)):
        fail("mixed_precision", "be a bool", repr(mixed_precision))
    check_backend(backend)
    if kernel == "scheduled" and gqa_packing is False:
        raise NotImplementedError("paged_attention: the scheduled kernel always packs the G query "
                                  "heads of a KV head as query rows; gqa_packing=False applies to "
                                  "kernel='dense' only")


def check_kv_layout(kv_layout: Any, *, kernel: str, fp8: bool) -> str:
    """``kv_layout`` if it is one of :data:`KV_LAYOUTS` and the kernel reads it.

    Raises:
        ValueError: not one of the layouts (named).
        NotImplementedError: "block_kv" with the dense kernel (vLLM's legacy interface reads
            the fused cache only) or with an fp8 cache (the cache ops write fp8 to the fused
            layout only).
    """
    if not isinstance(kv_layout, str) or kv_layout not in KV_LAYOUTS:
        fail("kv_layout", f"be one of {KV_LAYOUTS}", repr(kv_layout))
    if kv_layout == BLOCK_KV and kernel == "dense":
        raise NotImplementedError(
            "paged_attention: the dense kernel (vLLM's legacy interface) reads a fused "
            "(2, N, Hkv, B, d) kv_cache only; use kernel='scheduled' (the default) for a "
            "(key_cache, value_cache) pair, or pass the fused cache")
    if kv_layout == BLOCK_KV and fp8:
        raise NotImplementedError(
            "paged_attention: an fp8 block-KV (key_cache, value_cache) pair is not supported; "
            "use the fused (2, N, Hkv, B, d) layout for fp8 caches")
    return kv_layout


def plan_paged_attention(block_tables: Any, query_lens: Any, context_lens: Any, *, num_heads: int,
                         num_kv_heads: int, head_size: int, block_size: int, dtype: Any,
                         num_blocks: int, kv_cache_dtype: Any = None,
                         softmax_scale: float | None = None, mixed_precision: bool = True,
                         large_tile_size: Any = "auto", partial_tile_size: Any = "auto",
                         backend: str = "auto", gqa_packing: Any = "auto",
                         kernel: str = "scheduled", api: str | None = None,
                         lnc: int | None = None, kv_layout: str = FUSED,
                         **variant_options: Any) -> AttentionPlan:
    """Validate a step's batch and options once and build its frozen :class:`AttentionPlan`.

    Args:
        block_tables: (S, max_blocks) integer; row i's first ceil(context_lens[i] / B) entries
            are sequence i's context blocks (ids in [0, num_blocks)); later entries ignored.
        query_lens: (S,) integers >= 1 (new tokens).  context_lens: (S,) integers >= 0.
        num_heads, num_kv_heads, head_size: H, Hkv (H % Hkv == 0), d (1..512 scheduled,
            1..128 dense).
        block_size, num_blocks: the cache's B (power of two <= 256) and N (every layer's cache
            run with this plan must have them).
        dtype: the query / key / value dtype (float32, bfloat16, float16).
        kv_cache_dtype: the cache dtype (default ``dtype``; float8_e4m3fn / float8_e5m2 with
            k_scale / v_scale, scheduled kernel).
        softmax_scale, mixed_precision, large_tile_size, partial_tile_size, backend,
        gqa_packing, kernel, api, lnc (physical cores per launch, 1 or 2; None:
        ``NEURON_LOGICAL_NC_CONFIG`` or the platform's, ``nki_kernels.toolchain.Api.lnc``; the
        cores split the KV heads; scheduled kernel: two cores over an odd Hkv cut each class's
        schedule in two item parts, so the plan's launches must run on two cores; dense
        kernel: an odd Hkv split by query tiles, the last head on the current API, every
        head on the legacy API),
        kv_layout: "fused" (default; each layer's kv_cache is one (2, N, Hkv, B, d) array) or
            "block_kv" (each layer's kv_cache is vLLM's (key_cache, value_cache) pair of
            (N, B, Hkv, d) caches, read in place; scheduled kernel, no fp8),
        and the variant options sliding_window, logits_soft_cap,
        alibi_slopes, sinks, k_scale, v_scale: as ``host.paged_attention``. The values of
        alibi_slopes, sinks, k_scale and v_scale are the plan's defaults; a layer may give its
        own to ``run_paged_attention`` (a plan built with one of them needs one per layer).

    Raises:
        ValueError: any bad argument, named (before anything is built).
        NotImplementedError: valid but unsupported combinations (variants or fp8 with the dense
            kernel, gqa_packing=False with the scheduled kernel, partial_tile_size with dense,
            kv_layout="block_kv" with the dense kernel or an fp8 cache, lnc=2 where the API
            cannot split the launch: trn1, a legacy front end without ``nl.nc``).
        RuntimeError: an ``api`` the installed toolchain cannot run (``host.launch.check_api``).
    """
    unknown = sorted(set(variant_options) - set(_VARIANT_OPTIONS))
    if unknown:
        raise TypeError(f"plan_paged_attention() got unexpected keyword arguments {unknown}")
    H = check_int("num_heads", num_heads, min_value=1)
    Hkv = check_int("num_kv_heads", num_kv_heads, min_value=1)
    d = check_int("head_size", head_size, min_value=1)
    N = check_int("num_blocks", num_blocks, min_value=1)
    dt = _dtype("dtype", dtype)
    if dt.name not in DTYPES:
        fail("dtype", f"be one of {DTYPES}", dt.name)
    cdt = dt if kv_cache_dtype is None else _dtype("kv_cache_dtype", kv_cache_dtype)
    if cdt != dt and not is_fp8_cache_dtype(cdt):
        fail("kv_cache_dtype", f"equal dtype ({dt.name}) or be an fp8 cache dtype", cdt.name)
    check_attention_options(kernel=kernel, num_heads=H, num_kv_heads=Hkv, head_size=d,
                            num_blocks=N, mixed_precision=mixed_precision, backend=backend,
                            gqa_packing=gqa_packing)
    kv_layout = check_kv_layout(kv_layout, kernel=kernel, fp8=is_fp8_cache_dtype(cdt))
    scale = check_softmax_scale(softmax_scale, 1.0 / math.sqrt(d))
    api = check_api(api)
    item_parts = 1
    if kernel == "scheduled":
        item_parts = item_parts_for(api, lnc, Hkv)     # a bad lnc fails here, before any work
    else:
        check_lnc(api, lnc, Hkv)                         # likewise
    variants = make_variants(H, Hkv, cdt, **variant_options)
    if kernel == "dense" and not variants.is_default:
        raise NotImplementedError(
            "paged_attention: attention variants (sliding_window, logits_soft_cap, alibi_slopes, "
            "sinks, fp8 caches with k_scale / v_scale) are not supported by the dense kernel; use "
            "kernel='scheduled'")
    if not (isinstance(gqa_packing, (bool, np.bool_))
            or (isinstance(gqa_packing, str) and gqa_packing == "auto")):
        fail("gqa_packing", "be 'auto', True or False", repr(gqa_packing))
    B = check_power_of_two("block_size", block_size, lo=MIN_BLOCK_SIZE, hi=MAX_BLOCK_SIZE)
    auto_tile = isinstance(large_tile_size, str) and large_tile_size == "auto"
    LT = None if auto_tile else check_power_of_two("large_tile_size", large_tile_size,
                                                   lo=MIN_TILE_SIZE, hi=MAX_TILE_SIZE)
    auto_partial = isinstance(partial_tile_size, str) and partial_tile_size == "auto"
    if not auto_partial:
        check_power_of_two("partial_tile_size", partial_tile_size, lo=MIN_TILE_SIZE,
                           hi=MAX_TILE_SIZE if LT is None else LT)
        if kernel == "dense":
            raise NotImplementedError("paged_attention: partial_tile_size applies to the scheduled "
                                      "kernel; leave it 'auto' with kernel='dense'")
    q = check_lens("query_lens", query_lens, min_value=1)
    if q.shape[0] == 0:
        fail("query_lens", "have at least one entry (one per sequence)", "0 entries")
    c = check_lens("context_lens", context_lens, min_value=0, length=q.shape[0],
                   length_arg="query_lens")
    q = readonly(np.array(q, dtype=np.int64))
    c = readonly(np.array(c, dtype=np.int64))
    bt_np, _ = to_numpy(block_tables, "block_tables")
    bt = check_block_tables(bt_np, c, block_size=B, num_blocks=N)
    if LT is None and kernel != "scheduled":
        LT = AUTO_LARGE_TILE

    common = dict(num_heads=H, num_kv_heads=Hkv, head_size=d, block_size=B, num_blocks=N,
                  dtype=dt.name, kv_cache_dtype=cdt.name, num_tokens=int(q.sum()), query_lens=q,
                  context_lens=c, softmax_scale=scale, mixed_precision=bool(mixed_precision),
                  large_tile_size=LT, backend=backend, api=api, lnc=lnc, kv_layout=kv_layout,
                  variants=None if variants.is_default else variants)
    if kernel == "dense":
        return _dense_plan(bt, q, c, common, gqa_packing)
    return _scheduled_plan(bt, q, c, common, "auto" if auto_partial else int(partial_tile_size),
                           item_parts)


def _dtype(arg: str, value: Any) -> np.dtype:
    try:
        return np.dtype(value)
    except TypeError:
        fail(arg, "be a NumPy / ml_dtypes dtype", repr(value))


def _scheduled_plan(bt, q, c, common, partial_tile_size, item_parts) -> AttentionPlan:
    """One :class:`ClassPlan` per class (``class_sequences``): a class's large tile is the
    explicit one or its own ``"auto"`` (``auto_large_tile`` on its sequences: decodes get wider
    tiles in a mixed batch too), its partial tile the explicit one or its own ``"auto"``; its
    items in ``item_parts`` parts (one per core of an LNC=2 launch over an odd Hkv)."""
    v = common["variants"]
    H, Hkv, d, B = (common["num_heads"], common["num_kv_heads"], common["head_size"],
                    common["block_size"])
    alibi = v.alibi_slopes if v is not None else None
    sinks = v.sinks if v is not None else None
    sliding_window = v.sliding_window if v is not None else None
    with_row_init = alibi is not None or sinks is not None
    from nki_kernels.scheduled.sched_config import SchedOptions

    itemsize = np.dtype(common["dtype"]).itemsize
    cache_itemsize = np.dtype(common["kv_cache_dtype"]).itemsize
    built = []
    classes = class_sequences(q, H // Hkv)
    for kind, seqs in classes:
        LT = common["large_tile_size"]
        if LT is None:
            LT = auto_large_tile(q[seqs], num_heads=H, num_kv_heads=Hkv, head_size=d,
                                 block_size=B, itemsize=itemsize, cache_itemsize=cache_itemsize,
                                 mixed_precision=common["mixed_precision"],
                                 sliding_window=sliding_window,
                                 partial_tile_size=None if partial_tile_size == "auto"
                                 else partial_tile_size)
        sched = build_schedule(q, c, bt, num_heads=H, num_kv_heads=Hkv, head_size=d,
                               block_size=B, num_blocks=common["num_blocks"], large_tile_size=LT,
                               sliding_window=sliding_window, alibi=alibi is not None,
                               row_init=with_row_init, query_itemsize=itemsize,
                               cache_itemsize=cache_itemsize,
                               kernel_itemsize=2 if common["mixed_precision"] else itemsize,
                               group_blocks_cap=None, partial_tile_size=partial_tile_size,
                               kv_layout=common["kv_layout"], seqs=np.asarray(seqs, np.int64),
                               item_parts=item_parts)
        built.append((kind, LT, sched))
    fused = FUSE_CLASSES and len(built) == 2 and pair_fits(
        [sched.classes[0] for _, _, sched in built], [LT for _, LT, _ in built],
        block_size=B, head_size=d, query_itemsize=itemsize, cache_itemsize=cache_itemsize,
        kernel_itemsize=2 if common["mixed_precision"] else itemsize)
    parts = []
    for kind, LT, sched in built:
        kwargs = MappingProxyType(dict(options=SchedOptions(
            softmax_scale=common["softmax_scale"], mixed_precision=common["mixed_precision"],
            LARGE_TILE_SZ=LT, PARTIAL_TILE_SZ=sched.partial_tile_size,
            logits_soft_cap=v.logits_soft_cap if v is not None else None,
            alibi=alibi is not None, row_init=with_row_init,
            windowed=sliding_window is not None, kv_layout=common["kv_layout"],
            prefill_only=PREFILL_CLASS_OFFLOAD and kind == "prefill" and not fused,
            item_parts=item_parts, nested_rows=sched.classes[0].partial.nested_rows,
            fresh_items=(sched.classes[0].full.fresh_items,
                         sched.classes[0].partial.fresh_items))))
        (launch,) = class_launches(sched, H, Hkv, sinks=sinks, alibi_slopes=alibi)
        parts.append(ClassPlan(schedule=sched, launch=launch, kernel_kwargs=kwargs))
    common = dict(common, large_tile_size=max(p.large_tile_size for p in parts))
    return AttentionPlan(kernel="scheduled", parts=tuple(parts), block_tables=readonly(bt.copy()),
                         fused=fused, **common)


def pair_fits(classes, large_tiles, *, block_size: int, head_size: int, query_itemsize: int,
              cache_itemsize: int, kernel_itemsize: int) -> bool:
    """Whether the working sets of two classes (``host.scheduled.schedule.ClassSchedule``, each
    with its large tile) fit NeuronCore-v2's SBUF together
    (``nki_kernels.scheduled.sched_plan.working_set_bytes``): the condition for one launch of
    both (:data:`FUSE_CLASSES`)."""
    total = usable = 0
    for cls, lt in zip(classes, large_tiles):
        need, usable = working_set_bytes(
            nc_gen="gen2", block_size=block_size, large_tile=lt, head_size=head_size,
            rows=cls.rows, blocks=cls.blocks, cache_itemsize=cache_itemsize,
            query_itemsize=query_itemsize, kernel_itemsize=kernel_itemsize,
            keys_on_partitions=cls.decode_layout)
        total += need
    return total <= usable


def class_launches(schedule: AttentionSchedule, num_heads: int, num_kv_heads: int, *,
                   sinks=None, alibi_slopes=None) -> tuple:
    """One ``host.scheduled.scheduled.ClassLaunch`` per class of ``schedule`` (per-row initial values
    from ``sinks`` / ``alibi_slopes``, validated (H,) float32 or None)."""
    with_row_init = sinks is not None or alibi_slopes is not None
    return tuple(class_launch(cls, row_init(cls, num_heads, num_kv_heads, sinks=sinks,
                                            alibi_slopes=alibi_slopes), row_init=with_row_init)
                 for cls in schedule.classes)


def layer_launches(plan: AttentionPlan, **layer: Any) -> tuple:
    """``(variants, launches)`` of one layer of a scheduled-kernel plan: the plan's launches (one
    per :class:`ClassPlan`, in ``plan.parts`` order), or with the layer's own values of
    alibi_slopes / sinks / k_scale / v_scale (keywords; None = the plan's), validated, each
    given only for a variant the plan was built with."""
    given = {n: x for n, x in layer.items() if x is not None}
    v = plan.variants
    launches = tuple(part.launch for part in plan.parts)
    if not given:
        return v, launches
    for n in given:
        if v is None or getattr(v, n) is None:
            fail(n, "be None: the plan was built without it (plan_paged_attention(..., "
                 f"{n}=...) first)", summarize(to_numpy(given[n], n)[0]))
    opts = {f: getattr(v, f) for f in ("sliding_window", "logits_soft_cap", *LAYER_VALUES)}
    opts.update(given)
    v = make_variants(plan.num_heads, plan.num_kv_heads, plan.kv_cache_dtype, **opts)
    if not ({"alibi_slopes", "sinks"} & set(given)):
        return v, launches
    return v, tuple(launch for part in plan.parts
                    for launch in class_launches(part.schedule, plan.num_heads,
                                                 plan.num_kv_heads, sinks=v.sinks,
                                                 alibi_slopes=v.alibi_slopes))


def _dense_plan(bt, q, c, common, gqa_packing) -> AttentionPlan:
    H, Hkv, B, LT = (common["num_heads"], common["num_kv_heads"], common["block_size"],
                     common["large_tile_size"])
    batch = make_plan(q, c, block_size=B, large_tile_size=LT)
    active = active_table_of(batch, bt)
    G = H // Hkv
    if gqa_packing == "auto":
        gqa_packing = choose_gqa_packing(q, H, Hkv, context_lens=c, large_tile_size=LT)
    packed = bool(gqa_packing) and G > 1
    if packed:
        batch = make_plan(q * G, c, block_size=B, large_tile_size=LT)
        mask = packed_attention_mask(batch, G)
    else:
        mask = build_attention_mask(batch)
    dense = DenseInputs(batch=batch, gqa_packed=packed, active_table=readonly(active),
                        mask=readonly(mask))
    kwargs = MappingProxyType(dict(softmax_scale=common["softmax_scale"],
                                   mixed_precision=common["mixed_precision"], LARGE_TILE_SZ=LT))
    return AttentionPlan(kernel="dense", kernel_kwargs=kwargs, dense=dense, **common)
