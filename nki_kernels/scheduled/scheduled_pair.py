"""Two classes of a batch in ONE launch, their items interleaved: a mixed batch's decode class
and prefill class (``nki_kernels.scheduled.scheduled_attention``, one class each) share a
kernel call, so the decode items' gathers (DMA-bound) run beside the prefill items' compute
(ScalarE / VectorE-bound) instead of one launch after the other.

Per KV head, each class's items in its own order (full phase, then partial) form a stream;
:func:`segments` places both streams on one time line in proportion to their items and cuts
them where either changes phase, so that each segment pairs one phase of each class and both
classes' items spread over the whole launch. In a segment the two runs of items are
interleaved by :func:`interleave`: the run with fewer items (n) gives one item per step of a
sequential loop of n steps, the other ``k = its items // n`` items in the same step, its
remaining items after the loop. Everything else is each class's own: configuration, group tiles, constants,
persistent KV tiles, state scratch and output (both created by the same code as a one-class
launch, ``scheduled_attention.class_setup``), so the outputs are bit-identical to two launches
with the same options.

Dimensions and layouts: those of ``scheduled_paged_attention`` per class (the second
class's arguments with the suffix ``_b``); both classes read the
same cache (``kv_cache`` / ``value_cache``) and run on the same item parts
(``options.item_parts``).
"""

from __future__ import annotations

import warnings

from nki_kernels._assert import kernel_check
from nki_kernels.contract import MAX_CHUNK
from nki_kernels.ops import KernelFamily
from nki_kernels.scheduled.sched_config import SchedOptions, cache_dims, sbuf_need
from nki_kernels.scheduled.scheduled_attention import (PhaseRun, class_setup, constants,
                                                       group_tiles, output_shape, part_items,
                                                       phase_tiles, require_oob_skip, run_chunk,
                                                       run_items)
from nki_kernels.sbuf_plan import SbufBudgetWarning

KERNEL = "scheduled_pair_attention"


def interleave(n_a: int, n_b: int) -> tuple:
    """How two phases of ``n_a`` and ``n_b`` items (per item part) interleave (plain Python):
    ``(steps, k_a, k_b, rest_a, rest_b)`` -- a loop of ``steps`` steps, each running ``k_a``
    items of the first phase then ``k_b`` of the second (one of them 1), then ``rest_a`` /
    ``rest_b`` items of each alone (one of them 0). A phase without items: ``steps`` = 0 and
    the other phase's items all in its rest."""
    if n_a < 0 or n_b < 0:
        raise ValueError(f"interleave: item counts must be >= 0; got {n_a}, {n_b}")
    if n_a == 0 or n_b == 0:
        return 0, 0, 0, n_a, n_b
    steps = min(n_a, n_b)
    k_a, k_b = n_a // steps, n_b // steps
    return steps, k_a, k_b, n_a - steps * k_a, n_b - steps * k_b


