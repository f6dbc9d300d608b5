"""Vector / Scalar / GpSimd ``nisa`` instructions (legacy signatures, fp32 math, cast on output)."""

from __future__ import annotations

import warnings

import numpy as np

from ... import dtypes as D
from ... import errors as E
from ... import sdk
from ... import trace
from ...access import write
from ...alu import ALU, act_name, alu_name, apply_act, reduce_values
from ..compute import check_same_partitions, free_size, operand, require_kernel, result_tile
from ...engines.events import tensor_tensor_attrs
from ...indexing import IndexExpr, MaskExpr, broadcast_left, mask_array
from ..language.reduce import reduce_op
from ...state import state
from ...target import get_target
from ...tensor import Tensor
from .constants import engine as _engine
from .constants import reduce_cmd as _reduce_cmd

_ENGINE_NAMES = {_engine.vector: "vector", _engine.scalar: "scalar", _engine.gpsimd: "gpsimd",
                 _engine.tensor: "tensor"}


def _engine_name(engine, default):
    if engine is None or engine == _engine.unknown:
        return default
    try:
        return _ENGINE_NAMES[engine]
    except KeyError:
        raise ValueError(f"engine must be nisa.vector_engine / scalar_engine / gpsimd_engine; got {engine!r}") from None


def _no_psum_on_gpsimd(op, eng, *tiles):
    if eng != "gpsimd":
        return
    for t in tiles:
        if isinstance(t, Tensor) and t.buffer == "psum":
            raise E.MemorySpaceError(
                f"'{op}' on the GpSimd engine cannot access PSUM (operand {t.name}); GpSimd reads "
                "and writes SBUF only")


def _emit_psum_staging(a, m, op):
    """Trace the PSUM -> SBUF copy a GpSimd instruction reading PSUM needs (Vector engine)."""
    if not state.traces:
        return
    n = int(np.count_nonzero(m)) if m is not None else int(np.prod(a.shape, dtype=np.int64))
    rows = a.shape[0] if a.shape else 1
    trace.emit("vector", "copy", in_shapes=(a.shape,), out_shape=a.shape, in_dtypes=(a.dtype.name,),
               out_dtype=a.dtype.name, partitions=rows, free_elems=free_size(a.shape),
               nbytes=n * a.dtype.itemsize, src_buffer="psum", dst_buffer="sbuf",
               attrs={"implicit": True, "psum_input": True, "staging_for": op})


def warn_accumulator_chain(api: str):
    """A reduce_cmd=reduce continues an engine-accumulator chain begun by an earlier instruction:
    inside a multi-iteration affine_range the hardware may interleave iterations' chains."""
    k = state.kernel
    if not any(f.kind == "affine" and f.n > 1 for f in k.loops):
        return
    loc = trace.kernel_src_loc()
    seen = k.acc_warned
    if seen is None:
        seen = k.acc_warned = set()
    if loc in seen:
        return
    seen.add(loc)
    warnings.warn(f"{api} with reduce_cmd=reduce at {loc[0]}:{loc[1]} continues an engine-accumulator "
                  "chain inside a multi-iteration nl.affine_range: iterations may be pipelined on "
                  "hardware, and nothing orders accumulator state between them; keep the chain in one "
                  "instruction (reset_reduce) or use nl.sequential_range", RuntimeWarning, stacklevel=3)


def accumulators():
    k = state.kernel
    acc = k.accumulators
    if acc is None:
        acc = k.accumulators = {"scalar": np.zeros(get_target().pmax, np.float32),
                                "vector": np.full(get_target().pmax, -np.inf, np.float32)}
    return acc


