"""Compute instructions of ``nki.isa`` (current API, ``dst`` first, no return value).

Each function checks the documented constraints (AWS's simulator texts where known,
:mod:`nki_sim.current.checks`), resolves the views and calls the engine op
(:mod:`nki_sim.engines`).  Reference §4.2 / §4.3.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..alu import ALU, act_name, alu_name
from ..engines import scalar as S, tensor_engine as TE, vector as V
from ..engines.common import pe_written, written_mask
from ..target import get_target
from . import version
from .checks import require_kernel, buffer_in, fail, partitions, same_partition_layout, tile
from .enums import ENGINE_NAMES, engine as _engine, matmul_perf_mode, member, reduce_cmd as _rc
from .ndarray import NkiTensor


def _engine_name(engine, default):
    e = member(_engine, engine, "engine", _engine.unknown)
    return default if e is _engine.unknown else ENGINE_NAMES[e]


def _gen() -> str:
    return get_target().nc_version


def _check_parts(op, **tiles):
    for n, t in tiles.items():
        partitions(op, n, t)


def _c(x):
    return x.core() if isinstance(x, NkiTensor) else x


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(), perf_mode=None,
              name=""):
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` (fp32 PSUM on v2/v3)."""
    require_kernel("nisa.nc_matmul")
    dst, st, mv = (tile(x, "nc_matmul", n) for x, n in ((dst, "dst"), (stationary, "stationary"),
                                                          (moving, "moving")))
    pm = member(matmul_perf_mode, perf_mode, "perf_mode", matmul_perf_mode.none)
    if pm is not matmul_perf_mode.none:
        from ..errors import not_emulated
        raise not_emulated("nisa.nc_matmul(perf_mode=double_row)")
    if tile_position or tile_size or is_transpose:
        from ..errors import not_emulated
        raise not_emulated("nisa.nc_matmul(tile_position= / tile_size= / is_transpose=True)",
                           "use nisa.nc_transpose for PE transposes")
    buffer_in("dst", dst, ("psum",))
    buffer_in("stationary", st, ("sbuf",))
    buffer_in("moving", mv, ("sbuf",))
    K, M = st.shape[0], math.prod(st.shape[1:])
    K2, N = mv.shape[0], math.prod(mv.shape[1:])
    tgt = get_target()
    if K > tgt.gemm_contraction_max or K2 > tgt.gemm_contraction_max:
        fail(f"nc_matmul stationary partition dimension {max(K, K2)} exceeds maximum 128")
    if M > tgt.gemm_stationary_fmax:
        fail(f"nc_matmul stationary free size {M} exceeds maximum {tgt.gemm_stationary_fmax}")
    if N > tgt.gemm_moving_fmax:
        fail(f"nc_matmul moving free size {N} exceeds maximum {tgt.gemm_moving_fmax}")
    if K != K2:
        fail(f"nc_matmul: stationary {list(st.shape)} and moving {list(mv.shape)} must share the "
             "partition (contraction) size")
    if dst.shape[0] != M or dst.size != M * N:
        fail(f"nc_matmul: dst {list(dst.shape)} must hold the [{M}, {N}] result")
    if dst.dtype != "float32":
        fail(f"nc_matmul: dst must be float32 PSUM on NeuronCore-v2/v3; got {dst.dtype}")
    f32 = [d in ("float32", "tfloat32") for d in (st.dtype, mv.dtype)]
    if f32[0] != f32[1]:
        fail(f"nc_matmul: fp32 / tf32 operands must pair with fp32 / tf32; got {st.dtype} and {mv.dtype}")
    d = dst.core()
    if accumulate is None:
        acc = bool(pe_written(d).any())
    else:
        acc = bool(accumulate)
    if acc:
        pe, w = pe_written(d), written_mask(d)
        if (w & ~pe).any():
            fail(f"nc_matmul(accumulate=True) onto PSUM tensor `{dst.name}` initialised by a non-matmul "
                 "instruction (memset / tensor_copy): undefined on NeuronCore-v2/v3; start the "
                 "accumulation group with accumulate=False")
        if not w.all() and version.has((0, 5)):
            warnings.warn(f"nc_matmul(accumulate=True) on uninitialised PSUM tensor `{dst.name}`",
                          RuntimeWarning, stacklevel=2)
    TE.matmul(d, st.core(), mv.core(), accumulate=acc, name=name)


