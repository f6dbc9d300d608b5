"""Kernel launch of the current API: ``nki.jit``, ``kernel[lnc]``, ``nki.simulate``,
``nki.simulator.simulate_kernel``.

Arguments: NumPy arrays or torch tensors become HBM tensors (``nl.hbm``; ``nl.shared_hbm`` under
LNC=2) that the kernel may update in place (written back into the caller's array / tensor; a
read-only array works as an input and is a ``ValueError`` if the kernel writes it; the conversions
are :mod:`nki_sim.arguments`, shared with the legacy launch);
Python scalars and tuples pass through.  Outputs are ``nl.shared_hbm`` tensors returned by the
kernel, converted to the arguments' framework (torch in -> torch out).  ``lnc`` logical cores
run one after another with ``nl.program_id(0)`` = 0, 1 over the same HBM (each with its own
SBUF / PSUM); trace events carry their core in ``program_id``.  With no device present every
``@nki.jit`` call is simulated (``NKI_SIMULATOR=0`` makes it an error, as without a device).
"""

from __future__ import annotations


import functools
import inspect
import os
import warnings

import numpy as np

from .. import arguments as A
from .. import errors as E
from ..blas import single_threaded
from ..memory import Live
from ..state import KernelContext, state
from ..target import get_target
from ..trace import begin_launch
from . import version
from .checks import check_capacity
from .ndarray import NkiTensor, wrap_alloc
from . import dtypes as T


def _env_lnc():
    v = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
    if not v:
        return None
    if v not in ("1", "2"):
        raise ValueError(f"NEURON_LOGICAL_NC_CONFIG must be 1 or 2; got {v!r}")
    return int(v)


def _check_target():
    env = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip().lower()
    if env in ("trn3", "gen4"):
        raise E.NotEmulatedError("NEURON_PLATFORM_TARGET_OVERRIDE=trn3/gen4: NeuronCore-v4 is not "
                                 "simulated by nki_sim (trn2 / gen3 and trn1 / gen2 are)")
    tgt = get_target()
    if tgt.nc_version == "gen2":
        warnings.warn("the current nki API officially supports trn2 / trn3 only; AWS does not support "
                      "NKI 0.3+ kernels on trn1 (gen2); simulating gen2 anyway", UserWarning, stacklevel=4)
    return tgt


def _wrap(name, arr, buffer, inputs, user):
    """An HBM tensor over array argument ``name`` (any argument may be written: the caller's
    memory directly when it can be, else a copy returned by :func:`_copy_back`)."""
    dt = T.name_of(arr.dtype)                  # ValueError for float64 / int64 ...
    a = A.input_alloc(name, arr, buffer, mutable=True, user=user)
    inputs.append(a)
    return wrap_alloc(a, dt)


def _convert_args(func, args, kwargs, buffer):
    sig = inspect.signature(func)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"kernel {func.__name__}: {e}") from None
    bound.apply_defaults()
    inputs, torch_in = [], []

    def conv(name, v):
        if isinstance(v, tuple):
            return tuple(conv(f"{name}[{i}]", x) for i, x in enumerate(v))
        if isinstance(v, list):
            raise TypeError(f"kernel argument '{name}' is a list; pass a tuple (NKI kernels take no lists)")
        arr, tt = A.to_numpy(name, v)
        if arr is None:
            return v
        if tt is not None:
            torch_in.append(tt)
        return _wrap(name, arr, buffer, inputs, v)

    for n in list(bound.arguments):
        bound.arguments[n] = conv(n, bound.arguments[n])
    return bound, inputs, torch_in


def _copy_back(inputs):
    """Return every argument's HBM contents to the caller's array / tensor (nothing to do where
    the kernel ran on the caller's memory); a read-only array the kernel wrote is an error."""
    for a in inputs:
        A.write_back(a.name, a.user_array, a.data, written=a.ever_written)


def _output(x, torch_out):
    if isinstance(x, NkiTensor):
        a = x._alloc
        if a.kind == "input" and x._ind is None and x.offset == 0 and x.shape == a.data.shape \
                and x.is_contiguous():
            return a.user_array                # the whole argument: the caller's own object
        if a.kind != "input" and a.buffer != "shared_hbm":
            raise E.KernelSignatureError(
                f"kernel returned {a.buffer} tensor `{a.name}`: output tensors must use nl.shared_hbm")
        arr = A.materialize(x.core()).reshape(x.shape)
        want = T.declared_np(x.dtype)
        if arr.dtype != want:                  # NKI_PRECISE_FP=0: fp32 storage of a narrow dtype
            arr = arr.astype(want)
        return A.to_framework(arr, torch_out)
    if isinstance(x, (tuple, list)):
        return tuple(_output(v, torch_out) for v in x)
    return x