def pvec(x, name, op, P, allow_scalar=True):
    """A per-partition operand: scalar or [P, 1] tile -> fp32 array broadcastable to (P, 1...)."""
    if x is None:
        return None, None
    o = operand(x, name, op, allow_scalar=allow_scalar)
    if o.is_scalar:
        return np.float32(o.v), o
    if o.shape[0] not in (1, P) or free_size(o.shape) != 1:
        raise E.NkiCompileError(f"'{op}': {name} must be a scalar or a [{P}, 1] tile; got {list(o.shape)} "
                                "(err_activation_scale_scalar_or_vector)" if name == "scale" else
                                f"'{op}': {name} must be a scalar or a [{P}, 1] tile; got {list(o.shape)}")
    return np.asarray(o.v, np.float32).reshape(o.shape[0], 1), o


def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=_reduce_cmd.idle, mask=None, dtype=None, name="", _api="activation", **kw):
    """out = op(data * scale + bias) on ScalarE; optional per-partition reduction of out."""
    require_kernel(f"nisa.{_api}")
    if _api == "activation":
        sdk.check_kwargs("nisa.activation", (2, 22), reduce_op=reduce_op, reduce_res=reduce_res,
                         reduce_cmd=None if reduce_cmd == _reduce_cmd.idle else reduce_cmd)
    fn = act_name(op, f"nisa.{_api}")
    tgt = get_target()
    if not isinstance(data, Tensor):
        raise TypeError(f"nisa.{_api}: data must be a tile; got {type(data).__name__}")
    P = data.shape[0]
    m = mask_array(mask, data.shape) if mask is not None else None
    a = operand(data, "data", _api, m)
    b, bo = pvec(bias, "bias", _api, P)
    if bo is not None and bo.is_scalar and tgt.nc_version == "gen2":
        raise E.NkiCompileError(
            f"nisa.{_api}: a scalar bias needs NeuronCore-v3; pass a [{P}, 1] tile "
            "(err_activation_bias_invalid_type)", code="err_activation_bias_invalid_type")
    if bo is not None and not bo.is_scalar and bo.dtype not in (D.float32, D.float16, D.bfloat16):
        raise E.NkiCompileError(f"nisa.{_api}: bias must be float32/float16/bfloat16; got "
                                f"{bo.dtype.name} (err_activation_bias_invalid_type)",
                                code="err_activation_bias_invalid_type")
    if scale is None or isinstance(scale, (bool, str)) or not (
            isinstance(scale, (int, float, np.floating, np.integer, Tensor))):
        raise E.NkiCompileError(f"nisa.{_api}: scale must be a float scalar or a [{P}, 1] float32 tile; "
                                f"got {scale!r} (err_activation_scale_invalid_type)",
                                code="err_activation_scale_invalid_type")
    if isinstance(scale, Tensor) and scale.dtype != D.float32:
        raise E.NkiCompileError(f"nisa.{_api}: a scale tile must be float32; got {scale.dtype.name} "
                                "(err_activation_scale_invalid_type)", code="err_activation_scale_invalid_type")
    s, so = pvec(scale, "scale", _api, P)
    x = D.as_f32(a.v).reshape(P, -1)     # (P, free): (128,) ~ (128, 1)
    z = x * s
    if b is not None:
        z = z + b
    out = apply_act(fn, z)
    if out.shape != data.shape:
        out = out.reshape(data.shape)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    res = result_tile(out, out_dt, op=_api, engine="scalar",
                      inputs=tuple(o for o in (a, bo, so) if o is not None), mask=m, name=name,
                      attrs={"func": fn, "reduce": True} if (
                          _api == "activation_reduce" or reduce_res is not None
                          or reduce_cmd != _reduce_cmd.idle) else {"func": fn})
    if reduce_res is not None or reduce_cmd != _reduce_cmd.idle:
        if reduce_op is None:
            reduce_op = np.add
        rname = alu_name(reduce_op, f"nisa.{_api} reduce_op")
        if tgt.nc_version == "gen2" and rname != "add":
            raise E.TargetError(f"nisa.{_api}: on NeuronCore-v2 reduce_op must be add; got {rname}")
        cmd = _reduce_cmd(reduce_cmd)
        if reduce_res is not None and cmd == _reduce_cmd.idle:
            cmd = _reduce_cmd.reset_reduce
        acc = accumulators()["scalar"]
        ov = out if m is None else np.where(m, out, 0 if rname == "add" else np.nan)
        ov = ov.reshape(P, -1)
        part = reduce_values(rname, ov.reshape(P, -1), 1)
        if cmd == _reduce_cmd.reset:
            acc[:P] = 0
        elif cmd == _reduce_cmd.reset_reduce:
            acc[:P] = part
        elif cmd == _reduce_cmd.reduce:
            warn_accumulator_chain(f"nisa.{_api}")
            acc[:P] = reduce_values(rname, np.stack([acc[:P], part]), 0)
        if reduce_res is not None:
            if not isinstance(reduce_res, Tensor) or reduce_res.shape[0] != P or \
                    free_size(reduce_res.shape) != 1:
                raise E.NkiCompileError(
                    f"nisa.{_api}: reduce_res must be a tile view of shape ({P}, 1) (one element per "
                    f"partition); got {list(getattr(reduce_res, 'shape', [type(reduce_res).__name__]))}")
            write(reduce_res, acc[:P].reshape((P,) + (1,) * (reduce_res.ndim - 1))
                  if reduce_res.ndim > 1 else acc[:P], op=_api)
    return res


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None,
                      dtype=None, name="", **kw):
    """activation + per-partition reduction of the fp32 results into ``reduce_res``."""
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=_reduce_cmd.reset_reduce, mask=mask, dtype=dtype, name=name,
                      _api="activation_reduce")


