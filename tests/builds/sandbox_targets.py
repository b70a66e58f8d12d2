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


def connect(path: Path) -> str:
    """Try to reach a TCP port of this host (the file holds it), as code from a hostile pickle would; say how it
    went, and whether `cut_network` lets code run."""
    import socket

    from builds.sandbox import cut_network

    cut_network()
    port = int(path.read_text())
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as error:
        return f"refused: {type(error).__name__}"
    return "connected"
