"""Which NKI API and package device code runs on: the one place that decides.

Two API generations (docs/nki-compatibility-review.md):

``"legacy"``  ``neuronxcc.nki`` (NKI "Beta 1"): trn1 users, Neuron SDK <= 2.28 (the namespace
              fails to compile from 2.30 and is gone from 2.34).
``"nki"``     the current ``import nki`` API (NKI 0.8, SDK 2.34): trn2 / trn3 users.

Kernels never import either package: they run on the project op layer (``nki_kernels.ops``),
whose two modules get the packages from here (:data:`nki` / :data:`nl` / :data:`nisa` for the
legacy one -- also what the benchmarks' legacy-only baselines import -- and :func:`load_current`
for the current one). Host launchers call :func:`resolve_api` per launch.

Packages: the real ones when installed, else ``nki_sim`` (the project's simulator) registered
under their names -- except that a real neuronx-cc without ``neuronxcc.nki`` (SDK 2.34, used
in-process by the real ``nki`` and torch-neuronx) is never replaced: the legacy API is then absent
(``LEGACY_IMPORT_ERROR``), as on that SDK, unless ``NKI_PA_BACKEND=sim``. The environment
variable ``NKI_PA_BACKEND`` forces the choice: ``auto`` (default: real if importable, else the
simulator), ``sim`` (always the simulator, e.g. to compare it against a real install), ``neuron``
(real packages only: :func:`resolve_api` raises where a launch would run on the simulator).
Kernels never branch on which package is active.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import numbers
import os
import sys
from dataclasses import dataclass

from nki_kernels.ops import APIS  # noqa: E402  ("legacy", "nki")

LEGACY, CURRENT = APIS
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"   # 1 | 2: physical cores per logical core (the launch's LNC)
MULTI_CORE_LNC = 2                 # the default LNC of trn2 / trn3 (neuronx-cc's), the only >1 value
PLATFORM_LNC = {"trn1": 1, "trn2": MULTI_CORE_LNC, "trn3": MULTI_CORE_LNC}   # the platforms' defaults
CC_FLAGS_ENV = "NEURON_CC_FLAGS"   # neuronx-cc's extra flags: --lnc / --logical-nc-config N set its LNC
# neuronx-cc's LNC when nothing sets it, on the current API's platforms (trn2 / trn3); a kernel
# launched without an LNC is configured for 1, a mismatch neuronx-cc refuses (error EVRF066)
CURRENT_COMPILER_LNC = MULTI_CORE_LNC
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

try:        # resolved to real NKI or nki_sim above
    import neuronxcc.nki as nki  # noqa: E402
    import neuronxcc.nki.isa as nisa  # noqa: E402
    import neuronxcc.nki.language as nl  # noqa: E402
    import neuronxcc.nki.typing as nt  # noqa: E402  (nt.mutable_tensor: in-place arguments)
    LEGACY_IMPORT_ERROR = None
except ImportError as _err:     # SDK 2.34: no neuronxcc.nki; the current API still works
    nki = nisa = nl = nt = None
    LEGACY_IMPORT_ERROR = f"{type(_err).__name__}: {_err}"

__all__ = ["nki", "nl", "nisa", "nt", "SIMULATED", "BACKEND_REQUEST", "LEGACY", "CURRENT",
           "APIS", "API_ENV", "LNC_ENV", "PLATFORM_LNC", "Api", "resolve_api", "load_current", "real_current_available",
           "real_legacy_available", "simulator_has_current"]


# ---- the current API's package ----------------------------------------------------------------
def _ours(mod) -> bool:
    return bool(getattr(mod, "__nki_sim__", False))


def real_legacy_available() -> bool:
    """A real (not simulated) ``neuronxcc.nki`` is the active legacy package."""
    return not SIMULATED and LEGACY_IMPORT_ERROR is None


def _require_legacy() -> None:
    """RuntimeError naming what to install when no ``neuronxcc.nki`` (real or simulated) imports."""
    if LEGACY_IMPORT_ERROR is not None:
        raise RuntimeError("api='legacy' needs neuronx-cc with the neuronxcc.nki namespace (Neuron "
                           "SDK <= 2.28 for trn1; SDK 2.34 removed it), which does not import here "
                           f"({LEGACY_IMPORT_ERROR}): use api='nki' on trn2 / trn3, or install "
                           "neuronx-cc from Neuron SDK 2.28")


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


@dataclass(frozen=True)
class CurrentPackage:
    """The loaded current-API package: ``nki``, ``nki.language``, ``nki.isa`` and whether it is
    the simulator's front end."""

    nki: object
    nl: object
    nisa: object
    simulated: bool


