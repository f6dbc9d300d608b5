"""The op layer on the current API (``import nki``, NKI 0.8 / Neuron SDK 2.34; trn2 / trn3).

One of the two modules that name an NKI package (the other is :mod:`nki_kernels.ops.legacy`);
the interface is documented in :mod:`nki_kernels.ops`. Every op is the documented
destination-passing call (``nisa.op(dst=..., ...)``; reference: the NKI 0.6 API stubs and the
0.7 / 0.8 release pages): string dtypes, engines and ALU operators by their ``nki`` names,
indirect DMAs through ``.ap(..., vector_offset=<(P, 1) int32 SBUF column>, indirect_dim=0)``
with ``oob_mode.skip``, strided and broadcast views through ``.ap`` patterns (stride 0
broadcasts), plain ``range`` loops, no ``mask=``, no SPMD grid (the kernel loops over its KV
heads), outputs in ``shared_hbm``. Where the current API lacks a legacy form the lowering is
spelled out next to the op (selects through ``tensor_copy_predicated`` with an integer
predicate, ``o / l`` as a reciprocal and a multiply, ``o * alpha + pv`` as one
``scalar_tensor_tensor``). docs/nki-compatibility-review.md lists each construct with its source.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.toolchain import load_current

nki, nl, nisa = load_current()

NAME = "nki"

float32, bfloat16, float16, int32, uint8 = nl.float32, nl.bfloat16, nl.float16, nl.int32, nl.uint8
float8_e4m3, float8_e5m2 = nl.float8_e4m3, nl.float8_e5m2
PRED = nl.uint8            # comparison results: the predicate dtype of tensor_copy_predicated
FLAG = nl.uint8            # 0 / 1 tiles built once and selected with
FP32_MIN = float(np.finfo(np.float32).min)      # range_select's required on_false_value

_ENGINES = {None: None, "scalar": nisa.engine.scalar, "vector": nisa.engine.vector,
            "gpsimd": nisa.engine.gpsimd}
_ALU = {"add": nl.add, "subtract": nl.subtract, "multiply": nl.multiply, "maximum": nl.maximum,
        "minimum": nl.minimum, "max": nl.maximum, "min": nl.minimum, "less": nl.less,
        "equal": nl.equal, "greater": nl.greater}
_ACT = {"exp": nl.exp, "tanh": nl.tanh, "abs": nl.abs, "relu": nl.relu, "copy": nl.copy}
_FLOAT_NAMES = ("float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2", "float8_e4m3fn")


def jit(fn):
    """The API's kernel decorator."""
    return nki.jit(fn)


# ---- allocation and views ---------------------------------------------------------------------
def sbuf(shape, dtype):
    return nl.ndarray(tuple(shape), dtype=dtype, buffer=nl.sbuf)


def psum(shape, dtype):
    return nl.ndarray(tuple(shape), dtype=dtype, buffer=nl.psum)


def zeros(shape, dtype):
    t = sbuf(shape, dtype)
    nisa.memset(dst=t, value=0.0)
    return t


# HBM tensors are created by the kernel function itself (outputs at its top level):
# ``ops.ndarray(shape, dtype=dt, buffer=ops.SHARED_HBM)``.
ndarray = nl.ndarray
SHARED_HBM = nl.shared_hbm      # outputs
PRIVATE_HBM = nl.private_hbm    # scratch


def ds(start, size):
    return slice(start, start + size)


def bitcast(t, dtype):
    return t.view(dtype)


def filled_as_words(shape, dtype, fill):
    """A new SBUF tile ``shape`` of ``dtype`` (1 or 2 bytes; ``shape[1]`` a whole number of
    32-bit words) written through its float32 view: ``fill(words)`` writes the (P, words) view.
    The tile itself is returned (not a view), so it takes ``.ap`` access patterns as any tile."""
    t = sbuf(shape, dtype)
    fill(t.view(nl.float32))
    return t


