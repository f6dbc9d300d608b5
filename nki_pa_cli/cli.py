"""``nki-pa``: argument parsing and exit codes (0 PASS, 1 FAIL, 2 bad usage)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DEMO_HELP = """\
Run a mixed batch (a prefill chunk plus decodes, GQA) through the flash paged-attention kernel
on the embedded NKI simulator (nki_sim) for trn1 and trn2, check it against the float64
reference, print the max error, PASS/FAIL and the MODELED figures (nki_sim.cost: modeled us,
per-engine us, DMA instructions and bytes), and write into --out: one Perfetto trace per run
(trace-<kernel>-<target>.json, open in https://ui.perfetto.dev), summary.json and
modeled-engines.png (only when matplotlib is installed: the bench extra; without it the demo
says so and skips the PNG). Every kernel of host.paged_attention(kernel=...) runs, the default
first. Exit code 0 = PASS, 1 = FAIL, 2 = bad usage."""


ENV_HELP = """\
Report what a launch would run on here: the installed packages, the environment variables that
steer a launch (NKI_PA_BACKEND, NKI_PA_API, NEURON_LOGICAL_NC_CONFIG, NEURON_CC_FLAGS), the NKI
API each api= choice resolves to and whether that package is real or the embedded simulator, the
LNC a launch would use, and whether the torch ops' XLA device path is available. Nothing is
launched. Exit code 0."""


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0; got {text!r}")
    return value


def version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        return dist_version("nki-paged-attention")
    except PackageNotFoundError:
        from nki_pa_cli import __version__

        return __version__


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number; got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number; got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nki-pa", description="NKI flash paged attention: command line.")
    ap.add_argument("--version", action="version", version=f"nki-pa {version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="mixed batch on the simulator: accuracy, MODELED figures, "
                          "trace, PNG", description=DEMO_HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--quick", action="store_true",
                      help="small batch (4 sequences, H=8, Hkv=2, d=64; under a second)")
    demo.add_argument("--out", type=Path, default=Path("out") / "demo",
                      help="output folder (created; default: out/demo)")
    demo.add_argument("--no-png", action="store_true",
                      help="skip the PNG (skipped anyway, with a note, without matplotlib)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    demo.add_argument("--tolerance", type=_positive_float, default=None,
                      help="largest accepted max |error| (default 3e-2, the tests' bound for "
                           "fp32 inputs in mixed precision)")
    demo.add_argument("--seed", type=_seed, default=0,
                      help="RNG seed of the batch, an integer >= 0 (default 0)")
    demo.set_defaults(func=run_demo_command)
    env = sub.add_parser("env", help="which NKI API, package and LNC a launch would use here",
                         description=ENV_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    env.add_argument("--json", action="store_true", help="print the report as JSON")
    env.set_defaults(func=run_env_command)
    return ap


def run_env_command(args: argparse.Namespace) -> int:
    """Prints the report of ``nki_pa_cli.env`` (exit code 0: a report, whatever it finds)."""
    import json

    from host.environment import environment_report
    from nki_pa_cli.env import format_report

    report = environment_report()
    print(json.dumps(report, indent=2) if args.json else format_report(report, version()))
    return EXIT_PASS


def run_demo_command(args: argparse.Namespace) -> int:
    """Checks everything that can fail early (backend, matplotlib, --out), then runs the demo."""
    requested = os.environ.get("NKI_PA_BACKEND", "").strip().lower()
    if requested not in ("", "auto", "sim"):
        return _usage(f"the demo runs on the embedded simulator; NKI_PA_BACKEND={requested!r} "
                      "asks for another backend (unset it or set it to 'sim')")
    os.environ["NKI_PA_BACKEND"] = "sim"          # read when the kernels are first imported
    png = not args.no_png
    if png:
        from nki_pa_cli.plot import matplotlib_missing

        missing = matplotlib_missing(instead="pass --no-png to skip it")
        if missing:
            print(f"nki-pa demo: note: no PNG: {missing}", file=sys.stderr)
            png = False
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _usage(f"--out {str(args.out)!r} cannot be created: {e.strerror}")

    from nki_pa_cli import demo
    from nki_pa_cli.progress import Progress

    batch = demo.QUICK if args.quick else demo.FULL
    tolerance = demo.TOLERANCE if args.tolerance is None else args.tolerance
    kernels = demo.kernel_choices()
    t0 = time.perf_counter()
    steps = 2 + len(kernels) * len(demo.TARGETS)
    with Progress(steps, label="nki-pa demo", enabled=False if args.no_progress else None) as bar:
        results = demo.run_demo(batch, tolerance=tolerance, seed=args.seed, kernels=kernels,
                                step=lambda note: bar.advance(note=note))
        written = demo.write_outputs(args.out, batch, results, tolerance, png=png)
        bar.advance(note="outputs written")
    print(demo.format_report(batch, results, tolerance))
    print("wrote: " + ", ".join(str(p) for p in written))
    passed = all(r.passed for r in results)
    print(f"{'PASS' if passed else 'FAIL'} ({time.perf_counter() - t0:.1f} s on this CPU)")
    return EXIT_PASS if passed else EXIT_FAIL


def _usage(message: str) -> int:
    print(f"nki-pa demo: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
