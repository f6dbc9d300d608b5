"""Command-line conventions shared by the benchmark and timing scripts in ``scripts/``.

* ``--quick``: the same code path on a small workload (seconds), for smoke runs and tests.
* ``--json PATH``: the results as ONE JSON object ``{"script", "quick", "rows": [...], ...}``
  (``rows`` = one dict per printed table row; extra keys per script). Its folder is checked
  before anything runs, the file is written as soon as the results exist (before any plot) and
  reported on stdout as ``json: PATH``.
* ``--plot PATH`` (scripts that draw): matplotlib is checked before anything runs (exit 2 with
  the install hint), and the plot is drawn after the JSON is written, so a plotting error never
  loses the results.

    from nki_pa_cli.script_args import add_common_args, parse_args, write_json
    ap = argparse.ArgumentParser(...)
    add_common_args(ap, quick_help="...")
    args = parse_args(ap, argv)            # validates --json's folder (exit 2 before the run)
    ...
    write_json(args, __file__, rows, extra_key=...)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_common_args(ap: argparse.ArgumentParser, *, quick_help: str, plot_help: str = "") -> None:
    """Add ``--quick``, ``--json PATH`` and, when ``plot_help`` is given, ``--plot PATH``."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--json", type=Path, metavar="PATH",
                    help='write {"script", "quick", "rows", ...} to PATH (its folder must exist)')
    if plot_help:
        ap.add_argument("--plot", type=Path, metavar="PATH", help=plot_help + " (needs matplotlib)")


def parse_args(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``ap.parse_args`` plus the checks that must fail before a long run."""
    args = ap.parse_args(argv)
    for opt in ("json", "plot"):
        path = getattr(args, opt, None)
        if path is not None and not path.parent.is_dir():
            ap.error(f"--{opt} folder must exist; got {str(path.parent)!r}")
    if getattr(args, "plot", None) is not None:
        from nki_pa_cli.plot import matplotlib_missing

        missing = matplotlib_missing(instead="drop --plot")
        if missing:
            ap.error(f"--plot: {missing}")
    return args


def write_json(args: argparse.Namespace, script: str, rows: list, **extra) -> None:
    """Write the results object to ``args.json`` (if given) and say so."""
    if args.json is None:
        return
    doc = {"script": Path(script).name, "quick": bool(args.quick), "rows": rows, **extra}
    args.json.write_text(json.dumps(doc, indent=2))
    print(f"json: {args.json}")
