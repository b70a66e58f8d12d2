"""Fixtures of the build tests shared by several modules: real shared libraries that are no Triton backend."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

#: The markupsafe release constraints.txt pins: its wheels carry a small compiled extension for each platform.
MARKUPSAFE = "MarkupSafe==3.0.4"


@pytest.fixture(scope="session")
def x86_extension() -> Path:
    """markupsafe's compiled extension in the venv: a real x86_64 shared library that is no Triton backend."""
    spec = importlib.util.find_spec("markupsafe._speedups")
    assert spec is not None and spec.origin is not None, "markupsafe (a Django dependency) is not installed"
    return Path(spec.origin)


@pytest.fixture(scope="session")
def aarch64_extension(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """markupsafe's compiled extension from its manylinux aarch64 wheel on PyPI (about 24 kB)."""
    folder = tmp_path_factory.mktemp("aarch64-wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--no-deps",
            "--platform",
            "manylinux2014_aarch64",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--abi",
            "cp311",
            "-d",
            str(folder),
            MARKUPSAFE,
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = folder.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [name for name in archive.namelist() if name.endswith(".so")]
        target = folder / Path(member).name
        target.write_bytes(archive.read(member))
    return target
