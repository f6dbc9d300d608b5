"""Online-softmax step of the scheduled kernel: one Q block against <= 2048 keys of a KV tile.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first). Query rows are on partitions (``rows`` <= 128: a decode block packs
the G query heads x new tokens of ONE sequence; a prefill block is 128 rows), keys on the free
axis. Compared with ``nki_kernels.dense.flash_core`` this step reads the scores straight from PSUM
when no mask is needed, builds a mask from two fp32 numbers per row when one is, supports head
sizes up to 512 (QK^T accumulated over 128-channel slices in PSUM) and an optional logit
soft-cap, and keeps the state of a block as ``d + 2`` fp32 columns of one SBUF tile.

State columns of a block (``st[:, col0 : col0 + d + 2]``, fp32): o (d, un-normalised output),
-m (negated running max), l (running sum of exp(s - m)). Masked scores become
NEG_MASK / mult (mult = soft-cap or 1) so that exp(mult * NEG - m) is exactly 0 for every row
(``nki_kernels.constants``: m starts at M_FLOOR > NEG_MASK).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nki_kernels.contract import NEG_MASK, PARTITIONS, PSUM_BANK_F32
from nki_kernels.ops import dtype_name
from nki_kernels.scheduled.sched_range import natural_keys, natural_order, range_masked
from nki_kernels.tile_ops import identity_tile, transpose_bank_cols, transpose_blocks

P = PARTITIONS
# Masks are built against key index k + 1/2 so that integer indices never sit on a bound.
HALF = 0.5
# 128-key blocks of P per SBUF -> SBUF DMA transpose (StepConfig.probs_by_dma): 8 blocks of a
# 16-bit P move 2 KiB per partition, the descriptor size from which the DMA engines run at
# their full rate (nki_sim.cost_constants ``dma_small_descriptor_bytes``); 4 blocks (1 KiB)
# cost the prefill-only batches more DMA time than they save on ScalarE and TensorE (MODELED).
P_DMA_BLOCKS = 8


@dataclass(frozen=True)
class StepConfig:
    """Static configuration of the online-softmax steps of one kernel phase.

    d: value head size (columns of o; the key head size is that of the q / k slices).
    kernel_dtype: matmul-input / probability dtype.  soft_cap: None or c > 0.
    v_stride: columns between V chunks (None: d; e.g. an MLA entry size when K and V are the
        same gathered rows).
    windowed: False promises that every row's visible range starts at or before each tile (no
        sliding window): masks then test the upper bound only (``SchedOptions.windowed``, the
        same flag; the host sets it from ``sliding_window``).
    tiled_block_size: b' of the tile's rows (lets masked query-rows steps use range_select on
        NeuronCore-v3); None: never.
    p_evac: engine name(s) of the P^T PSUM -> SBUF copies (``tile_ops.transpose_blocks``).
    side_engine: "vector" puts the keys-on-partitions step's |x| (window mask) on VectorE
        (``ops.absolute``); None: the op layer's default (ScalarE on the current API). A kernel
        whose ScalarE is the busier engine (MLA) passes "vector".
    copy_engine: engine name of the keys-on-partitions step's small PSUM -> SBUF copies (its PV
        and its broadcast bounds); None: the compiler's choice. A kernel whose K^T
        arrives by DMA transpose leaves ScalarE idle, so it passes "scalar" to offload VectorE.
    state_engine: engine of the step's small SBUF-only state operations, the new running max
        -m' = min(-mult * max, -m) and its copy into the state (bit-exact fp32 on any engine):
        "gpsimd" (the default), which the steps otherwise leave to descriptor generation, off
        VectorE / ScalarE; None: the compiler's choice for -m' (VectorE) and ``copy_engine`` for
        the copy, for a phase whose GpSimd already zeroes every item's tiles.
    probs_by_dma: P^T of a step in tiled key order with at least :data:`P_DMA_BLOCKS` 128-key
        blocks by SBUF -> SBUF DMA transposes (:data:`P_DMA_BLOCKS` blocks per DMA) instead of
        PE transposes and their PSUM copies, where the API offers them
        (``ops.has_sbuf_dma_transpose``: current API, NeuronCore-v3+). Natural-order steps
        (``sched_range.natural_order``) keep the PE transposes. The host sets it for batches
        without a decode class (DMA has room there; a decode class streams the cache).
    pairwise_max: a step of several 512-key chunks folds the chunks' row maxima with
        ``tensor_scalar`` maxima on ``state_engine`` (two tiny passes for 4 chunks) instead of
        one VectorE reduce (and on NeuronCore-v3 without P^T by DMA its full steps send one
        P^T copy in two to VectorE, ``sched_item.P_EVAC_GEN3_FOLDED``). The host sets it with
        ``probs_by_dma`` (GpSimd has room without a decode class; with one, its V fills and
        descriptor generation keep it the busier engine). MODELED, prefill 2K on 2K: trn2
        current API 4020 -> 3755 us; 2 chunks + 30 decodes on trn2 1772 -> 1794 with it.
    distance_engine: engine of the additive mask's distance pass without a window (masked
        steps on NeuronCore-v2, :func:`additive_mask_ok`; SBUF operands only): None (the
        default) a ScalarE relu, which holds neither shared port of NeuronCore-v2; "gpsimd" a
        ``tensor_scalar`` (t - top) max 0 on GpSimd, the same values, which takes VectorE's
        turn on SBUF (MODELED with the shared ports, 4 x 512 + 60 decodes trn1: GpSimd 11125
        us, ScalarE 10396, both with ``max_evacuates``).
    max_evacuates: the row max of a chunk whose scores are still in PSUM also copies them to
        SBUF (VectorE ``ops.scalar_reduce``, one instruction) and the exponentials read that copy:
        PSUM is read once per score instead of twice. ``sched_item.fold_tile`` sets it on
        NeuronCore-v2, whose VectorE and ScalarE take turns on PSUM (MODELED, prefill 2K on
        2K trn1 6261 -> 5511 us); on v3 it would only add VectorE work.
    """

    d: int
    kernel_dtype: Any
    soft_cap: float | None = None
    v_stride: int | None = None
    windowed: bool = True
    tiled_block_size: int | None = None
    p_evac: Any = None
    copy_engine: str | None = None
    side_engine: str | None = None
    state_engine: str | None = "gpsimd"
    probs_by_dma: bool = False
    pairwise_max: bool = False
    distance_engine: str | None = None
    max_evacuates: bool = False

    @property
    def state_copy_engine(self):
        """Engine of the -m' copy into the state: ``state_engine``, else ``copy_engine``."""
        return self.state_engine or self.copy_engine


