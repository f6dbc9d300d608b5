"""The legacy module surface after nki_sim.install(): import forms used by third-party
kernels, dtypes, constants, enums, buffers and tile-size limits."""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest

import nki_sim


def test_install_is_idempotent_and_reports_state():
    before = nki_sim.is_installed()
    assert isinstance(nki_sim.install(), bool)
    assert nki_sim.is_installed() is before            # a repeat call changes nothing


@pytest.mark.parametrize("module", ["neuronxcc", "neuronxcc.nki", "neuronxcc.nki.language",
                                    "neuronxcc.nki.isa", "neuronxcc.nki.isa.constants",
                                    "neuronxcc.nki.typing", "neuronxcc.nki.compiler"])
def test_legacy_modules_import(module):
    assert importlib.import_module(module) is not None


def test_legacy_import_forms():
    from neuronxcc import nki                       # noqa: F401
    from neuronxcc.nki.isa.constants import oob_mode
    from neuronxcc.nki.language import par_dim      # noqa: F401
    from neuronxcc.nki.typing import scalar, tensor  # noqa: F401
    import neuronxcc.nki.isa as nisa

    assert oob_mode.error != oob_mode.skip
    assert nisa.oob_mode.skip == oob_mode.skip


def test_dtypes_are_numpy_dtypes():
    import neuronxcc.nki.language as nl

    assert np.dtype(nl.float32) == np.float32 and np.dtype(nl.int32) == np.int32
    assert np.dtype(nl.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert np.dtype(nl.float16) == np.float16 and np.dtype(nl.uint8) == np.uint8
    assert np.dtype(nl.bool_) == np.bool_
    assert nl.fp32.min == np.finfo(np.float32).min


def test_tile_size_constants():
    import neuronxcc.nki.language as nl

    ts = nl.tile_size
    assert (ts.pmax, ts.psum_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax) == (128, 512, 128, 512)


def test_isa_enums_and_engines():
    import neuronxcc.nki.isa as nisa

    cmds = {nisa.reduce_cmd.idle, nisa.reduce_cmd.reset, nisa.reduce_cmd.reduce,
            nisa.reduce_cmd.reset_reduce}
    assert len(cmds) == 4
    engines = {nisa.tensor_engine, nisa.vector_engine, nisa.scalar_engine, nisa.gpsimd_engine,
               nisa.unknown_engine}
    assert len(engines) == 5
    assert nisa.nc_version.gen2 != nisa.nc_version.gen3
    assert len({nisa.dge_mode.none, nisa.dge_mode.swdge, nisa.dge_mode.hwdge,
                nisa.dge_mode.unknown}) == 4


def test_buffers_exist():
    import neuronxcc.nki.language as nl

    buffers = [nl.sbuf, nl.psum, nl.hbm, nl.private_hbm, nl.shared_hbm]
    assert all(b is not None for b in buffers)
    assert nl.sbuf != nl.psum and nl.shared_hbm != nl.private_hbm


def test_nl_api_outside_a_kernel_is_an_error(sim_only):
    import neuronxcc.nki.language as nl

    with pytest.raises(Exception, match=r"(?i)kernel"):
        nl.zeros((128, 4), dtype=nl.float32)