def _compute(name, vals_dtypes):
    fn, int_exact, kind = ALU[name]
    dts = [d for _, d in vals_dtypes]
    cdt = D.compute_dtype(dts, int_exact)
    if kind == "bitvec":
        if any(D.is_float(d) for d in dts):
            raise E.DtypeError(f"bitvec op '{name}' needs integer operands; got {[d.name for d in dts]}")
        cdt = np.dtype(np.int64)
    return fn, cdt


def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=None, name="", **kw):
    """Element-wise ``op(data1, data2)``; same partitions and elements per partition."""
    require_kernel("nisa.tensor_tensor")
    sdk.check_kwargs("nisa.tensor_tensor", (2, 22), engine=engine)
    opn = alu_name(op, "nisa.tensor_tensor")
    for pname, t in (("data1", data1), ("data2", data2)):
        if not isinstance(t, Tensor):
            raise TypeError(f"nisa.tensor_tensor: {pname} must be a tile; got {type(t).__name__}")
    check_same_partitions("tensor_tensor", [("data1", data1.shape), ("data2", data2.shape)])
    if free_size(data1.shape) != free_size(data2.shape):
        raise E.NkiCompileError(
            f"nisa.tensor_tensor: data1{list(data1.shape)} and data2{list(data2.shape)} must have the "
            "same number of elements per partition")
    if data1.buffer == "psum" and data2.buffer == "psum":
        raise E.MemorySpaceError("nisa.tensor_tensor: data1 and data2 cannot both be in PSUM")
    all_int = D.is_int(data1.dtype) and D.is_int(data2.dtype)
    default = "gpsimd" if (all_int and opn in ("add", "subtract", "multiply") and "psum" not in
                           (data1.buffer, data2.buffer)) or opn == "power" else "vector"
    eng = _engine_name(engine, default)
    _no_psum_on_gpsimd("tensor_tensor", eng, data1, data2)
    m = mask_array(mask, data1.shape) if mask is not None else None
    a = operand(data1, "data1", "tensor_tensor", m)
    b = operand(data2, "data2", "tensor_tensor", m)
    fn, cdt = _compute(opn, [(a.v, a.dtype), (b.v, b.dtype)])
    r = fn(np.asarray(a.v, cdt), np.asarray(b.v, cdt).reshape(a.shape))
    out_dt = D.as_dtype(dtype) if dtype is not None else D.promote(a.dtype, b.dtype)
    return result_tile(r, out_dt, op="tensor_tensor", engine=eng, inputs=(a, b), mask=m, name=name,
                       attrs=tensor_tensor_attrs(opn, (a, b)) if state.traces else None)


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         dtype=None, mask=None, name="", **kw):
    """``(data op0 operand0) op1 operand1`` on VectorE: operand0 a scalar or a [P, 1] tile,
    operand1 a tile of data's shape; data and operand1 not both in PSUM."""
    api = "nisa.scalar_tensor_tensor"
    require_kernel(api)
    for pname, t in (("data", data), ("operand1", operand1)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{api}: {pname} must be a tile; got {type(t).__name__}")
    check_same_partitions("scalar_tensor_tensor",
                          [("data", data.shape), ("operand1", operand1.shape)])
    if tuple(data.shape) != tuple(operand1.shape):
        raise E.NkiCompileError(f"{api}: operand1{list(operand1.shape)} must have data's shape "
                                f"{list(data.shape)}")
    if data.buffer == "psum" and operand1.buffer == "psum":
        raise E.MemorySpaceError(f"{api}: data and operand1 cannot both be in PSUM")
    P = data.shape[0]
    m = mask_array(mask, data.shape) if mask is not None else None
    a = operand(data, "data", "scalar_tensor_tensor", m)
    s = operand(operand0, "operand0", "scalar_tensor_tensor")
    t = operand(operand1, "operand1", "scalar_tensor_tensor", m)
    if not s.is_scalar and (s.shape[0] not in (1, P) or free_size(s.shape) != 1):
        raise E.NkiCompileError(f"{api}: operand0 must be a scalar or a [{P}, 1] tile; got "
                                f"{list(s.shape)}")
    n0, n1 = alu_name(op0, f"{api} op0"), alu_name(op1, f"{api} op1")
    fn0, c0 = _compute(n0, [(a.v, a.dtype), (s.v, s.dtype)])
    x, y = np.asarray(a.v, c0), np.asarray(s.v, c0)
    if y.ndim:
        y = y.reshape((y.shape[0],) + (1,) * (x.ndim - 1))
    mid = fn0(y, x) if reverse0 else fn0(x, y)
    fn1, c1 = _compute(n1, [(a.v, a.dtype), (t.v, t.dtype)])
    z = np.asarray(t.v, c1).reshape(x.shape)
    r = fn1(z, np.asarray(mid, c1)) if reverse1 else fn1(np.asarray(mid, c1), z)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    return result_tile(r, out_dt, op="scalar_tensor_tensor", engine="vector", inputs=(a, s, t),
                       mask=m, name=name,
                       attrs={"ops": (n0, n1), **tensor_tensor_attrs(n1, (a, t))})


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *,
                  dtype=None, mask=None, engine=None, name="", **kw):
    """``(data op0 operand0) op1 operand1`` with scalar or [P, 1] operands."""
    require_kernel("nisa.tensor_scalar")
    sdk.check_kwargs("nisa.tensor_scalar", (2, 22), engine=engine)
    if not isinstance(data, Tensor):
        raise TypeError(f"nisa.tensor_scalar: data must be a tile; got {type(data).__name__}")
    P = data.shape[0]
    m = mask_array(mask, data.shape) if mask is not None else None
    a = operand(data, "data", "tensor_scalar", m)
    n0 = alu_name(op0, "nisa.tensor_scalar op0")
    o0 = operand(operand0, "operand0", "tensor_scalar")
    stages = [(n0, o0, reverse0)]
    if op1 is not None:
        stages.append((alu_name(op1, "nisa.tensor_scalar op1"), operand(operand1, "operand1", "tensor_scalar"),
                       reverse1))
    kinds = {ALU[n][2] == "bitvec" for n, _, _ in stages}
    if len(kinds) > 1:
        raise E.NkiCompileError(
            f"nisa.tensor_scalar: op0 and op1 must be of the same type (both bitvec or both "
            f"arithmetic); got {[n for n, _, _ in stages]}")
    for n, o, _ in stages:
        if not o.is_scalar and (o.shape[0] not in (1, P) or free_size(o.shape) != 1):
            raise E.NkiCompileError(f"nisa.tensor_scalar: operands must be scalars or [{P}, 1] tiles; "
                                    f"got {list(o.shape)}")
    eng = _engine_name(engine, "vector")
    _no_psum_on_gpsimd("tensor_scalar", eng, data)
    if eng == "scalar":
        tgt = get_target()
        pair = tuple(n for n, _, _ in stages) + ((None,) if len(stages) == 1 else ())
        if tgt.nc_version == "gen2":
            raise E.TargetError(
                f"nisa.tensor_scalar on the Scalar engine needs NeuronCore-v3 (trn2); target is "
                f"{tgt.name} ({tgt.nc_version}). Use nisa.vector_engine.")
        if pair not in (("multiply", "add"), ("multiply", None), ("add", None)):
            raise E.NkiCompileError(
                f"nisa.tensor_scalar on the Scalar engine supports (op0, op1) = (multiply, add), "
                f"(multiply, None) or (add, None); got {pair}")
    dts = [a.dtype] + [o.dtype for _, o, _ in stages]
    cur = a.v
    for n, o, rev in stages:
        fn, cdt = _compute(n, [(None, d) for d in dts])
        x = np.asarray(cur, cdt)
        y = np.asarray(o.v, cdt)
        if y.ndim:
            y = y.reshape((y.shape[0],) + (1,) * (x.ndim - 1))
        cur = fn(y, x) if rev else fn(x, y)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    attrs = {"ops": tuple(n for n, _, _ in stages)}
    if engine is None or engine == _engine.unknown:
        attrs["engine_unspecified"] = True          # the compiler picks (nki_sim/cost.py)
    return result_tile(cur, out_dt, op="tensor_scalar", engine=eng,
                       inputs=(a,) + tuple(o for _, o, _ in stages), mask=m, name=name,
                       attrs=attrs)


