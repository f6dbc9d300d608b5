"""Scripts import the progress bar from here; it lives in ``nki_pa_cli.progress``."""
from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from nki_pa_cli.progress import Progress  # noqa: E402

__all__ = ["Progress"]
