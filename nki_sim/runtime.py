"""Kernel launch (front-end neutral): :func:`run_kernel`.

A launch wraps NumPy arguments (and CPU torch tensors, :mod:`nki_sim.arguments`) as HBM tensors of the front end's tensor class (immutable
unless the parameter's annotation sets ``_nki_mutable``, e.g. ``nt.mutable_tensor``), runs the
SPMD programs serially in row-major grid order (each with fresh SBUF/PSUM/private HBM;
``shared_hbm`` allocations are shared by position), and converts returned tensors back to
NumPy (torch tensors if any argument was one).  The legacy decorators (``nki.jit``, ``kernel[grid]``, ``simulate_kernel``) are in
:mod:`nki_sim.legacy.launch`.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os

import numpy as np

from . import arguments as A
from . import errors as E
from .blas import single_threaded
from .config import config
from .memory import Live
from .state import KernelContext, state
from .target import get_target, use_target
from .tensor import Tensor
from .trace import begin_launch, in_simulator


def _is_mutable_annotation(ann) -> bool:
    """Whether a parameter annotation marks a kernel input the kernel may write: a front end's
    mutable annotation class sets ``_nki_mutable`` (legacy ``nt.mutable_tensor``, also
    subscripted); a string annotation (postponed evaluation) naming ``mutable_tensor``."""
    if getattr(ann, "_nki_mutable", False):
        return True
    return isinstance(ann, str) and "mutable_tensor" in ann


def _wrap_input(name: str, arr: np.ndarray, mutable: bool, tensor_type=Tensor, user=None) -> Tensor:
    """An HBM input tensor over ``arr``; ``user`` is the caller's object (``arr`` itself or the
    torch tensor ``arr`` was made from), the target of the write-back of a mutable input."""
    A.check_dtype(name, arr.dtype)
    a = A.input_alloc(name, arr, "hbm", mutable=mutable, user=arr if user is None else user)
    return tensor_type(a, a.data)


def _output(x, ctx, torch_out=False):
    if isinstance(x, Tensor):
        a = x.alloc
        if a.kind == "input":
            if x.idx is None and x.shape == a.data.shape and x.arr.strides == a.data.strides and \
                    x.arr.__array_interface__["data"][0] == a.data.__array_interface__["data"][0]:
                return a.user_array          # the whole parameter: the caller's own array
            return A.to_framework(A.materialize(x), torch_out)
        if a.buffer not in ("shared_hbm", "hbm", "private_hbm"):
            raise E.KernelSignatureError(
                f"kernel returned on-chip ({a.buffer}) tensor {a.name}; outputs must be HBM tensors "
                "created with nl.ndarray(..., buffer=nl.shared_hbm)")
        if not a.ever_written:
            raise E.KernelSignatureError(
                f"output tensor {a.name} was never written (err_tensor_output_not_written_to)",
                code="err_tensor_output_not_written_to")
        return A.to_framework(A.materialize(x), torch_out)
    if isinstance(x, (tuple, list)):
        return tuple(_output(v, ctx, torch_out) for v in x)
    if isinstance(x, dict):
        return {k: _output(v, ctx, torch_out) for k, v in x.items()}
    return x


def _returned_allocs(x, out):
    if isinstance(x, Tensor):
        out.add(id(x.alloc))
    elif isinstance(x, (tuple, list)):
        for v in x:
            _returned_allocs(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _returned_allocs(v, out)
    return out


def add_context_note(e: BaseException, ctx) -> None:
    """Record where in the kernel an error happened as ``e.nki_context`` (str(e) is unchanged)."""
    loc = None
    tb = e.__traceback__
    while tb is not None:
        if not in_simulator(tb.tb_frame):
            loc = (os.path.basename(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        tb = tb.tb_next
    stack = [(f.kind, f.value) for f in ctx.loops] or list(ctx.unwound or ())
    loops = ", ".join(f"{kind}_range={v}" for kind, v in stack) or "none"
    where = f" at {loc[0]}:{loc[1]}" if loc else ""
    # an attribute, not an exception note: pytest's match= also searches notes, and documented
    # messages (e.g. the indirect-DMA IndexError) must stay matchable exactly
    try:
        e.nki_context = (f"kernel '{ctx.name}', program_id {tuple(ctx.program_id)}, enclosing loops: "
                         f"{loops}{where} (target {ctx.target.name})")
    except AttributeError:
        pass


def _lnc_axis(grid):
    """(axis, programs per core) of the first grid axis marked with logical cores, or None
    (``kernel[nl.nc(2), 2]``: core = program id on that axis; ``nl.spmd_dim(nl.nc(2), 2)``: the
    axis of 4 is split in 2 contiguous halves, per the nl.nc / nl.spmd_dim docs)."""
    for ax, g in enumerate(grid):
        k = getattr(g, "nki_lnc", 0)
        if k:
            return ax, max(1, int(g) // int(k))
    return None


def run_kernel(func, grid, args, kwargs, platform_target=None, *, tensor_type=Tensor):
    """Simulate ``func`` over ``grid`` with NumPy (or CPU torch) arguments; returns NumPy
    outputs (torch tensors when an argument was a torch tensor).

    ``tensor_type``: the front end's tensor class (a :class:`~nki_sim.tensor.Tensor` subclass)
    of the inputs and of every tensor the kernel creates (``KernelContext.tensor_type``)."""
    if state.kernel is not None:
        raise E.KernelSignatureError(
            "calling a grid-launched / top-level kernel from inside another kernel "
            "(err_nested_kernel_with_spmd_grid)", code="err_nested_kernel_with_spmd_grid")
    lnc_axis = _lnc_axis(grid)
    grid = tuple(int(g) for g in grid)
    if any(g <= 0 for g in grid):
        raise ValueError(f"SPMD grid sizes must be positive; got {list(grid)}")
    cm = use_target(platform_target) if platform_target is not None else contextlib.nullcontext()
    # engine arithmetic never traps: inf / NaN results flow silently (NumPy's FP-error state is
    # per thread / context, so this does not affect other threads)
    with cm, single_threaded(), np.errstate(all="ignore"):
        sig = inspect.signature(func)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"kernel {func.__name__}: {e}") from None
        inputs, torch_in = [], []

        def wrap(pname, val, param):
            arr, tt = A.to_numpy(pname, val)
            if arr is None:
                return val
            if tt is not None:
                torch_in.append(pname)
            mutable = _is_mutable_annotation(param.annotation) or config.legacy_inplace_outputs
            t = _wrap_input(pname, arr, mutable, tensor_type, user=val)
            inputs.append(t)
            return t

        for pname, val in bound.arguments.items():
            param = sig.parameters[pname]
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[pname] = tuple(wrap(f"{pname}[{i}]", v, param) for i, v in enumerate(val))
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                bound.arguments[pname] = {kk: wrap(kk, v, param) for kk, v in val.items()}
            else:
                bound.arguments[pname] = wrap(pname, val, param)
        ctx = KernelContext(name=func.__name__, grid=grid, target=get_target(),
                            code=getattr(inspect.unwrap(func), "__code__", None),
                            tensor_type=tensor_type)
        begin_launch(ctx.target)
        programs = list(itertools.product(*[range(g) for g in grid])) if grid else [()]
        state.kernel = ctx
        ret = None
        try:
            for pid in programs:
                ctx.program_id = pid
                if lnc_axis is not None:      # nl.nc / nl.spmd_dim(nl.nc(k), ..) grid axis
                    ax, per = lnc_axis
                    ctx.lnc_core = pid[ax] // per
                ctx.live = Live()
                ctx.shared_cursor = 0
                ctx.loops.clear()
                ctx.affine.clear()
                ret = func(*bound.args, **bound.kwargs)
                ctx.live.finish(ctx.target)     # peaks on the traces (no capacity error here)
        except Exception as e:
            add_context_note(e, ctx)
            raise
        finally:
            state.kernel = None
            ctx.loops.clear()
            ctx.affine.clear()
        returned = _returned_allocs(ret, set())
        for t in inputs:
            a = t.alloc
            if a.mutable and a.ever_written:
                if id(a) not in returned and not config.legacy_inplace_outputs:
                    raise E.KernelSignatureError(
                        f"mutable parameter '{a.name}' is written by the kernel but not returned "
                        "(err_mutable_parameter_not_returned)", code="err_mutable_parameter_not_returned")
                A.write_back(a.name, a.user_array, a.data)
        return _output(ret, ctx, bool(torch_in))