def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, name="", **kw):
    """Reduce the trailing free axes with ``op`` (VectorE, fp32); ``negate`` multiplies by -1."""
    opn = alu_name(op, "nisa.tensor_reduce")
    if negate and opn not in ("add", "subtract", "multiply", "maximum", "minimum"):
        raise ValueError("nisa.tensor_reduce: negate=True needs an arithmetic op")
    return reduce_op("tensor_reduce", opn, data, axis, dtype=dtype, mask=mask, keepdims=keepdims,
                     negate=negate, api="nisa.tensor_reduce", tname=name)


def tensor_copy(src, *, mask=None, dtype=None, engine=None, name="", **kw):
    """On-chip copy (bit-exact when dtype is unchanged)."""
    require_kernel("nisa.tensor_copy")
    if not isinstance(src, Tensor):
        raise TypeError(f"nisa.tensor_copy: src must be a tile; got {type(src).__name__}")
    eng = _engine_name(engine, "vector")
    _no_psum_on_gpsimd("tensor_copy", eng, src)
    m = mask_array(mask, src.shape) if mask is not None else None
    a = operand(src, "src", "tensor_copy", m)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    v = a.v
    if eng == "scalar" and out_dt != a.dtype:
        v = np.asarray(v, np.float32)
    return result_tile(v, out_dt, op="tensor_copy", engine=eng, inputs=(a,), mask=m, name=name)