def free_view(t, dims, col0=0):
    """View of a 2-D on-chip tile ``t`` (P, F): partitions kept, free dims ``dims`` =
    ``((step, count), ...)`` in elements from column ``col0``; step 0 broadcasts. An ``.ap``
    pattern: the partition step is the storage's free size (``t.strides[0]``)."""
    pattern = [[t.strides[0], t.shape[0]]] + [[step, count] for step, count in dims]
    return t.ap(pattern, offset=t.offset + col0)


def _columns(t, n):
    """A (P, 1) column ``t`` broadcast to (P, n) (stride-0 view)."""
    return free_view(t, ((0, n),))


# ---- loops and programs -----------------------------------------------------------------------
def static_range(n):
    return range(n)


parallel_range = sequential_range = static_range


def kv_heads(num_kv_heads, item_parts=1):
    """The KV heads this launch runs: all; under LNC=2 (``nl.num_programs(0) == 2``) the Hkv / 2
    of core ``nl.program_id(0)`` (core c heads ``c * Hkv / 2 + j``), or all with ``item_parts``
    = 2 (each core its part of the items)."""
    cores = nl.num_programs(axes=0)
    if item_parts not in (1, cores):
        raise ValueError(f"a schedule in {item_parts} item parts needs a launch on "
                         f"{item_parts} cores; this one runs on {cores}")
    if cores == 1 or item_parts != 1:
        return range(num_kv_heads)
    if num_kv_heads % cores:
        raise NotImplementedError(f"a launch on {cores} cores splits its KV heads evenly; "
                                  f"Hkv = {num_kv_heads} is not a multiple of {cores}: use lnc=1 "
                                  "or a schedule in item parts")
    per = num_kv_heads // cores
    return [nl.program_id(axis=0) * per + j for j in range(per)]


def head_rows(table, head, rows_per_head, num_kv_heads):
    """Where KV head ``head`` enters the row ids of indirect gathers from ``table`` ``(2, R,
    F)`` (R = num_blocks * Hkv * rows_per_head rows, a head's rows ``rows_per_head`` apart
    within a block): ``(view, id_offset)``. Here the head enters the DMA's HBM offset (an access
    pattern's offset may be ``nl.program_id`` arithmetic; ``iota``'s is a constant): ``view`` =
    the rows of ``table`` from ``head * rows_per_head`` on (the same row count for every head),
    ``id_offset`` = None (the row ids carry no head term)."""
    n = table.shape[1] - (num_kv_heads - 1) * rows_per_head
    return table[:, head * rows_per_head:head * rows_per_head + n, :], None


def item_part(num_kv_heads, item_parts=1):
    """The part of every phase's items this program runs: its core when cut in parts, else 0."""
    del num_kv_heads
    return 0 if item_parts == 1 else nl.program_id(axis=0)


def launch_core():
    """``(core, cores)``: this physical core ``nl.program_id(0)`` and the launch's cores."""
    cores = nl.num_programs(axes=0)
    return (0 if cores == 1 else nl.program_id(axis=0)), cores


def query_part():
    """``(0, 1)``: a launch of this API splits its KV heads between its cores (:func:`kv_heads`);
    a kernel that splits an odd Hkv's last head by query tiles does so with :func:`launch_core`."""
    return 0, 1


def launch_grid(num_kv_heads, lnc=1, item_parts=1):
    """No SPMD grid: one launch covers every KV head (``lnc`` cores split them or the items)."""
    del num_kv_heads, lnc, item_parts
    return None


def max_lnc():
    """Physical cores one launch can use: 2 on NeuronCore-v3+ (LNC=2), 1 on v2."""
    return 1 if nc_gen() == "gen2" else 2


# ---- trace-time feature flags -----------------------------------------------------------------
def nc_gen():
    v = nisa.get_nc_version()
    for name in ("gen2", "gen3", "gen4"):
        if v == getattr(nisa.nc_version, name):
            return name
    return "gen3"


def has_range_select():
    return nc_gen() != "gen2"


def has_select_max():
    """Trace-time flag: :func:`where_max` (``select_reduce`` with a max reduction; every
    NeuronCore version of this API)."""
    return True


def has_oob_skip():
    return True


def transpose_psum_dtype(src_dtype):
    """PSUM dtype of a PE transpose: the source dtype (nc_transpose requires equal dtypes)."""
    return src_dtype


