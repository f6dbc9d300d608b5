"""Which NKI API and package device code runs on: the one place that decides.

Two API generations (docs/nki-compatibility-review.md):

``"legacy"``  ``neuronxcc.nki`` (NKI "Beta 1"): trn1 users, Neuron SDK <= 2.28 (the namespace
              fails to compile from 2.30 and is gone from 2.34).
``"nki"``     the current ``import nki`` API (NKI 0.8, SDK 2.34): trn2 / trn3 users.

Kernels never import either package: they run on the project op layer (``nki_kernels.ops``),
whose two modules get the packages from here (:data:`nki` / :data:`nl` / :data:`nisa` for the
legacy one -- also what the legacy-only dense kernel modules import -- and :func:`load_current`
for the current one). Host launchers call :func:`resolve_api` per launch.

Packages: the real ones when installed, else ``nki_sim`` (the project's simulator) registered
under their names. The environment variable ``NKI_PA_BACKEND`` forces the choice: ``auto``
(default: real if importable, else the simulator), ``sim`` (always the simulator, e.g. to
compare it against a real install), ``neuron`` (require the real legacy package). Kernels never
branch on which package is active.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from dataclasses import dataclass

from nki_kernels.ops import APIS  # noqa: E402  ("legacy", "nki")

LEGACY, CURRENT = APIS
API_ENV = "NKI_PA_API"            # "legacy" | "nki" | "auto": overrides the automatic choice
TARGETS = ("trn1", "trn2", "trn3")
# The API the simulator runs when none is asked for, per target.
SIMULATOR_DEFAULT = {"trn1": LEGACY, "trn2": CURRENT, "trn3": CURRENT}

_VALID = ("auto", "sim", "neuron")
BACKEND_REQUEST = os.environ.get("NKI_PA_BACKEND", "auto").strip().lower() or "auto"
if BACKEND_REQUEST not in _VALID:
    raise ValueError(
        f"NKI_PA_BACKEND must be one of {_VALID}; got {BACKEND_REQUEST!r}"
    )

if BACKEND_REQUEST == "neuron":
    SIMULATED = False
else:
    import nki_sim

    SIMULATED = nki_sim.install(force=(BACKEND_REQUEST == "sim")) or nki_sim.is_installed()

import neuronxcc.nki as nki  # noqa: E402  (resolved to real NKI or nki_sim above)
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402
import neuronxcc.nki.typing as nt  # noqa: E402  (nt.mutable_tensor for in-place kernel arguments)

__all__ = ["nki", "nl", "nisa", "nt", "SIMULATED", "BACKEND_REQUEST", "LEGACY", "CURRENT",
           "APIS", "API_ENV", "Api", "resolve_api", "load_current", "real_current_available",
           "real_legacy_available", "simulator_has_current"]


# ---- the current API's package ----------------------------------------------------------------
def _ours(mod) -> bool:
    return bool(getattr(mod, "__nki_sim__", False))


def real_legacy_available() -> bool:
    """A real (not simulated) ``neuronxcc.nki`` is the active legacy package."""
    return not SIMULATED


def real_current_available() -> bool:
    """Whether a real, importable ``nki`` package (NKI >= 0.3) exists on sys.path (the PyPI
    placeholder, which raises on import, counts as absent; so does the simulator's)."""
    mod = sys.modules.get("nki")
    if mod is not None:
        return not _ours(mod)
    if importlib.machinery.PathFinder.find_spec("nki") is None:
        return False
    try:
        mod = importlib.import_module("nki")
    except Exception:      # the placeholder raises ImportError; any failure means absent
        sys.modules.pop("nki", None)
        return False
    ok = not _ours(mod) and hasattr(mod, "jit")
    if not ok:
        sys.modules.pop("nki", None)
    return ok


def simulator_has_current() -> bool:
    """Whether this ``nki_sim`` provides the current (``nki``) front end."""
    installer = importlib.import_module("nki_sim.install")
    return callable(getattr(installer, "install_current", None))


_CURRENT = {}


def load_current():
    """``(nki, nki.language, nki.isa)`` of the current API: the real package when installed
    (and ``NKI_PA_BACKEND`` is not ``sim``), else the simulator's front end."""
    if not _CURRENT:
        if BACKEND_REQUEST != "sim" and real_current_available():
            simulated = False
        elif BACKEND_REQUEST == "neuron":
            raise ImportError("NKI_PA_BACKEND=neuron needs the real nki package (Neuron SDK >= "
                              "2.29, NKI >= 0.3) for api='nki'; it is not installed")
        else:
            installer = importlib.import_module("nki_sim.install")
            if not simulator_has_current():
                raise NotImplementedError("this nki_sim has no current-API (nki) front end; use "
                                          "api='legacy'")
            installer.install_current(force=BACKEND_REQUEST == "sim")
            simulated = True
        pkg = importlib.import_module("nki")
        _CURRENT.update(nki=pkg, nl=importlib.import_module("nki.language"),
                        nisa=importlib.import_module("nki.isa"), simulated=simulated)
    return _CURRENT["nki"], _CURRENT["nl"], _CURRENT["nisa"]


# ---- API selection ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Api:
    """A resolved API: ``name`` ("legacy" | "nki"), whether it runs on the simulator, and the
    target (the simulator's, "trn1" | "trn2"; None on real hardware: the device decides)."""

    name: str
    simulated: bool
    target: str | None

    @property
    def ops(self):
        """The op-layer module of this API (``nki_kernels.ops.legacy`` / ``.current``)."""
        from nki_kernels.ops import for_api

        return for_api(self.name)

    def kernel(self, family):
        """The jitted kernel of ``family`` (``nki_kernels.ops.KernelFamily``) for this API."""
        return family.for_api(self.name)

    def launch(self, family, args, kwargs, *, num_kv_heads: int, device: bool):
        """Run ``family`` on this API: legacy one program per KV head (grid ``[1, Hkv]``),
        current one launch (the kernel loops over its KV heads); ``device`` runs it on a
        Trainium device (a real package only), else on the API's simulator. Returns the
        kernel's output as returned (NumPy on the simulator)."""
        k = self.kernel(family)
        if device and self.simulated:
            raise RuntimeError(f"running on a device needs the real {self.name!r} package; the "
                               "simulator is active (NKI_PA_BACKEND="
                               f"{BACKEND_REQUEST!r}); use the simulator backend")
        if self.name == LEGACY:
            grid = k[1, num_kv_heads]
            return grid(*args, **kwargs) if device else nki.simulate_kernel(grid, *args, **kwargs)
        pkg = _CURRENT["nki"]
        return k(*args, **kwargs) if device else pkg.simulate(k)(*args, **kwargs)


def _sim_target(target):
    if target is None:
        import nki_sim

        target = nki_sim.get_target().name
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}; got {target!r}")
    return target