def step_chunks(k: int) -> tuple:
    """``(m, chunk)``: how one interleaved step's ``k`` items are preloaded -- ``m`` metadata
    chunks of ``chunk`` items (``m = ceil(k / contract.MAX_CHUNK)``, ``chunk = k // m``); the
    step runs ``m * chunk`` items (``k`` less fewer than ``m``; the phase's last items go after
    the loop)."""
    if k < 1:
        raise ValueError(f"step_chunks: k must be >= 1; got {k}")
    m = -(-k // MAX_CHUNK)
    return m, k // m


def _build(ops):
    # every HBM tensor is an argument of its own (no tuples of tensors: the legacy API documents
    # none), so this entry point is wider than the project's 16-parameter rule
    def scheduled_pair_attention(query_t, q_init, overlay, meta_pi, meta_pf, meta_fi, meta_ff,
                                 query_t_b, q_init_b, overlay_b, meta_pi_b, meta_pf_b,
                                 meta_fi_b, meta_ff_b, kv_cache, blocks, blocks_b,
                                 options=SchedOptions(), options_b=SchedOptions(), q_full=None,
                                 q_part=None, i_full=None, i_part=None, bounds_p=None,
                                 q_full_b=None, q_part_b=None, i_full_b=None, i_part_b=None,
                                 bounds_p_b=None, value_cache=None):
        """Scheduled paged attention of two classes of Q blocks in one launch.

        Args: per class those of ``scheduled_paged_attention`` (the second class's with the
        suffix ``_b``); ``kv_cache`` / ``value_cache`` shared; the two ``options`` share
        ``item_parts`` and ``kv_layout``.

        Returns:
            ``(out, out_b)``: each class's output as ``scheduled_paged_attention`` returns it.

        Raises:
            ValueError: a bad input of either class (named), or options the two classes must
                share that differ.
        """
        kernel_check(options.item_parts == options_b.item_parts, KERNEL, "options_b.item_parts",
                     f"equal options.item_parts = {options.item_parts}", options_b.item_parts)
        kernel_check(options.kv_layout == options_b.kv_layout, KERNEL, "options_b.kv_layout",
                     f"equal options.kv_layout = {options.kv_layout!r}", options_b.kv_layout)
        # the outputs are created here: shared-HBM outputs only at the kernel's top level
        out = ops.ndarray(output_shape(query_t, kv_cache, value_cache, blocks, options),
                          dtype=query_t.dtype, buffer=ops.SHARED_HBM)
        out_b = ops.ndarray(output_shape(query_t_b, kv_cache, value_cache, blocks_b, options_b),
                            dtype=query_t_b.dtype, buffer=ops.SHARED_HBM)
        a = class_setup(ops, query_t, q_init, kv_cache, overlay,
                        (meta_pi, meta_pf, meta_fi, meta_ff), blocks, options,
                        (q_full, q_part, i_full, i_part, bounds_p), value_cache, out)
        b = class_setup(ops, query_t_b, q_init_b, kv_cache, overlay_b,
                        (meta_pi_b, meta_pf_b, meta_fi_b, meta_ff_b), blocks_b, options_b,
                        (q_full_b, q_part_b, i_full_b, i_part_b, bounds_p_b), value_cache, out_b)
        _check_pair_sbuf(ops, a[0], b[0], (kv_cache, value_cache), query_t, query_t_b)
        pair_body(ops, a[:2], b[:2], a[2])
        return out, out_b

    return scheduled_pair_attention


scheduled_pair_attention = KernelFamily(_build, KERNEL)


def _check_pair_sbuf(ops, cfg_a, cfg_b, caches, query_t, query_t_b):
    """Warn (``SbufBudgetWarning``) when the two classes' working sets together exceed the
    target's usable SBUF (each is checked alone by ``class_setup``); ``caches`` = (kv_cache,
    value_cache)."""
    kv_cache = caches[0]
    _, B, _, _ = cache_dims(*caches, cfg_a.opts)
    need_a, usable = sbuf_need(ops, cfg_a, kv_cache, query_t, B)
    need_b, _ = sbuf_need(ops, cfg_b, kv_cache, query_t_b, B)
    if need_a + need_b > usable:
        warnings.warn(f"{KERNEL}: the two classes' working sets, about {need_a} + {need_b} SBUF "
                      f"bytes per partition, exceed the {usable} usable: the compiler will "
                      "spill; launch the classes one at a time (scheduled_paged_attention)",
                      SbufBudgetWarning, stacklevel=4)


def pair_body(ops, a, b, num_kv_heads: int):
    """Body of :func:`scheduled_pair_attention`: ``a`` / ``b`` are each class's ``(cfg, ins)``.

    Pseudocode (per KV head): each class's items in its order (full phase, then partial) are
    one stream; :func:`segments` cuts the two streams where either changes phase, so that each
    segment pairs one phase of each class, and spreads both streams evenly over the launch:
        for each segment (a's phase, its items; b's phase, its items):
            steps, k_a, k_b = interleave(a's items, b's items)[:3]
            for s in sequential_range(steps):
                a's next k_a items     (m metadata chunks of k_a // m items, step_chunks)
                b's next k_b items
            each class's items the loop left                 (run_items)
    Each item is the one-class kernel's item (``scheduled_attention``), on its class's tiles;
    a phase's persistent KV tiles are allocated where the phase first runs.
    """
    require_oob_skip(ops)
    (cfg_a, ins_a), (cfg_b, ins_b) = a, b
    parts = cfg_a.opts.item_parts
    part = ops.item_part(num_kv_heads, parts)
    const = None
    classes = ((cfg_a, ins_a), (cfg_b, ins_b))
    phases = [(cfg.full, cfg.partial) for cfg, _ in classes]
    counts = [tuple(part_items(cfg, ph) for ph in pair) for (cfg, _), pair in zip(classes, phases)]
    for head in ops.kv_heads(num_kv_heads, parts):
        tiles = tuple(group_tiles(ops, cfg, ins.query_t.dtype) for cfg, ins in classes)
        if const is None:         # once per kernel, after the first head's tiles
            const = tuple(constants(ops, cfg, t.init, num_kv_heads)
                          for (cfg, _), t in zip(classes, tiles))
        runs = [[None, None], [None, None]]      # [class][phase], built at first use
        for seg in segments(counts[0], counts[1]):
            picked = []
            for c, (ph, lo, n) in enumerate(seg):
                if n and runs[c][ph] is None:
                    cfg, ins = classes[c]
                    phase = phases[c][ph]
                    runs[c][ph] = PhaseRun(cfg, ins, phase, head, tiles[c], const[c],
                                           phase_tiles(ops, cfg, phase))
                picked.append((runs[c][ph], part * counts[c][ph] + lo, n))
            _interleaved(ops, picked)


def segments(counts_a: tuple, counts_b: tuple) -> list:
    """The segments of two classes' item streams (plain Python): ``counts_*`` = (full, partial)
    items per part. Each stream is placed on [0, 1) in proportion to its items; the streams are
    cut where either changes phase, and each cut point takes ``round(point x items)`` items of
    the other. Returns a list of ``((phase_a, first_a, n_a), (phase_b, first_b, n_b))``, phase
    0 = full, 1 = partial, ``first`` the item within its phase, in stream order: every item of
    each class exactly once, each class's full items before its partial ones."""
    streams = (counts_a, counts_b)
    totals = [sum(c) for c in streams]
    cuts = sorted({0.0, 1.0} | {c[0] / t for c, t in zip(streams, totals) if t and 0 < c[0] < t})
    out = []
    done = [0, 0]
    for x in cuts[1:]:
        seg = []
        for c, (counts, total) in enumerate(zip(streams, totals)):
            end = round(x * total) if x < 1.0 else total
            if total and x == counts[0] / total:
                end = counts[0]                    # this class's own phase change: exact
            lo, n = done[c], max(end - done[c], 0)
            # the items [lo, lo + n) of the stream: within one phase by construction
            ph = 0 if lo < counts[0] else 1
            first = lo if ph == 0 else lo - counts[0]
            if ph == 0 and lo + n > counts[0]:     # pragma: no cover - cut at the phase change
                raise AssertionError("internal: a segment crosses a phase change")
            seg.append((ph, first, n))
            done[c] += n
        out.append(tuple(seg))
    return out


def _interleaved(ops, picked):
    """The two classes' items of one segment (``picked``: per class its :class:`PhaseRun`, its
    first item and its item count), interleaved (:func:`interleave`): a sequential loop whose
    step runs each class's next ``m * chunk`` items (:func:`step_chunks`), then each class's
    items the loop left (:func:`run_items`)."""
    (_, _, n_a), (_, _, n_b) = picked
    steps, k_a, k_b, _, _ = interleave(n_a, n_b)
    plans = [step_chunks(k) if steps else (0, 0) for k in (k_a, k_b)]
    if steps:
        for s in ops.sequential_range(steps):
            for (run, first, _), (m, chunk) in zip(picked, plans):
                if m == 1:
                    run_chunk(ops, run, first + s * chunk, chunk)
                else:
                    for j in ops.sequential_range(m):
                        run_chunk(ops, run, first + s * (m * chunk) + j * chunk, chunk)
    for (run, first, n), (m, chunk) in zip(picked, plans):
        done = steps * m * chunk
        if n > done:
            run_items(ops, run, first + done, n - done)
