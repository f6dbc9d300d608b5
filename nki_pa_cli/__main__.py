"""``python -m nki_pa_cli demo`` is the same as ``nki-pa demo``."""
from nki_pa_cli.cli import main

raise SystemExit(main())
