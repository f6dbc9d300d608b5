"""The op layer on the legacy API (``neuronxcc.nki``, NKI "Beta 1"; trn1 on Neuron SDK <= 2.28).

One of the two modules that name an NKI package (the other is :mod:`nki_kernels.ops.current`);
the interface is documented in :mod:`nki_kernels.ops`. Each op writes its destination with the
legacy call the kernels used before the op layer existed (``dst[...] = nisa.op(..., dtype=
dst.dtype)``, ``nl.*`` elementwise ops with NumPy broadcasting, ``nl.arange`` index expressions
for indirect DMAs and strided views), so a kernel ported onto the layer traces the same
instructions as its hand-written legacy form.
"""

from __future__ import annotations

import numpy as np

from nki_kernels.toolchain import nki, nl, nisa

NAME = "legacy"

float32, bfloat16, float16, int32, uint8 = nl.float32, nl.bfloat16, nl.float16, nl.int32, nl.uint8
float8_e4m3, float8_e5m2 = nl.float8_e4m3, nl.float8_e5m2
PRED = nl.bool_            # comparison results
FLAG = nl.float32          # 0 / 1 tiles built once and selected with (nl.where takes floats)
FP32_MIN = float(np.finfo(np.float32).min)

_ENGINES = {None: None, "scalar": nisa.scalar_engine, "vector": nisa.vector_engine,
            "gpsimd": nisa.gpsimd_engine}
_ALU = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
        "minimum": np.minimum, "max": np.max, "min": np.min, "equal": np.equal}
_NL = {"add": nl.add, "subtract": nl.subtract, "multiply": nl.multiply, "maximum": nl.maximum,
       "minimum": nl.minimum, "less": nl.less, "equal": nl.equal, "divide": nl.divide}
_ACT = {"exp": np.exp, "tanh": np.tanh, "abs": np.abs, "relu": nl.relu, "copy": np.copy}


def jit(fn):
    """The API's kernel decorator."""
    return nki.jit(fn)


# ---- allocation and views ---------------------------------------------------------------------
def sbuf(shape, dtype):
    return nl.ndarray(tuple(shape), dtype=dtype, buffer=nl.sbuf)


def psum(shape, dtype):
    return nl.ndarray(tuple(shape), dtype=dtype, buffer=nl.psum)


def zeros(shape, dtype):
    return nl.zeros(tuple(shape), dtype=dtype, buffer=nl.sbuf)


# HBM tensors are created by the kernel function itself (outputs must be allocated at the
# kernel's top level): ``ops.ndarray(shape, dtype=dt, buffer=ops.SHARED_HBM)``.
ndarray = nl.ndarray
SHARED_HBM = nl.shared_hbm      # outputs
PRIVATE_HBM = nl.hbm            # scratch


def ds(start, size):
    return nl.ds(start, size)


def bitcast(t, dtype):
    return t.view(dtype)


