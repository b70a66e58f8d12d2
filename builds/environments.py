"""Execution environments for Python models: a Python model's requirements resolved, installed from wheels only and
packed the way Triton's Python backend loads an environment (`EXECUTION_ENV_PATH`).

How Triton uses it (Python backend README, "Creating Custom Execution Environments"; `stub_launcher.cc`): the
model's `parameters { key: "EXECUTION_ENV_PATH" }` names a `.tar.gz`, which the backend unpacks into a folder of
its own, puts its `bin` first on PATH and its `lib` on LD_LIBRARY_PATH (older releases `source` its
`bin/activate`), and starts the Python backend stub there. The stub embeds CPython, which finds its `sys.prefix`
by looking for `python3` on PATH: the environment's `bin/python3` with `pyvenv.cfg` beside `bin/` makes it a venv
of the server's own Python (`home` = the folder of that interpreter on the Triton host), so `site` adds the
environment's `lib/pythonX.Y/site-packages` and nothing of the host's. numpy must be in it (the stub imports it).

What Conch does with a requirements.txt (`parse_requirements`, `resolve`, `install`, `pack`):
- only requirement lines (a name, extras, a version specifier, a marker): no options, URLs or paths, so every
  package comes from the index the operator configured (`PIP_INDEX_URL` and friends, `EnvironmentTarget`);
- resolved by pip for the Triton's Python (`--python-version`, CPython ABI) and platform (manylinux up to the
  server's glibc) with `--only-binary=:all:`: wheels only, so no package's setup code runs at build time;
- pinned: the resolution (name, version, wheel sha256) is the environment's identity (`environment_key`) and is
  installed with `--require-hashes --no-deps`, exactly that and nothing more;
- in a child process whose environment holds nothing of Conch's (pip's own settings only), with a wall-clock
  limit; the code of the model is never imported here.

A requirement that cannot be met raises InvalidInput (field "requirements") naming the package and pip's reason.
Pure apart from running pip: no Django.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform as platform_module
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from conch.errors import InvalidInput, PayloadTooLarge, Unavailable

__all__ = [
    "ENVIRONMENT_FIELD",
    "EnvironmentTarget",
    "Pin",
    "environment_key",
    "install",
    "pack",
    "parse_requirements",
    "resolve",
]

#: The build field a requirements problem is reported under.
ENVIRONMENT_FIELD = "requirements"
#: Variables of Conch's environment pip may see: its own settings (index, proxy, certificates, cache) and what a
#: process needs (HOME for pip's cache, locale, temp folder). Nothing else (no database URL, no secret key).
_PIP_VARIABLES = re.compile(
    r"PIP_[A-Z_]+|(HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy|SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE"
)
_BASE_VARIABLES = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "PATH")
#: Lowest glibc minor a manylinux tag names (manylinux1 is glibc 2.5, PEP 600).
_OLDEST_GLIBC_MINOR = 5
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


@dataclass(frozen=True)
class EnvironmentTarget:
    """The Triton an environment is built for.

    Attributes:
        python_version: the Python of its Python backend stub, "3.11" (the stub embeds that CPython).
        python_home: the folder holding that interpreter (`python3.11`) on the Triton host: "/usr/bin" in NVIDIA's
            Triton containers; the venv's base interpreter's folder for the local Triton of the nvidia-pytriton wheel.
        glibc: the server's glibc as "2.35": wheels tagged manylinux for it or older are taken (PEP 600).
        machine: the CPU architecture of the servers as Python names it ("x86_64", "aarch64").
        constraints: requirement specifiers every environment must satisfy, as pip constraints ("numpy<2": the
            Python backend stub of Triton 2.51 is built for numpy 1; with numpy 2 in the environment the tensors it
            returns come back empty, seen here).
        find_links: folders or URLs pip also looks in for wheels (the operator's mirror), besides its index.
        timeout_s: wall-clock seconds pip may take for one resolution or installation.
    """

    python_version: str
    python_home: str
    glibc: str = "2.35"
    machine: str = platform_module.machine()
    constraints: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    timeout_s: float = 600.0

    @property
    def abi(self) -> str:
        """CPython's ABI tag for `python_version` ("cp311")."""
        return "cp" + self.python_version.replace(".", "")

    def platforms(self) -> list[str]:
        """The platform tags wheels may carry, newest first: manylinux_2_<glibc>_<machine> down to manylinux1."""
        major, minor = (int(part) for part in self.glibc.split(".")[:2])
        if major != 2:
            raise InvalidInput(f"glibc {self.glibc!r} is not a 2.x release", field="glibc")
        tags = []
        for glibc_minor in range(minor, _OLDEST_GLIBC_MINOR - 1, -1):
            tags.append(f"manylinux_2_{glibc_minor}_{self.machine}")
            if glibc_minor in _LEGACY_MANYLINUX:
                tags.append(f"{_LEGACY_MANYLINUX[glibc_minor]}_{self.machine}")
        return tags

    def describe(self) -> str:
        """ "CPython 3.11, manylinux (glibc 2.35) x86_64"."""
        return f"CPython {self.python_version}, manylinux (glibc {self.glibc}) {self.machine}"

    def to_dict(self) -> dict[str, Any]:
        """What makes two environments for the same pins different: interpreter, its home, platform, constraints."""
        return {
            "python_version": self.python_version,
            "python_home": self.python_home,
            "glibc": self.glibc,
            "machine": self.machine,
            "constraints": list(self.constraints),
        }


@dataclass(frozen=True)
class Pin:
    """One resolved package of an environment.

    Attributes:
        name: its normalized name ("opencv-python-headless").
        version: the version resolved ("4.10.0.84").
        sha256: the wheel's SHA-256, hex; "" where the index gave none.
        filename: the wheel's file name.
    """

    name: str
    version: str
    sha256: str
    filename: str

    def lock_line(self) -> str:
        """A pip requirement line that installs exactly this wheel ("name==1.0 --hash=sha256:…")."""
        return f"{self.name}=={self.version}" + (f" --hash=sha256:{self.sha256}" if self.sha256 else "")

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "filename": self.filename}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pin:
        return cls(
            name=str(data["name"]),
            version=str(data["version"]),
            sha256=str(data.get("sha256") or ""),
            filename=str(data.get("filename") or ""),
        )


