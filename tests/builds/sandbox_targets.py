"""Targets for `builds.sandbox.run_in_sandbox` tests: each misbehaves the way a hostile model file can make a parser
misbehave. Imported by the sandbox's child process, never run in the test process itself."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path


def file_size(path: Path) -> int:
    """Behave: return the file's size."""
    return path.stat().st_size


def segfault(path: Path) -> None:
    """Read address 0, as a parser following a corrupt offset would: SIGSEGV."""
    ctypes.string_at(0)


def spin(path: Path) -> None:
    """Burn CPU forever, as a parser stuck in a loop on crafted input would."""
    while True:
        pass


def block(path: Path) -> None:
    """Wait forever without using CPU, as a parser waiting on a lock would."""
    time.sleep(3600)


def allocate(path: Path) -> None:
    """Ask for 64 GiB, as a parser trusting a crafted length field would."""
    bytearray(64 * 1024**3)


def fail(path: Path) -> None:
    """Raise an error that says nothing about the file (a bug)."""
    raise KeyError("a bug in Conch")


def environment_names(path: Path) -> list[str]:
    """Return the names of the child's environment variables."""
    return sorted(os.environ)