def resolve_api(api: str | None = None, target: str | None = None) -> Api:
    """The API a launch runs on, and whether it is simulated.

    Args:
        api: "legacy", "nki", or None / "auto": the environment variable ``NKI_PA_API`` if set,
            else automatic: the real current ``nki`` when installed (trn2 / trn3), else the real
            legacy ``neuronxcc.nki`` when installed (trn1, SDK <= 2.28), else the simulator with
            the API of :data:`SIMULATOR_DEFAULT` for the target (the current API only when
            this nki_sim provides it).
        target: the simulator target ("trn1" | "trn2"; None: ``nki_sim.get_target()``); ignored
            with a real package (the device decides).

    Raises:
        ValueError: ``api`` (or ``NKI_PA_API``) is not one of "auto", "legacy", "nki".
        RuntimeError: a combination the installed toolchain cannot run, naming what to install
            (api="legacy" where only the current nki is installed, as on SDK 2.34; api="nki"
            where only the legacy neuronxcc.nki is).
        NotImplementedError: api="nki" on a simulated trn1 (the current API supports trn2 /
            trn3 only), or on a simulator without the current front end.
    """
    source = "api"
    if api is None or api == "auto":
        env = os.environ.get(API_ENV, "").strip().lower()
        if env and env != "auto":
            api, source = env, API_ENV
        else:
            api = None
    if api is not None and api not in APIS:
        raise ValueError(f"{source} must be one of ('auto', 'legacy', 'nki'); got {api!r}")
    real_cur = BACKEND_REQUEST != "sim" and real_current_available()
    real_leg = real_legacy_available()
    if api is None:
        if real_cur:
            return Api(CURRENT, False, None)
        if real_leg:
            return Api(LEGACY, False, None)
        t = _sim_target(target)
        if SIMULATOR_DEFAULT[t] == CURRENT and simulator_has_current():
            return Api(CURRENT, True, t)
        return Api(LEGACY, True, t)
    if api == LEGACY:
        if real_leg:
            return Api(LEGACY, False, None)
        if real_cur:
            raise RuntimeError("api='legacy' needs neuronx-cc with the neuronxcc.nki namespace "
                               "(Neuron SDK <= 2.28 for trn1; SDK 2.34 removed it), but only the "
                               "current nki package is installed: use api='nki', or install "
                               "neuronx-cc from Neuron SDK 2.28")
        return Api(LEGACY, True, _sim_target(target))
    if real_cur:
        return Api(CURRENT, False, None)
    if real_leg:
        raise RuntimeError("api='nki' needs the nki package (Neuron SDK >= 2.29, NKI >= 0.3; "
                           "trn2 / trn3), but only the legacy neuronxcc.nki is installed: use "
                           "api='legacy', or install nki from Neuron SDK 2.34")
    t = _sim_target(target)
    if t == "trn1":
        raise NotImplementedError("api='nki' on trn1: the current NKI API supports trn2 / trn3 "
                                  "only; use api='legacy' for trn1")
    if not simulator_has_current():
        raise NotImplementedError("this nki_sim has no current-API (nki) front end; use "
                                  "api='legacy'")
    return Api(CURRENT, True, t)
