"""Unpacking an uploaded archive (zip or tar, the tar plain or compressed with gzip, bzip2 or xz) in the sandbox.

An archive is untrusted input like a model file, and a classic carrier of attacks on whoever unpacks it: members
that write outside the target folder (an absolute name, `..`), links that point elsewhere, device files, and bombs
(a small archive that unpacks to far more than the disk holds). So it is unpacked in the build's sandbox child
(`builds.sandbox`) and every member is checked before a byte of it is written:

- its name must be relative and stay inside the target: no absolute name (`/x`, `C:\\x`), no `..`, no NUL;
- it must be a regular file or a folder: symbolic and hard links, devices, FIFOs are refused;
- a name may appear once (an archive holding one name twice unpacks differently with different tools);
- a zip member may not be encrypted;
- caps (`ArchiveLimits`): the number of members, the bytes unpacked in all, and the compression ratio (bytes
  unpacked per byte of the archive, counted over the whole archive and, in a zip, per member).

The sizes that headers claim are checked first and the bytes actually written are counted too, so a header that
lies does not get past the caps. A refusal is `InvalidInput` (field "file") that names the member and what to do.
Files are written with the child's default permissions (never the archive's modes: no setuid bit survives), and
macOS's resource forks (`__MACOSX/`, `._*`, `.DS_Store`) are skipped.
"""

from __future__ import annotations

import json
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.conf import settings

from builds.formats.archive import archive_kind
from builds.sandbox import SandboxLimits, run_in_sandbox
from conch.errors import InvalidInput

__all__ = ["ArchiveLimits", "UnpackedArchive", "unpack_archive", "unpack_archive_in_sandbox"]