def nc_transpose(dst, data, engine=None, name=""):
    """``dst[F, P] = data[P, F].T``: TensorE (<= 128 x 128, SBUF -> PSUM) or VectorE (<= 32 x 32)."""
    require_kernel("nisa.nc_transpose")
    dst, data = tile(dst, "nc_transpose", "dst"), tile(data, "nc_transpose", "data")
    eng = _engine_name(engine, "vector" if data._alloc.buffer == "psum" else "tensor")
    edge = 128 if eng == "tensor" else 32
    P, F = data.shape[0], math.prod(data.shape[1:])
    if P > edge or F > edge:
        fail(f"nc_transpose data [{P}, {F}] exceeds the {eng} engine limit [{edge}, {edge}]")
    if eng == "tensor":
        buffer_in("dst", dst, ("psum",))
        buffer_in("data", data, ("sbuf",))
    if dst.dtype != data.dtype:
        fail(f"nc_transpose: dst dtype {dst.dtype} must equal data dtype {data.dtype}")
    if dst.shape[0] != F or dst.size != P * F:
        fail(f"nc_transpose: dst {list(dst.shape)} must hold the [{F}, {P}] result")
    TE.transpose(dst.core(), data.core(), engine=eng, name=name)


def _cmd(reduce_cmd, default):
    return member(_rc, reduce_cmd, "reduce_cmd", default).name


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=None, name="", _api="activation"):
    """``dst = op(data * scale + bias)`` on ScalarE, with the per-partition add accumulator."""
    require_kernel(f"nisa.{_api}")
    dst, data = tile(dst, _api, "dst"), tile(data, _api, "data")
    fn = act_name(op, f"nisa.{_api}")
    _check_parts(_api, dst=dst, data=data)
    same_partition_layout(_api, [("dst", dst), ("data", data)])
    P = data.shape[0]
    for pname, v in (("bias", bias), ("scale", scale)):
        if isinstance(v, NkiTensor) and (v.shape[0] != P or math.prod(v.shape[1:]) != 1):
            fail(f"{_api}: {pname} must be a [{P}, 1] tile; got {list(v.shape)}")
    if bias is not None and not isinstance(bias, NkiTensor) and _gen() == "gen2":
        fail(f"{_api}: bias must be a [{P}, 1] tile on NeuronCore-v2 (a scalar bias needs v3+)")
    if isinstance(scale, NkiTensor) and scale.dtype != "float32":
        fail(f"{_api}: a scale tile must be float32; got {scale.dtype}")
    cmd = _cmd(reduce_cmd, _rc.reset_reduce if _api == "activation_reduce" else _rc.idle)
    ralu = None
    if reduce_op is not None or reduce_res is not None or cmd != "idle":
        ralu = alu_name(reduce_op if reduce_op is not None else "add", f"nisa.{_api} reduce_op")
        if ralu != "add" and _gen() == "gen2":
            fail(f"{_api}: reduce_op must be nl.add on NeuronCore-v2; got {ralu}")
    if reduce_res is not None:
        reduce_res = tile(reduce_res, _api, "reduce_res")
        if reduce_res.shape[0] != P or reduce_res.size != P:
            fail(f"{_api}: reduce_res must be a [{P}, 1] tile; got {list(reduce_res.shape)}")
    S.activation(dst.core(), fn, data.core(), bias=_c(bias), scale=_c(scale), reduce_alu=ralu,
                 reduce_res=_c(reduce_res), reduce_cmd=cmd, op=_api, name=name)


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=""):
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=_rc.reset_reduce, name=name, _api="activation_reduce")


def tensor_tensor(dst, data1, data2, op, engine=None, name="", _nl=False):
    """``dst = op(data1, data2)`` element-wise (``_nl``: called by an ``nl`` binary op)."""
    require_kernel("nisa.tensor_tensor")
    dst, a, b = (tile(x, "tensor_tensor", n) for x, n in ((dst, "dst"), (data1, "data1"), (data2, "data2")))
    opn = alu_name(op, "nisa.tensor_tensor")
    _check_parts("tensor_tensor", data1=a, data2=b, dst=dst)
    same_partition_layout("tensor_tensor", [("dst", dst), ("data1", a), ("data2", b)])
    bufs = (a._alloc.buffer, b._alloc.buffer)
    if bufs == ("psum", "psum"):
        fail("tensor_tensor: data1 and data2 cannot both be in PSUM")
    ints = a.dtype.startswith(("int", "uint")) and b.dtype.startswith(("int", "uint"))
    default = "gpsimd" if (ints and "psum" not in bufs + (dst._alloc.buffer,)) or opn == "power" else "vector"
    eng = _engine_name(engine, default)
    if ALU[opn][2] == "bitvec" and not ints:
        fail(f"tensor_tensor: bitvec op {opn} needs integer operands; got {a.dtype}, {b.dtype}")
    _no_psum_gpsimd("tensor_tensor", eng, dst, a, b)
    V.tensor_tensor(dst.core(), a.core(), b.core(), opn, engine=eng, name=name, nl=_nl)


