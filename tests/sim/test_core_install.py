"""nki_sim.install(): registration, real-package detection, PyPI placeholder (subprocesses)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _py(code: str, extra_path=None) -> str:
    env = dict(os.environ)
    parts = ([str(extra_path)] if extra_path else []) + [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.pop("NKI_PA_BACKEND", None)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


SCRIPT = """
    import nki_sim
    a = nki_sim.install()
    b = nki_sim.install()
    import neuronxcc.nki as nki
    import neuronxcc.nki.language as nl
    import neuronxcc.nki.isa as nisa
    from neuronxcc.nki.isa.constants import oob_mode
    import neuronxcc.nki.typing as nt
    import neuronxcc.nki.compiler as ncc
    from neuronxcc import nki as nki2
    print(a, b, nki_sim.is_installed(), getattr(nki, "__nki_sim__", False), nki2 is nki,
          nisa.oob_mode is oob_mode)
"""


def test_install_without_real_package():
    assert _py(SCRIPT) == "True False True True True True"


def test_pypi_placeholder_counts_as_absent(tmp_path):
    pkg = tmp_path / "neuronxcc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise ImportError("WRONG PACKAGE: this is a placeholder")\n')
    assert _py(SCRIPT, tmp_path) == "True False True True True True"


def test_real_package_wins_unless_forced(tmp_path):
    pkg = tmp_path / "neuronxcc" / "nki"
    pkg.mkdir(parents=True)
    (tmp_path / "neuronxcc" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("REAL = True\n")
    out = _py("""
        import nki_sim
        a = nki_sim.install()
        import neuronxcc.nki as nki
        real = getattr(nki, "REAL", False)
        b = nki_sim.install(force=True)
        import neuronxcc.nki as nki
        print(a, real, b, nki_sim.is_installed(), getattr(nki, "__nki_sim__", False))
    """, tmp_path)
    assert out == "False True True True True"


def test_unmodified_legacy_kernel_file_runs(tmp_path):
    (tmp_path / "legacy_kernel.py").write_text(textwrap.dedent("""
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl

        @nki.jit
        def tensor_add_kernel(a_input, b_input):
            c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
            offset_i_x = nl.program_id(0) * 128
            offset_i_y = nl.program_id(1) * 512
            ix = offset_i_x + nl.arange(128)[:, None]
            iy = offset_i_y + nl.arange(512)[None, :]
            a_tile = nl.load(a_input[ix, iy])
            b_tile = nl.load(b_input[ix, iy])
            nl.store(c_output[ix, iy], value=a_tile + b_tile)
            return c_output
    """))
    out = _py("""
        import numpy as np, nki_sim
        nki_sim.install()
        import legacy_kernel as m
        a = (np.arange(256 * 1024).reshape(256, 1024) % 7).astype(np.float16)
        b = np.ones_like(a)
        c = m.tensor_add_kernel[2, 2](a, b)
        print(bool(np.array_equal(c, a + b)))
    """, tmp_path)
    assert out == "True"


def test_works_when_imported_through_a_non_normalized_path(tmp_path):
    """Frames are classified by module name, not file path (scripts insert "<dir>/.." in sys.path)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r} + "/..")     # as scripts/ do: not normalized
        import numpy as np, nki_sim
        from nki_sim.legacy import nki_api as nki, language as nl
        def k(x):
            out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.load(x))
            return out
        with nki_sim.tracing() as tr:
            y = nki.simulate_kernel(nki.jit(k), np.ones((2, 2), np.float32))
        print(nki_sim.__file__.count(".."), bool(y.sum() == 4), tr.events[0].src_loc[0])
    """)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True", "<string>"]


def test_a_real_compiler_without_nki_is_left_alone_unless_forced(tmp_path):
    # Neuron SDK 2.34: neuronx-cc still installed (the real nki, torch-neuronx and the runtime use
    # it in-process) but without its neuronxcc.nki namespace; the stand-in must not replace it
    pkg = tmp_path / "neuronxcc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '2.34-fake'\n")
    (pkg / "driver.py").write_text("REAL_DRIVER = True\n")
    out = _py("""
        import nki_sim
        a = nki_sim.install()
        import neuronxcc, neuronxcc.driver
        try:
            import neuronxcc.nki
            legacy = "present"
        except ImportError:
            legacy = "absent"
        kept = (neuronxcc.__version__, neuronxcc.driver.REAL_DRIVER, legacy)
        from nki_kernels import toolchain                      # the project's import: the same
        import neuronxcc.driver
        kept += (toolchain.SIMULATED, toolchain.LEGACY_IMPORT_ERROR is not None,
                 neuronxcc.driver.REAL_DRIVER)
        b = nki_sim.install(force=True)                        # NKI_PA_BACKEND=sim: the stand-in
        import neuronxcc.nki as nki
        print(a, *kept, b, getattr(nki, "__nki_sim__", False))
    """, tmp_path)
    assert out == "False 2.34-fake True absent False True True True True"


def test_backend_neuron_never_resolves_to_the_simulator():
    env = dict(os.environ, NKI_PA_BACKEND="neuron", PYTHONPATH=str(ROOT))
    code = textwrap.dedent("""
        from nki_kernels import toolchain
        for api in (None, "legacy", "nki"):
            try:
                print(api, toolchain.resolve_api(api))
            except RuntimeError as err:     # what to install (the legacy API: its own message)
                print(api, "RuntimeError", "real NKI package" in str(err) or "neuronxcc.nki" in str(err))
    """)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{a} RuntimeError True" for a in ("None", "legacy", "nki")]