_CHUNK_BYTES = 1024 * 1024
#: Below this many unpacked bytes the compression ratio is not checked: a tiny archive of text compresses well.
_RATIO_FLOOR_BYTES = 1024 * 1024
#: Member names that macOS's archiver adds beside the real files; never unpacked.
_JUNK_PARTS = ("__MACOSX",)
_JUNK_NAMES = (".DS_Store",)


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps on one archive's unpacking.

    `max_unpacked_bytes`: bytes of all members together once unpacked. `max_members`: files and folders the
    archive may list. `max_ratio`: unpacked bytes per byte of the archive (over the archive, and per zip member),
    checked once more than 1 MiB is unpacked.
    """

    max_unpacked_bytes: int
    max_members: int
    max_ratio: float

    @classmethod
    def from_settings(cls) -> ArchiveLimits:
        """Caps from CONCH_ARCHIVE_MAX_UNPACKED_BYTES, CONCH_ARCHIVE_MAX_MEMBERS and CONCH_ARCHIVE_MAX_RATIO."""
        return cls(
            max_unpacked_bytes=int(settings.CONCH_ARCHIVE_MAX_UNPACKED_BYTES),
            max_members=int(settings.CONCH_ARCHIVE_MAX_MEMBERS),
            max_ratio=float(settings.CONCH_ARCHIVE_MAX_RATIO),
        )


@dataclass(frozen=True)
class UnpackedArchive:
    """What `unpack_archive_in_sandbox` unpacked: `kind` ("zip", "tar", "tar.gz", "tar.bz2", "tar.xz"), `files`
    (the regular files' names, relative, "/"-separated, in archive order), `unpacked_bytes` (their bytes in all)
    and `skipped` (junk members left out, such as `__MACOSX/…`)."""

    kind: str
    files: tuple[str, ...]
    unpacked_bytes: int
    skipped: tuple[str, ...] = ()


def unpack_archive_in_sandbox(
    archive: Path,
    target: Path,
    *,
    limits: ArchiveLimits | None = None,
    sandbox_limits: SandboxLimits | None = None,
) -> UnpackedArchive:
    """Unpack the archive file `archive` into the empty or missing folder `target`, in the sandbox child.

    `limits` default to `ArchiveLimits.from_settings()`, `sandbox_limits` (CPU, memory, wall time of the child) to
    `SandboxLimits.from_settings()`. Raises InvalidInput (field "file") naming the member for every refusal the
    module docstring lists, for a damaged or unreadable archive, and for the sandbox's own limits.
    """
    limits = limits or ArchiveLimits.from_settings()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="conch-unpack-") as work:
        job = Path(work) / "job.json"
        job.write_text(
            json.dumps(
                {
                    "archive": str(Path(archive).resolve()),
                    "target": str(target.resolve()),
                    "max_unpacked_bytes": limits.max_unpacked_bytes,
                    "max_members": limits.max_members,
                    "max_ratio": limits.max_ratio,
                }
            ),
            encoding="utf-8",
        )
        value = run_in_sandbox(f"{__name__}:_unpack_job", job, limits=sandbox_limits or SandboxLimits.from_settings())
    return UnpackedArchive(
        kind=str(value["kind"]),
        files=tuple(value["files"]),
        unpacked_bytes=int(value["unpacked_bytes"]),
        skipped=tuple(value["skipped"]),
    )


# --- the sandbox child -------------------------------------------------------------------------------------------


def _unpack_job(job_path: Path) -> dict[str, Any]:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    limits = ArchiveLimits(
        max_unpacked_bytes=int(job["max_unpacked_bytes"]),
        max_members=int(job["max_members"]),
        max_ratio=float(job["max_ratio"]),
    )
    unpacked = unpack_archive(Path(job["archive"]), Path(job["target"]), limits)
    return {
        "kind": unpacked.kind,
        "files": list(unpacked.files),
        "unpacked_bytes": unpacked.unpacked_bytes,
        "skipped": list(unpacked.skipped),
    }


def unpack_archive(archive: Path, target: Path, limits: ArchiveLimits) -> UnpackedArchive:
    """Sandbox child only (the archive's own bytes drive zipfile/tarfile here): unpack `archive` into `target`.

    Raises InvalidInput (field "file") as `unpack_archive_in_sandbox` documents.
    """
    with archive.open("rb") as handle:
        kind = archive_kind(handle.read(512))
    if not kind:
        raise InvalidInput(
            "This file is not a zip or tar archive. Pack the model's folder with `zip -r model.zip <folder>` or "
            "`tar czf model.tar.gz <folder>`, or upload the model file itself.",
            field="file",
        )
    writer = _Writer(target, limits, archive_bytes=max(archive.stat().st_size, 1))
    if kind == "zip":
        _unpack_zip(archive, writer)
    else:
        _unpack_tar(archive, kind, writer)
    if not writer.files:
        raise InvalidInput(
            f"The {kind} archive holds no files"
            + (f" (only {', '.join(writer.skipped[:3])})" if writer.skipped else "")
            + ". Pack the model's files into it and upload it again.",
            field="file",
        )
    return UnpackedArchive(
        kind=kind, files=tuple(writer.files), unpacked_bytes=writer.total, skipped=tuple(writer.skipped)
    )


class _Writer:
    """Checks member names and counts bytes against the caps while writing the members under `target`."""

    def __init__(self, target: Path, limits: ArchiveLimits, *, archive_bytes: int) -> None:
        self.target = target.resolve()
        self.limits = limits
        self.archive_bytes = archive_bytes
        self.members = 0
        self.total = 0
        self.files: list[str] = []
        self.skipped: list[str] = []
        self._seen: set[str] = set()

    def relative_name(self, raw: str) -> str | None:
        """The member's checked relative name ("a/b.onnx"), or None for a junk member or the archive's root."""
        self.members += 1
        if self.members > self.limits.max_members:
            raise _refusal(
                raw,
                f"the archive lists more than {self.limits.max_members:,} members (CONCH_ARCHIVE_MAX_MEMBERS). "
                "Pack only the model's files",
            )
        if "\x00" in raw:
            raise _refusal(raw, "its name holds a NUL character. Pack the files again with a standard tool")
        name = raw.replace("\\", "/")
        if name.startswith("/") or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
            raise _refusal(
                raw,
                "its name is an absolute path, which would be written outside the model's folder. Pack the "
                "files with names relative to the folder (run `zip -r` or `tar czf` inside it)",
            )
        parts = [part for part in PurePosixPath(name).parts if part not in ("", ".")]
        if ".." in parts:
            raise _refusal(
                raw,
                "its name climbs out of the archive with `..`, which would be written outside the model's "
                "folder. Pack the files with names inside the folder",
            )
        if not parts:
            return None
        relative = "/".join(parts)
        if any(part in _JUNK_PARTS for part in parts) or parts[-1] in _JUNK_NAMES or parts[-1].startswith("._"):
            self.skipped.append(relative)
            return None
        if relative in self._seen:
            raise _refusal(raw, "the archive holds this name twice. Pack each file once")
        self._seen.add(relative)
        return relative

    def claim(self, name: str, size: int, *, compressed: int | None = None) -> None:
        """Check a file member's claimed size (and, for a zip member, its compressed size) before writing it."""
        if self.total + size > self.limits.max_unpacked_bytes:
            raise _refusal(name, self._too_big_text())
        if compressed is not None and size > _RATIO_FLOOR_BYTES and size > self.limits.max_ratio * max(compressed, 1):
            raise _refusal(name, self._ratio_text(size / max(compressed, 1)))

    def folder(self, name: str) -> None:
        self._path(name).mkdir(parents=True, exist_ok=True)

    def write(self, name: str, source: IO[bytes]) -> None:
        """Copy `source` into the member's file, counting bytes against the unpacked-size and ratio caps."""
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("xb") as out:
            while chunk := source.read(_CHUNK_BYTES):
                self.total += len(chunk)
                if self.total > self.limits.max_unpacked_bytes:
                    raise _refusal(name, self._too_big_text())
                ratio = self.total / self.archive_bytes
                if self.total > _RATIO_FLOOR_BYTES and ratio > self.limits.max_ratio:
                    raise _refusal(name, self._ratio_text(ratio))
                out.write(chunk)
        self.files.append(name)

    def _path(self, name: str) -> Path:
        path = (self.target / name).resolve()
        if path != self.target and self.target not in path.parents:
            raise _refusal(name, "it would be written outside the model's folder")
        return path

    def _too_big_text(self) -> str:
        return (
            f"the archive unpacks to more than {self.limits.max_unpacked_bytes:,} bytes "
            "(CONCH_ARCHIVE_MAX_UNPACKED_BYTES). Pack only the model's files, or ask the operator to raise the cap"
        )

    def _ratio_text(self, ratio: float) -> str:
        return (
            f"it unpacks to {ratio:,.0f} times its compressed size, more than the {self.limits.max_ratio:g} accepted "
            "(CONCH_ARCHIVE_MAX_RATIO; such archives are how zip bombs work). Pack the files without compression "
            "(`zip -0 -r` or plain `tar cf`)"
        )


def _refusal(member: str, reason: str) -> InvalidInput:
    return InvalidInput(f"Archive member {member!r} is refused: {reason}.", field="file")


def _unpack_zip(archive: Path, writer: _Writer) -> None:
    try:
        bundle = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise _damaged("zip", error) from None
    with bundle:
        for info in bundle.infolist():
            name = writer.relative_name(info.filename)
            if name is None:
                continue
            file_type = stat.S_IFMT(info.external_attr >> 16)
            if file_type == stat.S_IFLNK:
                raise _refusal(info.filename, _LINK_TEXT)
            if file_type not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise _refusal(info.filename, _SPECIAL_TEXT)
            if info.flag_bits & 0x1:
                raise _refusal(info.filename, "it is encrypted. Pack the files without a password")
            if info.is_dir() or file_type == stat.S_IFDIR:
                writer.folder(name)
                continue
            writer.claim(name, info.file_size, compressed=info.compress_size)
            try:
                with bundle.open(info) as member:
                    writer.write(name, member)
            except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError) as error:
                raise _refusal(info.filename, f"it cannot be read ({error}). Pack the files again") from None


def _unpack_tar(archive: Path, kind: str, writer: _Writer) -> None:
    try:
        bundle = tarfile.open(archive, mode="r:*")
    except (tarfile.TarError, OSError, EOFError) as error:
        raise _damaged(kind, error) from None
    with bundle:
        for member in _tar_members(bundle, kind):
            name = writer.relative_name(member.name)
            if name is None:
                continue
            if member.issym() or member.islnk():
                raise _refusal(member.name, _LINK_TEXT)
            if member.isdir():
                writer.folder(name)
                continue
            if not member.isreg():
                raise _refusal(member.name, _SPECIAL_TEXT)
            writer.claim(name, member.size)
            with _tar_reading(member.name):
                source = bundle.extractfile(member)
                if source is None:  # pragma: no cover - a regular member always has a file object
                    raise _refusal(member.name, "it cannot be read. Pack the files again")
                with source:
                    writer.write(name, source)


def _tar_members(bundle: tarfile.TarFile, kind: str) -> Iterator[tarfile.TarInfo]:
    """The tar's members, read one at a time (`next`), so a huge member list is capped before it is all read."""
    while True:
        try:
            member = bundle.next()
        except (tarfile.TarError, OSError, EOFError) as error:
            raise _damaged(kind, error) from None
        if member is None:
            return
        yield member


@contextmanager
def _tar_reading(name: str) -> Iterator[None]:
    try:
        yield
    except (tarfile.TarError, EOFError, OSError) as error:
        if isinstance(error, FileExistsError):
            raise _refusal(name, "the archive holds this name twice. Pack each file once") from None
        raise _refusal(name, f"it cannot be read ({error}); the archive may be cut off. Pack the files again") from None


def _damaged(kind: str, error: BaseException) -> InvalidInput:
    return InvalidInput(
        f"This {kind} archive cannot be read ({error}); it may be cut off or damaged. Pack the model's folder again "
        "(`zip -r model.zip <folder>` or `tar czf model.tar.gz <folder>`) and upload it.",
        field="file",
    )


_LINK_TEXT = (
    "it is a link, and links in an uploaded archive could point anywhere on the machine. Pack the files themselves "
    "(a plain `zip -r` follows links; `tar` does with `--dereference`)"
)
_SPECIAL_TEXT = "it is a device file or a FIFO, not a regular file. Pack only the model's files"
