"""API selection (nki_kernels.toolchain.resolve_api): the real current nki when installed, the real
legacy neuronxcc.nki when installed, else the simulator with the target's API; an explicit
api= or NKI_PA_API overrides; wrong combinations name what to install."""

from __future__ import annotations

import pytest

from nki_kernels import toolchain as tc


@pytest.fixture
def toolchain(monkeypatch):
    """``toolchain(current=False, legacy=False, sim_current=True)``: pretend which real packages
    are installed and whether the simulator has the current front end."""
    monkeypatch.delenv(tc.API_ENV, raising=False)

    def set_(current=False, legacy=False, sim_current=True):
        monkeypatch.setattr(tc, "real_current_available", lambda: current)
        monkeypatch.setattr(tc, "real_legacy_available", lambda: legacy)
        monkeypatch.setattr(tc, "simulator_has_current", lambda: sim_current)
    return set_


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_simulator_default_is_the_tables(toolchain, target):
    toolchain()
    want = tc.SIMULATOR_DEFAULT[target]
    assert tc.resolve_api(target=target) == tc.Api(want, True, target)
    assert tc.resolve_api("auto", target) == tc.Api(want, True, target)
    assert tc.SIMULATOR_DEFAULT["trn1"] == "legacy"      # trn1 users have the legacy API


def test_simulator_without_current_front_end_runs_legacy_by_default(toolchain, monkeypatch):
    toolchain(sim_current=False)
    monkeypatch.setitem(tc.SIMULATOR_DEFAULT, "trn2", "nki")
    assert tc.resolve_api(target="trn2").name == "legacy"
    with pytest.raises(NotImplementedError, match="no current-API"):
        tc.resolve_api("nki", "trn2")


@pytest.mark.parametrize("current, legacy, want", [(True, False, "nki"), (False, True, "legacy"),
                                                   (True, True, "nki")])
def test_real_packages_win(toolchain, current, legacy, want):
    toolchain(current=current, legacy=legacy)
    assert tc.resolve_api(target="trn1") == tc.Api(want, False, None)


def test_explicit_api_and_environment_override(toolchain, monkeypatch):
    toolchain()
    assert tc.resolve_api("legacy", "trn2") == tc.Api("legacy", True, "trn2")
    monkeypatch.setenv(tc.API_ENV, "legacy")
    assert tc.resolve_api(target="trn2").name == "legacy"
    assert tc.resolve_api("nki", "trn2").name == "nki"       # the argument beats the variable
    monkeypatch.setenv(tc.API_ENV, "newest")
    with pytest.raises(ValueError, match="NKI_PA_API must be one of"):
        tc.resolve_api(target="trn2")


@pytest.mark.parametrize("api", ["Legacy", "neuron", 3])
def test_bad_api_is_a_value_error(toolchain, api):
    toolchain()
    with pytest.raises(ValueError, match="api must be one of"):
        tc.resolve_api(api, "trn2")


def test_wrong_combinations_name_what_to_install(toolchain):
    toolchain(current=True)            # SDK 2.34: no neuronxcc.nki
    with pytest.raises(RuntimeError, match="neuronxcc.nki.*SDK 2.28"):
        tc.resolve_api("legacy")
    toolchain(legacy=True)             # SDK <= 2.28 only
    with pytest.raises(RuntimeError, match="install nki"):
        tc.resolve_api("nki")
    toolchain()
    with pytest.raises(NotImplementedError, match="trn2 / trn3 only"):
        tc.resolve_api("nki", "trn1")
    with pytest.raises(ValueError, match="target must be one of"):
        tc.resolve_api("legacy", "inf2")
