"""The evidence suite's pantheonneuron cases without network: their measured times are the stated
conversion of the published rates, the work each conversion uses is the work the simulated run
does, and the ``pantheon`` builder assembles a package for a factory-built kernel (fetched
helpers, empty harness-only modules, interpreter state restored) and checks results against
references from the definition (must-pass and must-fail)."""
from __future__ import annotations

import math
import re
import sys
import textwrap

import numpy as np
import pytest

from test_cost_evidence import bench, builders  # noqa: F401  (puts scripts/ on sys.path)

PANTHEON = [c for c in bench.load_table() if c["inputs"]["builder"] == "pantheon"]
PER_US = {"GB/s": 1e3, "TFLOPS": 1e6}          # bytes or FLOPs per microsecond at 1 unit


def _work_of(spec: dict) -> int:
    """Bytes (or FLOPs) one run of the simulated case moves, from its inputs alone."""
    work = spec["workload"]
    if work == "matmul":
        return 2 * spec["K"] * spec["M"] * spec["N"]
    nbytes = spec["rows"] * spec["free"] * 2                     # bf16
    return 2 * nbytes if work == "copy" else nbytes              # a copy reads and writes


def test_pantheon_cases_are_declared():
    assert len(PANTHEON) >= 10
    for c in PANTHEON:
        spec, k = c["inputs"], c["kernel"]
        assert k["repo"] == "pantheongpu/pantheonneuron" and spec["kernel_name"], c["id"]
        for path, commit in spec.get("helpers", {}).values():
            assert path.endswith(".py") and re.fullmatch(r"[0-9a-f]{40}", commit), c["id"]
        assert not set(spec.get("helpers", {})) & set(spec.get("empty_modules", [])), c["id"]


@pytest.mark.parametrize("case", PANTHEON, ids=[c["id"] for c in PANTHEON])
def test_measured_time_is_the_stated_conversion(case):
    conv = case["converted_from"]
    assert conv["unit"] in PER_US and conv["rule"], case["id"]
    assert conv["work"] == _work_of(case["inputs"]), case["id"]
    expected = conv["work"] / (conv["figure"] * PER_US[conv["unit"]])
    assert math.isclose(case["measured_us"], expected, rel_tol=1e-5), (case["id"], expected)
    assert str(conv["figure"]) in case["how_measured"], case["id"]


