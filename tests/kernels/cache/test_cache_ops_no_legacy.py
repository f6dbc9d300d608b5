"""The cache ops with the legacy namespace absent, as on Neuron SDK 2.34 (``import neuronxcc.nki``
fails): ``import host`` works, ``reshape_and_cache`` / ``copy_blocks`` / ``swap_blocks`` run the
current API on the simulated trn2 and match the float64 reference; api="legacy" says what to
install.

Runs in a subprocess: a meta-path hook makes every ``neuronxcc`` import fail, and the simulator
registers its current front end only (not a stand-in for ``neuronxcc.nki``), so nothing can reach
the legacy API by accident.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.simulation

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent('''
    import importlib, importlib.abc, sys

    class NoLegacy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "neuronxcc" or name.startswith("neuronxcc."):
                raise ImportError(f"No module named {name!r} (SDK 2.34: neuronxcc.nki removed)")
            return None

    sys.meta_path.insert(0, NoLegacy())
    sys.modules["neuronxcc"] = None
    import nki_sim
    installer = importlib.import_module("nki_sim.install")

    def current_only(force=False):      # the simulator stands in for the current nki only
        installer.install_current(force)
        return False

    nki_sim.install = installer.install = current_only

    import numpy as np
    import host
    from host.cache.cache_ops import copy_blocks, reshape_and_cache, swap_blocks

    rng = np.random.default_rng(0)
    T, Hkv, d, N, B = 150, 2, 16, 24, 8          # 300 rows: two full tiles and a tail
    cache = rng.standard_normal((2, N, Hkv, B, d)).astype(np.float32)
    key = rng.standard_normal((T, Hkv, d))
    value = rng.standard_normal((T, Hkv, d))
    slots = rng.permutation(N * B)[:T]
    slots[[3, 77]] = -1
    ref = cache.astype(np.float64)               # the definition, per token, in float64
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            ref[0, s // B, :, s % B] = key[t].astype(np.float32)
            ref[1, s // B, :, s % B] = value[t].astype(np.float32)
    with nki_sim.use_target("trn2"):
        reshape_and_cache(key.astype(np.float32), value.astype(np.float32), cache, slots,
                          api="nki")
        assert np.array_equal(cache.astype(np.float64), ref), "reshape_and_cache"
        mapping = np.array([[0, 5], [7, 2], [9, 11]])
        for src, dst in mapping:
            ref[:, dst] = ref[:, src]
        copy_blocks([cache], mapping)            # api=None: the current API (no legacy here)
        assert np.array_equal(cache.astype(np.float64), ref), "copy_blocks"
        other = np.zeros((2, 4, Hkv, B, d), np.float32)
        swap_blocks(cache, other, [[3, 1]], api="nki")
        assert np.array_equal(other[:, 1].astype(np.float64), ref[:, 3]), "swap_blocks"
        try:
            reshape_and_cache(key.astype(np.float32), value.astype(np.float32), cache, slots,
                              api="legacy")
        except RuntimeError as e:
            assert "neuronxcc.nki" in str(e) and "SDK 2.28" in str(e), e
        else:
            raise AssertionError("api='legacy' ran without neuronxcc.nki")
    assert not any(m == "neuronxcc" or m.startswith("neuronxcc.")
                   for m, v in sys.modules.items() if v is not None), "a neuronxcc module loaded"
    print("ok")
''')


def test_cache_ops_run_on_the_current_api_without_the_legacy_namespace():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NKI_PA_API", None)
    env.pop("NKI_PA_BACKEND", None)
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


def test_the_blocking_hook_must_fail_a_legacy_import():
    """Must-fail twin: the same hook makes ``import neuronxcc.nki`` fail."""
    code = SCRIPT.split("import nki_sim")[0] + textwrap.dedent('''
        try:
            import neuronxcc.nki
        except ImportError:
            print("blocked")
    ''')
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.stdout.strip() == "blocked", run.stderr[-2000:]
