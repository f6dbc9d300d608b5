"""``nki.isa`` scalars, registers and queries: ``scalar_load`` / ``scalar_store`` / ``NkiScalar``
(NKI 0.7+), ``register_*`` (<= 0.7; ``DeprecationWarning`` in 0.8), ``get_nc_version``.

Scalar loads / stores move one element between a ``(1, 1)`` tensor and an engine sequencer; they
record no trace event (they are not data-path instructions).
"""

from __future__ import annotations

import warnings

import numpy as np

from ..access import read_values, write
from ..target import get_target
from . import version
from .checks import require_kernel, fail, tile
from .enums import nc_version
from .scalars import NkiScalar, VirtualRegister, value_of


def get_nc_version():
    v = get_target().nc_version
    return {"gen2": nc_version.gen2, "gen3": nc_version.gen3}.get(v, nc_version.gen4)


def get_nc_sub_version():
    return 0


def _one(t, op):
    t = tile(t, op, "tensor")
    if t.size != 1:
        fail(f"{op}: the tensor must hold exactly one element; got {list(t.shape)}")
    return t


def scalar_load(src, name=""):
    """An ``NkiScalar`` holding the int32 / int64 element of a 1x1 SBUF or HBM tensor."""
    version.require((0, 7), "nisa.scalar_load")
    require_kernel("nisa.scalar_load")
    src = _one(src, "scalar_load")
    if src.dtype not in ("int32",):
        fail(f"scalar_load: src must be an int32 tensor (unsigned types are rejected); got {src.dtype}")
    return NkiScalar(int(np.asarray(read_values(src.core(), op="scalar_load")).reshape(-1)[0]), "int32")


def scalar_store(dst, value, name=""):
    version.require((0, 7), "nisa.scalar_store")
    require_kernel("nisa.scalar_store")
    dst = _one(dst, "scalar_store")
    write(dst.core(), np.asarray([value_of(value)]).reshape(dst.core().shape), op="scalar_store")


def _deprecated(api):
    if version.has((0, 8)):
        warnings.warn(f"nisa.{api} is deprecated in NKI 0.8; use nisa.scalar_load / NkiScalar",
                      DeprecationWarning, stacklevel=3)


def _registers(api):
    if version.has((0, 8)):
        _deprecated(api)


def register_alloc(x=None):
    require_kernel("nisa.register_alloc")
    _registers("register_alloc")
    return VirtualRegister(0 if x is None else value_of(x))


def register_move(dst, src):
    require_kernel("nisa.register_move")
    _registers("register_move")
    if not isinstance(dst, VirtualRegister):
        raise TypeError(f"nisa.register_move: dst must be a VirtualRegister; got {type(dst).__name__}")
    dst.value = VirtualRegister(value_of(src)).value


def register_load(dst, src):
    require_kernel("nisa.register_load")
    _registers("register_load")
    if not isinstance(dst, VirtualRegister):
        raise TypeError(f"nisa.register_load: dst must be a VirtualRegister; got {type(dst).__name__}")
    src = _one(src, "register_load")
    dst.value = VirtualRegister(int(np.asarray(read_values(src.core(), op="register_load")).reshape(-1)[0])).value


def register_store(dst, src):
    require_kernel("nisa.register_store")
    _registers("register_store")
    dst = _one(dst, "register_store")
    write(dst.core(), np.asarray([value_of(src)]).reshape(dst.core().shape), op="register_store")