def reciprocal(data, *, dtype=None, mask=None, name="", **kw):
    """1 / data on VectorE (fp32)."""
    require_kernel("nisa.reciprocal")
    if not isinstance(data, Tensor):
        raise TypeError(f"nisa.reciprocal: data must be a tile; got {type(data).__name__}")
    m = mask_array(mask, data.shape) if mask is not None else None
    a = operand(data, "data", "reciprocal", m)
    r = np.float32(1.0) / np.asarray(a.v, np.float32)
    out_dt = D.as_dtype(dtype) if dtype is not None else (a.dtype if D.is_float(a.dtype) else D.float32)
    return result_tile(r, out_dt, op="reciprocal", engine="vector", inputs=(a,), mask=m, name=name)


def iota(expr, dtype, *, mask=None, name="", **kw):
    """Materialize an affine index expression (or an int) as an SBUF tile (GpSimd, int32 math)."""
    require_kernel("nisa.iota")
    d = D.as_dtype(dtype, "nisa.iota: dtype")
    if isinstance(expr, IndexExpr):
        v = expr.v
    elif isinstance(expr, (int, np.integer)) and not isinstance(expr, bool):
        v = np.full((1, 1), int(expr), dtype=np.int64)
    else:
        raise TypeError(f"nisa.iota: expr must be an nl.arange / nl.mgrid expression or an int; "
                        f"got {type(expr).__name__}")
    if v.ndim < 2:
        if isinstance(expr, IndexExpr):
            raise E.IndexingError(
                f"nisa.iota: 1-D nl.arange of shape {list(v.shape)} is not supported; lift it to 2-D "
                "with [:, None] or [None, :] (err_1d_arange_not_supported)",
                code="err_1d_arange_not_supported")
        v = v.reshape(v.shape + (1,) * (2 - v.ndim))
    m = mask_array(mask, v.shape) if mask is not None else None
    return result_tile(v, d, op="iota", engine="gpsimd", mask=m, name=name)