def run(func, lnc, args, kwargs):
    """Simulate ``func`` on ``lnc`` logical cores; returns the converted outputs."""
    if state.kernel is not None:
        raise E.KernelSignatureError("a jitted kernel cannot be called from inside another kernel; "
                                     "sub-kernels are plain (undecorated) functions")
    if lnc not in (1, 2):
        raise ValueError(f"the logical core count must be 1 or 2; got {lnc!r}")
    tgt = _check_target()
    pfp = os.environ.get("NKI_PRECISE_FP", "1").strip()
    if pfp not in ("0", "1"):
        raise ValueError(f"NKI_PRECISE_FP must be 0 or 1; got {pfp!r}")
    T.set_precise(pfp == "1")
    if lnc == 2 and tgt.nc_version == "gen2":
        raise E.TargetError("LNC=2 needs trn2 (NeuronCore-v3): trn1 has one core per logical core")
    with single_threaded(), np.errstate(all="ignore"):
        bound, inputs, torch_in = _convert_args(func, args, kwargs, "shared_hbm" if lnc == 2 else "hbm")
        ctx_args = dict(name=func.__name__, grid=(lnc,), target=tgt,
                        code=getattr(inspect.unwrap(func), "__code__", None))
        begin_launch(tgt)
        if lnc > 1:
            from .lnc import run_cores
            ret = run_cores(func, bound, ctx_args, lnc)
        else:
            ctx = KernelContext(**ctx_args)
            ctx.program_id = (0,)
            ctx.live = Live()
            state.kernel = ctx
            try:
                ret = func(*bound.args, **bound.kwargs)
                check_capacity(ctx.live, tgt)
            except Exception as e:
                from ..runtime import add_context_note
                add_context_note(e, ctx)
                raise
            finally:
                state.kernel = None
        out = _output(ret, bool(torch_in))
        _copy_back(inputs)
        return out


class Kernel:
    """``@nki.jit`` kernel; ``kernel[lnc]`` selects the logical core count."""

    def __init__(self, func, lnc=None, **options):
        if "platform_target" in options:
            raise TypeError("nki.jit: platform_target= was removed in NKI 0.3; set "
                            "NEURON_PLATFORM_TARGET_OVERRIDE instead")
        if "mode" in options:
            warnings.warn("nki.jit(mode=...) is deprecated and ignored", DeprecationWarning, stacklevel=3)
            options.pop("mode")
        for k in ("compile_config", "specialization_config"):
            if k in options:
                version.require((0, 7), f"nki.jit({k}=)")
        self.func, self.lnc, self.options = func, lnc, options
        functools.update_wrapper(self, func)

    def _lnc(self):
        env = _env_lnc()
        if self.lnc is not None and env is not None and env != self.lnc:
            raise E.KernelSignatureError(
                f"NKI kernel '{self.func.__name__}' is configured with LNC={self.lnc}, but neuronx-cc "
                f"is using LNC={env}. (NCC_EVRF066)")
        return self.lnc or env or 1

    def __call__(self, *args, **kwargs):
        if os.environ.get("NKI_SIMULATOR", "").strip() == "0":
            raise E.DeviceRequiredError("running an nki.jit kernel needs a Neuron device; none is "
                                        "available (set NKI_SIMULATOR=1 or use nki.simulate)")
        return run(self.func, self._lnc(), args, kwargs)

    def __getitem__(self, lnc):
        if isinstance(lnc, tuple):
            raise TypeError(f"kernel[{lnc}]: the launch bracket holds the logical core count (1 or 2), "
                            "not an SPMD grid; loop inside the kernel instead")
        if version.has((0, 7)):
            warnings.warn("kernel[lnc] is being deprecated (NKI 0.7); set NEURON_LOGICAL_NC_CONFIG",
                          DeprecationWarning, stacklevel=2)
        return Kernel(self.func, lnc=int(lnc), **self.options)

    def __repr__(self):
        return f"<nki_sim current kernel {self.func.__name__} lnc={self.lnc}>"


def jit(fn=None, **kwargs):
    if fn is None:
        return lambda f: Kernel(f, **kwargs)
    return Kernel(fn, **kwargs)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)`` / ``nki.simulate(kernel[2])(*args)``."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    def call(*args, **kwargs):
        return run(k.func, k._lnc(), args, kwargs)
    return call


def simulate_kernel(func, args=(), kwargs=None, lnc=None):
    """vllm-neuron's CPU-mode entry: ``nki.simulator.simulate_kernel(func, args, kwargs, lnc)``."""
    k = func if isinstance(func, Kernel) else Kernel(getattr(func, "func", func))
    n = lnc if lnc is not None else k._lnc()
    return run(k.func, int(n), tuple(args), dict(kwargs or {}))



