#!/usr/bin/env python
"""Hardware evidence: published NKI kernel measurements vs the cost model (MODELED vs measured).

For every case of ``scripts/evidence/measurements.json`` (source, kernel, shapes, dtype, target,
how measured, figure, profile data where published) this script

1. fetches the public kernel source at its pinned commit into a cache OUTSIDE the repository
   (``scripts/evidence/sources.py``; ``--mirror DIR`` reads local git mirrors instead of the
   network; a case whose source cannot be fetched is skipped with the reason), or takes the
   project's own equivalent where only a description was published (``scripts/evidence/
   own_kernels.py``, labelled ``own``);
2. runs it UNCHANGED on nki_sim for the published target, checks its output against a reference
   (``scripts/evidence/builders.py``) and saves the trace in the cache (``--resimulate`` redoes
   it; a saved trace lets a cost-model change be re-evaluated in seconds);
3. models the trace with ``nki_sim.cost.estimate`` and reports modeled / measured, HBM bytes
   modeled vs profiled, ScalarE / VectorE / GpSimd busy time vs the profile's engine-active
   time, the class (clean / compiler-rewritten / ambiguous, ``scripts/evidence/report.py``) and
   the summary statistics per class.

    python scripts/bench_evidence.py [--mirror DIR] [--cases SUBSTR ...] [--resimulate]
                                     [--markdown docs/cost-model-validation.md] [--json out.json]

--quick: only the cases that need no network (the project's own equivalents).
--markdown: rewrite the generated block of that page (between the evidence:begin / end markers).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import pickle
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for p in (ROOT, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from nki_pa_cli.script_args import add_common_args, parse_args, write_json  # noqa: E402
from evidence import builders, report, sources  # noqa: E402

TABLE = HERE / "evidence" / "measurements.json"
BEGIN, END = "<!-- evidence:begin -->", "<!-- evidence:end -->"
TRACE_FORMAT = 2          # bump when the simulator's trace gains fields the cost model reads


def load_table(path: Path = TABLE) -> list[dict]:
    return json.loads(Path(path).read_text())["cases"]


def _kernel_label(case: dict) -> str:
    k = case["kernel"]
    if "own" in k:
        return f"own: {k['own']}"
    return f"{k['repo']} {Path(k['path']).name}:{k['function']}"


def _resolve(case: dict, mirror):
    """(kernel function, Run, cache key) of a case; raises SourceUnavailable when offline."""
    import nki_sim
    nki_sim.install()
    k, spec = case["kernel"], case["inputs"]
    builder = builders.BUILDERS[spec["builder"]]
    if "own" in k:
        from evidence import own_kernels
        fn, text = own_kernels.kernel(k["own"]), (HERE / "evidence" / "own_kernels.py").read_bytes()
        run = builder(spec)
    else:
        def fetch(p, commit=None):          # a file of the kernel's repository (its commit by default)
            return sources.fetch(k["repo"], commit or k["commit"], p, mirror=mirror)
        path = fetch(k["path"])
        text = path.read_bytes()
        run = builder(spec, fetch)
        if run.load_kernel is not None:     # built by the builder (e.g. a factory in a package)
            fn = run.load_kernel(path, k["function"])
        else:
            mod = builders.load_module(path, "evidence_" + hashlib.sha1(str(path).encode()).hexdigest()[:8])
            fn = getattr(mod, k["function"])
    # the dependency checker changes no event: a trace saved with it off is the same trace
    sim_key = {k: v for k, v in case.get("sim_config", {}).items() if k != "check_dependencies"}
    key = hashlib.sha1(text + json.dumps([TRACE_FORMAT, spec, case["target"], sim_key],
                                         sort_keys=True).encode()).hexdigest()[:16]
    return fn, run, key


class NotSimulated(RuntimeError):
    """--saved-only and no saved trace for the case."""


class KernelRejected(RuntimeError):
    """--saved-only: an earlier run found that nki_sim rejects the kernel (the saved reason)."""


def simulate(case: dict, mirror, resimulate: bool, saved_only: bool = False) -> dict:
    """Trace + check of one case, from the cache when possible. Raises SourceUnavailable."""
    fn, run, key = _resolve(case, mirror)
    saved = sources.cache_dir() / "traces" / f"{case['id']}-{key}.pkl"
    failed = saved.with_suffix(".fail")
    if saved.is_file() and not resimulate:
        with saved.open("rb") as f:
            return pickle.load(f)
    if saved_only:
        if failed.is_file():
            raise KernelRejected(failed.read_text())
        raise NotSimulated("not simulated in this run (no saved trace; run without --saved-only)")
    import nki_sim
    t0 = time.time()
    try:
        with warnings.catch_warnings(record=True) as caught, \
                nki_sim.use_target(case["target"]), \
                nki_sim.configure(**case.get("sim_config", {})), nki_sim.tracing() as trace:
            warnings.simplefilter("always")
            out = fn(*run.args, **run.kwargs)
    except MemoryError:
        raise
    except Exception as e:              # remembered, so that --saved-only reports it too
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        raise
    err = run.check(out)
    rec = {"events": trace.events, "max_rel_error": err, "tolerance": run.tolerance,
           "sim_s": time.time() - t0, "warnings": sorted({type(w.message).__name__ for w in caught})}
    saved.parent.mkdir(parents=True, exist_ok=True)
    with saved.open("wb") as f:
        pickle.dump(rec, f, protocol=pickle.HIGHEST_PROTOCOL)
    return rec


def evaluate(case: dict, rec: dict) -> dict:
    """The report row of a simulated case (MODELED figures from nki_sim.cost)."""
    from nki_sim.cost import estimate
    rep = estimate(rec["events"], case["target"])
    measured = float(case["measured_us"])
    cls, evidence = report.classify(case, rep.hbm_bytes)
    row = {"modeled_us": rep.modeled_us, "ratio": rep.modeled_us / measured,
           "bottleneck": rep.bottleneck, "per_engine_us": dict(rep.per_engine_us),
           "hbm_bytes": rep.hbm_bytes, "hbm_bytes_profiled": report.profiled_hbm_bytes(case),
           "class": cls, "class_evidence": evidence, "max_rel_error": rec["max_rel_error"],
           "correct": rec["max_rel_error"] <= rec["tolerance"], "instructions": dict(rep.instructions)}
    active = (case.get("profile") or {}).get("engine_active_fraction") or {}
    row["engines"] = {e: {"modeled": rep.per_engine_us[e],
                          "measured": active[e] * measured if e in active else None}
                      for e in ("scalar", "vector", "gpsimd", "tensor", "dma")}
    return row


def run_cases(cases: list[dict], mirror=None, resimulate=False, log=print,
              saved_only=False) -> list[dict]:
    rows = []
    for case in cases:
        row = {"id": case["id"], "kernel": _kernel_label(case), "shapes": case["shapes"],
               "dtype": case["dtype"], "target": case["target"], "source": case["source"],
               "citation": case["citation"], "measured_us": float(case["measured_us"]),
               "fits": case.get("fits", [])}
        try:
            rec = simulate(case, mirror, resimulate, saved_only)
        except (sources.SourceUnavailable, NotSimulated) as e:
            row["status"] = f"skipped: {e}"
        except MemoryError:
            row["status"] = "skipped: out of memory (nki_sim holds every on-chip tensor as a NumPy array)"
        except KernelRejected as e:
            row["status"] = f"does not run on nki_sim: {e}"
        except Exception as e:                      # a kernel nki_sim rejects: reported, not hidden
            row["status"] = f"does not run on nki_sim: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        else:
            row.update(evaluate(case, rec), status="ok")
            if not row["correct"]:
                row["status"] = f"wrong result (max rel error {row['max_rel_error']:.2e})"
        rows.append(row)
        gc.collect()
        if row["status"] == "ok":
            log(f"{case['id']:<38} measured {row['measured_us']:>10.1f} us  modeled {row['modeled_us']:>10.1f}"
                f" us  ratio {row['ratio']:.2f}  {row['class']}")
        else:
            log(f"{case['id']:<38} {row['status']}")
    return rows


def write_markdown(path: Path, text: str) -> None:
    page = path.read_text() if path.exists() else f"{BEGIN}\n{END}\n"
    if BEGIN not in page or END not in page:
        raise ValueError(f"{path} must contain the markers {BEGIN} and {END}")
    head, rest = page.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, quick_help="only the project's own equivalents (no network)")
    ap.add_argument("--mirror", type=Path, help="folder of local git mirrors (owner+name/repo)")
    ap.add_argument("--cases", nargs="+", metavar="SUBSTR", help="run the cases whose id contains one")
    ap.add_argument("--resimulate", action="store_true", help="ignore saved traces")
    ap.add_argument("--saved-only", action="store_true",
                    help="model saved traces only; cases without one are reported as not simulated")
    ap.add_argument("--markdown", type=Path, help="page whose generated block is rewritten")
    args = parse_args(ap, argv)
    if args.mirror is not None and not args.mirror.is_dir():
        ap.error(f"--mirror must be a folder; got {str(args.mirror)!r}")
    cases = load_table()
    if args.quick:
        cases = [c for c in cases if "own" in c["kernel"]]
    if args.cases:
        cases = [c for c in cases if any(s in c["id"] for s in args.cases)]
        if not cases:
            ap.error(f"--cases matched no case id; got {args.cases}")
    rows = run_cases(cases, args.mirror, args.resimulate, saved_only=args.saved_only)
    stats = report.stats_by_class(rows)
    for name, s in stats.items():
        if s["n"]:
            print(f"{name}: {s['n']} cases, geomean {s['geomean']:.2f}, within +-25% "
                  f"{s['within_25pct']:.0%}, within 2x {s['within_2x']:.0%}")
    write_json(args, __file__, rows, stats=stats)
    if args.markdown is not None:
        write_markdown(args.markdown, report.markdown(rows, stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
