"""Neuron SDK version gating (release notes general/nki/nki_rn.rst): names and keywords."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim

from test_core_helpers import f32, nisa, nl, run


def test_default_sdk_is_the_project_floor_generation():
    import os
    if os.environ.get("NKI_SIM_SDK"):
        pytest.skip("NKI_SIM_SDK overrides the default")
    assert nki_sim.config.sdk == (2, 24)


@pytest.mark.parametrize("sdk,has_select_reduce,has_range_select,has_gather", [
    ((2, 21), False, False, False), ((2, 23), False, True, False),
    ((2, 24), False, True, True), ((2, 26), True, True, True), ((2, 27), True, True, True)])
def test_names_follow_the_sdk(sdk, has_select_reduce, has_range_select, has_gather):
    with nki_sim.configure(sdk=sdk):
        assert hasattr(nisa, "select_reduce") is has_select_reduce
        assert hasattr(nisa, "range_select") is has_range_select
        assert hasattr(nl, "gather_flattened") is has_gather
        assert hasattr(nl, "tile_size")
        assert hasattr(nisa, "oob_mode") is (sdk >= (2, 23))
        assert hasattr(nisa, "reduce_cmd") is (sdk >= (2, 22))
        if not has_select_reduce:
            with pytest.raises(AttributeError, match="added in Neuron SDK 2.26"):
                nisa.select_reduce


def _copy_skip(x, idx, *, use_oob):
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    it = nl.load(idx)
    dst = nl.zeros((idx.shape[0], x.shape[1]), x.dtype)
    kw = {"oob_mode": nisa.oob_mode.skip} if use_oob else {}
    nisa.dma_copy(dst=dst[i_p, i_f], src=x[it[i_p, 0], i_f], **kw)
    out = nl.ndarray(dst.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, dst)
    return out


def test_keywords_follow_the_sdk(rng, monkeypatch):
    x = f32(rng, 10, 4)
    idx = np.array([[1], [3]], np.int32)
    with nki_sim.configure(sdk="2.22"):
        assert np.array_equal(run(_copy_skip, x, idx, use_oob=False), x[[1, 3]])
        from nki_sim.legacy.isa.constants import oob_mode
        monkeypatch.setattr(nisa, "oob_mode", oob_mode, raising=False)   # as if the enum existed
        with pytest.raises(TypeError, match="unexpected keyword argument 'oob_mode'.*2.23"):
            run(_copy_skip, x, idx, use_oob=True)
        monkeypatch.undo()
    with nki_sim.configure(sdk="2.23"):
        assert np.array_equal(run(_copy_skip, x, idx, use_oob=True), x[[1, 3]])


def test_sdk_values_are_validated():
    for bad in ("2.20", "3.0", "x", (2, 28)):
        with pytest.raises(ValueError, match="sdk"):
            with nki_sim.configure(sdk=bad):
                pass


def test_gated_names_can_be_monkeypatched_like_real_module_attributes(monkeypatch):
    monkeypatch.delattr(nisa, "oob_mode")                  # as tests of the real toolchain do
    assert not hasattr(nisa, "oob_mode")
    monkeypatch.undo()
    assert hasattr(nisa, "oob_mode")
