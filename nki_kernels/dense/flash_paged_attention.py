"""Flash paged attention over a flat (continuous) batch, with vectorized KV-cache loads.

One source for both NKI APIs (the op layer, :mod:`nki_kernels.ops`): on the legacy API one
program per KV head (grid ``[1, Hkv]``, ``flash_paged_attention[1, Hkv]``; LNC=2: ``[1,
nl.spmd_dim(nl.nc(2), Hkv/2)]``, an odd Hkv ``[nl.nc(2), Hkv]``, each program half of its
head's query tiles), on the current API one launch looping over the KV heads
(``flash_paged_attention.for_api("nki")``; LNC=2: each physical core over its half, an odd Hkv's
last head split between the cores by query tiles). Interface of vLLM's ``flash_paged_attention``
after PR #13245 / #15911 (fused ``kv_cache``); host wrappers live in ``host/attention.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.dense.block_tables import load_block_tables
from nki_kernels.constants import (B_P_SIZE, FP32_EXACT_INT, L_FLOOR, M_FLOOR, MAX_BLOCK_SIZE,
                                   MAX_HEAD_SIZE, MAX_LARGE_TILE, MIN_BLOCK_SIZE, MIN_LARGE_TILE,
                                   BLOCK_TABLE_BUDGET_BYTES, STEP_KEYS, tile_geometry)
from nki_kernels.dense.finite import (FAULT_NAN, finite_columns, finite_values, poison_values,
                                     value_stride)
from nki_kernels.dense.flash_core import flash_attention_tile
from nki_kernels.dense.kv_load import flat_kv_view, load_kv_tile
from nki_kernels.ops import KernelFamily, dtype_name, itemsize
from nki_kernels.sbuf_plan import q_tiles_per_group

KERNEL = "flash_paged_attention"
_FLOAT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DenseGeometry:
    """The validated static geometry of a launch (:func:`_check_inputs`; symbols as in
    :func:`flash_paged_attention_body`): query heads H, head size d, padded queries Qpad, cache
    blocks N, KV heads Hkv, G = H // Hkv, block size B; M, T, b' (``bp``), L and nL
    (``n_loads``) of ``constants.tile_geometry``; active blocks nab, context keys ctx = nab * B,
    context tiles n_tiles; the names of the kernel (matmul-input) and accumulator dtypes; the
    softmax scale."""

    H: int
    d: int
    Qpad: int
    N: int
    Hkv: int
    G: int
    B: int
    M: int
    T: int
    bp: int
    L: int
    n_loads: int
    nab: int
    ctx: int
    n_tiles: int
    kernel_dtype: str
    acc_dtype: str
    scale: float


def _build(ops):
    def flash_paged_attention(query, key, value, kv_cache, block_tables, mask, softmax_scale=None,
                              mixed_precision=True, LARGE_TILE_SZ=2048):
        """Paged attention of the padded flat query batch (vLLM interface).

        Thin entry point: allocates the (1, H, Qpad, d) output in shared HBM (which NKI only
        allows at the kernel's top level) and runs :func:`flash_paged_attention_body` (which
        documents the arguments) with the product KV loader ``load_kv_tile``.
        """
        o = ops.ndarray(output_shape(query), dtype=query.dtype, buffer=ops.SHARED_HBM)
        return flash_paged_attention_body(ops, query, key, value, kv_cache, block_tables, mask,
                                          softmax_scale=softmax_scale,
                                          mixed_precision=mixed_precision,
                                          LARGE_TILE_SZ=LARGE_TILE_SZ, out=o)

    return flash_paged_attention


flash_paged_attention = KernelFamily(_build, "flash_paged_attention", odd_heads=True)


def output_shape(query):
    """``(1, H, Qpad, d)`` for a ``(1, H, d, Qpad)`` query (checked to be 4-D with batch 1)."""
    kernel_check(len(query.shape) == 4 and query.shape[0] == 1, KERNEL, "query.shape",
                 "be (1, H, d, Qpad)", tuple(query.shape))
    _, H, d, Qpad = query.shape
    return (1, H, Qpad, d)


def flash_paged_attention_body(ops, query, key, value, kv_cache, block_tables, mask,
                               softmax_scale=None, mixed_precision=True, LARGE_TILE_SZ=2048, *,
                               out, load_kv=load_kv_tile, p_transpose="auto"):
    """Paged attention of the padded flat query batch against its cached context and itself.

    Dimensions:
        H      query heads               Hkv   KV heads (grid axis 1; H % Hkv == 0), G = H // Hkv
        d      head size (1..128)        Qpad  padded query count (multiple of 128)
        N      cache blocks              B     block_size (power of two, 1..256)
        LT     LARGE_TILE_SZ (power of two, 512..8192), context tokens per large tile
        nab    num_active_blocks (multiple of M = LT // B)   ctx = nab * B   n_tiles = ctx // LT
        T, b', L, nL   tiling factor, tokens per gathered row, rows per tile, loads per tile
                       (nki_kernels.constants.tile_geometry)

    Args:
        ops: the op layer (:mod:`nki_kernels.ops`) of the API the kernel is traced for.
        query: (1, H, d, Qpad) float32/bfloat16/float16, query tokens transposed (d on partitions);
            rows past the real token count are padding.
        key: (1, Hkv, d, Qpad), the new (active) tokens' keys, same dtype as query.
        value: (1, Hkv, Qpad, d), the new tokens' values, same dtype as query.
        kv_cache: (2, N, Hkv, B, d), same dtype as query; [0] = K, [1] = V.
        block_tables: (nab,) int32, context blocks of all sequences concatenated, padded with
            valid ids (e.g. 0) to a multiple of M. May be empty (nab = 0: no context at all).
        mask: (Qpad, ctx + Qpad) bool (or uint8), True = may attend. Context columns are in the
            kernel's load order (``host.dense.masks.reorder_context_mask``); the last Qpad columns are
            the active mask, which must be causal in the flat order (column <= row), as
            ``host.dense.masks.active_mask`` is -- the kernel skips the active keys above the diagonal.
        softmax_scale: float, default 1/sqrt(d).
        mixed_precision: True: bf16 matmul inputs and probabilities, fp32 scores, statistics and
            output accumulator. False: the input dtype for matmul inputs, probabilities and the
            output accumulator; scores and the (m, l) statistics stay fp32 (PSUM is fp32, and
            the masking sentinels do not fit fp16).
        LARGE_TILE_SZ: LT.
        out: the output, an HBM ``ops.ndarray(output_shape(query), query.dtype,
            buffer=ops.SHARED_HBM)`` allocated by the calling jitted kernel; every element
            is written.
        load_kv: the KV-tile loader, called as ``load_kv(ops, kv_flat, rows, j, n_loads=nL,
            tiled_block_size=b', head_size=d, kernel_dtype=kd) -> (k_tile, v_tile)`` with the
            signature and output layout of ``nki_kernels.dense.kv_load.load_kv_tile`` (hook for
            per-block baselines).
        p_transpose: how P is transposed for the PV matmul: "auto" (DMA transpose on gen3+ when
            the kernel dtype has 2 bytes, as vLLM's kernel: one per 128-key block on the legacy
            API, one per step on the current API; TensorE otherwise), "dma" (gen3+, 2-byte
            kernel dtype only) or "pe" (TensorE through PSUM; any target). A knob for
            benchmarks: the jit entry always uses "auto".

    Returns:
        ``out``: (1, H, Qpad, d) in query.dtype. A row whose mask is all False is exactly 0.

    Raises:
        ValueError: any shape / dtype / range violation above, naming the argument.
        NotImplementedError: kv_cache dtype different from the query dtype (e.g. fp8 caches),
            or a transformed block table over BLOCK_TABLE_BUDGET_BYTES per partition.
    Warns:
        nki_kernels.sbuf_plan.SbufBudgetWarning: the SBUF working set exceeds the target's
            usable SBUF even with one Q tile per group (fp32 kernel dtype at LT = 8192).

    Pseudocode:
      for each KV head (legacy: this program's; current: all, or this core's, in a loop):
        rows = load_block_tables(block_tables, head)          # (128, nL * n_tiles) flat-cache rows
        for each group of Q tiles whose state fits the SBUF plan (usually one group):
            -m, l, o = -M_FLOOR, 0, 0; Qs = scale * Q   for every slot (Q tile i, query head g)
            for j in sequential_range(n_tiles):               # context: one KV load per KV head
                K, V = load_kv(kv_flat, rows, j)               # nL indirect DMAs each for K and V
                Vf = finite_values(V)             # non-finite value rows -> 0, + a fault column
                for i, g, step s of <= 2048 keys:
                    flash_attention_tile(Qs[i, g], K[:, s], Vf[:, s], mask[i, tile j][:, s], state[i, g])
            for active window w (<= 2048 keys):               # new tokens, causal tile skipping
                for i with (i+1)*128 > w0, g: flash_attention_tile(Qs[i, g], K_w, finite_values(V_w),
                                                   mask[i, ctx + w0 : ctx + min(w0+2048, (i+1)*128)])
            out[i, g] = o / max(l, L_FLOOR), NaN where the row's fault sum > 0
    """
    # Step 0: validate inputs and derive the geometry (plain Python on shapes and dtypes).
    cfg = _check_inputs(query, key, value, kv_cache, block_tables, mask, softmax_scale,
                        mixed_precision, LARGE_TILE_SZ)
    Hkv = cfg.Hkv
    ops.check_head_grid(KERNEL, Hkv, query_parts=True)
    dma_t_ok = ops.nc_gen() != "gen2" and itemsize(cfg.kernel_dtype) == 2
    kernel_check(p_transpose in ("auto", "pe") or (p_transpose == "dma" and dma_t_ok), KERNEL,
                 "p_transpose", "be 'auto', 'pe', or 'dma' (gen3 with a 2-byte kernel dtype)",
                 p_transpose)
    kernel_check(tuple(out.shape) == (1, cfg.H, cfg.Qpad, cfg.d)
                 and dtype_name(out.dtype) == dtype_name(query.dtype), KERNEL, "out",
                 f"be a {(1, cfg.H, cfg.Qpad, cfg.d)} {dtype_name(query.dtype)} HBM tensor",
                 (tuple(out.shape), dtype_name(out.dtype)))
    # Q tiles per group: the group's online-softmax state and scaled Q stay in SBUF next to the
    # KV working set (nki_kernels.sbuf_plan); each group re-reads the KV tiles (one group in the
    # common case, e.g. up to 10 Q tiles for G = 8, d = 128).
    q_per_group = q_tiles_per_group(
        nc_gen="gen2" if ops.nc_gen() == "gen2" else "gen3",
        n_q_tiles=cfg.Qpad // B_P_SIZE, heads_per_kv=cfg.G, large_tile=LARGE_TILE_SZ,
        head_size=cfg.d, tiled_block_size=cfg.bp, kernel_itemsize=itemsize(cfg.kernel_dtype),
        acc_itemsize=itemsize(cfg.acc_dtype),
        cache_itemsize=itemsize(kv_cache.dtype), table_bytes=cfg.n_loads * cfg.n_tiles * 4,
        kernel=KERNEL)
    run = _Run(cfg=cfg, LT=LARGE_TILE_SZ, use_dma_t=dma_t_ok and p_transpose != "pe",
               q_per_group=q_per_group, load_kv=load_kv)
    args = (query, key, value, kv_cache, block_tables, mask, out)
    core, cores = ops.launch_core()
    odd = Hkv % cores                  # current API, LNC=2, odd Hkv: the last head by Q tiles
    part, parts = ops.query_part()     # legacy API, LNC=2, odd Hkv: every head by Q tiles
    for head in ops.kv_heads(Hkv - odd):            # LNC=2: each core its half of the rest
        _head(ops, run, head, *args, q_part=(part, parts) if parts > 1 else None)
    if odd:
        _head(ops, run, Hkv - 1, *args, q_part=(core, cores))
    return out


@dataclass(frozen=True)
class _Run:
    """What every KV head of a launch shares: the geometry, LARGE_TILE_SZ, the P-transpose
    path, the Q tiles per group, the loader."""

    cfg: DenseGeometry
    LT: int
    use_dma_t: bool
    q_per_group: int
    load_kv: Any


def _head(ops, run, head, query, key, value, kv_cache, block_tables, mask, out, q_part=None):
    """Every Q-tile group of one KV head (the body of :func:`flash_paged_attention_body`), or
    with ``q_part = (core, 2)`` this core's half of its Q tiles: ``ceil(n_q / 2)`` tiles from
    tile ``core * (n_q - ceil(n_q / 2))`` (an odd n_q's middle tile on both cores, which store
    the same values); the first tile enters the HBM offsets of the Q, mask and output accesses
    (``nl.program_id`` arithmetic, as ``ops.head_rows``), and the new tokens' causal skipping
    is decided for the later core's tiles (the earlier core's extra keys are masked)."""
    cfg, LT = run.cfg, run.LT
    kd, acc = getattr(ops, cfg.kernel_dtype), getattr(ops, cfg.acc_dtype)   # the op layer's dtypes
    G, d, Qpad, n_tiles, ctx = cfg.G, cfg.d, cfg.Qpad, cfg.n_tiles, cfg.ctx
    P = B_P_SIZE
    n_q = Qpad // P
    q0 = q_last = 0                        # this core's first Q tile; the later core's (static)
    if q_part is not None:
        core, cores = q_part
        n_own = -(-n_q // cores)
        q0, q_last, n_q = core * (n_q - n_own), (cores - 1) * (n_q - n_own), n_own
    step = min(LT, STEP_KEYS)              # keys per online-softmax step (divides LT)
    q_per_group = run.q_per_group
    n_groups = (n_q + q_per_group - 1) // q_per_group
    f32 = ops.float32

    gen2 = ops.nc_gen() == "gen2"       # PE transposes spread non-finite values (finite.py)
    ones_d = None
    if gen2:
        ones_d = ops.sbuf((d, 1), kd)
        ops.memset(ones_d, 1.0)
    if n_tiles > 0:
        # Flat-cache rows of every large tile for this KV head: (128, nL * n_tiles) int32.
        # The head enters the row ids (legacy) or the gathers' HBM offset (current API).
        kv_flat, head_row = ops.head_rows(flat_kv_view(kv_cache, tiling_factor=cfg.T), head,
                                          cfg.T, cfg.Hkv)
        rows = load_block_tables(ops, block_tables, num_tiles=n_tiles, blocks_per_tile=cfg.M,
                                 tiling_factor=cfg.T, num_kv_heads=cfg.Hkv, head_row=head_row)

    for grp in ops.static_range(n_groups):         # static: the last group may be smaller
        i0 = grp * q_per_group
        nqg = min(q_per_group, n_q - i0)
        n_slots = nqg * G                          # slot s = ii * G + g  <->  Q tile i0 + ii, head g

        # Step 1: state (m = M_FLOOR, l = 0, o = 0) and the scaled, transposed Q of every slot.
        nm_buf = ops.sbuf((P, n_slots), f32)                          # -max
        ops.memset(nm_buf, -M_FLOOR)
        l_buf = ops.zeros((P, n_slots), f32)
        sw = value_stride(d)                                # o and the fault column per slot
        o_buf = ops.zeros((P, n_slots * sw), acc)
        q_buf = ops.sbuf((d, n_slots * P), kd)
        q_faults = ops.sbuf((P, n_slots), f32) if gen2 else None   # non-finite Q channels
        for ii in ops.parallel_range(nqg):
            for g in ops.parallel_range(G):
                q_raw = ops.sbuf((d, P), query.dtype)
                ops.load(q_raw, query[0, head * G + g, :, ops.ds((q0 + i0 + ii) * P, P)])
                q_slot = q_buf[:, ops.ds((ii * G + g) * P, P)]
                ops.tensor_scalar(q_slot, q_raw, "multiply", cfg.scale)
                if gen2:        # P's PE transposes would spread a non-finite query row
                    counts = finite_columns(ops, q_slot, ones_d, kernel_dtype=kd)
                    ops.copy(q_faults[:, ops.ds(ii * G + g, 1)], counts)

        # Step 2: context tiles -- every Q tile of the group against every context tile (the
        # mask removes other sequences' and padding tokens); one KV load per tile and group.
        if n_tiles > 0:
            for j in ops.sequential_range(n_tiles):
                k_tile, v_tile = run.load_kv(ops, kv_flat, rows, j, n_loads=cfg.n_loads,
                                             tiled_block_size=cfg.bp, head_size=d,
                                             kernel_dtype=kd)
                # non-finite value rows -> 0 and a fault flag (garbage-safe P V)
                v_seen = finite_values(ops, v_tile, head_size=d, kernel_dtype=kd)
                for ii in ops.parallel_range(nqg):
                    mask_tile = ops.sbuf((P, LT), mask.dtype)
                    ops.load(mask_tile, mask[ops.ds((q0 + i0 + ii) * P, P), ops.ds(j * LT, LT)])
                    for g in ops.parallel_range(G):
                        slot = ii * G + g
                        for st in ops.static_range(LT // step):    # online-softmax steps
                            flash_attention_tile(ops, q_buf[:, ops.ds(slot * P, P)], k_tile,
                                                 v_seen, mask_tile[:, ops.ds(st * step, step)],
                                                 o_buf, nm_buf, l_buf, slot, k_start=st * step,
                                                 width=step, kernel_dtype=kd,
                                                 use_dma_transpose=run.use_dma_t)

        # Step 3: active (new) tokens in windows of <= step keys. Causal tile skipping: Q tile i
        # only needs active keys < (i+1)*128, so windows starting at or past that are skipped
        # and the last needed window is cut at (i+1)*128. Static loops: widths differ.
        for w in ops.static_range((Qpad + step - 1) // step):
            w0 = w * step
            if (q_last + i0 + nqg) * P <= w0:
                continue                           # no Q tile of this group reaches window w
            wt = min(step, (q_last + i0 + nqg) * P - w0)
            k_act = ops.sbuf((d, wt), kd)
            ops.load_cast(k_act, key[0, head, :, ops.ds(w0, wt)])
            v_act = ops.sbuf((P, (wt // P) * d), kd)
            for c in ops.parallel_range(wt // P):
                ops.load_cast(v_act[:, ops.ds(c * d, d)], value[0, head, ops.ds(w0 + c * P, P), :])
            if gen2:            # the new tokens' K^T, element by element; faults into V
                poison_values(ops, v_act, finite_columns(ops, k_act, ones_d, kernel_dtype=kd),
                              head_size=d)
            v_act = finite_values(ops, v_act, head_size=d, kernel_dtype=kd)
            for ii in ops.static_range(nqg):
                n_keys = (q_last + i0 + ii + 1) * P
                if n_keys <= w0:
                    continue
                width = min(wt, n_keys - w0)
                mask_tile = ops.sbuf((P, width), mask.dtype)
                ops.load(mask_tile, mask[ops.ds((q0 + i0 + ii) * P, P), ops.ds(ctx + w0, width)])
                for g in ops.parallel_range(G):
                    slot = ii * G + g
                    flash_attention_tile(ops, q_buf[:, ops.ds(slot * P, P)], k_act, v_act,
                                         mask_tile, o_buf, nm_buf, l_buf, slot, k_start=0,
                                         width=width, kernel_dtype=kd,
                                         use_dma_transpose=run.use_dma_t)

        # Step 4: normalise and store. Fully masked rows have o = 0, l = 0 -> 0 / L_FLOOR = 0;
        # a row that saw a non-finite value (fault column > 0) is NaN, as in the reference.
        for ii in ops.parallel_range(nqg):
            for g in ops.parallel_range(G):
                slot = ii * G + g
                l_safe = ops.sbuf((P, 1), f32)
                ops.floored_divisors(l_safe, l_buf[:, ops.ds(slot, 1)], L_FLOOR)
                fault = o_buf[:, ops.ds(slot * sw + d, 1)]
                if gen2:
                    total = ops.sbuf((P, 1), f32)
                    ops.tensor_tensor(total, fault, q_faults[:, ops.ds(slot, 1)], "add")
                    fault = total
                clean = ops.sbuf((P, 1), f32)
                ops.tensor_tensor(clean, fault, 0.0, "equal")
                l_div = ops.sbuf((P, 1), f32)                 # NaN divisor for a faulty row
                ops.where(l_div, clean, l_safe, FAULT_NAN)
                out_tile = ops.sbuf((P, d), query.dtype)
                ops.divide_by(out_tile, o_buf[:, ops.ds(slot * sw, d)], l_div)
                ops.dma(out[0, head * G + g, ops.ds((q0 + i0 + ii) * P, P), :], out_tile)


def _is_pow2(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


def _check_inputs(query, key, value, kv_cache, block_tables, mask, softmax_scale,
                  mixed_precision, LARGE_TILE_SZ):
    """Validate every kernel input; return the derived :class:`DenseGeometry`."""
    ck = lambda cond, arg, constraint, got: kernel_check(cond, KERNEL, arg, constraint, got)  # noqa: E731
    ck(len(query.shape) == 4 and query.shape[0] == 1, "query.shape",
       "be (1, H, d, Qpad)", tuple(query.shape))
    _, H, d, Qpad = query.shape
    ck(dtype_name(query.dtype) in _FLOAT_DTYPES, "query.dtype",
       f"be one of {_FLOAT_DTYPES}", dtype_name(query.dtype))
    ck(1 <= d <= MAX_HEAD_SIZE, "query.shape[2] (head size d)", f"be in [1, {MAX_HEAD_SIZE}]", d)
    ck(Qpad >= B_P_SIZE and Qpad % B_P_SIZE == 0, "query.shape[3] (Qpad)",
       f"be a positive multiple of {B_P_SIZE} (pad the queries on the host)", Qpad)
    ck(len(kv_cache.shape) == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[4] == d,
       "kv_cache.shape", f"be (2, num_blocks, Hkv, block_size, d={d})", tuple(kv_cache.shape))
    _, N, Hkv, B, _ = kv_cache.shape
    ck(N >= 1 and Hkv >= 1, "kv_cache.shape", "have num_blocks >= 1 and Hkv >= 1",
       tuple(kv_cache.shape))
    ck(H % Hkv == 0, "query.shape[1] (H)", f"be a multiple of Hkv={Hkv} (kv_cache.shape[2])", H)
    ck(tuple(key.shape) == (1, Hkv, d, Qpad), "key.shape", f"be (1, Hkv, d, Qpad) = {(1, Hkv, d, Qpad)}",
       tuple(key.shape))
    ck(tuple(value.shape) == (1, Hkv, Qpad, d), "value.shape",
       f"be (1, Hkv, Qpad, d) = {(1, Hkv, Qpad, d)}", tuple(value.shape))
    for name, t in (("key", key), ("value", value)):
        ck(dtype_name(t.dtype) == dtype_name(query.dtype), f"{name}.dtype",
           f"equal query.dtype ({dtype_name(query.dtype)})", dtype_name(t.dtype))
    kernel_unsupported(dtype_name(kv_cache.dtype) == dtype_name(query.dtype), KERNEL,
                       f"a kv_cache of dtype {dtype_name(kv_cache.dtype)} with "
                       f"{dtype_name(query.dtype)} queries",
                       "cast the cache (or the queries) so both use the same dtype")
    ck(_is_pow2(B) and MIN_BLOCK_SIZE <= B <= MAX_BLOCK_SIZE, "kv_cache.shape[3] (block_size)",
       f"be a power of two in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]", B)
    ck(_is_pow2(LARGE_TILE_SZ) and MIN_LARGE_TILE <= LARGE_TILE_SZ <= MAX_LARGE_TILE,
       "LARGE_TILE_SZ", f"be a power of two in [{MIN_LARGE_TILE}, {MAX_LARGE_TILE}]", LARGE_TILE_SZ)
    M, T, bp, L, n_loads = tile_geometry(B, LARGE_TILE_SZ)
    ck(len(block_tables.shape) == 1, "block_tables.shape", "be 1-D (num_active_blocks,)",
       tuple(block_tables.shape))
    ck(dtype_name(block_tables.dtype) == "int32", "block_tables.dtype", "be int32",
       dtype_name(block_tables.dtype))
    nab = block_tables.shape[0]
    ck(nab % M == 0, "block_tables.shape[0] (num_active_blocks)",
       f"be a multiple of LARGE_TILE_SZ // block_size = {M} (context length a multiple of "
       f"LARGE_TILE_SZ)", nab)
    ctx = nab * B
    ck(N * Hkv * T < FP32_EXACT_INT, "kv_cache.shape",
       f"give num_blocks * Hkv * tiling_factor < 2**24 (block ids are transposed through fp32); "
       f"tiling_factor={T}", tuple(kv_cache.shape))
    table_bytes = n_loads * (ctx // LARGE_TILE_SZ) * 4
    kernel_unsupported(table_bytes <= BLOCK_TABLE_BUDGET_BYTES, KERNEL,
                       f"a transformed block table of {table_bytes} bytes per SBUF partition "
                       f"(num_active_blocks={nab}, block_size={B}, LARGE_TILE_SZ={LARGE_TILE_SZ}; "
                       f"limit {BLOCK_TABLE_BUDGET_BYTES})",
                       "use a larger block_size or split the batch into several launches")
    ck(len(mask.shape) == 2 and tuple(mask.shape) == (Qpad, ctx + Qpad), "mask.shape",
       f"be (Qpad, num_active_blocks*block_size + Qpad) = {(Qpad, ctx + Qpad)}", tuple(mask.shape))
    ck(dtype_name(mask.dtype) in ("bool", "uint8"), "mask.dtype", "be bool or uint8",
       dtype_name(mask.dtype))
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        ck(isinstance(softmax_scale, (int, float, np.floating, np.integer))
           and not isinstance(softmax_scale, bool) and math.isfinite(float(softmax_scale)),
           "softmax_scale", "be a finite real number or None", softmax_scale)
        scale = float(softmax_scale)
    ck(isinstance(mixed_precision, (bool, np.bool_)), "mixed_precision", "be a bool",
       mixed_precision)
    kd = "bfloat16" if mixed_precision else dtype_name(query.dtype)
    acc = "float32" if mixed_precision else dtype_name(query.dtype)
    return DenseGeometry(H=H, d=d, Qpad=Qpad, N=N, Hkv=Hkv, G=H // Hkv, B=B, M=M, T=T, bp=bp,
                         L=L, n_loads=n_loads, nab=nab, ctx=ctx, n_tiles=ctx // LARGE_TILE_SZ,
                         kernel_dtype=kd, acc_dtype=acc, scale=scale)
