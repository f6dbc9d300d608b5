"""TensorE ``nisa`` instructions: nc_matmul, nc_transpose."""

from __future__ import annotations

from ... import errors as E
from ... import sdk
from ..compute import require_kernel
from ..language.tensor_engine import matmul_core, transpose_core
from ...target import get_target
from ...tensor import Tensor
from .constants import engine as _engine


def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, tile_position=(), tile_size=(), mask=None, perf_mode=None,
              name="", **kwargs):
    """``stationary[K, M].T @ moving[K, N]`` -> fp32 [M, N] PSUM tile (K, M <= 128, N <= 512)."""
    require_kernel("nisa.nc_matmul")
    sdk.check_kwargs("nisa.nc_matmul", (2, 22), tile_position=tile_position or None,
                     tile_size=tile_size or None)
    if perf_mode:
        raise E.not_emulated(f"nisa.nc_matmul(perf_mode={perf_mode!r})", "use the default perf mode")
    if bool(tile_position) != bool(tile_size):
        raise ValueError("nisa.nc_matmul: tile_position and tile_size must be given together")
    out_dtype = "float32"
    if is_transpose:
        if get_target().nc_version != "gen2" and isinstance(moving, Tensor):
            out_dtype = moving.dtype
    return matmul_core("nc_matmul", stationary, moving, mask=mask, out_dtype=out_dtype, name=name)


def nc_transpose(data, *, mask=None, dtype=None, engine=None, name="", **kwargs):
    """Partition <-> free transpose: TensorE (<= 128x128, SBUF -> PSUM) or VectorE (<= 32x32)."""
    require_kernel("nisa.nc_transpose")
    if engine is None or engine == _engine.unknown:
        eng = "vector" if (isinstance(data, Tensor) and data.buffer == "psum") else "tensor"
    elif engine == _engine.tensor:
        eng = "tensor"
    elif engine == _engine.vector:
        eng = "vector"
    else:
        raise ValueError(f"nisa.nc_transpose: engine must be tensor_engine or vector_engine; got {engine!r}")
    return transpose_core("nc_transpose", data, dtype=dtype, mask=mask, engine=eng,
                          buffer="psum" if eng == "tensor" else "sbuf", name=name)