@dataclass(frozen=True)
class KVTile:
    """One KV tile on chip: ``k_t`` nd SBUF tiles ``(dk, W)`` (K^T, column order of
    :func:`key_index_tile`); ``v_rows`` SBUF ``(128, ...)`` with V chunk u (keys ``u*128 + p``
    in column order) at columns ``[u*v_stride, u*v_stride + d)``; ``v_overlay`` None or a second
    V tile of ``v_rows``' layout added into every PV product; ``kidx`` the key-index tile of
    masked / ALiBi steps (:func:`key_index_tile` or ``sched_decode.key_index_columns``) or None;
    ``mask_eye`` None or :func:`mask_eye_tile` (masked query-rows steps then add their mask to
    the scores on TensorE, :func:`additive_mask_ok`); ``ones`` None or a ``(128, 2)`` tile of
    ones in the kernel dtype (query-rows steps with d + 2 <= 512 then take the row sums on
    TensorE, ``P 1`` beside ``P V``, instead of the exponentials' ScalarE accumulators)."""

    k_t: Any
    v_rows: Any
    v_overlay: Any = None
    kidx: Any = None
    mask_eye: Any = None
    ones: Any = None


# The mask_eye diagonal: every masked key has a distance of at least 1/2 past its row's bounds
# (bounds sit on half-integers), so its score moves by at most 2 * NEG_MASK * 1/2 = NEG_MASK.
MASK_EYE_VALUE = 2.0 * NEG_MASK


