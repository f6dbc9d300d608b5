"""A tiny dependency-free progress bar for the demo and long benchmark sweeps (writes to stderr).

    with Progress(total=12, label="bench") as bar:
        for item in items:
            ...
            bar.advance(note=str(item))

Disabled automatically when the stream is not a terminal (unless enabled=True), so logs and
piped output stay clean. Each redraw fits the terminal width (one column spare, so the cursor
never wraps) and blanks only what the previous, longer line left behind.
"""
from __future__ import annotations

import shutil
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
        self._shown = 0            # length of the line on screen

    def render(self, note: str = "") -> str:
        """The bar as a string (no carriage return)."""
        frac = 1.0 if self.total == 0 else min(1.0, self.done / self.total)
        filled = int(round(frac * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self._t0
        text = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s"
        return f"{text} {note}" if note else text

    @staticmethod
    def columns() -> int:
        """Usable line width: the terminal's columns minus one (80 when unknown)."""
        return max(20, shutil.get_terminal_size((80, 24)).columns - 1)

    def _draw(self, note: str = "") -> None:
        line = self.render(note)[:self.columns()]
        self.stream.write("\r" + line.ljust(self._shown))
        self._shown = len(line)
        self.stream.flush()

    def advance(self, n: int = 1, note: str = "") -> None:
        """Count n more items done and redraw."""
        self.done += n
        if self.enabled:
            self._draw(note)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._draw()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
