"""nki_sim.install() registers the current front end as ``nki`` only where no real ``nki`` is
importable; the PyPI placeholder (raises on import) counts as absent."""

from __future__ import annotations

import sys

import pytest

import importlib

inst = importlib.import_module("nki_sim.install")


@pytest.fixture
def fake_nki(tmp_path, monkeypatch):
    def make(body):
        (tmp_path / "nki").mkdir()
        (tmp_path / "nki" / "__init__.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        inst.uninstall_current()
        return tmp_path
    yield make
    for n in [n for n in sys.modules if n == "nki" or n.startswith("nki.")]:
        del sys.modules[n]
    monkeypatch.undo()
    inst.install_current()


def test_placeholder_counts_as_absent(fake_nki):
    fake_nki("raise ImportError('WRONG PACKAGE: this is not the Neuron nki')\n")
    assert inst.install_current() is True
    assert getattr(sys.modules["nki"], "__nki_sim__", False)


def test_a_real_nki_wins(fake_nki):
    fake_nki("MARK = 'real'\ndef jit(f=None, **k):\n    return f\n")
    assert inst.install_current() is False
    import nki
    assert getattr(nki, "MARK", "") == "real" and not getattr(nki, "__nki_sim__", False)
    assert inst.install_current(force=True) is True and sys.modules["nki"].__nki_sim__
