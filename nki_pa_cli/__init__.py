"""The ``nki-pa`` command line (``python -m nki_pa_cli``): an application on top of ``host``.

    nki-pa demo [--quick] [--out DIR] [--no-png] [--no-progress] [--tolerance X] [--seed N]
    nki-pa env [--json]
    nki-pa --version

Modules: ``cli`` (argument parsing, exit codes), ``demo`` (the demo batch, its run on the
embedded simulator and the report), ``env`` (what a launch would run on here), ``plot`` (the per-engine PNG, matplotlib), ``progress``
(a dependency-free progress bar, also used by ``scripts/``). Library code stays in ``host``,
``nki_kernels`` and ``nki_sim``; only this package prints.
"""

__version__ = "0.1.0"   # = pyproject.toml [project] version (tests/test_cli_demo.py checks)
