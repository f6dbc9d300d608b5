"""Kernel launch: ``nki.jit``, grid launch ``kernel[d0, d1](...)``, ``nki.simulate_kernel``.

A top-level call wraps NumPy arguments as HBM tensors (immutable unless annotated
``nt.mutable_tensor``), runs the SPMD programs serially in row-major grid order (each with
fresh SBUF/PSUM/private HBM; ``shared_hbm`` allocations are shared by position), and
converts returned tensors back to NumPy.  A jit function called while a kernel runs is an
ordinary inline call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools

import numpy as np

from . import dtypes as D
from . import errors as E
from .blas import single_threaded
from .config import config
from .memory import Alloc, Live
from .state import KernelContext, state
from .target import get_target, resolve_target, use_target
from .tensor import Tensor

_DEVICE_MODES = ("baremetal", "benchmark", "profile")
_SIM_MODES = ("auto", "simulation", "trace")
_MODES = _SIM_MODES + _DEVICE_MODES + ("jax", "torchxla")


def _is_mutable_annotation(ann) -> bool:
    from .legacy.nki_typing import mutable_tensor
    if ann is mutable_tensor or isinstance(ann, type) and issubclass(ann, mutable_tensor):
        return True
    if getattr(ann, "_nki_mutable", False):
        return True
    return isinstance(ann, str) and "mutable_tensor" in ann


def _wrap_input(name: str, arr: np.ndarray, mutable: bool) -> Tensor:
    d = arr.dtype
    if d not in D.SUPPORTED:
        raise ValueError(
            f"kernel argument '{name}' must have an NKI dtype (float32, float16, bfloat16, fp8, "
            f"(u)int8/16/32, bool); got {d.name}. Cast it on the host first.")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if mutable:
        data = arr if arr.flags.c_contiguous and arr.flags.writeable else np.ascontiguousarray(arr).copy()
    else:
        data = np.ascontiguousarray(arr).view()
        data.flags.writeable = False
    a = Alloc(data, "hbm", name=name, kind="input", written=True, mutable=mutable)
    a.user_array = arr
    return Tensor(a, data)


def _output(x, ctx, inputs_by_alloc):
    if isinstance(x, Tensor):
        a = x.alloc
        if a.kind == "input":
            if x.idx is None and x.shape == a.data.shape and x.arr.strides == a.data.strides and \
                    x.arr.__array_interface__["data"][0] == a.data.__array_interface__["data"][0]:
                return a.user_array          # the whole parameter: the caller's own array
            return _materialize(x)
        if a.buffer not in ("shared_hbm", "hbm", "private_hbm"):
            raise E.KernelSignatureError(
                f"kernel returned on-chip ({a.buffer}) tensor {a.name}; outputs must be HBM tensors "
                "created with nl.ndarray(..., buffer=nl.shared_hbm)")
        if not a.ever_written:
            raise E.KernelSignatureError(
                f"output tensor {a.name} was never written (err_tensor_output_not_written_to)",
                code="err_tensor_output_not_written_to")
        return _materialize(x)
    if isinstance(x, (tuple, list)):
        return tuple(_output(v, ctx, inputs_by_alloc) for v in x)
    if isinstance(x, dict):
        return {k: _output(v, ctx, inputs_by_alloc) for k, v in x.items()}
    return x


def _materialize(x: Tensor) -> np.ndarray:
    """A NumPy copy of a returned tensor view (basic or advanced)."""
    from .access import Access
    x.alloc.poison()
    if x.idx is None:
        return np.array(x.arr)
    return np.array(Access(x).gather(x.alloc.data))


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


def _add_context_note(e: BaseException, ctx) -> None:
    """Record where in the kernel an error happened as ``e.nki_context`` (str(e) is unchanged)."""
    import os
    from .trace import in_simulator
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


def run_kernel(func, grid, args, kwargs, platform_target=None):
    """Simulate ``func`` over ``grid`` with NumPy arguments; returns NumPy outputs."""
    if state.kernel is not None:
        raise E.KernelSignatureError(
            "calling a grid-launched / top-level kernel from inside another kernel "
            "(err_nested_kernel_with_spmd_grid)", code="err_nested_kernel_with_spmd_grid")
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
        inputs = []

        def wrap(pname, val, param):
            if isinstance(val, np.ndarray):
                mutable = _is_mutable_annotation(param.annotation) or config.legacy_inplace_outputs
                t = _wrap_input(pname, val, mutable)
                inputs.append(t)
                return t
            if hasattr(val, "__array__") and type(val).__module__.startswith("torch"):
                raise TypeError(f"kernel argument '{pname}' is a torch tensor; pass a NumPy array "
                                "(host/_arrays.to_numpy) to the simulator")
            return val

        for pname, val in bound.arguments.items():
            param = sig.parameters[pname]
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[pname] = tuple(wrap(f"{pname}[{i}]", v, param) for i, v in enumerate(val))
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                bound.arguments[pname] = {kk: wrap(kk, v, param) for kk, v in val.items()}
            else:
                bound.arguments[pname] = wrap(pname, val, param)
        ctx = KernelContext(name=func.__name__, grid=grid, target=get_target(),
                            code=getattr(inspect.unwrap(func), "__code__", None))
        for tr in state.traces:
            tr._note_run(ctx.target)
        programs = list(itertools.product(*[range(g) for g in grid])) if grid else [()]
        state.kernel = ctx
        ret = None
        try:
            for pid in programs:
                ctx.program_id = pid
                ctx.live = Live()
                ctx.shared_cursor = 0
                ctx.loops.clear()
                ctx.affine.clear()
                ret = func(*bound.args, **bound.kwargs)
        except Exception as e:
            _add_context_note(e, ctx)
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
                if a.data is not a.user_array:
                    np.copyto(a.user_array, a.data)
        return _output(ret, ctx, None)


class Kernel:
    """Result of ``nki.jit`` (and of ``nki.baremetal`` / ``benchmark`` / ``profile``)."""

    def __init__(self, func, mode="auto", platform_target=None, **options):
        if mode not in _MODES:
            raise ValueError(f"nki.jit: mode must be one of {_MODES}; got {mode!r}")
        if platform_target is not None:
            resolve_target(platform_target)
        self.func = func
        self.mode = mode
        self.platform_target = platform_target
        self.options = options
        functools.update_wrapper(self, func)

    def _check_mode(self):
        if self.mode in _DEVICE_MODES:
            raise E.DeviceRequiredError(
                f"nki.{self.mode} requires a Neuron device (Trainium / Inferentia); none is available "
                "under nki_sim. Use nki.simulate_kernel(kernel, ...) or nki.jit(mode='simulation').")
        if self.mode in ("jax", "torchxla"):
            raise NotImplementedError(
                f"nki.jit(mode={self.mode!r}) needs the Neuron framework integration; call the kernel "
                "with NumPy arrays (simulation) instead")

    def __call__(self, *args, **kwargs):
        if state.kernel is not None:            # @nki.jit helper called inside a kernel: inline
            return self.func(*args, **kwargs)
        self._check_mode()
        return run_kernel(self.func, (), args, kwargs, self.platform_target)

    def __getitem__(self, grid):
        return GridLaunch(self, grid)

    def __repr__(self):
        return f"<nki_sim kernel {self.func.__name__} mode={self.mode}>"


class GridLaunch:
    """``kernel[d0, d1, ...]``: an SPMD launch configuration."""

    def __init__(self, kernel, grid):
        if not isinstance(grid, tuple):
            grid = (grid,)
        self.kernel = kernel
        self.grid = tuple(int(g) for g in grid)

    def __call__(self, *args, **kwargs):
        if state.kernel is not None:
            raise E.KernelSignatureError(
                "a grid-launched kernel cannot be called from inside another kernel "
                "(err_nested_kernel_with_spmd_grid)", code="err_nested_kernel_with_spmd_grid")
        self.kernel._check_mode()
        return run_kernel(self.kernel.func, self.grid, args, kwargs, self.kernel.platform_target)


def jit(func=None, mode="auto", platform_target=None, **kwargs):
    """``@nki.jit`` / ``nki.jit(func, mode=..., platform_target=...)``."""
    if func is None:
        return lambda f: Kernel(f, mode=mode, platform_target=platform_target, **kwargs)
    return Kernel(func, mode=mode, platform_target=platform_target, **kwargs)


def _device_decorator(mode):
    def deco(kernel=None, **kwargs):
        if kernel is None:
            return lambda f: Kernel(getattr(f, "func", f), mode=mode, **kwargs)
        return Kernel(getattr(kernel, "func", kernel), mode=mode, **kwargs)
    deco.__name__ = mode
    deco.__doc__ = f"nki.{mode}: needs a Neuron device (calling raises); simulate_kernel still works."
    return deco


baremetal = _device_decorator("baremetal")
benchmark = _device_decorator("benchmark")
profile = _device_decorator("profile")


def simulate_kernel(kernel, *args, **kwargs):
    """Run ``kernel`` (jit / baremetal kernel, ``kernel[grid]`` or plain function) on NumPy args."""
    if isinstance(kernel, GridLaunch):
        k = kernel.kernel
        return run_kernel(k.func, kernel.grid, args, kwargs, k.platform_target)
    if isinstance(kernel, Kernel):
        return run_kernel(kernel.func, (), args, kwargs, kernel.platform_target)
    if callable(kernel):
        return run_kernel(kernel, (), args, kwargs)
    raise TypeError(f"simulate_kernel: kernel must be an nki.jit kernel, kernel[grid] or a function; "
                    f"got {type(kernel).__name__}")