def parse_requirements(text: str) -> tuple[str, ...]:
    """The requirement lines of a requirements.txt, each checked with `packaging.requirements.Requirement`; numpy
    is added when no line names it (Triton's Python backend stub imports numpy).

    Comments (`#`) and blank lines are skipped; a line continued with a trailing backslash is joined.
    Raises InvalidInput (field "requirements") naming the line for an option (-r, -e, --index-url...), a URL or path
    requirement, or a line that is not a requirement, saying what to write instead.
    """
    found: list[str] = []
    names: set[str] = set()
    for number, line in _logical_lines(text):
        if line.startswith("-"):
            raise InvalidInput(
                f"requirements.txt line {number}: {line.split()[0]!r} is a pip option, which Conch does not take: "
                "packages come from the index the platform is configured with, as wheels. Keep requirement lines "
                "only (name, extras, version specifier, environment marker), for example numpy==1.26.4.",
                field=ENVIRONMENT_FIELD,
            )
        try:
            requirement = Requirement(line)
        except InvalidRequirement as error:
            raise InvalidInput(
                f"requirements.txt line {number}: {line!r} is not a requirement ({error}). Write a package name with "
                "an optional version specifier, for example pyclipper==1.3.0.post6.",
                field=ENVIRONMENT_FIELD,
            ) from None
        if requirement.url:
            raise InvalidInput(
                f"requirements.txt line {number}: {requirement.name} is given as a URL or path ({requirement.url}). "
                "Conch installs packages from the package index only; name a released version instead.",
                field=ENVIRONMENT_FIELD,
            )
        found.append(str(requirement))
        names.add(canonicalize_name(requirement.name))
    if "numpy" not in names:
        found.append("numpy")
    return tuple(found)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            yield start, line
    if pending.strip():
        yield start, pending.strip()