# ---- compute ----------------------------------------------------------------------------------
def _engine_kw(engine):
    return {} if engine is None else {"engine": _ENGINES[engine]}


def memset(dst, value, engine=None):
    nisa.memset(dst=dst, value=value, **_engine_kw(engine))


def iota(dst, *, step, offset=0, partition_step=0):
    """``dst[p, j] = offset + p * partition_step + j * step`` (2-D ``dst``)."""
    nisa.iota(dst=dst, pattern=[[step, dst.shape[1]]], offset=offset,
              channel_multiplier=partition_step)


def copy(dst, src, engine=None):
    """``dst = src`` (cast to ``dst``'s dtype). ``engine=None``: off VectorE, as the legacy
    ``nl.copy``: float tiles on ScalarE, ``activation(op=nl.copy)`` (every NeuronCore version;
    fp32 in between, exact for float data); an integer copy of one dtype between SBUF tiles on
    GpSimd (``tensor_copy``, bit-exact; ScalarE's fp32 would round values above 2^24); any other
    a VectorE ``tensor_copy`` (GpSimd has no PSUM access)."""
    if engine is None:
        if _is_float(src.dtype) and _is_float(dst.dtype):
            nisa.activation(dst=dst, op=nl.copy, data=src)
            return
        if src.dtype == dst.dtype and src.buffer != nl.psum and dst.buffer != nl.psum:
            nisa.tensor_copy(dst=dst, src=src, engine=nisa.engine.gpsimd)
            return
    nisa.tensor_copy(dst=dst, src=src, **_engine_kw(engine))


def _is_float(dtype):
    from nki_kernels.ops import dtype_name

    return dtype_name(dtype) in _FLOAT_NAMES


def activation(dst, func, data, *, bias=None, scale=1.0, row_sum=None):
    """``dst = func(data * scale + bias)``; ``row_sum``: a (P, 1) fp32 tile receiving the sum of
    each row (``activation_reduce``)."""
    if row_sum is None:
        nisa.activation(dst=dst, op=_ACT[func], data=data, bias=bias, scale=scale)
    else:
        nisa.activation_reduce(dst=dst, op=_ACT[func], data=data, reduce_op=nl.add,
                               reduce_res=row_sum, bias=bias, scale=scale)


def tensor_scalar(dst, data, op0, operand0, op1=None, operand1=None, reverse0=False,
                  engine=None):
    """``dst = (data op0 operand0) op1 operand1`` (operands numbers or (P, 1) columns) on
    ``engine`` (None: the compiler's choice; "gpsimd" for SBUF-only operands)."""
    kw = {}
    if op1 is not None:
        kw = {"op1": _ALU[op1], "operand1": operand1}
    nisa.tensor_scalar(dst=dst, data=data, op0=_ALU[op0], operand0=operand0, reverse0=reverse0,
                       **kw, **_engine_kw(engine))


def _is_column(b, a):
    return (not isinstance(b, (int, float)) and len(b.shape) == 2 and b.shape[1] == 1
            and tuple(a.shape) != tuple(b.shape))


def tensor_tensor(dst, a, b, op, engine=None):
    """Elementwise ``a op b``: ``b`` a tile of ``a``'s shape (a broadcast view is one), a (P, 1)
    column (``tensor_scalar``) or a Python number (``tensor_scalar``); ``engine``: None (the
    compiler's choice) or an engine name (SBUF operands only for "gpsimd")."""
    if isinstance(b, (int, float)) or _is_column(b, a):
        nisa.tensor_scalar(dst=dst, data=a, op0=_ALU[op], operand0=b, **_engine_kw(engine))
    else:
        nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=_ALU[op], **_engine_kw(engine))


def absolute(dst, src, engine=None):
    """``dst = |src|``: on ScalarE (an ``abs`` activation), or with ``engine="vector"`` one
    VectorE ``scalar_tensor_tensor`` pass max(-src, src) (exact) for kernels whose ScalarE is the
    busier engine."""
    if engine == "vector":
        nisa.scalar_tensor_tensor(dst=dst, data=src, op0=nl.multiply, operand0=-1.0,
                                  op1=nl.maximum, operand1=src)
        return
    nisa.activation(dst=dst, op=nl.abs, data=src)


