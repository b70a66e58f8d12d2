"""What the CLI prints: results on stdout (a table or lines, or one JSON document with `--json`), progress and
notes on stderr, so `conch … --json | jq` always reads clean JSON.

Progress is a rich bar (bytes, speed, time left) on a terminal; in a CI log (stderr not a terminal) it is one
plain line every few seconds and one at the end.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from functools import cache
from typing import TYPE_CHECKING, Any

from conch_cli.transfer import Progress

if TYPE_CHECKING:
    from rich.console import Console

# rich is imported by what draws with it (a table, the bar on a terminal), not at start: a pipeline's `--json` or
# `--quiet` command never loads it, which saves about 35 ms of every run.


@cache
def _console(err: bool) -> Console:
    """The rich console of stderr (`err`) or stdout, made on first use."""
    from rich.console import Console

    return Console(stderr=err, soft_wrap=True, highlight=False)


def emit_json(data: Any) -> None:
    """Print `data` as one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    """A line for the person or the log (stderr): never part of the result. Written as it is (no markup)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def line(text: str) -> None:
    """A line of the result (stdout), written as it is."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def table(columns: list[str], rows: list[list[Any]]) -> None:
    """Print rows under column titles on stdout."""
    from rich.table import Table

    grid = Table(*columns, box=None, pad_edge=False, header_style="bold")
    for row in rows:
        grid.add_row(*("" if value is None else str(value) for value in row))
    _console(False).print(grid)


def mib(count: float) -> str:
    """`count` bytes as MiB with one decimal."""
    return f"{count / 2**20:.1f} MiB"


class BarProgress(Progress):
    """A rich progress bar on stderr: bytes done of total, speed, time left."""

    def __init__(self) -> None:
        self._bar = None
        self._task = None

    def start(self, label: str, total: int, done: int = 0) -> None:
        from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
        from rich.progress import Progress as RichProgressBar

        self._bar = RichProgressBar(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=_console(True),
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=total, completed=done)

    def advance(self, count: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, count)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class LineProgress(Progress):
    """Progress for logs: `label: 412.0 MiB of 1024.0 MiB (40%), 96.3 MiB/s, 6 s left` every `interval_s`."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self.label, self.total, self.done = "", 0, 0

    def start(self, label: str, total: int, done: int = 0) -> None:
        with self._lock:
            self.label, self.total, self.done, self._first = label, total, done, done
            self._started = self._last = time.monotonic()

    def advance(self, count: int) -> None:
        with self._lock:
            self.done += count
            now = time.monotonic()
            if now - self._last >= self.interval_s:
                self._last = now
                self._print(now)

    def finish(self) -> None:
        with self._lock:
            if self.total:
                self._print(time.monotonic())

    def _print(self, now: float) -> None:
        elapsed = max(now - self._started, 1e-6)
        speed = (self.done - self._first) / elapsed
        left = f", {(self.total - self.done) / speed:.0f} s left" if speed > 0 and self.done < self.total else ""
        share = 100 * self.done / self.total if self.total else 100
        note(f"{self.label}: {mib(self.done)} of {mib(self.total)} ({share:.0f}%), {mib(speed)}/s{left}")


def progress_for_terminal(quiet: bool) -> Progress:
    """The progress reporter that suits stderr: none when quiet, a bar on a terminal, lines otherwise."""
    if quiet:
        return Progress()
    return BarProgress() if _console(True).is_terminal else LineProgress()
