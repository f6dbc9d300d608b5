"""``neuronxcc.nki.language`` (legacy NKI "Beta 1") as emulated by nki_sim.

Names that exist in the real module but are not emulated raise ``NotImplementedError``
(also an ``AttributeError``) naming them.
"""

from __future__ import annotations

import numpy as _np

from ... import dtypes as _D
from ... import sdk as _sdk
from ...config import config as _config
from ...target import get_target as _get_target
from ...errors import not_emulated as _not_emulated
from ...indexing import arange, ds, mgrid, par_dim  # noqa: F401
from ...loops import affine_range, sequential_range, static_range  # noqa: F401
from ..dma import load, load_transpose2d, store  # noqa: F401
from .creation import (  # noqa: F401
    Buffer, device_print, empty_like, full, full_like, hbm, nc, ndarray, num_programs, ones,
    ones_like, private_hbm, program_id, program_ndim, psum, sbuf, shared_constant,
    shared_hbm, shared_identity_matrix, spmd_dim, static_cast, zeros, zeros_like)
from .elementwise import (  # noqa: F401
    abs, add, arctan, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, broadcast_to, ceil,
    copy, cos, divide, equal, erf, exp, floor, fmod, gelu, gelu_apprx_sigmoid, gelu_apprx_tanh,
    greater,
    greater_equal, invert, left_shift, less, less_equal, log, logical_and, logical_not,
    logical_or, logical_xor, maximum, minimum, mish, mod, multiply, negative, not_equal,
    power, reciprocal, relu, right_shift, rsqrt, sigmoid, sign, silu, sin, softplus, sqrt,
    square, subtract, tan, tanh, trunc, where)
from .misc import gather_flattened, softmax  # noqa: F401
from .reduce import all, any, loop_reduce, max, mean, min, prod, sum, var  # noqa: F401
from .tensor_engine import matmul, transpose  # noqa: F401

# ---- dtypes (NumPy dtype objects, as in the legacy API) ------------------------------
float32 = _np.float32
float16 = _np.float16
bfloat16 = _D.bfloat16
float8_e4m3 = _D.float8_e4m3
float8_e5m2 = _D.float8_e5m2
tfloat32 = _D.tfloat32
int8, int16, int32 = _np.int8, _np.int16, _np.int32
uint8, uint16, uint32 = _np.uint8, _np.uint16, _np.uint32
bool_ = _np.bool_


class _Const:
    def __init__(self, **kw):
        self.__dict__.update(kw)


fp32 = _Const(min=float(_np.finfo(_np.float32).min), max=float(_np.finfo(_np.float32).max))
bfp16 = _Const(min=float("-inf"))


class _TileSize:
    """Hardware tile-size constants (``nl.tile_size.pmax`` etc.) of the simulated target."""

    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1

    def __getattr__(self, name):
        if name == "total_available_sbuf_size":    # usable SBUF bytes per partition (SDK 2.26)
            if not _sdk.has((2, 26)):
                raise AttributeError("nl.tile_size.total_available_sbuf_size was added in Neuron SDK "
                                     f"2.26; nki_sim simulates SDK {_sdk.fmt(_config.sdk)}")
            return _get_target().sbuf_usable_bytes_per_partition
        raise AttributeError(f"nl.tile_size has no attribute {name!r}")


tile_size = _TileSize()


def dropout(*a, **k):
    raise _not_emulated("nl.dropout", "the simulator has no hardware RNG")


# names of the real legacy module that nki_sim does not emulate
_NOT_EMULATED = {
    "rms_norm", "atomic_rmw", "rand",
    "random_seed", "shuffle", "invert_permutation", "exp2", "log2", "log1p", "expm1",
    "sequence_bounds", "load_transpose", "all_reduce", "tile", "tensor",
}


# names added after the oldest supported SDK are served only when the simulated SDK has them
__getattr__ = _sdk.module_getattr("language", "nl", globals(), _NOT_EMULATED)