def scale_add(dst, a, col, b):
    """``dst = a * col + b`` (``col`` a (P, 1) column): one ``scalar_tensor_tensor`` pass."""
    nisa.scalar_tensor_tensor(dst=dst, data=a, op0=nl.multiply, operand0=col, op1=nl.add,
                              operand1=b)


def floored_divisors(dst, cols, floor, engine=None):
    """What :func:`divide_by` divides by, for n (P, 1) columns at once: ``dst`` (P, n) fp32 =
    ``1 / max(cols, floor)`` (``cols`` may be strided): ``a * (1 / col)``, the reciprocal on
    ScalarE (its table holds 1/x for |x| in [2^-42, 2^42]); ``engine="vector"``: on VectorE
    (``nisa.reciprocal``), for kernels whose ScalarE is busier; "gpsimd": the floor there."""
    floored = sbuf(tuple(dst.shape), nl.float32)
    nisa.tensor_scalar(dst=floored, data=cols, op0=nl.maximum, operand0=floor,
                       **_engine_kw("gpsimd" if engine == "gpsimd" else None))
    if engine == "vector":
        nisa.reciprocal(dst=dst, data=floored)
        return
    nisa.activation(dst=dst, op=nl.reciprocal, data=floored)


def divide_by(dst, a, div, engine=None):
    """``dst = a / max(col, floor)`` for a (P, 1) column ``div`` of :func:`floored_divisors`:
    ``a * div`` on the compiler's engine (``engine="vector"`` / ``"gpsimd"`` pins it there;
    ``a`` and ``div`` in SBUF)."""
    nisa.tensor_scalar(dst=dst, data=a, op0=nl.multiply, operand0=div, **_engine_kw(engine))


def _predicate(pred):
    """An integer predicate: ``pred`` itself, or ``pred > 0`` of a float 0 / positive tile."""
    from nki_kernels.ops import dtype_name

    if dtype_name(pred.dtype) not in _FLOAT_NAMES:
        return pred
    p = sbuf(pred.shape, PRED)
    nisa.tensor_scalar(dst=p, data=pred, op0=nl.greater, operand0=0.0)
    return p


def where(dst, pred, on_true, on_false):
    """``dst = on_true where pred else on_false`` (a select: NaN in the unselected operand does
    not leak). ``pred``: an integer tile, or a float tile whose positive entries select;
    ``on_true``: a tile of ``dst``'s shape or a (P, 1) column; ``on_false``: a number or a tile
    (``dst`` itself: a predicated copy into it). A (P, 1) ``pred`` selects whole rows."""
    p = _predicate(pred)
    if tuple(p.shape) != tuple(dst.shape):
        p = _columns(p, dst.shape[1])
    if _is_column(on_true, dst):
        on_true = _columns(on_true, dst.shape[1])
    if isinstance(on_false, (int, float)):     # one pass: a select without its reduction
        nisa.select_reduce(dst=dst, predicate=p, on_true=on_true, on_false=float(on_false))
        return
    if on_false is not dst:
        nisa.tensor_copy(dst=dst, src=on_false)
    nisa.tensor_copy_predicated(dst=dst, src=on_true, predicate=p)


def where_max(dst, pred, on_true, on_false, row_max):
    """:func:`where` with a number ``on_false``, and ``row_max`` (P, 1) fp32 = the max of each row
    of ``dst``: one ``select_reduce`` (reset_reduce, maximum), the select's own reduction."""
    p = _predicate(pred)
    if tuple(p.shape) != tuple(dst.shape):
        p = _columns(p, dst.shape[1])
    nisa.select_reduce(dst=dst, predicate=p, on_true=on_true, on_false=float(on_false),
                       reduce_res=row_max, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                       reduce_op=nl.maximum)


class _Flags:
    def __init__(self, tile):
        self.tile = tile

    def column(self, i, rows):
        return self.tile[0:rows, i:i + 1]