def _no_psum_gpsimd(op, eng, *tiles):
    if eng == "gpsimd" and any(isinstance(t, NkiTensor) and t._alloc.buffer == "psum" for t in tiles):
        fail(f"{op}: the GpSimd engine cannot access PSUM")


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=""):
    """``dst = (data op0 operand0) op1 operand1``; operands scalars or [P, 1] tiles."""
    require_kernel("nisa.tensor_scalar")
    dst, data = tile(dst, "tensor_scalar", "dst"), tile(data, "tensor_scalar", "data")
    _check_parts("tensor_scalar", data=data, dst=dst)
    same_partition_layout("tensor_scalar", [("dst", dst), ("data", data)])
    P = data.shape[0]
    stages = [(alu_name(op0, "nisa.tensor_scalar op0"), operand0, reverse0)]
    if op1 is not None:
        stages.append((alu_name(op1, "nisa.tensor_scalar op1"), operand1, reverse1))
    kinds = {ALU[n][2] == "bitvec" for n, _, _ in stages}
    if len(kinds) > 1:
        fail(f"tensor_scalar: op0 and op1 must both be arithmetic or both bitvec; got {[s[0] for s in stages]}")
    for n, o, _ in stages:
        if isinstance(o, NkiTensor):
            if o.shape[0] != P or math.prod(o.shape[1:]) != 1:
                fail(f"tensor_scalar: operands must be scalars or [{P}, 1] tiles; got {list(o.shape)}")
            if ALU[n][2] != "bitvec" and o.dtype != "float32":
                fail(f"tensor_scalar: arithmetic operands must be float32; got a {o.dtype} tile")
    eng = _engine_name(engine, "vector")
    _no_psum_gpsimd("tensor_scalar", eng, dst, data)
    if eng == "scalar":
        pair = tuple(n for n, _, _ in stages) + ((None,) if len(stages) == 1 else ())
        if _gen() == "gen2":
            fail("tensor_scalar on the Scalar engine needs NeuronCore-v3+")
        if pair not in (("multiply", "add"), ("multiply", None), ("add", None)):
            fail(f"tensor_scalar on the Scalar engine supports multiply+add, multiply or add; got {pair}")
    V.tensor_scalar(dst.core(), data.core(), [(n, _c(o), bool(r)) for n, o, r in stages],
                    engine=eng, name=name,
                    unspecified=member(_engine, engine, "engine", _engine.unknown) is _engine.unknown)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=""):
    """Reduce the trailing free ``axis`` (int or tuple; never 0) of ``data`` into ``dst``."""
    require_kernel("nisa.tensor_reduce")
    dst, data = tile(dst, "tensor_reduce", "dst"), tile(data, "tensor_reduce", "data")
    opn = alu_name(op, "nisa.tensor_reduce")
    _check_parts("tensor_reduce", data=data, dst=dst)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(int(a) % data.ndim for a in axes))
    if not axes or 0 in axes or axes != tuple(range(data.ndim - len(axes), data.ndim)):
        fail(f"tensor_reduce: axis {axis!r} must be the trailing contiguous free dim(s) of a rank-"
             f"{data.ndim} tile (axis 0 cannot be reduced)")
    out = math.prod(data.shape[:data.ndim - len(axes)])
    if dst.shape[0] != data.shape[0] or dst.size != out:
        fail(f"tensor_reduce: dst {list(dst.shape)} must hold the {out} reduced elements")
    V.tensor_reduce(dst.core(), data.core(), opn, axes, negate=bool(negate), keepdims=True, name=name)


def tensor_copy(dst, src, engine=None, name="", dtype=None, _nl=False):
    """``dst = src`` (cast through fp32 when the dtypes differ).  ``dtype=`` is not in the
    documented signature but AWS's current-API matmul tutorial passes it (also different from
    dst's dtype); the destination's dtype is the output dtype, a different ``dtype`` warns."""
    require_kernel("nisa.tensor_copy")
    dst, src = tile(dst, "tensor_copy", "dst"), tile(src, "tensor_copy", "src")
    if dtype is not None:
        from .dtypes import name_of
        if name_of(dtype) != dst.dtype:
            warnings.warn(f"nisa.tensor_copy: dtype={name_of(dtype)} is ignored; the output dtype is "
                          f"dst's ({dst.dtype})", UserWarning, stacklevel=2)
    _check_parts("tensor_copy", dst=dst, src=src)
    same_partition_layout("tensor_copy", [("dst", dst), ("src", src)])
    eng = _engine_name(engine, "vector")
    if eng == "scalar" and _gen() == "gen2":
        fail("tensor_copy on the Scalar engine is not available on NeuronCore-v2; use "
             "nisa.activation(op=nl.copy)")
    _no_psum_gpsimd("tensor_copy", eng, dst, src)
    V.tensor_copy(dst.core(), src.core(), engine=eng, name=name, unspecified=_nl)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=""):
    """``dst = predicate ? src : dst`` (predicate uint8/16/32; src a tile or scalar of dst's dtype)."""
    require_kernel("nisa.tensor_copy_predicated")
    dst = tile(dst, "tensor_copy_predicated", "dst")
    predicate = tile(predicate, "tensor_copy_predicated", "predicate")
    if predicate.dtype not in ("uint8", "uint16", "uint32", "int8", "int16", "int32", "bool"):
        fail(f"tensor_copy_predicated: predicate must be an integer tile; got {predicate.dtype}")
    if isinstance(src, NkiTensor):
        same_partition_layout("tensor_copy_predicated", [("dst", dst), ("src", src), ("predicate", predicate)])
        if src.dtype != dst.dtype:
            fail(f"tensor_copy_predicated: src dtype {src.dtype} must equal dst dtype {dst.dtype}")
    _check_parts("tensor_copy_predicated", dst=dst, predicate=predicate)
    V.copy_predicated(dst.core(), _c(src), predicate.core(), reverse=bool(reverse_pred), name=name)


