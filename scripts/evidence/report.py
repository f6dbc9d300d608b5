"""Classification, summary statistics and the Markdown report of the evidence suite.

Class of a case (``classify``), decided by rule from the published data, never per case:

* ``ambiguous`` / ``compiler-rewritten`` when the table says so with its evidence (e.g. a
  tutorial whose text and script disagree on the shape, or whose profile shows spill traffic);
* ``compiler-rewritten`` when the profile reports SBUF spill bytes, or when the profiled HBM
  bytes differ from the HBM bytes of the source's trace by more than ``HBM_TOLERANCE``: the
  compiler moved data the source does not move (spills, removed or added loads), which a source
  trace cannot see;
* ``clean`` otherwise.

Statistics (``summary``): geometric mean of modeled / measured, share within +-25 %
(0.75 <= ratio <= 1.25) and share within 2x (0.5 <= ratio <= 2).
"""
from __future__ import annotations

import math

HBM_TOLERANCE = 0.10
CLASSES = ("clean", "compiler-rewritten", "ambiguous")


def profiled_hbm_bytes(case: dict) -> int | None:
    prof = case.get("profile") or {}
    if "hbm_read_bytes" not in prof:
        return None
    return int(prof["hbm_read_bytes"]) + int(prof.get("hbm_write_bytes", 0))


def classify(case: dict, modeled_hbm_bytes: int | None) -> tuple[str, str]:
    """(class, evidence) of a case; see the module docstring for the rule."""
    if case.get("class"):
        if case["class"] not in CLASSES:
            raise ValueError(f"class must be one of {CLASSES}; got {case['class']!r} ({case['id']})")
        return case["class"], case.get("class_evidence", "")
    prof = case.get("profile") or {}
    spill = int(prof.get("spill_save_bytes", 0)) + int(prof.get("spill_reload_bytes", 0))
    if spill:
        return ("compiler-rewritten",
                f"profile: {prof.get('spill_save_bytes', 0) / 2**20:.0f} MiB spill-save + "
                f"{prof.get('spill_reload_bytes', 0) / 2**20:.0f} MiB spill-reload")
    hbm = profiled_hbm_bytes(case)
    if hbm is not None and modeled_hbm_bytes:
        r = hbm / modeled_hbm_bytes
        if abs(r - 1) > HBM_TOLERANCE:
            return ("compiler-rewritten",
                    f"profiled HBM bytes {hbm / 2**20:.0f} MiB = {r:.2f}x the source's "
                    f"{modeled_hbm_bytes / 2**20:.0f} MiB")
        return "clean", f"profiled HBM bytes within {HBM_TOLERANCE:.0%} of the source's ({r:.3f}x), no spills"
    return "clean", "no documented rewrite" + ("" if hbm is None else "")


def summary(ratios: list[float]) -> dict:
    """n, geomean, share within +-25 %, share within 2x, min, max of modeled/measured ratios."""
    rs = [float(r) for r in ratios if r and r > 0 and math.isfinite(r)]
    if not rs:
        return {"n": 0, "geomean": float("nan"), "within_25pct": float("nan"),
                "within_2x": float("nan"), "min": float("nan"), "max": float("nan")}
    n = len(rs)
    return {"n": n, "geomean": math.exp(sum(math.log(r) for r in rs) / n),
            "within_25pct": sum(0.75 <= r <= 1.25 for r in rs) / n,
            "within_2x": sum(0.5 <= r <= 2.0 for r in rs) / n, "min": min(rs), "max": max(rs)}


def stats_by_class(rows: list[dict]) -> dict:
    """Statistics of the clean cases, of the clean cases no model constant was fitted on, and of
    every case that ran."""
    ok = [r for r in rows if r["status"] == "ok"]
    clean = [r for r in ok if r["class"] == "clean"]
    return {"clean": summary([r["ratio"] for r in clean]),
            "clean, not used in any fit": summary([r["ratio"] for r in clean if not r.get("fits")]),
            "all runnable": summary([r["ratio"] for r in ok])}


def _f(x, fmt="{:.0f}"):
    return "-" if x is None else fmt.format(x)


def markdown(rows: list[dict], stats: dict) -> str:
    lines = ["| class | cases | modeled / measured geomean | within +-25 % | within 2x | range |",
             "|---|---|---|---|---|---|"]
    for name, s in stats.items():
        if s["n"]:
            lines.append(f"| {name} | {s['n']} | {s['geomean']:.2f} | {s['within_25pct']:.0%} | "
                         f"{s['within_2x']:.0%} | {s['min']:.2f}-{s['max']:.2f} |")
    lines += ["", "| case | kernel | shapes | measured us | modeled us (MODELED) | modeled / measured "
              "| bottleneck | HBM MiB modeled / profiled | ScalarE us modeled / profiled | "
              "VectorE us modeled / profiled | class | evidence |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shapes = ", ".join(f"{k}={v}" for k, v in r["shapes"].items())
        if r["status"] != "ok":
            lines.append(f"| {r['id']} | {r['kernel']} | {shapes} | {r['measured_us']:.1f} | - | - | - "
                         f"| - | - | - | {r.get('class', '-')} | {r['status']} |")
            continue
        eng = r.get("engines") or {}
        sc, ve = eng.get("scalar", {}), eng.get("vector", {})
        hbm_p = r.get("hbm_bytes_profiled")
        lines.append(
            f"| {r['id']} | {r['kernel']} | {shapes} | {r['measured_us']:.1f} | {r['modeled_us']:.1f} | "
            f"{r['ratio']:.2f} | {r['bottleneck']} | {r['hbm_bytes'] / 2**20:.1f} / "
            f"{_f(None if hbm_p is None else hbm_p / 2**20, '{:.1f}')} | "
            f"{sc.get('modeled', 0):.0f} / {_f(sc.get('measured'))} | "
            f"{ve.get('modeled', 0):.0f} / {_f(ve.get('measured'))} | {r['class']} | {r['class_evidence']}"
            + (f" Used to fit: {', '.join(r['fits'])}." if r.get("fits") else "") + " |")
    return "\n".join(lines)
