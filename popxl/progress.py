"""The compile progress bar: a Session whose construction takes longer than a second shows one on
stderr (PopXL shows Poplar's while compiling); quick compiles print nothing."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

DELAY_SECONDS = 1.0  # silent until the work has taken this long
WIDTH = 30


class Progress:
    """``total`` steps of named work; ``step(label)`` after each. The bar is redrawn in place."""

    def __init__(self, title: str, total: int, stream: Optional[TextIO] = None) -> None:
        self.title, self.total, self.done = title, max(total, 1), 0
        self.stream = stream
        self.start = time.perf_counter()
        self.shown = False

    def step(self, label: str) -> None:
        self.done = min(self.done + 1, self.total)
        if self.shown or time.perf_counter() - self.start >= DELAY_SECONDS:
            self._draw(label)

    def _draw(self, label: str) -> None:
        stream = self.stream or sys.stderr
        filled = WIDTH * self.done // self.total
        stream.write(f"\r{self.title} [{'#' * filled}{'.' * (WIDTH - filled)}] {100 * self.done // self.total:3d}% "
                     f"{time.perf_counter() - self.start:5.1f}s {label[:40]:<40}")
        stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.done = self.total
            self._draw("done")
            (self.stream or sys.stderr).write("\n")