def reciprocal(dst, data, name=""):
    require_kernel("nisa.reciprocal")
    dst, data = tile(dst, "reciprocal", "dst"), tile(data, "reciprocal", "data")
    _check_parts("reciprocal", dst=dst, data=data)
    same_partition_layout("reciprocal", [("dst", dst), ("data", data)])
    V.reciprocal(dst.core(), data.core(), name=name)


def memset(dst, value, engine=None, name=""):
    """Fill ``dst`` with ``value`` (an int for integer tiles)."""
    require_kernel("nisa.memset")
    dst = tile(dst, "memset", "dst")
    _check_parts("memset", dst=dst)
    if dst.dtype.startswith(("int", "uint")) and not isinstance(value, (int, np.integer)):
        fail(f"memset: value {value!r} must be an int for a {dst.dtype} tensor")
    eng = _engine_name(engine, "vector")
    _no_psum_gpsimd("memset", eng, dst)
    V.memset(dst.core(), value, engine=eng, name=name)


def nc_stream_shuffle(src, dst, shuffle_mask, name=""):
    """``dst[i] = src[shuffle_mask[i]]`` across at most 32 partitions (255 keeps ``dst[i]``)."""
    require_kernel("nisa.nc_stream_shuffle")
    src, dst = tile(src, "nc_stream_shuffle", "src"), tile(dst, "nc_stream_shuffle", "dst")
    mask = [int(m) for m in shuffle_mask]
    if dst.shape[0] > 32 or src.shape[0] > 32 or len(mask) != 32:
        fail(f"nc_stream_shuffle: src / dst span at most 32 partitions and shuffle_mask has 32 entries; "
             f"got src {list(src.shape)}, dst {list(dst.shape)}, {len(mask)} mask entries")
    if any(m != 255 and not 0 <= m < src.shape[0] for m in mask[:dst.shape[0]]):
        fail(f"nc_stream_shuffle: shuffle_mask entries must index src partitions (< {src.shape[0]}) or be 255")
    if math.prod(src.shape[1:]) != math.prod(dst.shape[1:]):
        fail("nc_stream_shuffle: src and dst must have the same elements per partition")
    V.stream_shuffle(dst.core(), src.core(), mask, name=name)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         engine=None, name=""):
    """``dst = (data op0 operand0) op1 operand1`` (operand0 scalar or [P, 1], operand1 a tile)."""
    require_kernel("nisa.scalar_tensor_tensor")
    dst, data = tile(dst, "scalar_tensor_tensor", "dst"), tile(data, "scalar_tensor_tensor", "data")
    t1 = tile(operand1, "scalar_tensor_tensor", "operand1")
    same_partition_layout("scalar_tensor_tensor", [("dst", dst), ("data", data), ("operand1", t1)])
    _check_parts("scalar_tensor_tensor", dst=dst, data=data)
    P = data.shape[0]
    if isinstance(operand0, NkiTensor) and (operand0.shape[0] != P or math.prod(operand0.shape[1:]) != 1):
        fail(f"scalar_tensor_tensor: operand0 must be a scalar or a [{P}, 1] tile; got {list(operand0.shape)}")
    eng = _engine_name(engine, "vector")
    _no_psum_gpsimd("scalar_tensor_tensor", eng, dst, data, t1)
    V.scalar_tensor_tensor(dst.core(), data.core(), alu_name(op0, "nisa.scalar_tensor_tensor op0"),
                           _c(operand0), alu_name(op1, "nisa.scalar_tensor_tensor op1"), t1.core(),
                           reverse0=bool(reverse0), reverse1=bool(reverse1), engine=eng, name=name)