_CURRENT: CurrentPackage | None = None       # set once by load_current


def load_current():
    """``(nki, nki.language, nki.isa)`` of the current API: the real package when installed
    (and ``NKI_PA_BACKEND`` is not ``sim``), else the simulator's front end."""
    global _CURRENT
    if _CURRENT is None:
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
        _CURRENT = CurrentPackage(nki=importlib.import_module("nki"),
                                  nl=importlib.import_module("nki.language"),
                                  nisa=importlib.import_module("nki.isa"), simulated=simulated)
    return _CURRENT.nki, _CURRENT.nl, _CURRENT.nisa


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

    def lnc(self, lnc=None, num_kv_heads: int = 2, *, item_split: bool = False,
            odd_heads: bool = False, rows: bool = False) -> int:
        """Physical cores a launch uses (the logical core's LNC): ``lnc`` (1 | 2), else the
        environment variable ``NEURON_LOGICAL_NC_CONFIG``, else the platform's (:data:`PLATFORM_LNC`:
        2 on trn2 / trn3, 1 on trn1) when this API can split the launch (the current API: its
        KV heads by ``nl.program_id(0)``; legacy: ``nl.nc`` SPMD programs) over an even Hkv or,
        with ``item_split`` (a kernel whose host schedule can be cut in item parts, one per
        core: the scheduled kernel), over any Hkv -- as with ``odd_heads`` (a kernel that
        splits an odd Hkv's heads between the cores by query tiles: the dense kernel, the last
        head on the current API, every head on the legacy API) or ``rows`` (a kernel without a
        head grid that splits its rows on the current API and runs as one program on the legacy
        API, which needs nothing of the front end: the cache kernels); else 1. On a device the
        launch must use neuronx-cc's LNC (error EVRF066 otherwise), which decides: the ``--lnc``
        / ``--logical-nc-config`` of ``NEURON_CC_FLAGS``, else the environment variable, else the
        compiler's default on the current API (2: trn2 / trn3); an ``lnc`` that differs is a
        ValueError; None on the legacy API with nothing set (the legacy grid).

        Raises:
            ValueError: ``lnc`` / the environment variable is not 1 or 2.
            NotImplementedError: 2 where it cannot run (trn1; an odd Hkv without
                ``item_split`` or ``odd_heads``; a legacy front end without ``nl.nc``), saying
                to use 1.
        """
        source = "lnc"
        if lnc is None:
            env = os.environ.get(LNC_ENV, "").strip()
            if env:
                lnc, source = env, LNC_ENV
        if not self.simulated and self.target is None:          # a device: the compiler's LNC
            lnc, source = self._device_lnc(lnc, source)
            if lnc is None:
                return None             # legacy API, nothing set: the legacy grid decides
        if lnc is None:
            want = PLATFORM_LNC.get(self.target, 1)
            return (want if want == 1 or rows
                    or self._can_split(num_kv_heads, want, item_split, odd_heads) else 1)
        if (str(lnc) not in ("1", "2") or isinstance(lnc, bool)
                or (source == "lnc" and not isinstance(lnc, numbers.Integral))):
            raise ValueError(f"{source} must be 1 or 2; got {lnc!r}")
        lnc = int(lnc)
        if lnc == 2:
            if self.target == "trn1":
                raise NotImplementedError(f"{source}=2 on trn1: a trn1 logical core is one "
                                          "NeuronCore; use lnc=1")
            if not rows and not self._can_split(num_kv_heads, lnc, item_split, odd_heads):
                need = ("nl.nc is needed" if item_split or odd_heads else
                        "an even Hkv and, on the legacy API, nl.nc are needed")
                fix = ("set NEURON_LOGICAL_NC_CONFIG=1 (neuronx-cc then compiles at LNC 1 too)"
                       if not self.simulated else "use lnc=1")
                raise NotImplementedError(
                    f"{source}=2: the {self.name!r} API here cannot split a launch over "
                    f"{num_kv_heads} KV head(s) between two cores ({need}); {fix}")
        return lnc

    def _device_lnc(self, lnc, source):
        """``(lnc, source)`` on a device, where the compiler's LNC decides: the ``--lnc`` of
        ``NEURON_CC_FLAGS``, else ``NEURON_LOGICAL_NC_CONFIG``, else (current API) neuronx-cc's
        default, 2 on trn2 / trn3; the legacy API with nothing set: None (its grid decides). A
        choice made so far (the argument) that differs is a ValueError: the compile would fail
        with EVRF066."""
        env = os.environ.get(LNC_ENV, "").strip()
        cc = compiler_lnc()
        if cc is not None:
            compiler = (cc, CC_FLAGS_ENV, f"the --lnc of {CC_FLAGS_ENV}")
        elif env:
            compiler = (env, LNC_ENV, LNC_ENV)
        elif self.name == CURRENT:
            compiler = (str(CURRENT_COMPILER_LNC), "neuronx-cc's default on trn2 / trn3",
                        "neuronx-cc's default LNC on trn2 / trn3")
        else:
            return lnc, source
        value, who, name = compiler
        if lnc is not None and str(lnc) != value:
            raise ValueError(f"{source}={lnc!r}, but {who} makes neuronx-cc compile at LNC "
                             f"{value}: a kernel must use the compiler's LNC (error EVRF066); "
                             f"make the two agree ({LNC_ENV} or the --lnc of {CC_FLAGS_ENV} sets "
                             "it for the whole model)")
        return (value if lnc is None else lnc), (name if lnc is None else source)

    def _can_split(self, num_kv_heads, lnc, item_split=False, odd_heads=False):
        if num_kv_heads % lnc and not (item_split or odd_heads):
            return False
        return self.name == CURRENT or hasattr(self.ops.nl, "nc")

    def run(self, family, *args, lnc=None, **kwargs):
        """Run a kernel without a head grid (the cache kernels) where this API's package runs:
        :meth:`launch` with ``num_kv_heads=None`` on the device with a real package, on the
        simulator with nki_sim. Returns the kernel's output (the written cache)."""
        return self.launch(family, args, kwargs, num_kv_heads=None, device=not self.simulated,
                           lnc=lnc)

    def launch(self, family, args, kwargs, *, num_kv_heads: int | None, device: bool, lnc=None,
               item_parts: int = 1):
        """Run ``family`` on this API: legacy one program per KV head (grid ``[1, Hkv]``; with
        LNC=2 ``[1, nl.spmd_dim(nl.nc(2), Hkv/2)]``), current one launch (the kernel loops over
        its KV heads, each core over half of them with LNC=2); ``lnc``: :meth:`lnc`. A schedule
        cut in ``item_parts`` > 1 parts runs on exactly that many cores, each core its part of
        every head (legacy grid ``[nl.nc(2), Hkv]``); a family with ``odd_heads`` splits an
        odd Hkv too (:meth:`lnc`; legacy grid ``[nl.nc(2), Hkv]``, each program half of its
        head's query tiles). ``num_kv_heads`` None: a kernel without a head grid that splits its
        rows between the cores it runs on (the cache kernels, ``nki_kernels.row_tiles``): legacy
        one program, current at the launch's LNC (:meth:`lnc`, any Hkv). ``device`` runs it on a
        Trainium device (a real package only), else on the API's simulator. Returns the
        kernel's output as returned (NumPy on the simulator).

        Raises:
            ValueError: ``item_parts`` > 1 and the launch resolves to another core count.
        """
        k = self.kernel(family)
        if device and self.simulated:
            pkg = "neuronx-cc (neuronxcc.nki)" if self.name == LEGACY else "nki"
            raise RuntimeError(f"backend='neuron' needs the real Neuron toolchain ({pkg}, api="
                               f"{self.name!r}) and a Trainium device, but the simulator is "
                               f"active (NKI_PA_BACKEND={BACKEND_REQUEST!r}); use backend='sim' "
                               "or 'auto'")
        if num_kv_heads is None:        # no head grid: the kernel splits its rows between cores
            if self.name == LEGACY:     # one program (legacy SDKs have no LNC check)
                return k(*args, **kwargs) if device else nki.simulate_kernel(k, *args, **kwargs)
            cores = self.lnc(lnc, rows=True)
        else:
            cores = self.lnc(lnc, num_kv_heads, item_split=item_parts > 1,
                             odd_heads=family.odd_heads)
        if item_parts > 1 and cores != item_parts:
            raise ValueError(f"lnc must be {item_parts} for a schedule in {item_parts} item "
                             f"parts (plan it with the launch's lnc); got {cores}")
        if self.name == LEGACY:
            parts = item_parts
            if parts == 1 and family.odd_heads and cores and num_kv_heads % cores:
                parts = cores           # an odd Hkv: each program half of its head's Q tiles
            grid = k[self.ops.launch_grid(num_kv_heads, cores or 1, parts)]
            return grid(*args, **kwargs) if device else nki.simulate_kernel(grid, *args, **kwargs)
        pkg = load_current()[0]
        if device:
            env = os.environ.get(LNC_ENV, "").strip()
            return (k if cores is None or env == str(cores) else k[cores])(*args, **kwargs)
        return pkg.simulator.simulate_kernel(k, tuple(args), dict(kwargs), cores)


