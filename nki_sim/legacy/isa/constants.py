"""``neuronxcc.nki.isa.constants``: legacy enum values (never hard-code the integers)."""

from __future__ import annotations

import enum


class oob_mode(enum.IntEnum):
    error = 0
    skip = 1


class dge_mode(enum.IntEnum):
    none = 0
    swdge = 1
    hwdge = 2
    unknown = 3


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    vector = 5
    sync = 6


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