def additive_mask_ok(ops, cfg: "StepConfig") -> bool:
    """Whether masked query-rows steps of ``cfg`` may add their mask to the scores in PSUM
    (TensorE: :func:`mask_eye_tile` times the keys' distances past the row's bounds) instead of
    a VectorE select: no soft-cap (the mask must follow the tanh), no range_select path (NeuronCore-v3
    selects and reduces in one pass), and a kernel dtype with fp32's exponent range (bfloat16
    or float32: the diagonal ``MASK_EYE_VALUE`` must be finite). The caller guarantees that every
    key of the tile has a finite score (K rows no DMA writes are zeros)."""
    return (cfg.soft_cap is None
            and not (cfg.tiled_block_size is not None and ops.has_range_select())
            and dtype_name(cfg.kernel_dtype) in ("bfloat16", "float32"))


def mask_eye_tile(ops, rows, dtype):
    """SBUF ``(rows, rows)`` in ``dtype``: ``MASK_EYE_VALUE`` on the diagonal, 0 elsewhere (the
    stationary operand that adds ``MASK_EYE_VALUE * R`` onto a scores PSUM tile)."""
    eye = identity_tile(ops, rows, ops.float32)
    out = ops.sbuf((rows, rows), dtype)
    ops.tensor_scalar(out, eye, "multiply", MASK_EYE_VALUE)
    return out


def key_index_tile(ops, rows, loads, tiled_block_size):
    """SBUF fp32 ``(rows, W)``, W = loads*128*b': column ``c = l*128*b' + s*128 + p`` holds the
    tile-local key index ``(l*128 + p)*b' + s`` of the key it carries (same on every row)."""
    bp = tiled_block_size
    W = loads * P * bp
    kidx = ops.sbuf((rows, W), ops.float32)
    for l in ops.static_range(loads):
        for s in ops.static_range(bp):
            ops.iota(kidx[:, ops.ds(l * P * bp + s * P, P)], step=bp, offset=l * P * bp + s)
    return kidx


