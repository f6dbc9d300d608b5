"""``nl.ndarray`` and friends, SPMD queries and tile-size constants of the current API.

New tensors are filled as AWS's simulator fills them (NaN for floats, 4 for integers) and stay
marked never-written for the core's uninitialised-read check.  On-chip allocations are counted
against the target's SBUF / PSUM capacity per partition (AWS's simulator does not check it):
exceeding it raises :class:`~nki_sim.current.checks.NkiValidationError`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes as D
from ..memory import Alloc
from ..state import state
from ..target import get_target
from . import dtypes as T
from .checks import require_kernel, fail
from .tensor import MemoryRegion, contiguous_strides, sbuf
from .ndarray import NkiTensor

PSUM_BANK_BYTES = 2048


def region_name(buffer) -> str:
    if buffer is None:
        return "sbuf"
    if isinstance(buffer, MemoryRegion):
        return buffer.core
    raise TypeError(f"buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm "
                    f"(strings are rejected from NKI 0.3); got {buffer!r}")


def _placement(buf: str, alloc: Alloc, shape, address):
    """A tensor placed by ``address=(partition, byte offset)`` must fit the memory; placed
    tensors are not counted as live bytes (kernels reuse addresses on purpose)."""
    tgt = get_target()
    p0, off = (int(v) for v in address)
    cap = tgt.sbuf_usable_bytes_per_partition if buf == "sbuf" else tgt.psum_bytes_per_partition
    nbytes = math.prod(shape[1:]) * alloc.data.itemsize
    if p0 < 0 or p0 + shape[0] > tgt.pmax or off < 0 or off + nbytes > cap:
        fail(f"{buf} tensor `{alloc.name}` {list(shape)} at address {tuple(address)} does not fit: "
             f"partitions {p0}..{p0 + shape[0] - 1} of {tgt.pmax}, bytes {off}..{off + nbytes - 1} of {cap}")


def allocate(shape, dtype, buffer, name="", address=None, fill=None) -> NkiTensor:
    """A new tensor of ``shape`` (dim 0 = partitions on chip) in ``buffer``."""
    require_kernel("nl.ndarray")
    buf = region_name(buffer)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    dt = T.name_of(dtype)
    npdt = T.to_np(dt)
    if buf in ("sbuf", "psum"):
        if len(shape) < 2:
            fail("SBUF and PSUM tensors must have at least 2 dimensions (partition-dim and free-dim)")
        if shape[0] > get_target().pmax:
            fail(f"ndarray partition dimension {shape[0]} exceeds maximum {get_target().pmax}")
        if buf == "psum" and math.prod(shape[1:]) * npdt.itemsize > get_target().psum_bank_bytes * 8:
            fail(f"PSUM tensor `{name}` {list(shape)} {dt} needs "
                 f"{math.prod(shape[1:]) * npdt.itemsize} bytes per partition; PSUM has "
                 f"{get_target().psum_bytes_per_partition}")
        if buf == "psum" and address is not None and int(address[1]) % PSUM_BANK_BYTES:
            fail(f"PSUM address {address} must start at a bank (2 KiB) boundary")
    k = state.kernel
    if buf == "shared_hbm" and k is not None and len(k.grid) and math.prod(k.grid) > 1:
        from .lnc import shared_lock
        with shared_lock():
            return _shared(k, shape, dt, npdt, name)
    placed = address is not None and buf in ("sbuf", "psum")
    a = Alloc(np.empty(shape, dtype=npdt), buf, name=name, count_live=not placed)
    if fill is not None:
        a.data[...] = D.cast_for_write(np.asarray(fill), npdt)
        a.written = None
        a.unwritten = 0
    elif D.is_int(npdt):
        a.data.fill(4)                       # AWS's simulator sentinel for integer tensors
    else:
        a.lazy_poison = True                 # NaN, filled when unwritten memory is exposed
    if buf == "shared_hbm" and k is not None:
        k.shared_allocs.append(a)
        k.shared_cursor += 1
    if placed:
        _placement(buf, a, shape, address)
    return NkiTensor(a, shape, contiguous_strides(shape), 0, dt)


def _shared(k, shape, dt, npdt, name) -> NkiTensor:
    """The shared_hbm allocation at this core's allocation position (created by the first core)."""
    if k.shared_cursor < len(k.shared_allocs):
        a = k.shared_allocs[k.shared_cursor]
        if a.data.shape != shape or a.data.dtype != npdt:
            fail(f"shared_hbm allocation #{k.shared_cursor} differs between logical cores: "
                 f"{list(a.data.shape)} vs {list(shape)}")
    else:
        a = Alloc(np.empty(shape, dtype=npdt), "shared_hbm", name=name)
        a.lazy_poison = not D.is_int(npdt)
        if D.is_int(npdt):
            a.data.fill(4)
        k.shared_allocs.append(a)
    k.shared_cursor += 1
    return NkiTensor(a, shape, contiguous_strides(shape), 0, dt)


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    return allocate(shape, dtype, buffer, name, address)


def zeros(shape, dtype, buffer=sbuf, name=""):
    return allocate(shape, dtype, buffer, name, fill=0)


def ones(shape, dtype, buffer=sbuf, name=""):
    return allocate(shape, dtype, buffer, name, fill=1)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return allocate(shape, dtype, buffer, name, fill=fill_value)


def zeros_like(a, dtype=None, buffer=None, name=""):
    return allocate(a.shape, dtype or a.dtype, buffer or a.buffer, name, fill=0)


def empty_like(a, dtype=None, buffer=None, name=""):
    return allocate(a.shape, dtype or a.dtype, buffer or a.buffer, name)


def program_id(axis=0):
    """The logical core (0 or 1 under LNC=2) for axis 0."""
    require_kernel("nl.program_id")
    k = state.kernel
    if axis != 0:
        raise ValueError(f"nl.program_id: the current API has one launch axis (the logical core); got {axis}")
    return k.program_id[0] if k.program_id else 0


def num_programs(axes=0):
    require_kernel("nl.num_programs")
    k = state.kernel
    if axes not in (0, None):
        raise ValueError(f"nl.num_programs: the current API has one launch axis; got {axes}")
    return k.grid[0] if k.grid else 1


def program_ndim():
    require_kernel("nl.program_ndim")
    return 1 if state.kernel.grid else 0


class _TileSize:
    """``nl.tile_size``: hardware tile limits of the simulated target."""

    pmax = 128
    psum_fmax = psum_bank_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8

    @property
    def sbuf_fmax_bytes(self):
        return get_target().sbuf_usable_bytes_per_partition

    total_available_sbuf_size = sbuf_fmax_bytes

    @property
    def sbuf_fmax(self):
        return self.sbuf_fmax_bytes // 4

    @property
    def sbuf_size_bytes(self):
        return self.sbuf_fmax_bytes * 128

    def __getattr__(self, name):
        raise AttributeError(f"nl.tile_size has no attribute {name!r}")


tile_size = _TileSize()

