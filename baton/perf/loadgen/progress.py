"""A one-line progress display on stderr (redrawn in place on a terminal, a line every few seconds
otherwise, so logs of CI runs stay readable)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Progress:
    total_s: float
    label: str = "serve"
    enabled: bool = True
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    sent: int = 0
    done: int = 0
    failed: int = 0
    _last_draw: float = 0.0

    @property
    def tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, t: float, in_flight: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < (0.25 if self.tty else 5.0):
            return
        self._last_draw = now
        frac = min(1.0, t / self.total_s) if self.total_s > 0 else 1.0
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        line = (
            f"[{self.label}] [{bar}] {t:6.1f}/{self.total_s:.0f}s  sent {self.sent}  done {self.done}  "
            f"in-flight {in_flight}  failed {self.failed}"
        )
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self, t: float, in_flight: int) -> None:
        if not self.enabled:
            return
        self.update(t, in_flight, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
