"""Command-line conventions shared by the benchmark and timing scripts in ``scripts/``.

* ``--quick``: the same code path on a small workload (seconds), for smoke runs and tests.
* ``--json PATH``: the results as ONE JSON object ``{"script", "quick", "rows": [...], ...}``
  (``rows`` = one dict per printed table row; extra keys per script). Its folder is checked
  before anything runs, the file is written as soon as the results exist (before any plot) and
  reported on stdout as ``json: PATH``.
* ``--plot PATH`` (scripts that draw): matplotlib is checked before anything runs (exit 2 with
  the install hint), and the plot is drawn after the JSON is written, so a plotting error never
  loses the results.
* ``--api auto|legacy|nki|both`` (scripts that run a kernel with both NKI APIs): ``auto`` the API
  each target's users get (trn1 legacy, trn2 the current ``nki``), ``legacy`` / ``nki`` that API
  on every target, ``both`` legacy on every target plus ``nki`` where it is modeled (trn2). The
  current API supports trn2 / trn3 only: ``--api nki`` with trn1 among the targets exits 2
  before anything runs (:func:`check_api_targets`); ``both`` runs trn1 on legacy only.

    from nki_pa_cli.script_args import add_common_args, parse_args, write_json
    ap = argparse.ArgumentParser(...)
    add_common_args(ap, quick_help="...")
    args = parse_args(ap, argv)            # validates --json's folder (exit 2 before the run)
    ...
    write_json(args, __file__, rows, extra_key=...)

    add_api_arg(ap, default="both")
    args = parse_args(ap, argv)
    check_api_targets(ap, args.api, args.targets)
    for target, api in api_runs(args.api, args.targets): ...
"""
from __future__ import annotations

import argparse
import json
import sys
import subprocess
from pathlib import Path


def add_common_args(ap: argparse.ArgumentParser, *, quick_help: str, plot_help: str = "") -> None:
    """Add ``--quick``, ``--json PATH`` and, when ``plot_help`` is given, ``--plot PATH``."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--json", type=Path, metavar="PATH",
                    help='write {"script", "quick", "rows", ...} to PATH (its folder must exist)')
    if plot_help:
        ap.add_argument("--plot", type=Path, metavar="PATH", help=plot_help + " (needs matplotlib)")


def parse_args(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``ap.parse_args`` plus the checks that must fail before a long run: the folders of
    ``--json``, ``--plot`` and (where a script has it) ``--markdown`` exist, and ``--plot`` has
    matplotlib."""
    args = ap.parse_args(argv)
    for opt in ("json", "plot", "markdown"):
        path = getattr(args, opt, None)
        if path is not None and not path.parent.is_dir():
            ap.error(f"--{opt} folder must exist; got {str(path.parent)!r}")
    if getattr(args, "plot", None) is not None:
        from nki_pa_cli.plot import matplotlib_missing

        missing = matplotlib_missing(instead="drop --plot")
        if missing:
            ap.error(f"--plot: {missing}")
    return args


def add_markdown_arg(ap: argparse.ArgumentParser, help: str = "write the table as a page") -> None:
    """Add ``--markdown PATH`` (its folder is checked by :func:`parse_args`)."""
    ap.add_argument("--markdown", type=Path, metavar="PATH", help=help)


def write_markdown(args: argparse.Namespace, script: str, argv, page) -> None:
    """If ``--markdown`` was given: write ``page(command, commit)`` there -- the command line
    that ran ``script`` with ``argv`` (None: ``sys.argv[1:]``) as :func:`command_line` records
    it, and the checkout's :func:`git_commit` -- and say so."""
    if getattr(args, "markdown", None) is None:
        return
    cmd = command_line(Path(script).name, sys.argv[1:] if argv is None else argv)
    args.markdown.write_text(page(cmd, git_commit()))
    print(f"markdown: {args.markdown}")


def write_json(args: argparse.Namespace, script: str, rows: list, **extra) -> None:
    """Write the results object to ``args.json`` (if given) and say so."""
    if args.json is None:
        return
    doc = {"script": Path(script).name, "quick": bool(args.quick), "rows": rows, **extra}
    args.json.write_text(json.dumps(doc, indent=2))
    print(f"json: {args.json}")


def git_commit(*paths: str) -> str:
    """Short hash of the checkout's HEAD, or of the last commit touching ``paths``; "unknown"
    outside a git checkout. Generated pages state it beside their command."""
    root = Path(__file__).resolve().parents[1]
    cmd = ["git", "log", "-1", "--format=%h", "--", *paths] if paths else \
        ["git", "rev-parse", "--short", "HEAD"]
    try:
        return subprocess.run(cmd, cwd=root, text=True, capture_output=True,
                              check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command_line(script: str, argv) -> str:
    """``python scripts/<script> <argv>`` as a generated page records it: an absolute path
    inside the checkout becomes repo-relative, so no page names the machine it ran on."""
    root = Path(__file__).resolve().parents[1]

    def rel(arg: str) -> str:
        p = Path(arg)
        if p.is_absolute():
            try:
                return str(p.resolve().relative_to(root))
            except ValueError:
                return arg
        return arg

    return f"python scripts/{script} " + " ".join(rel(str(a)) for a in argv)


API_CHOICES = ("auto", "legacy", "nki", "both")
AUTO_API = {"trn1": "legacy", "trn2": "nki"}      # the API each target's users get
CURRENT_API_TARGETS = ("trn2",)                   # simulated targets of the current API


def add_api_arg(ap: argparse.ArgumentParser, *, default: str = "auto", what: str = "the kernel") -> None:
    """Add ``--api`` (module docstring) with ``default`` ("auto" or "both")."""
    if default not in API_CHOICES:
        raise ValueError(f"default must be one of {API_CHOICES}; got {default!r}")
    ap.add_argument("--api", choices=API_CHOICES, default=default,
                    help=f"NKI API of {what}: auto (trn1 legacy, trn2 nki), legacy, nki (trn2 "
                         f"only), both (legacy everywhere + nki on trn2); default {default}")


def check_api_targets(ap: argparse.ArgumentParser, api: str, targets) -> None:
    """Exit 2 (``ap.error``) for ``--api nki`` with a target the current API does not support."""
    bad = [t for t in targets if t not in CURRENT_API_TARGETS]
    if api == "nki" and bad:
        ap.error(f"--api nki: the current NKI API is modeled on {', '.join(CURRENT_API_TARGETS)} "
                 f"only; got targets {bad} (pass --targets {' '.join(CURRENT_API_TARGETS)}, or "
                 "--api auto / both, which run trn1 on the legacy API)")


def api_runs(api: str, targets) -> list[tuple[str, str]]:
    """The (target, api) pairs an ``--api`` value runs, target by target in the given order."""
    if api not in API_CHOICES:
        raise ValueError(f"api must be one of {API_CHOICES}; got {api!r}")
    out = []
    for t in targets:
        if api == "auto":
            out.append((t, AUTO_API[t]))
        elif api == "both":
            out += [(t, "legacy")] + ([(t, "nki")] if t in CURRENT_API_TARGETS else [])
        else:
            out.append((t, api))
    return out