def filled_as_words(shape, dtype, fill):
    """A new SBUF tile ``shape`` of ``dtype`` (1 or 2 bytes; ``shape[1]`` a whole number of
    32-bit words) written through its float32 view: ``fill(words)`` writes the (P, words) view.
    Here the float32 tile is allocated and filled first, then viewed as ``dtype`` (the legacy
    front end views written tiles only)."""
    from nki_kernels.ops import itemsize

    words = sbuf((shape[0], shape[1] * itemsize(dtype) // 4), nl.float32)
    fill(words)
    return words.view(dtype)


def free_view(t, dims, col0=0):
    """View of a 2-D on-chip tile ``t`` (P, F): partitions kept, free dims ``dims`` =
    ``((step, count), ...)`` from column ``col0``; a step-0 dim is a size-1 dim here (NumPy
    broadcasting of the legacy ``nl`` ops widens it)."""
    sizes = tuple(count if step else 1 for step, count in dims)
    inner = 1
    # a loop-variable offset (an affine expression) is never a plain reshape
    contiguous = type(col0) is int and col0 == 0
    for (step, count) in reversed(dims):
        if step:
            contiguous = contiguous and step == inner
            inner *= count
    if contiguous:      # a reshape (writable); broadcast dims have size 1
        return t.reshape((t.shape[0],) + sizes)
    n = len(dims) + 1

    def axis(k, size):
        return nl.arange(size)[tuple(slice(None) if a == k else None for a in range(n))]

    expr = None
    for k, (step, count) in enumerate(dims):
        ar = axis(k + 1, count if step else 1)
        term = ar if step == 1 else ar * step
        expr = term if expr is None else expr + term
    return t[axis(0, t.shape[0]), col0 + expr]


# ---- loops and programs -----------------------------------------------------------------------
static_range = nl.static_range
parallel_range = nl.affine_range
sequential_range = nl.sequential_range


def kv_heads(num_kv_heads, item_parts=1):
    """The KV heads this program runs: one per program, ``program_id(1)`` of the ``[1, Hkv]``
    SPMD grid (or of the ``[nl.nc(2), Hkv]`` grid of a schedule cut in item parts)."""
    del num_kv_heads, item_parts
    return (nl.program_id(axis=1),)


def head_rows(table, head, rows_per_head, num_kv_heads):
    """Where KV head ``head`` enters the row ids of indirect gathers from ``table`` ``(2, R,
    F)``: ``(view, id_offset)``. Here in the row ids, as vLLM's kernel does (an ``iota`` of the
    program id's offset): ``(table, head * rows_per_head)``."""
    del num_kv_heads
    return table, head * rows_per_head


def item_part(num_kv_heads, item_parts=1):
    """The part of every phase's items this program runs: ``program_id(0)``, its physical core,
    on the ``[nl.nc(2), Hkv]`` grid of a schedule cut in item parts (:func:`launch_grid`), else
    0."""
    del num_kv_heads
    return 0 if item_parts == 1 else nl.program_id(axis=0)


def launch_core():
    """``(0, 1)``: every program of a legacy grid has its own ``private_hbm``, so a scratch
    needs no slab per physical core."""
    return 0, 1


def query_part():
    """``(part, parts)``: which part of its KV head's query tiles this program runs -- on the
    ``[nl.nc(2), Hkv]`` grid (:func:`launch_grid` with two parts: the dense kernel over an odd
    Hkv at LNC=2) ``(nl.program_id(0), 2)``, program ``(c, h)`` on core c running half of head
    h's query tiles; on a ``[1, ...]`` grid ``(0, 1)``."""
    parts = nl.num_programs(axes=0)
    return (0, 1) if parts == 1 else (nl.program_id(axis=0), parts)


def launch_grid(num_kv_heads, lnc=1, item_parts=1):
    """The SPMD grid of a launch over ``num_kv_heads`` KV heads: ``[1, Hkv]``; with ``lnc=2``
    ``[1, nl.spmd_dim(nl.nc(2), Hkv / 2)]`` (physical core 0 runs programs ``0 .. Hkv/2 - 1``,
    core 1 the rest; ``program_id(1)`` is still the KV head), or with ``item_parts=2`` (a
    schedule cut in two item parts, any Hkv; the dense kernel's query-tile halves of an odd
    Hkv, :func:`query_part`) ``[nl.nc(2), Hkv]``: program ``(c, h)`` on core c runs part c of
    head h."""
    if lnc == 1:
        if item_parts != 1:
            raise ValueError(f"a schedule in {item_parts} item parts needs lnc={item_parts}; "
                             "got lnc=1")
        return (1, num_kv_heads)
    if lnc != max_lnc():
        raise NotImplementedError(
            f"lnc={lnc}: this legacy NKI front end cannot place programs on two physical cores "
            "(nl.nc needs neuronxcc on a NeuronCore-v3 target); use lnc=1")
    if item_parts == lnc:
        return (nl.nc(lnc), num_kv_heads)
    if item_parts != 1:
        raise ValueError(f"a schedule in {item_parts} item parts needs lnc={item_parts}; "
                         f"got lnc={lnc}")
    if num_kv_heads % lnc:
        raise NotImplementedError(f"lnc={lnc} splits the KV heads evenly over the cores; Hkv = "
                                  f"{num_kv_heads} is not a multiple of {lnc}: use lnc=1 or a "
                                  "schedule in item parts")
    return (1, nl.spmd_dim(nl.nc(lnc), num_kv_heads // lnc))


def max_lnc():
    """Physical cores one launch can use: 2 on NeuronCore-v3 when the API places SPMD programs
    on cores (``nl.nc``), else 1."""
    return 2 if nc_gen() == "gen3" and hasattr(nl, "nc") else 1


# ---- trace-time feature flags -----------------------------------------------------------------
def nc_gen():
    v = nisa.get_nc_version()
    return "gen3" if v == nisa.nc_version.gen3 else "gen2"


def has_range_select():
    return nc_gen() == "gen3"


def has_select_max():
    """Trace-time flag: a select that also max-reduces its rows (:func:`where_max`). Not on this
    layer: ``nisa.select_reduce`` needs SDK 2.26 (and was reported wrong on trn1); callers select
    with :func:`where` and reduce with :func:`tensor_reduce`."""
    return False


def has_oob_skip():
    return hasattr(nisa, "oob_mode")


def transpose_psum_dtype(src_dtype):
    """PSUM dtype of a PE transpose of ``src_dtype``: fp32 on gen2, the source dtype on gen3."""
    return src_dtype if nc_gen() == "gen3" else nl.float32


# ---- compute ----------------------------------------------------------------------------------
def memset(dst, value, engine=None):
    kw = {} if engine is None else {"engine": _ENGINES[engine]}
    dst[...] = nisa.memset(dst.shape, value, dtype=dst.dtype, **kw)


def iota(dst, *, step, offset=0, partition_step=0):
    """``dst[p, j] = offset + p * partition_step + j * step`` (2-D ``dst``)."""
    i_p = nl.arange(dst.shape[0])[:, None]
    i_f = nl.arange(dst.shape[1])[None, :]
    dst[...] = nisa.iota(i_p * partition_step + i_f * step + offset, dtype=dst.dtype)


def copy(dst, src, engine=None):
    if engine is None:
        dst[...] = nl.copy(src, dtype=dst.dtype)
    else:
        dst[...] = nisa.tensor_copy(src, dtype=dst.dtype, engine=_ENGINES[engine])


def activation(dst, func, data, *, bias=None, scale=1.0, row_sum=None):
    """``dst = func(data * scale + bias)``; ``row_sum``: a (P, 1) fp32 tile receiving the sum of
    ``dst``'s rows (before the cast)."""
    kw = {} if bias is None else {"bias": bias}
    if row_sum is None:
        dst[...] = nisa.activation(_ACT[func], data, scale=scale, dtype=dst.dtype, **kw)
    else:
        dst[...] = nisa.activation_reduce(_ACT[func], data, scale=scale, reduce_op=np.add,
                                          reduce_res=row_sum, dtype=dst.dtype, **kw)


def tensor_scalar(dst, data, op0, operand0, op1=None, operand1=None, reverse0=False,
                  engine=None):
    """``dst = (data op0 operand0) op1 operand1`` on ``engine`` (None: the compiler's choice;
    "gpsimd" for SBUF-only operands)."""
    kw = {} if op1 is None else {"op1": _ALU[op1], "operand1": operand1}
    if reverse0:
        kw = {**kw, "reverse0": True}
    if engine is not None:
        kw = {**kw, "engine": _ENGINES[engine]}
    dst[...] = nisa.tensor_scalar(data, _ALU[op0], operand0, dtype=dst.dtype, **kw)


def tensor_tensor(dst, a, b, op, engine=None):
    """Elementwise ``a op b`` (``b`` a tile, a (P, 1) column or a scalar; broadcasting as NumPy;
    ``engine`` is a hint of the current-API layer, unused here)."""
    dst[...] = _NL[op](a, b, dtype=dst.dtype)


def absolute(dst, src, engine=None):
    """``dst = |src|`` (``nl.abs``; ``engine`` is a hint of the current-API layer, unused here)."""
    dst[...] = nl.abs(src, dtype=dst.dtype)


def scale_add(dst, a, col, b):
    """``dst = a * col + b`` (``col`` a (P, 1) column; ``a`` and ``b`` not both in PSUM): one
    VectorE ``scalar_tensor_tensor`` pass."""
    dst[...] = nisa.scalar_tensor_tensor(data=a, op0=nl.multiply, operand0=col, op1=nl.add,
                                         operand1=b, dtype=dst.dtype)


def floored_divisors(dst, cols, floor, engine=None):
    """What :func:`divide_by` divides by, for n (P, 1) columns at once: ``dst`` (P, n) =
    ``max(cols, floor)``: ``nl.maximum``, or with ``engine`` (SBUF ``cols``) a
    ``nisa.tensor_scalar`` there (e.g. "gpsimd": off VectorE, which divides next)."""
    if engine is None:
        dst[...] = nl.maximum(cols, floor, dtype=dst.dtype)
    else:
        dst[...] = nisa.tensor_scalar(cols, np.maximum, floor, dtype=dst.dtype,
                                      engine=_ENGINES[engine])


def divide_by(dst, a, div, engine=None):
    """``dst = a / div`` for a (P, 1) column ``div`` of :func:`floored_divisors`
    (``nl.divide``)."""
    dst[...] = nl.divide(a, div, dtype=dst.dtype)


def where(dst, pred, on_true, on_false):
    """``dst = on_true where pred else on_false`` (a select: NaN in the unselected operand does
    not leak); ``on_true`` may be a (P, 1) column, ``on_false`` a scalar or a tile."""
    dst[...] = nl.where(pred, on_true, on_false, dtype=dst.dtype)


def where_max(dst, pred, on_true, on_false, row_max):
    raise NotImplementedError("the legacy ops layer has no select with a row max; check "
                              "ops.has_select_max() and use where() and tensor_reduce()")


class _Flags:
    def __init__(self, src, col0, stride):
        self.src, self.col0, self.stride = src, col0, stride

    def column(self, i, rows):
        return self.src[0:rows, nl.ds(self.col0 + i * self.stride, 1)]


def flags(src, col0, stride, count):
    """The 0 / 1 float columns ``col0 + i * stride`` (i < count) of ``src`` as predicates
    (``nl.where`` takes float predicates: no instruction); ``.column(i, rows)`` is flag column
    i of the first ``rows`` partitions."""
    del count
    return _Flags(src, col0, stride)


def tensor_reduce(dst, op, data, axis, keepdims=False, negate=False):
    """``dst = op``-reduction of ``data`` over ``axis`` (VectorE); ``negate``: times -1."""
    kw = {"keepdims": True} if keepdims else {}
    if negate:
        kw = {**kw, "negate": True}
    dst[...] = nisa.tensor_reduce(_ALU[op], data, axis=axis, dtype=dst.dtype, **kw)


def scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res):
    """``dst = data op0 operand0`` (``operand0`` a scalar or a (P, 1) column), ``reduce_res[p]``
    = the ``reduce_op`` of row p of ``dst``: one VectorE ``tensor_scalar_reduce``."""
    dst[...] = nisa.tensor_scalar_reduce(data=data, op0=_ALU[op0], operand0=operand0,
                                         reduce_op=_ALU[reduce_op], reduce_res=reduce_res,
                                         dtype=dst.dtype)


def range_select_max(dst, data, lo, hi, row_max, start=0):
    """``dst[p, j] = data[p, j]`` where ``lo[p] <= start + j < hi[p]`` else FP32_MIN;
    ``row_max[p]`` = the row max of ``dst`` (one reset-reduce instruction; NeuronCore-v3+;
    ``start`` a static int)."""
    dst[...] = nisa.range_select(on_true_tile=data, comp_op0=np.greater_equal, comp_op1=np.less,
                                 bound0=lo, bound1=hi, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                                 reduce_res=row_max, reduce_op=np.amax, range_start=start,
                                 on_false_value=nl.fp32.min, dtype=dst.dtype)


def matmul(dst, stationary, moving, accumulate=False):
    """``dst (PSUM) = stationary.T @ moving``, added onto ``dst`` when ``accumulate``."""
    prod = nisa.nc_matmul(stationary, moving)
    if accumulate:
        dst[...] += prod
    else:
        dst[...] = prod


def transpose(dst, src):
    """PE transpose of ``src`` (SBUF) into ``dst`` (PSUM)."""
    dst[...] = nisa.nc_transpose(src)


def tensor_scalar_columns(dst, col0, stride, data, op0, operand0, op1=None, operand1=None):
    """``dst[:, col0 + i * stride] = (data[:, i] op0 operand0) op1 operand1`` for i < n, ``data``
    (P, n): one instruction writing every ``stride``-th column (an ``nl.arange`` index
    expression on the destination)."""
    kw = {} if op1 is None else {"op1": _ALU[op1], "operand1": operand1}
    i_p = nl.arange(data.shape[0])[:, None]
    i_f = nl.arange(data.shape[1])[None, :]
    dst[i_p, col0 + i_f * stride] = nisa.tensor_scalar(data, _ALU[op0], operand0,
                                                       dtype=dst.dtype, **kw)


def tensor_tensor_columns(dst, col0, stride, b, op):
    """``dst[:, col0 + i * stride] = dst[:, col0 + i * stride] op b[:, i]`` for i < n, ``b``
    (P, n): one instruction on every ``stride``-th column (``nl.arange`` index expressions)."""
    i_p = nl.arange(b.shape[0])[:, None]
    i_f = nl.arange(b.shape[1])[None, :]
    dst[i_p, col0 + i_f * stride] = _NL[op](dst[i_p, col0 + i_f * stride], b, dtype=dst.dtype)


def where_chunks(dst, dst_stride, pred, src, count, width, on_false=0.0):
    """``dst[:, k*dst_stride : +width] = where(pred[:, k], src[:, k*width : +width], on_false)``
    for k < count (``pred`` (P, count), one flag per chunk): one ``nl.where`` over
    (P, count, width) ``nl.arange`` index expressions, the flag broadcast along its chunk."""
    i_p = nl.arange(src.shape[0])[:, None, None]
    i_k = nl.arange(count)[None, :, None]
    i_w = nl.arange(width)[None, None, :]
    dst[i_p, i_k * dst_stride + i_w] = nl.where(pred[i_p, i_k], src[i_p, i_k * width + i_w],
                                                on_false, dtype=dst.dtype)


def engine_names(engine):
    """Engine name(s) of legacy engine object(s) (None, one, or a tuple)."""
    if isinstance(engine, tuple):
        return tuple(engine_names(e) for e in engine)
    for name, obj in _ENGINES.items():
        if obj is engine or (obj is not None and engine is not None and obj == engine):
            return name
    raise ValueError(f"unknown legacy engine {engine!r}")


def check_head_grid(kernel, num_kv_heads, query_parts=False):
    """A per-KV-head kernel's launch grid must be ``[1, Hkv]`` or, with ``query_parts`` (a
    kernel that splits its heads' query tiles by :func:`query_part`), ``[nl.nc(2), Hkv]``
    (ValueError naming it)."""
    from nki_kernels._assert import kernel_check

    ndim = nl.program_ndim()
    want = f"[1, Hkv] = [1, {num_kv_heads}]" + (
        f" or [2, Hkv] = [2, {num_kv_heads}]" if query_parts else "")
    kernel_check(ndim == 2, kernel, "launch grid", f"be 2-D {want}", f"{ndim}-D")
    grid = (nl.num_programs(axes=0), nl.num_programs(axes=1))
    ok = grid == (1, num_kv_heads) or (query_parts and grid == (2, num_kv_heads))
    kernel_check(ok, kernel, "launch grid", f"be {want}", list(grid))


# ---- DMA (nki_kernels.ops.legacy_dma, re-exported: one op-layer namespace) --------------------
from nki_kernels.ops.legacy_dma import *  # noqa: E402,F401,F403