def _fake_repo(tmp_path, kernel_name="read_sum_kernel", skip_last=False):
    """A package module shaped like the pantheonneuron kernels (the project's own test code):
    relative imports of a helper and of a harness-only module, a factory building the kernel."""
    (tmp_path / "tiling.py").write_text("PARTITION = 128\n")
    last = "rows - 1" if skip_last else "rows"
    (tmp_path / "kern.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, "/nonexistent-added-by-the-file")
        from . import registry, tiling

        PARTITION = tiling.PARTITION

        def make():
            import neuronxcc.nki as nki
            import neuronxcc.nki.language as nl

            @nki.jit
            def {kernel_name}(source):
                n, free = source.shape
                rows = n // PARTITION
                total = nl.zeros((nl.par_dim(PARTITION), 1), dtype=nl.float32)
                out = nl.ndarray((nl.par_dim(PARTITION), 1), dtype=nl.float32, buffer=nl.shared_hbm)
                for r in nl.affine_range({last}):
                    t = nl.load(source[r * PARTITION:(r + 1) * PARTITION, 0:free])
                    total += nl.sum(t.astype(nl.float32), axis=1, keepdims=True)
                nl.store(out, value=total)
                return out
            return None, {kernel_name}
    """))
    fetched = []

    def fetch_ref(path, commit=None):
        fetched.append((path, commit))
        return tmp_path / path
    spec = {"builder": "pantheon", "workload": "read_sum", "rows": 512, "free": 64,
            "factory_args": [], "kernel_name": "read_sum_kernel", "package": "kernels",
            "helpers": {"tiling": ["tiling.py", "c" * 40]}, "empty_modules": ["registry"]}
    return spec, fetch_ref, fetched


def _package_modules() -> dict:
    """The modules of the package name the builder borrows, by identity: whatever held the name
    before the build (nothing, or another package of that name) must hold it afterwards."""
    return {k: id(m) for k, m in sys.modules.items() if k.split(".")[0] == "kernels"}


@pytest.mark.simulation
@pytest.mark.parametrize("skip_last", [False, True])
def test_builder_runs_a_factory_kernel_and_checks_it(tmp_path, skip_last):
    import nki_sim
    nki_sim.install()
    spec, fetch_ref, fetched = _fake_repo(tmp_path, skip_last=skip_last)
    path_before = list(sys.path)
    pkg_before = _package_modules()          # e.g. the test suite's own tests/kernels package
    run = builders.BUILDERS["pantheon"](spec, fetch_ref)
    kernel = run.load_kernel(tmp_path / "kern.py", "make")
    assert sys.path == path_before and _package_modules() == pkg_before
    assert not [m for m in list(sys.modules.values())
                if str(getattr(m, "__file__", "")).startswith(str(tmp_path))]
    assert fetched == [("tiling.py", "c" * 40)]
    with nki_sim.use_target("trn1"):
        err = run.check(kernel(*run.args))
    if skip_last:                        # one 128-row tile left out of the sum: must fail
        assert err > run.tolerance
    else:
        assert err <= run.tolerance == 1e-6


def test_builder_refuses_a_factory_returning_another_kernel(tmp_path):
    pytest.importorskip("nki_sim").install()
    spec, fetch_ref, _ = _fake_repo(tmp_path, kernel_name="other_kernel")
    pkg_before = _package_modules()
    run = builders.BUILDERS["pantheon"](spec, fetch_ref)
    with pytest.raises(ValueError, match="must return kernel 'read_sum_kernel'; got 'other_kernel'"):
        run.load_kernel(tmp_path / "kern.py", "make")
    assert _package_modules() == pkg_before


@pytest.mark.parametrize("work", ["broadcast_write", "copy"])
def test_copy_checks_pass_on_the_definition_and_fail_on_one_wrong_element(work):
    spec = {"workload": work, "rows": 512, "free": 64, "kernel_name": "k"}
    run = builders.BUILDERS["pantheon"](spec, lambda *a: None)
    (x,) = run.args
    out = np.tile(x, (512 // 128, 1)) if work == "broadcast_write" else x.copy()
    assert run.check(out) == 0.0 <= run.tolerance
    out[-1, -1] = out[-1, -1] + 1                  # the last row's last element
    assert run.check(out) > run.tolerance
    with pytest.raises(ValueError, match=r"kernel output shape \(256, 64\) != \(512, 64\)"):
        run.check(out[:256])


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="workload must be .*; got 'gather'"):
        builders.BUILDERS["pantheon"]({"workload": "gather", "kernel_name": "k"}, lambda *a: None)
    with pytest.raises(ValueError, match="rows must be a multiple of 128; got 100"):
        builders.BUILDERS["pantheon"]({"workload": "read_sum", "rows": 100, "free": 8,
                                       "kernel_name": "k"}, lambda *a: None)


@pytest.mark.simulation
def test_builder_restores_another_package_of_the_same_name(tmp_path, monkeypatch):
    """A `kernels` package already imported (the suite's own tests/kernels, say) is put back,
    the same object, after the builder borrowed the name."""
    import types
    import nki_sim
    nki_sim.install()
    sentinel = types.ModuleType("kernels")
    monkeypatch.setitem(sys.modules, "kernels", sentinel)
    spec, fetch_ref, _ = _fake_repo(tmp_path)
    run = builders.BUILDERS["pantheon"](spec, fetch_ref)
    run.load_kernel(tmp_path / "kern.py", "make")
    assert sys.modules["kernels"] is sentinel