def flash_step(ops, cfg: StepConfig, q_slices, tile: KVTile, st, col0, *, k0, width, bounds=None,
               alibi=None, derived=None):
    """Fold keys ``[k0, k0 + width)`` of the tile into one block's state.

    Args:
        q_slices: nd SBUF tiles ``(dk, rows)`` kernel_dtype: Q^T of the block, pre-scaled by the
            softmax scale (channel slice k holds channels [128k, 128k + dk)).
        tile: the :class:`KVTile`.
        st: SBUF ``(rows, ...)`` fp32 state tile; this block's columns start at ``col0``.
        k0, width: first key column and width (multiples of 512, width <= 2048).
        bounds: None (no mask) or ``(c, r)``, two ``(rows, 1)`` fp32 tiles: row i sees tile-local
            key t iff ``|t - c_i| < r_i``.
        alibi: None or ``(slope, off)``, two ``(rows, 1)`` fp32 tiles: scores get
            ``slope * t + off`` added (t = tile-local key index from ``tile.kidx``), before the
            soft-cap.
        derived: None or this block's columns of :func:`step_bounds` (the per-row values the
            step's mask form derives from ``bounds``, computed once per item for every block
            and step), for the range form optionally its ``sched_range.OffsetBounds``; None: derived
            here.
    On NeuronCore-v3 (``ops.has_range_select()``) with ``cfg.tiled_block_size``, a masked step
    selects and takes the row max with ``range_select`` (``sched_range``) instead of a distance
    pass, a select pass and a max pass: in natural key order (``sched_range.natural_order``:
    the QK matmul reads K^T through ``natural_keys``, the P^T transposes read P back with a
    stride of b') ONE pass per 512-key chunk, otherwise one per 128-key block. With
    ``tile.mask_eye`` (:func:`additive_mask_ok`) a masked step adds
    ``MASK_EYE_VALUE * R`` to the scores on TensorE instead, ``R`` = the distance of each key
    past the row's bounds (0 for a key the row sees, >= 1/2 otherwise; one ScalarE relu pass, two
    with a window): a masked score is then <= NEG_MASK (+ the score), and the max is the plain
    PSUM reduce.

    Pseudocode:
        S = q^T k  (PSUM, 512 columns per chunk; summed over channel slices)
        S = S + slope * kidx + off                                    (ALiBi only)
        U = tanh(S / cap) if soft_cap else S;  mult = cap or 1        (score = mult * U)
        U = where(|kidx - c| < r, U, NEG_MASK / mult)                 (masked steps only;
                                                                       not windowed: kidx < c + r + 1/2;
                                                                       v3: range_select, fp32.min)
        -m' = min(-m, -mult * rowmax(U));  alpha = exp(m - m')
        P = exp(mult * U - m') (kernel dtype), rs = rowsum (fp32)     [ScalarE, fused;
                                                                       tile.ones: rs = P 1, TensorE]
        l = alpha * l + rs;  o = alpha * o + P V  (P^T by PE transposes or DMA transposes:
                                                   ``cfg.probs_by_dma``; PV accumulated in PSUM)
    """
    f32, d, kidx = ops.float32, cfg.d, tile.kidx
    rows = q_slices[0].shape[1]
    nd = len(q_slices)
    n_c = width // PSUM_BANK_F32
    mult = float(cfg.soft_cap) if cfg.soft_cap is not None else 1.0
    form = mask_form(ops, cfg, tile) if bounds is not None else None
    natural = form == "range" and natural_order(ops, cfg.tiled_block_size, width)
    bp = cfg.tiled_block_size
    # Step 1: scores per 512-column chunk in PSUM (fp32); natural order: keys k0 + 512c + t.
    src = []
    for c in ops.static_range(n_c):
        ps = ops.psum((rows, PSUM_BANK_F32), f32)
        for k in ops.static_range(nd):      # the first slice starts the PSUM accumulation
            n0 = k0 + c * PSUM_BANK_F32
            keys = (natural_keys(ops, tile.k_t[k], bp, n0) if natural
                    else tile.k_t[k][:, ops.ds(n0, PSUM_BANK_F32)])
            ops.matmul(ps, q_slices[k], keys, accumulate=k > 0)
        src.append(ps)
    if form is not None and derived is None:
        derived = step_bounds(ops, cfg, form, bounds[0], bounds[1])
    ranged = form == "range"
    if form == "additive":
        _add_mask(ops, src, derived, kidx, k0, width, rows, cfg.windowed, tile.mask_eye,
                  engine=cfg.distance_engine)
        bounds = None           # the scores are masked already
    # Step 2: optional ALiBi bias (ScalarE + VectorE pass), soft-cap (one ScalarE pass) and mask
    # (ScalarE |t - c| + 2 VectorE passes).
    whole = None        # the SBUF (rows, width) tile whose chunk slices ``src`` is, if any
    if alibi is not None:
        bias = ops.sbuf((rows, width), f32)
        ops.activation(bias, "copy", kidx[:, ops.ds(k0, width)], scale=alibi[0], bias=alibi[1])
        biased = []     # tiles of their own: a range select reads 128-column parts of them
        for c in range(n_c):
            b_c = ops.sbuf((rows, PSUM_BANK_F32), f32)
            ops.tensor_tensor(b_c, src[c], bias[:, ops.ds(c * PSUM_BANK_F32, PSUM_BANK_F32)], "add")
            biased.append(b_c)
        src = biased
    n_k = width // P
    mx = None
    if ranged:
        whole = ops.sbuf((rows, width), f32)   # from PSUM or the ALiBi tiles: once per chunk
        src, mx = range_masked(ops, src, derived, k0=k0, rows=rows, soft_cap=cfg.soft_cap,
                               natural=natural, kidx=kidx, bp=bp, out=whole)
    elif cfg.soft_cap is not None or bounds is not None:
        seen = None
        if bounds is not None and not cfg.windowed:
            # every row's range starts at or before the tile (no window): t < hi = c + r + 1/2,
            # i.e. relu(c + r - t) > 0 for integer t -- one ScalarE pass, a float predicate
            (top,) = derived
            seen = ops.sbuf((rows, width), f32)
            ops.activation(seen, "relu", kidx[:, ops.ds(k0, width)], bias=top, scale=-1.0)
        elif bounds is not None:
            (neg_c,) = derived
            dist = ops.sbuf((rows, width), f32)
            ops.activation(dist, "abs", kidx[:, ops.ds(k0, width)], bias=neg_c, scale=1.0)
            seen = ops.sbuf((rows, width), ops.PRED)
            ops.tensor_tensor(seen, dist, bounds[1], "less")
        if cfg.soft_cap is not None:
            whole, capped = _chunk_slices(ops, rows, n_c)
            for c in ops.static_range(n_c):
                ops.activation(capped[c], "tanh", src[c], scale=1.0 / mult)
            src = capped
        if seen is not None:
            whole, sel = _chunk_slices(ops, rows, n_c)
            for c in ops.static_range(n_c):
                ops.where(sel[c], seen[:, ops.ds(c * PSUM_BANK_F32, PSUM_BANK_F32)], src[c],
                          NEG_MASK / mult)
            src = sel
    # Step 3: running max (kept negated) and the rescale factor.
    if mx is None:
        mx = ops.sbuf((rows, n_c), f32)
        if cfg.max_evacuates and whole is None and alibi is None:  # scores still in PSUM
            whole, scores = _chunk_slices(ops, rows, n_c)
            for c in ops.static_range(n_c):
                ops.scalar_reduce(scores[c], src[c], "multiply", 1.0, "max",
                                  mx[:, ops.ds(c, 1)])
            src = scores
        elif whole is not None and n_c > 1:   # the chunks' maxima in one (rows, n_c, 512) reduce
            ops.tensor_reduce(mx, "max", ops.free_view(whole, ((PSUM_BANK_F32, n_c),
                                                               (1, PSUM_BANK_F32))), axis=(2,))
        else:
            for c in ops.static_range(n_c):
                ops.tensor_reduce(mx[:, ops.ds(c, 1)], "max", src[c], axis=(1,), keepdims=True)
    nm_prev, nm_new, alpha = new_max(ops, st, col0 + d, mx, mult, engine=cfg.state_engine,
                                     pairwise=cfg.pairwise_max)
    # Step 4: probabilities (and, unless TensorE sums them, their row sums) in one ScalarE pass
    # per PSUM chunk, or one over the step when the values are in SBUF (``whole``): a PSUM
    # access stays inside its bank, an SBUF one does not, and each instruction saved is its
    # static overhead.
    pe_sums = tile.ones is not None and d + 2 <= PSUM_BANK_F32
    probs = ops.sbuf((rows, width), cfg.kernel_dtype)
    row_sum = None
    if whole is not None and pe_sums:
        ops.activation(probs, "exp", whole, bias=nm_new, scale=mult)
    elif whole is not None:
        row_sum = ops.sbuf((rows, 1), f32)
        ops.activation(probs, "exp", whole, bias=nm_new, scale=mult, row_sum=row_sum)
    elif pe_sums:
        for c in ops.static_range(n_c):
            ops.activation(probs[:, ops.ds(c * PSUM_BANK_F32, PSUM_BANK_F32)], "exp", src[c],
                           bias=nm_new, scale=mult)
    else:
        rs = ops.sbuf((rows, n_c), f32)
        for c in ops.static_range(n_c):
            ops.activation(probs[:, ops.ds(c * PSUM_BANK_F32, PSUM_BANK_F32)], "exp", src[c],
                           bias=nm_new, scale=mult, row_sum=rs[:, ops.ds(c, 1)])
        row_sum = ops.sbuf((rows, 1), f32)
        ops.tensor_reduce(row_sum, "add", rs, axis=(1,), keepdims=True)
    # Step 5: P^T (keys on partitions; 128-key chunk u at columns [u*rows, (u+1)*rows)), then
    # P V accumulated over the chunks in one PSUM tile (with pe_sums: P 1 beside it, columns
    # d and d + 1, the row sums of the kernel-dtype probabilities that P V adds up).
    probs_t = ops.sbuf((P, n_k * rows), cfg.kernel_dtype)
    by_dma = 0
    if (cfg.probs_by_dma and not natural and n_k >= P_DMA_BLOCKS
            and ops.has_sbuf_dma_transpose(cfg.kernel_dtype)):
        by_dma = n_k // P_DMA_BLOCKS * P_DMA_BLOCKS
        for u in ops.static_range(n_k // P_DMA_BLOCKS):
            ops.transpose_on_dma(probs_t, u * P_DMA_BLOCKS * rows, probs, u * P_DMA_BLOCKS * P,
                                 P_DMA_BLOCKS)
    if by_dma < n_k:
        transpose_blocks(ops, probs_t, by_dma * rows, probs, by_dma * P, P, n_k - by_dma,
                         evac=cfg.p_evac, bank_cols=transpose_bank_cols(ops, probs.dtype),
                         interleave=bp if natural else 1)
    ext = ops.psum((rows, d + 2), f32) if pe_sums else None
    pv = ext[:, ops.ds(0, d)] if pe_sums else ops.psum((rows, d), f32)
    u0 = k0 // P
    vs = d if cfg.v_stride is None else cfg.v_stride
    v_tiles = (tile.v_rows,) if tile.v_overlay is None else (tile.v_rows, tile.v_overlay)
    for u in ops.static_range(n_k):     # the first product starts the PSUM accumulation
        p_u = probs_t[:, ops.ds(u * rows, rows)]
        if pe_sums:
            ops.matmul(ext[:, ops.ds(d, 2)], p_u, tile.ones, accumulate=u > 0)
        for i, vt in enumerate(v_tiles):
            ops.matmul(pv, p_u, vt[:, ops.ds((u0 + u) * vs, d)], accumulate=u > 0 or i > 0)
    # Step 6: state update (pe_sums: o, -m, l in one pass; -m, which got a row sum, rewritten).
    if pe_sums:
        sw = d + 2
        ops.scale_add(st[:, ops.ds(col0, sw)], st[:, ops.ds(col0, sw)], alpha, ext)
        ops.copy(st[:, ops.ds(col0 + d, 1)], nm_new, engine=cfg.state_copy_engine)
        return
    update_state(ops, st, col0, d, alpha=alpha, row_sum=row_sum, nm_new=nm_new, pv=pv,
                 copy_engine=cfg.state_copy_engine)


def _chunk_slices(ops, rows, n_c):
    """A new SBUF ``(rows, n_c * 512)`` fp32 tile and its n_c 512-column slices (one step's
    chunks side by side, so that one instruction can read them all)."""
    t = ops.sbuf((rows, n_c * PSUM_BANK_F32), ops.float32)
    return t, [t[:, ops.ds(c * PSUM_BANK_F32, PSUM_BANK_F32)] for c in range(n_c)]


def _add_mask(ops, src, derived, kidx, k0, width, rows, windowed, mask_eye, engine=None):
    """Masked step with :func:`mask_eye_tile`: ``R = relu(kidx - (c + r))`` (no window; on
    ``engine`` as a ``tensor_scalar`` (t - top) max 0, None: a ScalarE relu) or
    ``relu(|kidx - c| - r)`` (two ScalarE passes) in ``mask_eye``'s dtype (0 stays 0 and a
    distance >= 1/2 stays >= 1/2 under any rounding), then per 512-key chunk one matmul adds
    ``mask_eye^T R`` = ``MASK_EYE_VALUE * R`` onto the chunk's scores in PSUM (a visible key
    gets exactly +0). ``derived``: the additive form of :func:`step_bounds`."""
    f32 = ops.float32
    far = ops.sbuf((rows, width), mask_eye.dtype)
    keys = kidx[:, ops.ds(k0, width)]
    if windowed:
        neg_c, neg_r = derived
        dist = ops.sbuf((rows, width), f32)
        ops.activation(dist, "abs", keys, bias=neg_c, scale=1.0)
        ops.activation(far, "relu", dist, bias=neg_r, scale=1.0)
    else:       # every row's range starts at or before the tile: only t >= c + r + 1/2 is masked
        (neg_top,) = derived
        if engine is None:
            ops.activation(far, "relu", keys, bias=neg_top, scale=1.0)
        else:               # SBUF operands only: max(t - top, 0), the same fp32 value rounded
            ops.tensor_scalar(far, keys, "add", neg_top, op1="maximum", operand1=0.0,
                              engine=engine)
    for c in ops.static_range(len(src)):
        ops.matmul(src[c], mask_eye, far[:, ops.ds(c * PSUM_BANK_F32, PSUM_BANK_F32)],
                   accumulate=True)


def mask_form(ops, cfg: StepConfig, tile: KVTile) -> str:
    """How a masked query-rows step of ``cfg`` masks: ``"range"`` (NeuronCore-v3 range select,
    ``sched_range.range_masked``), ``"additive"`` (the mask added on TensorE, :func:`_add_mask`) or
    ``"select"`` (a float predicate and a select)."""
    if cfg.tiled_block_size is not None and ops.has_range_select():
        return "range"
    if tile.mask_eye is not None and cfg.soft_cap is None:
        return "additive"
    return "select"


def step_bounds(ops, cfg: StepConfig, form: str, c, r):
    """The per-row values the masked steps of ``form`` (:func:`mask_form`) derive from bounds
    ``(c, r)`` -- ``(rows, n)`` fp32 tiles or views, so a caller derives the n blocks of an item
    at once, once for all its steps -- as a tuple of ``(rows, n)`` fp32 tiles:

        range                     (c - r + 1/2, c + r + 1/2)
        additive, no window       (-(c + r),)
        additive, window          (-c, -r)
        select, no window         (c + r,)
        select, window            (-c,)

    All exact (c and r are multiples of 1/2)."""
    f32, shape = ops.float32, tuple(c.shape)

    def new(a, b, op, then=None):
        t = ops.sbuf(shape, f32)
        ops.tensor_tensor(t, a, b, op)
        if then is not None:
            ops.tensor_tensor(t, t, then[1], then[0])
        return t

    if form == "range":
        return new(c, r, "subtract", ("add", HALF)), new(c, r, "add", ("add", HALF))
    if form == "additive" and not cfg.windowed:
        return (new(c, r, "add", ("multiply", -1.0)),)
    if form == "additive":
        return new(c, -1.0, "multiply"), new(r, -1.0, "multiply")
    if not cfg.windowed:
        return (new(c, r, "add"),)
    return (new(c, -1.0, "multiply"),)


def new_max(ops, st, col, partial_max, mult, engine=None, pairwise=False):
    """The running max after a step: ``partial_max`` (rows, n) fp32 holds row maxima of the
    step's (score / mult) values (reduced over n on VectorE, or with ``pairwise`` (an SBUF
    ``partial_max``) by maxima against its last columns on ``engine``, n -> n - 2 columns per
    pass; n = 1, a one-chunk step, is read
    as it is: MODELED, 4 x 512 + 60 decodes on trn2, whose prefill class has 512-key partial
    tiles, 6623 -> 6290 us); returns ``(nm_prev, nm_new, alpha)``, (rows, 1) fp32: the
    state's -m (column ``col`` of ``st``), ``-m' = min(-m, -mult * max)`` (on ``engine``;
    None: the compiler's choice) and ``alpha = exp(m - m')``."""
    rows = partial_max.shape[0]
    m_tile = partial_max          # one column (a one-chunk step): already the row max
    if partial_max.shape[1] > 1 and pairwise:
        while m_tile.shape[1] > 1:        # n -> max(n - 2, 1) columns per pass
            n = m_tile.shape[1]
            k = max(n - 2, 1)
            nxt = ops.sbuf((rows, k), ops.float32)
            rest = ({} if n == 2 else
                    dict(op1="maximum", operand1=m_tile[:, ops.ds(n - 1, 1)]))
            ops.tensor_scalar(nxt, m_tile[:, ops.ds(0, k)], "maximum", m_tile[:, ops.ds(k, 1)],
                              engine=engine, **rest)
            m_tile = nxt
    elif partial_max.shape[1] > 1:
        m_tile = ops.sbuf((rows, 1), ops.float32)
        ops.tensor_reduce(m_tile, "max", partial_max, axis=(1,), keepdims=True)
    nm_prev = st[:, ops.ds(col, 1)]
    nm_new = ops.sbuf((rows, 1), ops.float32)
    ops.tensor_scalar(nm_new, m_tile, "multiply", -mult, op1="minimum", operand1=nm_prev,
                      engine=engine)
    return nm_prev, nm_new, rescale_factor(ops, nm_prev, nm_new)


def new_max_of_negated(ops, st, col, neg_max):
    """:func:`new_max` of a step without soft-cap (mult = 1) whose ``neg_max`` (rows, n) fp32
    holds the NEGATED partial row maxima (``tensor_reduce(negate=True)``): ``-m' = min(-m,
    min_j neg_max[:, j])`` in one VectorE ``tensor_scalar_reduce`` (min against -m, min-reduced)
    instead of a reduce and a dependent tensor_scalar; returns ``(nm_prev, nm_new, alpha)``."""
    rows, n = neg_max.shape
    nm_prev = st[:, ops.ds(col, 1)]
    nm_new = ops.sbuf((rows, 1), ops.float32)
    clamped = ops.sbuf((rows, n), ops.float32)
    ops.scalar_reduce(clamped, neg_max, "minimum", nm_prev, "min", nm_new)
    return nm_prev, nm_new, rescale_factor(ops, nm_prev, nm_new)


def rescale_factor(ops, nm_prev, nm_new):
    """``alpha = exp(m - m') = exp(-(-m) + (-m'))``, (rows, 1) fp32."""
    alpha = ops.sbuf((nm_prev.shape[0], 1), ops.float32)
    ops.activation(alpha, "exp", nm_prev, bias=nm_new, scale=-1.0)
    return alpha


def update_state(ops, st, col0, d, *, alpha, row_sum, nm_new, pv, copy_engine=None, prev=None):
    """``l = alpha * l + row_sum``, ``-m = nm_new``, ``o = alpha * o + pv`` for one block's state
    columns ``st[:, col0 : col0 + d + 2]`` (o, -m, l; fp32; rows on partitions); the -m copy on
    ``copy_engine`` (None: the compiler's choice). ``prev``: the tile o and l are read from
    (None: ``st``)."""
    src = st if prev is None else prev
    l_col = src[:, ops.ds(col0 + d + 1, 1)]
    ops.tensor_scalar(st[:, ops.ds(col0 + d + 1, 1)], l_col, "multiply", alpha, op1="add",
                      operand1=row_sum)
    ops.copy(st[:, ops.ds(col0 + d, 1)], nm_new, engine=copy_engine)
    o_view = src[:, ops.ds(col0, d)]
    ops.scale_add(st[:, ops.ds(col0, d)], o_view, alpha, pv)
