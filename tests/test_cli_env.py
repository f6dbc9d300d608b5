"""``nki-pa env`` and ``host.environment.environment_report``: what a launch would run on (API,
package, LNC, the torch device path)."""

from __future__ import annotations

import json

import nki_sim
from nki_kernels import toolchain
from nki_pa_cli.cli import EXIT_PASS, main
from host.environment import environment_report


def test_env_prints_each_apis_resolution(capsys, monkeypatch):
    monkeypatch.delenv(toolchain.LNC_ENV, raising=False)
    monkeypatch.delenv(toolchain.CC_FLAGS_ENV, raising=False)
    with nki_sim.use_target("trn2"):
        assert main(["env"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert "api='legacy': 'legacy' on the simulator (target trn2); a launch's LNC: 2" in out
    assert "api='nki': 'nki' on the simulator (target trn2); a launch's LNC: 2" in out
    assert "torch XLA device path: unavailable" in out       # no torch-neuronx here


def test_env_json_reports_what_fails_instead_of_stopping(capsys, monkeypatch):
    monkeypatch.setenv(toolchain.LNC_ENV, "3")
    with nki_sim.use_target("trn1"):
        assert main(["env", "--json"]) == EXIT_PASS
        report = json.loads(capsys.readouterr().out)
        assert report == json.loads(json.dumps(environment_report()))
    assert report["environment"][toolchain.LNC_ENV] == "3"
    auto = report["apis"]["auto"]
    assert auto["api"] == "legacy" and auto["simulated"] and auto["target"] == "trn1"
    assert "NEURON_LOGICAL_NC_CONFIG must be 1 or 2; got '3'" in auto["lnc"]["error"]
    assert report["apis"]["nki"]["error"].startswith("NotImplementedError: api='nki' on trn1")
    assert report["packages"]["numpy"]                        # installed: a version string