def compiler_lnc() -> str | None:
    """The LNC ``NEURON_CC_FLAGS`` gives neuronx-cc (``--lnc N``, ``--lnc=N``,
    ``--logical-nc-config N`` or ``=N``; the last one wins), else None."""
    import shlex

    words = shlex.split(os.environ.get(CC_FLAGS_ENV, ""))
    found = None
    for i, w in enumerate(words):
        for flag in ("--lnc", "--logical-nc-config"):
            if w == flag and i + 1 < len(words):
                found = words[i + 1]
            elif w.startswith(flag + "="):
                found = w[len(flag) + 1:]
    return found


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
    chosen = _resolve(api, target)
    if chosen.simulated and BACKEND_REQUEST == "neuron":
        raise RuntimeError(f"NKI_PA_BACKEND=neuron requires a real NKI package, but api="
                           f"{chosen.name!r} would run on the simulator here: install the current "
                           "nki (Neuron SDK 2.34, trn2 / trn3) or neuronx-cc with neuronxcc.nki "
                           "(SDK <= 2.28, trn1), or unset NKI_PA_BACKEND")
    return chosen


def _resolve(api: str | None, target: str | None) -> Api:
    """:func:`resolve_api` before the ``NKI_PA_BACKEND=neuron`` check."""
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
        if simulator_has_current() and t != "trn1" and (SIMULATOR_DEFAULT[t] == CURRENT
                                                         or LEGACY_IMPORT_ERROR is not None):
            return Api(CURRENT, True, t)
        _require_legacy()
        return Api(LEGACY, True, t)
    if api == LEGACY:
        if real_leg:
            return Api(LEGACY, False, None)
        if real_cur:
            raise RuntimeError("api='legacy' needs neuronx-cc with the neuronxcc.nki namespace "
                               "(Neuron SDK <= 2.28 for trn1; SDK 2.34 removed it), but only the "
                               "current nki package is installed: use api='nki', or install "
                               "neuronx-cc from Neuron SDK 2.28")
        _require_legacy()
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