def flags(src, col0, stride, count):
    """The 0 / 1 float columns ``col0 + i * stride`` (i < count) of ``src`` (P, F) as
    predicates: converted once (``src > 0`` into a uint8 (P, count) tile); ``.column(i, rows)``
    is flag column i of the first ``rows`` partitions."""
    p = sbuf((src.shape[0], count), PRED)
    nisa.tensor_scalar(dst=p, data=free_view(src, ((stride, count),), col0=col0), op0=nl.greater,
                       operand0=0.0)
    return _Flags(p)


def tensor_reduce(dst, op, data, axis, keepdims=False, negate=False):
    """``dst = op``-reduction of ``data`` over ``axis`` (VectorE); ``negate``: times -1."""
    nisa.tensor_reduce(dst=dst, op=_ALU[op], data=data, axis=axis, negate=negate, keepdims=keepdims)


def scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res):
    """``dst = data op0 operand0`` ((P, 1) or scalar operand0), ``reduce_res[p]`` = its row p's
    ``reduce_op`` (one VectorE ``tensor_scalar_reduce``)."""
    nisa.tensor_scalar_reduce(dst=dst, data=data, op0=_ALU[op0], operand0=operand0,
                              reduce_op=_ALU[reduce_op], reduce_res=reduce_res)


def range_select_max(dst, data, lo, hi, row_max, start=0):
    """``dst[p, j] = data[p, j]`` where ``lo[p] <= start + j < hi[p]`` else FP32_MIN;
    ``row_max[p]`` = the row max of ``dst`` (one reset-reduce instruction; NeuronCore-v3+;
    ``start`` a static int)."""
    nisa.range_select(dst=dst, on_true_tile=data, comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=lo, bound1=hi, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                      reduce_res=row_max, reduce_op=nl.maximum, range_start=start,
                      on_false_value=FP32_MIN)


def matmul(dst, stationary, moving, accumulate=False):
    """``dst (PSUM) = stationary.T @ moving``, added onto ``dst`` when ``accumulate`` (whose
    earlier content must come from a matmul)."""
    nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, accumulate=accumulate)


def transpose(dst, src):
    """PE transpose of ``src`` (SBUF) into ``dst`` (PSUM, ``src``'s dtype)."""
    nisa.nc_transpose(dst=dst, data=src)


def tensor_scalar_columns(dst, col0, stride, data, op0, operand0, op1=None, operand1=None):
    """``dst[:, col0 + i * stride] = (data[:, i] op0 operand0) op1 operand1`` for i < n, ``data``
    (P, n): one instruction writing every ``stride``-th column (a strided ``.ap`` destination)."""
    tensor_scalar(free_view(dst, ((stride, data.shape[1]),), col0=col0), data, op0, operand0,
                  op1=op1, operand1=operand1)


def tensor_tensor_columns(dst, col0, stride, b, op):
    """``dst[:, col0 + i * stride] = dst[:, col0 + i * stride] op b[:, i]`` for i < n, ``b``
    (P, n): one instruction on every ``stride``-th column (strided ``.ap`` views)."""
    cols = free_view(dst, ((stride, b.shape[1]),), col0=col0)
    tensor_tensor(cols, cols, b, op)


def where_chunks(dst, dst_stride, pred, src, count, width, on_false=0.0):
    """``dst[:, k*dst_stride : +width] = where(pred[:, k], src[:, k*width : +width], on_false)``
    for k < count (``pred`` (P, count), one flag per chunk): one select over (P, count, width)
    access patterns, the predicate's chunk flag broadcast along the chunk (step 0)."""
    p = _predicate(pred)
    nisa.select_reduce(dst=free_view(dst, ((dst_stride, count), (1, width))),
                       predicate=free_view(p, ((1, count), (0, width))),
                       on_true=free_view(src, ((width, count), (1, width))),
                       on_false=float(on_false))


def engine_names(engine):
    """Engine names are the interface here already."""
    return engine


def check_head_grid(kernel, num_kv_heads, query_parts=False):
    """No SPMD grid on this API (the kernel loops over its KV heads): nothing to check."""
    del kernel, num_kv_heads, query_parts


# ---- DMA (nki_kernels.ops.current_dma, re-exported: one op-layer namespace) -------------
from nki_kernels.ops.current_dma import *  # noqa: E402,F401,F403
