"""torch and transformers are optional: with them made unimportable (a child interpreter whose
sys.modules maps them to None) the host API and the cache manager work, the torch / HF modules
fail with an ImportError that says which extra to install, and their tests skip cleanly."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_without(blocked, code):
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_host_works_without_torch():
    code = """
import numpy as np
import host
from host import *
mgr = KVCacheManager(4, 2)
mgr.add_sequence(0)
assert mgr.append_slots(0, 3).tolist() == [0, 1, 2]
try:
    import host.serving.torch_ops
except ImportError as e:
    assert "pip install -e '.[torch]'" in str(e), e
else:
    raise AssertionError("host.serving.torch_ops imported without torch")
try:
    host.generate
except ImportError:
    pass
else:
    raise AssertionError("host.generate resolved without torch")
for mod in ("host.serving.hf_backend", "host.serving.generation"):
    try:
        __import__(mod)
    except ImportError:
        pass
    else:
        raise AssertionError(mod + " imported without torch")
print("ok")
"""
    res = run_without(["torch", "transformers"], code)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_integration_tests_skip_without_torch_or_transformers():
    code = """
import pytest
sys.exit(pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", "-rs",
                      "tests/integration/test_torch_ops.py", "tests/integration/test_hf_backend.py"]))
"""
    # exit code 5 = "no tests collected": every module skipped itself at import
    res = run_without(["torch", "transformers"], code)
    assert res.returncode == 5 and "error" not in res.stdout.lower(), res.stdout + res.stderr
    assert "2 skipped" in res.stdout and "could not import 'torch'" in res.stdout
    res = run_without(["transformers"], code.replace('"tests/integration/test_torch_ops.py", ', ""))
    assert res.returncode == 5 and "1 skipped" in res.stdout, res.stdout + res.stderr
    # with torch installed the HF tests name transformers; without it (the minimal install)
    # they skip on torch first
    missing = "transformers" if importlib.util.find_spec("torch") else "torch"
    assert f"could not import '{missing}'" in res.stdout
