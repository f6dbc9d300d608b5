"""``neuronxcc.nki.isa`` (legacy) as emulated by nki_sim.

Names of the real module that are not emulated raise ``NotImplementedError`` naming them.
"""

from __future__ import annotations

from ... import sdk as _sdk
from ...target import get_target as _get_target
from ..dma import dma_copy, dma_transpose  # noqa: F401
from . import constants  # noqa: F401
from .constants import dge_mode, engine, nc_version, oob_mode, reduce_cmd  # noqa: F401
from .scalar_vector import (  # noqa: F401
    activation, activation_reduce, affine_select, iota, memset, reciprocal, scalar_tensor_tensor,
    tensor_copy, tensor_reduce, tensor_scalar, tensor_tensor)
from .select import (  # noqa: F401
    range_select, select_reduce, tensor_copy_predicated, tensor_tensor_scan)
from .stats import bn_aggr, bn_stats, tensor_scalar_reduce  # noqa: F401
from .tensor_engine import nc_matmul, nc_transpose  # noqa: F401

tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


def get_nc_version():
    """``nc_version.gen2`` on trn1, ``nc_version.gen3`` on trn2 (the simulated target)."""
    return nc_version.gen2 if _get_target().nc_version == "gen2" else nc_version.gen3


_NOT_EMULATED = {
    "nc_stream_shuffle", "local_gather", "max8", "nc_find_index8", "nc_match_replace8",
    "dropout",
    "tensor_partition_reduce", "sequence_bounds", "tensor_copy_dynamic_src",
    "tensor_copy_dynamic_dst", "builtin_custom_op", "dma_compute",
    "nc_matmul_mx", "rand2", "rand_set_state", "rand_get_state", "set_rng_seed",
    "activation_accu", "exponential", "tensor_scalar_cumulative", "nonzero_with_count",
}


# names added after the oldest supported SDK are served only when the simulated SDK has them
__getattr__ = _sdk.module_getattr("isa", "nisa", globals(), _NOT_EMULATED)
