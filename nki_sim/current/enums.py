"""Enums of ``nki.isa`` / ``nki.isa.constants`` (named members only: raw ints are rejected
from NKI 0.3, and the ``dge_mode`` order changed, reference §3)."""

from __future__ import annotations

import enum


class engine(enum.Enum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.Enum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    none = 0
    double_row = 1


class nc_version(enum.IntEnum):
    """Ordered (kernels compare ``get_nc_version() >= nc_version.gen3``)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    dma = 0
    gpsimd_dma = 1


def member(enum_cls, value, pname: str, default):
    """``value`` as a member of ``enum_cls`` (None -> default); ints and strings are rejected."""
    if value is None:
        return default
    if isinstance(value, enum_cls):
        return value
    raise TypeError(f"{pname} must be a member of nisa.{enum_cls.__name__} (e.g. "
                    f"nisa.{enum_cls.__name__}.{next(iter(enum_cls)).name}); got {value!r}")


ENGINE_NAMES = {engine.tensor: "tensor", engine.scalar: "scalar", engine.gpsimd: "gpsimd",
                engine.vector: "vector", engine.dma: "dma", engine.sync: "sync"}