def environment_key(pins: Sequence[Pin], target: EnvironmentTarget) -> str:
    """The environment's identity: SHA-256 (hex) of its pins (name, version, wheel hash) and its target. Two models
    whose requirements resolve to the same wheels for the same Triton share one environment."""
    data = {
        "target": target.to_dict(),
        "pins": sorted([p.name, p.version, p.sha256] for p in pins),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _pip_environment() -> dict[str, str]:
    env = {name: os.environ[name] for name in _BASE_VARIABLES if name in os.environ}
    env.update({name: value for name, value in os.environ.items() if _PIP_VARIABLES.fullmatch(name)})
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _pip_target_arguments(target: EnvironmentTarget) -> list[str]:
    arguments = [
        "--only-binary=:all:",
        "--python-version",
        target.python_version,
        "--implementation",
        "cp",
        "--abi",
        target.abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for tag in target.platforms():
        arguments += ["--platform", tag]
    for link in target.find_links:
        arguments += ["--find-links", link]
    return arguments


def _run_pip(arguments: Sequence[str], target: EnvironmentTarget, *, what: str) -> str:
    """Run `python -m pip <arguments>` in a child with pip's settings only; return its stderr+stdout text.
    Raises InvalidInput (field "requirements") with pip's reason, Unavailable when the index cannot be reached
    or pip ran past `target.timeout_s`."""
    command = [sys.executable, "-m", "pip", *arguments]
    try:
        done = subprocess.run(
            command,
            env=_pip_environment(),
            capture_output=True,
            text=True,
            timeout=target.timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(
            f"pip took longer than {target.timeout_s:.0f} s to {what}; the package index may be slow. The build "
            "retries."
        ) from None
    output = (done.stderr or "") + (done.stdout or "")
    if done.returncode != 0:
        raise _pip_failure(output, target, what=what)
    return output


#: What to do once requirements.txt is fixed: it is in the uploaded archive, which a rebuild reads again as it was.
_AGAIN = "upload the archive again with the changed requirements.txt (a rebuild reuses the uploaded one)"
_NO_VERSION = re.compile(
    r"Could not find a version that satisfies the requirement (\S+)(?: \(from versions: ([^)]*)\))?"
)
_NETWORK_SIGNS = (
    "NewConnectionError",
    "Connection refused",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Read timed out",
    "ConnectTimeoutError",
)


def _pip_failure(output: str, target: EnvironmentTarget, *, what: str) -> Exception:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    missing = _NO_VERSION.search(output)
    if missing is None and any(sign in output for sign in _NETWORK_SIGNS):
        return Unavailable(f"pip could not reach the package index to {what}: {lines[-1] if lines else ''}")
    if missing is not None:
        requirement, versions = missing.group(1), (missing.group(2) or "").strip()
        seen = (
            "the index has no wheel of it for this Python and platform: it may publish source distributions only, "
            "or not exist under that name"
            if versions in ("", "none")
            else f"the wheels the index has for this Python and platform are of versions {versions}, none matching"
        )
        return InvalidInput(
            f"requirements.txt: no wheel of {requirement} for {target.describe()} ({seen}). Conch installs wheels "
            "only, so that no package's setup code runs at build time: pin a version that publishes such a wheel, "
            f"or drop the requirement, then {_AGAIN}.",
            field=ENVIRONMENT_FIELD,
        )
    if "ResolutionImpossible" in output or "conflict is caused by" in output:
        cause = [line for line in lines if " depends on " in line or line.startswith("The user requested")]
        constrained = {canonicalize_name(Requirement(line).name) for line in target.constraints}
        named = {canonicalize_name(word) for word in re.findall(r"[A-Za-z0-9][A-Za-z0-9._-]*", " ".join(cause))}
        fixed = (
            f" The Triton these models run in requires {', '.join(target.constraints)} (its Python backend is built "
            "for them); those constraints cannot be lifted."
            if constrained & named
            else ""
        )
        return InvalidInput(
            "requirements.txt: the requirements contradict each other"
            + (f" ({'; '.join(cause[:6])})" if cause else "")
            + f". Loosen or change the pins so that one version of each package satisfies every line, then {_AGAIN}."
            + fixed,
            field=ENVIRONMENT_FIELD,
        )
    errors = [line for line in lines if line.startswith("ERROR:")] or lines[-3:]
    return InvalidInput(f"requirements.txt: pip could not {what}: {' '.join(errors)[:1500]}", field=ENVIRONMENT_FIELD)


def resolve(requirements: Sequence[str], target: EnvironmentTarget) -> tuple[Pin, ...]:
    """Resolve `requirements` (`parse_requirements`' answer) for `target` with pip (`--dry-run --report`), wheels
    only; return every package to install with its version and wheel hash, sorted by name.

    Raises InvalidInput (field "requirements") naming the package that has no suitable wheel or the conflict;
    Unavailable when the index cannot be reached (the build retries).
    """
    with tempfile.TemporaryDirectory(prefix="conch-resolve-") as work:
        listing = Path(work) / "requirements.txt"
        listing.write_text("\n".join(requirements) + "\n")
        constraints = Path(work) / "constraints.txt"
        constraints.write_text("".join(f"{line}\n" for line in target.constraints))
        report = Path(work) / "report.json"
        _run_pip(
            [
                "install",
                "--dry-run",
                "--ignore-installed",
                "--target",
                str(Path(work) / "target"),
                "--report",
                str(report),
                *_pip_target_arguments(target),
                "-c",
                str(constraints),
                "-r",
                str(listing),
            ],
            target,
            what="resolve the requirements",
        )
        data = json.loads(report.read_text())
    pins = []
    for item in data.get("install", []):
        metadata = item.get("metadata") or {}
        download = item.get("download_info") or {}
        url = str(download.get("url") or "")
        hashes = (download.get("archive_info") or {}).get("hashes") or {}
        sha256 = str(hashes.get("sha256") or "")
        if not sha256 and url.startswith("file://"):
            sha256 = _file_sha256(Path(unquote(urlparse(url).path)))
        pins.append(
            Pin(
                name=canonicalize_name(str(metadata.get("name"))),
                version=str(metadata.get("version")),
                sha256=sha256,
                filename=unquote(url.rsplit("/", 1)[-1].split("#", 1)[0]),
            )
        )
    return tuple(sorted(pins, key=lambda pin: pin.name))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def install(pins: Sequence[Pin], target: EnvironmentTarget, folder: Path, *, max_bytes: int) -> int:
    """Install exactly `pins` (`--no-deps`, `--require-hashes` where every pin has a hash) into `folder` as an
    environment Triton's Python backend loads: `lib/pythonX.Y/site-packages`, `bin/python3` and
    `bin/pythonX.Y` (links to the server's interpreter in `target.python_home`), `bin/activate`, `pyvenv.cfg`.
    Returns the installed size in bytes.

    Raises InvalidInput (field "requirements") with pip's reason; PayloadTooLarge (field "requirements") when the
    installed packages pass `max_bytes`; Unavailable as `resolve` does.
    """
    site = folder / "lib" / f"python{target.python_version}" / "site-packages"
    site.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="conch-install-") as work:
        lock = Path(work) / "lock.txt"
        lock.write_text("\n".join(pin.lock_line() for pin in pins) + "\n")
        hashed = all(pin.sha256 for pin in pins)
        _run_pip(
            [
                "install",
                "--quiet",
                "--no-deps",
                "--no-compile",
                *(["--require-hashes"] if hashed else []),
                "--target",
                str(site),
                *_pip_target_arguments(target),
                "-r",
                str(lock),
            ],
            target,
            what="install the resolved packages",
        )
    # Console scripts pip wrote for the worker's interpreter: meaningless on the server.
    shutil.rmtree(site / "bin", ignore_errors=True)
    size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())
    if size > max_bytes:
        raise PayloadTooLarge(
            f"requirements.txt: the installed packages take {size} bytes, more than the {max_bytes} bytes an "
            "environment may (CONCH_ENVIRONMENT_MAX_BYTES). Drop what the model does not import, or use smaller "
            f"variants (opencv-python-headless instead of opencv-python), then {_AGAIN}.",
            field=ENVIRONMENT_FIELD,
        )
    _write_venv_layout(folder, target)
    return size


def _write_venv_layout(folder: Path, target: EnvironmentTarget) -> None:
    bin_folder = folder / "bin"
    bin_folder.mkdir(exist_ok=True)
    interpreter = f"{target.python_home.rstrip('/')}/python{target.python_version}"
    for name in ("python3", f"python{target.python_version}"):
        (bin_folder / name).symlink_to(interpreter)
    (folder / "pyvenv.cfg").write_text(
        f"home = {target.python_home}\ninclude-system-site-packages = false\nversion = {target.python_version}\n"
    )
    # Sourced by Triton releases that start the stub through bash (`source bin/activate`); later ones set the same
    # variables themselves. The folder is wherever the backend unpacked the archive.
    (bin_folder / "activate").write_text(
        "# Written by Conch: the environment of a Python model, for Triton's Python backend.\n"
        'VIRTUAL_ENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        "export VIRTUAL_ENV\n"
        'export PATH="$VIRTUAL_ENV/bin:$PATH"\n'
        "unset PYTHONHOME\n"
    )


def pack(folder: Path, archive: Path) -> int:
    """Pack the environment `folder` into the gzip'd tar `archive` Triton unpacks (`EXECUTION_ENV_PATH`): members
    relative to the folder, sorted, owned by root, with a fixed modification time, so the same environment packs
    to the same bytes. Returns the archive's size in bytes."""

    def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with (
        archive.open("wb") as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=6) as packed,
        tarfile.open(fileobj=packed, mode="w") as bundle,
    ):
        for path in sorted(folder.rglob("*")):
            bundle.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False, filter=normalized)
    return archive.stat().st_size