def memset(shape, value, dtype, *, mask=None, engine=None, name="", **kw):
    """A new tile filled with ``value`` (shape[0] = partitions)."""
    require_kernel("nisa.memset")
    sdk.check_kwargs("nisa.memset", (2, 22), engine=engine)
    d = D.as_dtype(dtype, "nisa.memset: dtype")
    shape = tuple(int(s) for s in shape)
    eng = _engine_name(engine, "vector")
    m = mask_array(mask, shape) if mask is not None else None
    return result_tile(np.full(shape, value), d, op="memset", engine=eng, mask=m, name=name)


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None, name="", **kw):
    """``pred ? on_true_tile : on_false_value`` with an affine predicate on index grids (GpSimd).

    ``on_true_tile`` may be in PSUM: the legacy front end accepts it (AWS's SD-attention
    tutorial, flash_fwd and flash_attn_bwd mask their PSUM scores this way under
    ``simulate_kernel``; only the NKI 0.2+ API demands SBUF).  GpSimd has no PSUM port, so the
    trace records the PSUM read as an implicit Vector-engine staging copy to SBUF before the
    GpSimd instruction (``attrs`` implicit / staging_for); the result must go to SBUF."""
    require_kernel("nisa.affine_select")
    if not isinstance(pred, MaskExpr):
        raise TypeError("nisa.affine_select: pred must be an affine predicate on nl.arange / nl.mgrid "
                        f"indices (e.g. i_q >= i_k); got {type(pred).__name__}")
    if not pred.affine or pred.terms != 1:
        raise E.NkiCompileError(
            "nisa.affine_select: pred must be ONE affine comparison of the indices (no '&' / '|' "
            "combinations, no % or //); for a complex predicate use nl.where",
            code="err_unsupported_expression_in_mask")
    if not isinstance(on_true_tile, Tensor):
        raise TypeError("nisa.affine_select: on_true_tile must be a tile")
    shape = on_true_tile.shape
    m = mask_array(mask, shape) if mask is not None else None
    a = operand(on_true_tile, "on_true_tile", "affine_select", m)
    if a.buffer == "psum":
        _emit_psum_staging(a, m, "affine_select")
    p = broadcast_left(pred.v, shape)
    r = np.where(p, np.asarray(a.v, np.float32), np.float32(on_false_value))
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    return result_tile(r, out_dt, op="affine_select", engine="gpsimd", inputs=(a,), mask=m, name=name)
