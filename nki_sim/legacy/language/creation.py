"""Tensor creation, buffers and SPMD queries of ``nl`` (legacy signatures)."""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes as D
from ... import errors as E
from ... import trace
from ...access import read_values
from ..compute import check_partitions, require_kernel
from ...config import config
from ...indexing import ParDim
from ..kernel_scope import outside_kernel_level, warn_at_kernel_line
from ...memory import HBM_BUFFERS, Alloc, new_alloc
from ...sdk import fmt as sdk_fmt
from ...state import state
from ...target import get_target
from ...tensor import Tensor


class Buffer:
    """A memory location object (``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ...)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"nl.{self.name}"

    def __call__(self, *a, **k):       # ncc-style allocator callables pass through
        return self


sbuf = Buffer("sbuf")
psum = Buffer("psum")
hbm = Buffer("hbm")
private_hbm = Buffer("private_hbm")
shared_hbm = Buffer("shared_hbm")
_BUFFERS = {b.name: b.name for b in (sbuf, psum, hbm, private_hbm, shared_hbm)}


def buffer_name(buffer) -> str:
    if buffer is None:
        return "sbuf"
    if isinstance(buffer, Buffer):
        return buffer.name
    kind = getattr(buffer, "_nki_sim_buffer", None)       # nki.compiler allocators
    if kind:
        return kind
    if isinstance(buffer, str) and buffer in _BUFFERS:
        return buffer
    raise ValueError(f"buffer must be one of nl.sbuf, nl.psum, nl.hbm, nl.private_hbm, "
                     f"nl.shared_hbm; got {buffer!r}")


def _shape_and_par(shape, buf: str):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(shape)
    dims = tuple(int(s) for s in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must have non-negative sizes; got {dims}")
    pars = [i for i, s in enumerate(shape) if isinstance(s, ParDim)]
    par_axis = pars[0] if pars else 0
    if buf in ("sbuf", "psum"):
        if par_axis > 0:
            _check_block_dims(dims, par_axis)
        if len(dims) - par_axis < 2:
            raise E.NkiCompileError(
                f"Insufficient rank for on-chip tensor of shape {list(dims)}: SBUF/PSUM tensors need a "
                "partition and at least one free dimension, e.g. (128, 1)")
        check_partitions(dims[par_axis:], f"allocation of {buf} tensor {list(dims)}")
    return dims, par_axis


# Block dimensions: the NKI 2.23 release notes add a warning. The end-of-support announcement
# (Neuron 2.24) promised errors from 2.25, but AWS's legacy attention tutorial (nki-samples,
# August 2025, after 2.25) uses them, next to nl.store from PSUM, which needs 2.26; the
# migration guide lists block dimensions among what the new `nki` API (NKI 0.2, SDK 2.27) removed.
# So the legacy front end warns from 2.23 up to its last release (nki_sim/README.md rule 1).
BLOCK_DIMS_WARN_FROM, BLOCK_DIMS_ERROR_FROM = (2, 23), None


def block_dims_rule() -> str:
    """What the simulated front end does with block dimensions: "allow", "warn" or "error"."""
    if config.block_dims != "auto":
        return config.block_dims
    sdk = tuple(config.sdk)
    if BLOCK_DIMS_ERROR_FROM is not None and sdk >= BLOCK_DIMS_ERROR_FROM:
        return "error"
    return "warn" if sdk >= BLOCK_DIMS_WARN_FROM else "allow"


def _check_block_dims(dims, par_axis):
    rule = block_dims_rule()
    if rule == "allow":
        return
    fixed = [dims[par_axis]] + [d for i, d in enumerate(dims) if i != par_axis]
    what = (f"shape {list(dims)} puts {par_axis} block dimension(s) before par_dim "
            "(err_leading_dimension_of_tensor_must_be_partition)")
    if rule == "error":
        raise E.BlockDimensionError(
            f"Leading dimension of tensor must be partition: {what}; block dimensions are an error "
            f"here (nki_sim.configure(block_dims='error'); the new nki API has none; nki_sim "
            f"simulates SDK {sdk_fmt(config.sdk)}). Put the partition dimension first, e.g. "
            f"{fixed}, or nki_sim.configure(block_dims='warn').")
    warn_at_kernel_line(
        f"block dimensions are deprecated (removed in the new nki API): {what}; put the "
        f"partition dimension first, e.g. {fixed}", E.BlockDimensionWarning)


def _check_psum(dims, par_axis, d):
    t = get_target()
    per_part = math.prod(dims[par_axis + 1:]) * d.itemsize
    if per_part > t.psum_bank_bytes:
        raise E.SizeLimitError(
            f"PSUM tile {list(dims)} {d.name} needs {per_part} bytes per partition; a PSUM tile must "
            f"fit one bank ({t.psum_bank_bytes} bytes = {t.psum_fmax} fp32 per partition)")


def _allocate(shape, dtype, buffer, name, fill, api):
    require_kernel(api)
    buf = buffer_name(buffer)
    d = D.as_dtype(dtype, f"{api}: dtype")
    dims, par_axis = _shape_and_par(shape, buf)
    if buf == "psum":
        _check_psum(dims, par_axis, d)
    k = state.kernel
    if buf in HBM_BUFFERS:
        if fill is not None:
            raise E.NkiCompileError(
                f"{api}: HBM tensors cannot have an init value "
                "(err_hbm_tensor_with_init_value_not_supported); allocate with nl.ndarray and store "
                "into it", code="err_hbm_tensor_with_init_value_not_supported")
        if buf == "shared_hbm":
            where = "inside an NKI loop" if k.loops else (
                outside_kernel_level(k.code) if config.check_scope else "")
            if where:
                raise E.NkiCompileError(
                    f"{api}: shared_hbm tensor can only be created in top level kernel scope; this one "
                    f"is created {where} (err_shared_hbm_must_in_kernel_level). Hoist the creation "
                    "to the top level of the @nki.jit function and pass the tensor down.",
                    code="err_shared_hbm_must_in_kernel_level")
            # all SPMD programs share the k-th shared_hbm allocation
            if k.shared_cursor < len(k.shared_allocs):
                a = k.shared_allocs[k.shared_cursor]
                k.shared_cursor += 1
                if a.shape != dims or a.dtype != d:
                    raise E.KernelSignatureError(
                        f"shared_hbm allocation #{k.shared_cursor} differs between SPMD programs: "
                        f"{a.shape} {a.dtype.name} vs {dims} {d.name}")
                return k.tensor_type(a, a.data)
            a = new_alloc(dims, d, buf, name=name, kind="output")
            k.shared_allocs.append(a)
            k.shared_cursor += 1
            return k.tensor_type(a, a.data)
        a = new_alloc(dims, d, buf, name=name)
        return k.tensor_type(a, a.data)
    a = new_alloc(dims, d, buf, name=name, par_axis=par_axis, fill=fill)
    t = k.tensor_type(a, a.data, pax=par_axis)
    if fill is not None:
        pshape = dims[par_axis:]
        trace.emit("vector", "memset", name=name, out_shape=dims, out_dtype=d,
                   partitions=pshape[0], free_elems=math.prod(dims) // max(1, pshape[0]),
                   nbytes=a.data.nbytes)
    return t


def ndarray(shape, dtype, *, buffer=None, name="", **kwargs):
    """New tensor (contents undefined = poisoned).  buffer default: SBUF."""
    return _allocate(shape, dtype, buffer, name, None, "nl.ndarray")


def zeros(shape, dtype, *, buffer=None, name="", **kwargs):
    return _allocate(shape, dtype, buffer, name, 0, "nl.zeros")


def ones(shape, dtype, *, buffer=None, name="", **kwargs):
    return _allocate(shape, dtype, buffer, name, 1, "nl.ones")


def full(shape, fill_value, dtype, *, buffer=None, name="", **kwargs):
    return _allocate(shape, dtype, buffer, name, fill_value, "nl.full")


def empty_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return _allocate(a.shape, dtype or a.dtype, buffer if buffer is not None else a.buffer,
                     name, None, "nl.empty_like")


def zeros_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return _allocate(a.shape, dtype or a.dtype, buffer if buffer is not None else a.buffer,
                     name, 0, "nl.zeros_like")


def ones_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return _allocate(a.shape, dtype or a.dtype, buffer if buffer is not None else a.buffer,
                     name, 1, "nl.ones_like")


def full_like(a, fill_value, dtype=None, *, buffer=None, name="", **kwargs):
    return _allocate(a.shape, dtype or a.dtype, buffer if buffer is not None else a.buffer,
                     name, fill_value, "nl.full_like")


def shared_constant(constant, dtype=None, **kwargs):
    """An HBM tensor holding a host constant (read-only)."""
    require_kernel("nl.shared_constant")
    arr = np.asarray(constant)
    d = D.as_dtype(dtype or arr.dtype, "nl.shared_constant: dtype")
    a = Alloc(np.ascontiguousarray(D.cast_for_write(arr, d)), "shared_hbm", kind="input",
              written=True, mutable=False, name="shared_constant")
    return state.kernel.tensor_type(a, a.data)


def shared_identity_matrix(n, dtype=np.uint8, **kwargs):
    return shared_constant(np.eye(int(n)), dtype=dtype)


def static_cast(input_data, dtype):
    """Host-side cast of a scalar / NumPy array (hardware rounding rules)."""
    return D.cast_for_write(np.asarray(input_data), D.as_dtype(dtype))


# ---- SPMD --------------------------------------------------------------------------
def program_id(axis=0):
    require_kernel("nl.program_id")
    k = state.kernel
    axis = int(axis)
    if not k.grid:
        if axis == 0:
            return 0
    if not 0 <= axis < len(k.grid):
        raise ValueError(f"nl.program_id: axis must be in [0, {len(k.grid)}) for grid {list(k.grid)}; got {axis}")
    return int(k.program_id[axis])


def num_programs(axes=None):
    require_kernel("nl.num_programs")
    g = state.kernel.grid or (1,)
    if axes is None:
        return int(np.prod(g))
    if isinstance(axes, (tuple, list)):
        return int(np.prod([g[int(a)] for a in axes]))
    a = int(axes)
    if not 0 <= a < len(g):
        raise ValueError(f"nl.num_programs: axes must be in [0, {len(g)}); got {axes}")
    return int(g[a])


def program_ndim():
    require_kernel("nl.program_ndim")
    return len(state.kernel.grid)


class nc(int):
    """``nl.nc(n)``: logical-core count marker in SPMD grids (cores simulated one after another;
    events carry their core, see nki_sim/runtime.py)."""

    @property
    def nki_lnc(self) -> int:
        return int(self)


class _SpmdDim(int):
    """A grid dimension built by ``nl.spmd_dim(nl.nc(k), ...)``: split over ``nki_lnc`` cores."""

    nki_lnc = 0


def spmd_dim(*dims):
    d = _SpmdDim(int(np.prod([int(x) for x in dims])))
    d.nki_lnc = sum(int(x) for x in dims[:1] if isinstance(x, nc))
    return d if d.nki_lnc else int(d)


def device_print(prefix, x, **kwargs):
    if isinstance(x, Tensor):
        print(prefix, np.asarray(read_values(x, op="device_print")))
    else:
        print(prefix, x)
