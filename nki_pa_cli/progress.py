"""A tiny dependency-free progress bar for the demo and long benchmark sweeps (writes to stderr).

    with Progress(total=12, label="bench") as bar:
        for item in items:
            ...
            bar.advance(note=str(item))

Disabled automatically when the stream is not a terminal (unless enabled=True), so logs and
piped output stay clean.
"""
from __future__ import annotations

import sys
import time


class Progress:
    """Single-line text progress bar: ``label [#####-----] 5/10 12.3s note``."""

    def __init__(self, total: int, label: str = "", width: int = 30, stream=None,
                 enabled: bool | None = None):
        if total < 0:
            raise ValueError(f"total must be >= 0; got {total}")
        self.total, self.label, self.width = total, label, width
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = isatty() if enabled is None else enabled
        self.done = 0
        self._t0 = time.monotonic()

    def render(self, note: str = "") -> str:
        """The bar as a string (no carriage return)."""
        frac = 1.0 if self.total == 0 else min(1.0, self.done / self.total)
        filled = int(round(frac * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self._t0
        text = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s"
        return f"{text} {note}" if note else text

    def advance(self, n: int = 1, note: str = "") -> None:
        """Count n more items done and redraw."""
        self.done += n
        if self.enabled:
            self.stream.write("\r" + self.render(note)[:150].ljust(150))
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        if self.enabled:
            self.stream.write(self.render())
            self.stream.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
