"""Object-store adapter: where uploaded model files and built Triton model repositories live.

Talks to one of two systems, chosen by `settings.CONCH_STORAGE_URL`:

- `file:///abs/path` — a local folder (the embedded default; Triton reads it as a local path);
- `s3://bucket/optional/prefix` — an S3-compatible bucket (AWS S3, MinIO) through boto3; Triton reads
  the repository itself over S3.

Keys are `/`-separated paths relative to the store's root (the folder, or the bucket plus prefix),
e.g. `models/7/versions/1/source/model.onnx`. Only this module imports boto3/botocore: callers get
`StoredObject` values and the typed errors of `conch.errors` (`NotFound` for a missing key,
`Unavailable` when the store cannot be reached or refuses us, `InvalidInput` for a malformed key).
"""

from __future__ import annotations

import abc
import base64
import binascii
import contextlib
import hashlib
import io
import logging
import os
import re
import shutil
import tempfile
import threading
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Self
from urllib.parse import unquote, urlsplit

import boto3
import s3transfer.exceptions
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from conch.errors import ConchError, Conflict, InvalidInput, NotFound, PayloadTooLarge, Unavailable

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DEFAULT_PART_SIZE_BYTES = 8 * MIB
# S3 rejects multipart parts under 5 MiB (except the last) and uploads of more than 10,000 parts.
MIN_PART_SIZE_BYTES = 5 * MIB
MAX_PARTS = 10_000
# Parts uploading at once. A writer buffers at most this many parts plus the one it is filling,
# so its memory stays under (DEFAULT_MAX_CONCURRENCY + 1) * part size (32 MiB by default).
DEFAULT_MAX_CONCURRENCY = 3
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 60.0
# Total attempts per request (first try included), botocore "standard" retry mode.
DEFAULT_MAX_ATTEMPTS = 4
# Region sent to S3-compatible servers (MinIO, moto) when none is configured; they accept any.
FALLBACK_REGION = "us-east-1"

# In-progress files of FileObjectStore writers start with this; they are never listed as keys.
_TEMP_MARKER = ".conch-tmp-"
# Characters of the target file name kept in a temp file's name (the rest of a 255-byte name is mkstemp's).
_TEMP_NAME_CHARS = 100
_MAX_KEY_BYTES = 1024
# Resumable uploads of a FileObjectStore: `<root>/.conch-tmp-uploads/<upload id>/<number>-<sha256 hex>`.
_STAGING_FOLDER = f"{_TEMP_MARKER}uploads"
_FOLDER_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
_PART_FILE_RE = re.compile(r"(?P<number>[0-9]{5})-(?P<etag>[0-9a-f]{64})")
# S3's largest part (S3 API reference, "UploadPart"): 5 GiB.
MAX_PART_SIZE_BYTES = 5 * 1024 * MIB
_COPY_BUFFER_BYTES = 1 * MIB
#: The per-part checksum algorithm a multipart upload may declare, and the header a part's CRC32 travels in
#: (S3 API reference, "Checking object integrity": base64 of the 4 big-endian bytes of the CRC32 of the part).
CRC32 = "CRC32"
CHECKSUM_CRC32_HEADER = "x-amz-checksum-crc32"

# What Triton's S3 filesystem accepts (triton-inference-server/core, src/filesystem/
# implementations/s3.h, `s3_regex_`): host and port, a bucket name, then path segments.
_TRITON_HOST_RE = re.compile(r"[0-9a-zA-Z\-.]+")
_TRITON_BUCKET_RE = re.compile(r"[0-9a-z.\-]+")
_TRITON_SEGMENT_RE = re.compile(r"[0-9a-zA-Z.\-_]+")

_S3_ERRORS: tuple[type[BaseException], ...] = (
    ClientError,
    BotoCoreError,
    Boto3Error,
    s3transfer.exceptions.RetriesExceededError,
    s3transfer.exceptions.S3UploadFailedError,
    s3transfer.exceptions.S3DownloadFailedError,
    s3transfer.exceptions.S3CopyFailedError,
)
_S3_MISSING_KEY_CODES = {"NoSuchKey", "404", "NotFound"}
_S3_CREDENTIAL_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "ExpiredToken"}


class ObjectStoreConfigError(ConchError):
    """The object-store settings (CONCH_STORAGE_URL, CONCH_S3_*) are malformed or contradictory (HTTP 500)."""


@dataclass(frozen=True)
class StoredObject:
    """An object as written to the store.

    `key` is the store-relative key, `size_bytes` the exact length of the content in bytes and
    `sha256_hex` the SHA-256 of the content as 64 lowercase hex digits.
    """

    key: str
    size_bytes: int
    sha256_hex: str


@dataclass(frozen=True)
class StoredPart:
    """One part of an unfinished multipart upload as the store holds it: its `number` (1-based), `size_bytes`
    and `etag` (S3's ETag, quotes included; a folder store's own tag). `checksum_crc32` is the part's CRC32 as the
    store reports it (base64 of 4 big-endian bytes) for an upload started with CRC32, else ""."""

    number: int
    size_bytes: int
    etag: str
    checksum_crc32: str = ""


def crc32_base64(crc: int) -> str:
    """The `x-amz-checksum-crc32` form of a CRC32 (`zlib.crc32` of the bytes, 0 to 2**32 - 1): base64 of its 4
    big-endian bytes, 8 characters (e.g. `zlib.crc32(b"abc")` 0x352441C2 -> "NSRBwg==")."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def is_crc32_base64(value: object) -> bool:
    """Whether `value` is a CRC32 in the `x-amz-checksum-crc32` form (base64 of exactly 4 bytes)."""
    if not isinstance(value, str) or len(value) != 8:
        return False
    try:
        return len(base64.b64decode(value, validate=True)) == 4
    except (binascii.Error, ValueError):
        return False


@dataclass(frozen=True)
class PartTarget:
    """Where a client sends the bytes of one part itself: an HTTP `method` on `url` with `headers`, valid until
    `expires_in_s` seconds from when it was made. Only stores whose parts bypass Conch give one (S3)."""

    number: int
    method: str
    url: str
    headers: dict[str, str]
    expires_in_s: int


def check_key(key: str) -> str:
    """Return `key` if it is a valid object key, else raise InvalidInput (field `key`).

    A key is a relative `/`-separated path: not empty, at most 1024 bytes in UTF-8, no leading
    or trailing `/`, no empty, `.` or `..` segment, no backslash or control character, and no
    segment starting with `.conch-tmp-` (reserved for in-progress files).
    """
    if not isinstance(key, str) or not key:
        raise InvalidInput("An object key must be a non-empty string.", field="key")
    if len(key.encode("utf-8")) > _MAX_KEY_BYTES:
        raise InvalidInput(f"Object key is longer than {_MAX_KEY_BYTES} bytes: {key[:80]!r}...", field="key")
    if "\\" in key or any(ord(char) < 32 or ord(char) == 127 for char in key):
        raise InvalidInput(f"Object key {key!r} contains a backslash or a control character.", field="key")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidInput(
                f"Object key {key!r} must be a relative path without empty, '.' or '..' segments.", field="key"
            )
        if segment.startswith(_TEMP_MARKER):
            raise InvalidInput(f"Object key {key!r} uses the reserved name prefix {_TEMP_MARKER!r}.", field="key")
    return key


def check_prefix(prefix: str) -> str:
    """Return `prefix` normalised to `""` or `"a/b/"` (a folder), else raise InvalidInput.

    A prefix names a folder of keys: `"models/7"` and `"models/7/"` both mean every key under
    `models/7/` (never `models/70/...`). `""` means the whole store. Segments follow `check_key`.
    """
    if not isinstance(prefix, str):
        raise InvalidInput("A key prefix must be a string.", field="prefix")
    stripped = prefix.rstrip("/")
    if not stripped:
        if prefix:
            raise InvalidInput(f"Key prefix {prefix!r} must be relative (no leading '/').", field="prefix")
        return ""
    check_key(stripped)
    return stripped + "/"


class ObjectWriter(abc.ABC):
    """A stream of bytes becoming one object; the object appears only on `commit()`.

    Call `write()` any number of times, then `commit()` (or `abort()`). SHA-256 and size are
    computed as the bytes pass; the writer never holds the whole object in memory. Used as a
    context manager it aborts on exit unless committed, so an exception leaves no object behind.
    A writer is used from one thread.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._sha256 = hashlib.sha256()
        self._size_bytes = 0
        self._state = "open"

    @property
    def size_bytes(self) -> int:
        """Bytes written so far."""
        return self._size_bytes

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        """Append `chunk` to the object.

        Raises Unavailable when the store fails (the writer is then aborted), PayloadTooLarge when
        the object outgrows what the store accepts, ConchError when the writer is already closed.
        """
        self._require_open()
        view = memoryview(chunk)
        if not view.nbytes:
            return
        self._sha256.update(view)
        self._size_bytes += view.nbytes
        try:
            self._write(view)
        except BaseException:
            self._abort_quietly()
            raise

    def commit(self) -> StoredObject:
        """Publish the object under its key (replacing any previous one) and return what was stored.

        Raises Unavailable when the store fails; the writer is then aborted and no object is left.
        """
        self._require_open()
        try:
            self._commit()
        except BaseException:
            self._abort_quietly()
            raise
        self._state = "committed"
        return StoredObject(key=self.key, size_bytes=self._size_bytes, sha256_hex=self._sha256.hexdigest())

    def abort(self) -> None:
        """Discard everything written; no object and no partial upload remain. Idempotent.

        Does nothing after `commit()`. Raises Unavailable when the store cannot be told to drop
        a partial upload.
        """
        if self._state != "open":
            return
        self._state = "aborted"
        self._abort()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None:
            self.abort()
        else:
            self._abort_quietly()

    def _abort_quietly(self) -> None:
        try:
            self.abort()
        except ConchError as error:
            log.warning("storage.writer.abort_failed", extra={"key": self.key, "error": error.detail})

    def _require_open(self) -> None:
        if self._state != "open":
            raise ConchError(f"The writer for {self.key!r} is already {self._state}.")

    @abc.abstractmethod
    def _write(self, view: memoryview) -> None: ...

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _abort(self) -> None: ...


class ObjectStore(abc.ABC):
    """Where objects live: a local folder or an S3 bucket. Keys follow `check_key`.

    Every method raises InvalidInput for a malformed key and Unavailable when the store cannot
    be reached (after bounded retries) or refuses our credentials.
    """

    @abc.abstractmethod
    def open_writer(self, key: str) -> ObjectWriter:
        """Return a writer that streams a new object to `key` (see ObjectWriter)."""

    @abc.abstractmethod
    def open_reader(self, key: str) -> BinaryIO:
        """Return a binary file-like object streaming the content of `key`; close it after use.

        Raises NotFound when `key` does not exist.
        """

    @abc.abstractmethod
    def copy(self, src_key: str, dst_key: str) -> None:
        """Copy object `src_key` to `dst_key` inside the store (server-side on S3).

        Raises NotFound when `src_key` does not exist.
        """

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Return whether an object is stored under exactly `key` (folders are not objects)."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """Return the size of object `key` in bytes. Raises NotFound."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete object `key`. Deleting a missing key is not an error."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under folder `prefix` (see `check_prefix`); return how many.

        An empty prefix is refused (InvalidInput) so a bug cannot wipe the whole store.
        """

    @abc.abstractmethod
    def list_keys(self, prefix: str = "") -> list[str]:
        """Return the keys under folder `prefix` (all keys for `""`), sorted, as full store keys."""

    @abc.abstractmethod
    def abort_multipart_uploads(self, key: str) -> int:
        """Abort every unfinished write of object `key` left by a writer that never finished; return how many.

        For a writer whose process died (a web worker killed mid-upload): on S3 its multipart upload stays
        open, and its parts are stored (and billed) until aborted; in a folder its temp file stays. A writer
        still running for `key` loses its partial upload too, and its `commit()` then raises Unavailable.
        The object `key` itself, if committed, is not touched (see `delete`).
        """

    # --- Resumable uploads: a multipart upload the client fills part by part ---------------------------
    #: "s3": clients PUT parts straight to the store (`presign_part`); "conch": through Conch (`write_part`).
    transport: str = ""

    @abc.abstractmethod
    def start_multipart(self, key: str, *, checksum_algorithm: str = "") -> str:
        """Start a multipart upload that will become object `key`; return its id (the store's reference to it).

        `checksum_algorithm` CRC32: every part comes with the CRC32 of its bytes, which the store checks as the
        part arrives; "": parts come without checksums.
        """

    @abc.abstractmethod
    def presign_part(
        self, key: str, upload_id: str, number: int, *, expires_in_s: int, checksum_crc32: str = ""
    ) -> PartTarget | None:
        """Return where a client PUTs part `number` of upload `upload_id` itself, or None when this store takes
        parts through Conch (`write_part`). Makes no request. `checksum_crc32` (base64, `crc32_base64`): the
        part's CRC32, signed into the target, whose `headers` then carry it for the client to send."""

    @abc.abstractmethod
    def write_part(
        self, key: str, upload_id: str, number: int, stream: BinaryIO, size_bytes: int, *, checksum_crc32: str = ""
    ) -> StoredPart:
        """Store part `number` from `stream`: exactly `size_bytes` bytes read in chunks, never the whole part in
        memory; replaces an earlier copy of the part. With `checksum_crc32` (base64, `crc32_base64`) the bytes must
        have that CRC32, else the part is refused and an earlier copy of it kept. Raises InvalidInput (field
        `size_bytes`) when the stream ends early, InvalidInput (field `parts[<number>]`) on a CRC32 mismatch,
        NotFound when the upload is gone, Conflict for a store whose clients write parts themselves.
        """

    @abc.abstractmethod
    def list_parts(self, key: str, upload_id: str) -> list[StoredPart]:
        """Return the parts the store holds of upload `upload_id`, by number. Raises NotFound when it is gone."""

    @abc.abstractmethod
    def complete_multipart(self, key: str, upload_id: str, parts: list[StoredPart]) -> None:
        """Join `parts` (numbers 1..n, in order, as `list_parts` gave them: checksums included) into object `key`
        atomically and end the upload.

        Idempotent: when the upload is already gone and `key` exists, it was completed before and nothing is done.
        Raises NotFound when the upload is gone and no object is there, InvalidInput (field `parts`) when the
        store refuses the parts (a part other than the last under 5 MiB on S3, an ETag that does not match).
        """

    @abc.abstractmethod
    def abort_multipart(self, key: str, upload_id: str) -> None:
        """End upload `upload_id` and drop its parts; one already gone is not an error. `key` is not touched."""

    @abc.abstractmethod
    def triton_repository_location(self, prefix: str) -> str:
        """Return the `--model-repository` value that makes Triton read the repository at `prefix`.

        Raises ObjectStoreConfigError when Triton could not parse the location (see subclasses).
        """

    @abc.abstractmethod
    def triton_environment(self) -> dict[str, str]:
        """Return the environment variables Triton needs to read `triton_repository_location`."""

    def put_bytes(self, key: str, data: bytes) -> StoredObject:
        """Store `data` as object `key` (replacing any previous one) and return what was stored."""
        with self.open_writer(key) as writer:
            writer.write(data)
            return writer.commit()

    def read_bytes(self, key: str) -> bytes:
        """Return the whole content of object `key` (for small objects). Raises NotFound."""
        with self.open_reader(key) as reader:
            return reader.read()

    def download_to(self, key: str, path: Path | str) -> None:
        """Write object `key` to the local file `path`, atomically (a temp file then a rename).

        Parent folders are created. Raises NotFound when `key` does not exist.
        """
        target = Path(path)
        with self.open_reader(key) as reader, _atomic_local_file(target) as out:
            shutil.copyfileobj(reader, out, _COPY_BUFFER_BYTES)


def _temp_prefix(target: Path) -> str:
    """Name prefix of the in-progress files that become `target` (`.conch-tmp-<name>.`)."""
    return f"{_TEMP_MARKER}{target.name[:_TEMP_NAME_CHARS]}."


@contextlib.contextmanager
def _atomic_local_file(target: Path) -> Iterator[BinaryIO]:
    """Yield a temp file next to `target` that replaces `target` when the block succeeds."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(target), suffix=".part")
    except OSError as exc:
        raise Unavailable(f"Cannot write {target}: {exc.strerror or exc}.") from exc
    temp_path = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.chmod(temp_path, 0o644)
        os.replace(temp_path, target)
    except OSError as exc:
        temp_path.unlink(missing_ok=True)
        raise Unavailable(f"Cannot write {target}: {exc.strerror or exc}.") from exc
    except BaseException:
        temp_path.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------
# Local folder


class _FileObjectWriter(ObjectWriter):
    """Writes to a hidden temp file in the target folder; commit renames it into place atomically."""

    def __init__(self, key: str, path: Path) -> None:
        super().__init__(key)
        self._final_path = path
        fd, temp_name = self._make_temp(path)
        self._temp_path = Path(temp_name)
        self._file = os.fdopen(fd, "wb")

    @staticmethod
    def _make_temp(path: Path) -> tuple[int, str]:
        # A concurrent delete may prune the freshly made (still empty) folder; one retry covers it.
        for attempt in range(2):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                return tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".part")
            except FileNotFoundError:
                if attempt:
                    raise Unavailable(f"Cannot create a file in {path.parent}.") from None
            except OSError as exc:
                raise Unavailable(f"Cannot create a file in {path.parent}: {exc.strerror or exc}.") from exc
        raise AssertionError("unreachable")

    def _write(self, view: memoryview) -> None:
        try:
            self._file.write(view)
        except OSError as exc:
            raise Unavailable(f"Cannot write {self._final_path}: {exc.strerror or exc}.") from exc

    def _commit(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.chmod(self._temp_path, 0o644)
            os.replace(self._temp_path, self._final_path)
        except OSError as exc:
            raise Unavailable(f"Cannot write {self._final_path}: {exc.strerror or exc}.") from exc

    def _abort(self) -> None:
        self._file.close()
        self._temp_path.unlink(missing_ok=True)


class FileObjectStore(ObjectStore):
    """An object store in a local folder: key `a/b/c` is the file `<root>/a/b/c`.

    Writes are atomic (temp file in the same folder, fsync, rename). Emptied folders are removed
    on delete, so a Triton repository never keeps an empty model or version folder.
    """

    def __init__(self, root: Path | str) -> None:
        """Use folder `root` (made absolute; created on the first write)."""
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"FileObjectStore(root={str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _folder(self, prefix: str) -> Path:
        normalised = check_prefix(prefix)
        return self.root.joinpath(*normalised.rstrip("/").split("/")) if normalised else self.root

    def _prune_empty_parents(self, path: Path) -> None:
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                return
            parent = parent.parent

    def open_writer(self, key: str) -> ObjectWriter:
        """Return a writer to the local file of `key` (see ObjectWriter). Raises Unavailable."""
        return _FileObjectWriter(key, self._path(key))

    def open_reader(self, key: str) -> BinaryIO:
        """Open the local file of `key` for reading. Raises NotFound, Unavailable."""
        path = self._path(key)
        try:
            return open(path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"Object {key!r} does not exist in the object store.") from None
        except OSError as exc:
            raise Unavailable(f"Cannot read {path}: {exc.strerror or exc}.") from exc

    def copy(self, src_key: str, dst_key: str) -> None:
        """Copy the file of `src_key` to `dst_key` atomically. Raises NotFound, Unavailable."""
        source = self._path(src_key)
        target = self._path(dst_key)
        if not source.is_file():
            raise NotFound(f"Object {src_key!r} does not exist in the object store.")
        with _atomic_local_file(target) as out:
            try:
                with open(source, "rb") as reader:
                    shutil.copyfileobj(reader, out, _COPY_BUFFER_BYTES)
            except FileNotFoundError:
                raise NotFound(f"Object {src_key!r} does not exist in the object store.") from None

    def exists(self, key: str) -> bool:
        """Return whether the file of `key` exists."""
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        """Return the size of the file of `key` in bytes. Raises NotFound."""
        path = self._path(key)
        try:
            stat = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"Object {key!r} does not exist in the object store.") from None
        if not path.is_file():
            raise NotFound(f"Object {key!r} does not exist in the object store.")
        return stat.st_size

    def delete(self, key: str) -> None:
        """Delete the file of `key` (missing is fine) and any folders it leaves empty."""
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except IsADirectoryError:
            return
        except OSError as exc:
            raise Unavailable(f"Cannot delete {path}: {exc.strerror or exc}.") from exc
        self._prune_empty_parents(path)

    def delete_prefix(self, prefix: str) -> int:
        """Delete the folder of `prefix` with everything in it; return how many objects went."""
        if not check_prefix(prefix):
            raise InvalidInput("Refusing to delete the whole object store (empty prefix).", field="prefix")
        folder = self._folder(prefix)
        if not folder.is_dir():
            return 0
        count = len(self.list_keys(prefix))
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise Unavailable(f"Cannot delete {folder}: {exc.strerror or exc}.") from exc
        self._prune_empty_parents(folder)
        return count

    def list_keys(self, prefix: str = "") -> list[str]:
        """Return the keys of the files under folder `prefix`, sorted (in-progress writes excluded)."""
        folder = self._folder(prefix)
        keys = []
        for dirpath, dirnames, filenames in os.walk(folder):
            # The staging folder of resumable uploads (`.conch-tmp-uploads`) holds no objects.
            dirnames[:] = [name for name in dirnames if not name.startswith(_TEMP_MARKER)]
            base = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(_TEMP_MARKER):
                    continue
                keys.append(name if base == "." else f"{base}/{name}")
        return sorted(keys)

    def abort_multipart_uploads(self, key: str) -> int:
        """Delete the in-progress temp files of `key` (`.conch-tmp-<name>.<random>.part` next to it); return how many.

        mkstemp's random part has no `.`, which tells `model.onnx`'s temp files from `model.onnx.sig`'s. Names
        are cut to 100 characters in temp names, so a sibling sharing the first 100 characters matches too.
        """
        target = self._path(key)
        prefix = _temp_prefix(target)

        def is_temp_of_key(name: str) -> bool:
            rest = name[len(prefix) :]
            return name.startswith(prefix) and rest.endswith(".part") and "." not in rest[: -len(".part")]

        try:
            leftovers = [path for path in target.parent.iterdir() if is_temp_of_key(path.name)]
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError as exc:
            raise Unavailable(f"Cannot list {target.parent}: {exc.strerror or exc}.") from exc
        for path in leftovers:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise Unavailable(f"Cannot delete {path}: {exc.strerror or exc}.") from exc
        if leftovers:
            self._prune_empty_parents(target)
        return len(leftovers)

    # --- Resumable uploads: parts are files `<number>-<sha256>` in `<root>/.conch-tmp-uploads/<upload id>/`.
    transport = "conch"

    def _staging(self, upload_id: str) -> Path:
        if not _FOLDER_UPLOAD_ID_RE.fullmatch(upload_id or ""):
            raise InvalidInput(f"{upload_id!r} is not an upload id of this store.", field="upload_id")
        return self.root / _STAGING_FOLDER / upload_id

    def start_multipart(self, key: str, *, checksum_algorithm: str = "") -> str:
        """Make the upload's staging folder; return its id (32 hex digits). Raises Unavailable.

        The checksum algorithm needs nothing here: `write_part` checks the CRC32 it is given.
        """
        self._path(key)
        upload_id = uuid.uuid4().hex
        try:
            self._staging(upload_id).mkdir(parents=True)
        except OSError as exc:
            raise Unavailable(f"Cannot create the staging folder of an upload in {self.root}: {exc}.") from exc
        return upload_id

    def presign_part(
        self, key: str, upload_id: str, number: int, *, expires_in_s: int, checksum_crc32: str = ""
    ) -> PartTarget | None:
        """Return None: parts of a folder store come through Conch (`write_part`)."""
        return None

    def write_part(
        self, key: str, upload_id: str, number: int, stream: BinaryIO, size_bytes: int, *, checksum_crc32: str = ""
    ) -> StoredPart:
        """Stream exactly `size_bytes` bytes of `stream` into the part's file (a temp file renamed into place).

        Reads `_COPY_BUFFER_BYTES` at a time; the part's tag is the SHA-256 of its bytes. With `checksum_crc32`
        the CRC32 of the bytes is computed on the way and must equal it, as S3 checks `x-amz-checksum-crc32`
        (BadDigest): otherwise the temp file is dropped and an earlier copy of the part stays. Raises InvalidInput
        (field `size_bytes`) when the stream ends before `size_bytes`, InvalidInput (field `parts[<number>]`) on a
        CRC32 mismatch, NotFound when the upload is gone, Unavailable when the disk fails.
        """
        folder = self._staging(upload_id)
        if not folder.is_dir():
            raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id")
        digest = hashlib.sha256()
        crc = 0
        received = 0
        try:
            fd, temp_name = tempfile.mkstemp(dir=folder, prefix=f"{_TEMP_MARKER}{number:05d}.", suffix=".part")
        except OSError as exc:
            raise Unavailable(f"Cannot write a part in {folder}: {exc.strerror or exc}.") from exc
        temp_path = Path(temp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                while received < size_bytes:
                    chunk = stream.read(min(_COPY_BUFFER_BYTES, size_bytes - received))
                    if not chunk:
                        raise InvalidInput(
                            f"Part {number} ended after {received} of its {size_bytes} bytes; send the part again "
                            "whole.",
                            field="size_bytes",
                        )
                    digest.update(chunk)
                    if checksum_crc32:
                        crc = zlib.crc32(chunk, crc)
                    out.write(chunk)
                    received += len(chunk)
            if checksum_crc32 and crc32_base64(crc) != checksum_crc32:
                raise InvalidInput(
                    f"Part {number}'s {received} bytes have CRC32 {crc32_base64(crc)}, not the {checksum_crc32} its "
                    f"{CHECKSUM_CRC32_HEADER} header gives: they changed on the way. This copy was not kept (the parts "
                    f"already stored are); send part {number} again.",
                    field=f"parts[{number}]",
                )
            for old in folder.glob(f"{number:05d}-*"):
                old.unlink(missing_ok=True)
            etag = digest.hexdigest()
            os.replace(temp_path, folder / f"{number:05d}-{etag}")
        except OSError as exc:
            temp_path.unlink(missing_ok=True)
            raise Unavailable(f"Cannot write part {number} in {folder}: {exc.strerror or exc}.") from exc
        except BaseException:
            temp_path.unlink(missing_ok=True)
            raise
        return StoredPart(
            number=number, size_bytes=received, etag=etag, checksum_crc32=crc32_base64(crc) if checksum_crc32 else ""
        )

    def list_parts(self, key: str, upload_id: str) -> list[StoredPart]:
        """Return the finished part files of the upload, by number. Raises NotFound when the upload is gone."""
        folder = self._staging(upload_id)
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id") from None
        except OSError as exc:
            raise Unavailable(f"Cannot list {folder}: {exc.strerror or exc}.") from exc
        parts = []
        for entry in entries:
            match = _PART_FILE_RE.fullmatch(entry.name)
            if match:
                size = entry.stat().st_size
                parts.append(StoredPart(number=int(match["number"]), size_bytes=size, etag=match["etag"]))
        return sorted(parts, key=lambda part: part.number)

    def complete_multipart(self, key: str, upload_id: str, parts: list[StoredPart]) -> None:
        """Concatenate the part files into object `key` (a temp file renamed into place), then drop the staging
        folder. Reads and writes a megabyte at a time."""
        folder = self._staging(upload_id)
        target = self._path(key)
        if not folder.is_dir():
            if target.is_file():
                return
            raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id")
        for expected, part in enumerate(parts, start=1):
            if part.number != expected:
                raise InvalidInput(f"Part {expected} is missing; send it, then complete again.", field="parts")
        with _atomic_local_file(target) as out:
            for part in parts:
                path = folder / f"{part.number:05d}-{part.etag}"
                try:
                    with open(path, "rb") as reader:
                        shutil.copyfileobj(reader, out, _COPY_BUFFER_BYTES)
                except FileNotFoundError:
                    raise InvalidInput(
                        f"Part {part.number} with tag {part.etag} is not in the store any more; list the parts "
                        "and send the missing ones again.",
                        field="parts",
                    ) from None
        shutil.rmtree(folder, ignore_errors=True)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Delete the upload's staging folder with its parts (missing is fine). Raises Unavailable."""
        folder = self._staging(upload_id)
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise Unavailable(f"Cannot delete {folder}: {exc.strerror or exc}.") from exc

    def triton_repository_location(self, prefix: str) -> str:
        """Return the absolute local path of folder `prefix`, without a trailing slash.

        Triton docs, model repository, "Local File System": the absolute path must be given.
        """
        return str(self._folder(prefix))

    def triton_environment(self) -> dict[str, str]:
        """Return `{}`: Triton needs no credentials for a local folder."""
        return {}


# --------------------------------------------------------------------------------------------
# S3


class _S3BodyReader(io.RawIOBase):
    """Raw stream over a GetObject body that turns botocore read errors into Unavailable."""

    def __init__(self, body: Any, key: str) -> None:
        super().__init__()
        self._body = body
        self._key = key

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._body.read(len(buffer))
        except _S3_ERRORS as exc:
            raise Unavailable(f"Reading object {self._key!r} from the object store failed: {exc}.") from exc
        size = len(data)
        buffer[:size] = data
        return size

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


class _S3ObjectWriter(ObjectWriter):
    """Buffers one part at a time; small objects become one PutObject, larger ones a multipart upload.

    Full parts go to a small thread pool. A semaphore bounds the parts in flight, so `write()`
    blocks (back-pressure) rather than buffering more than `max_concurrency + 1` parts.
    """

    def __init__(self, store: S3ObjectStore, key: str) -> None:
        super().__init__(key)
        self._store = store
        self._client = store._client
        self._object_key = store._object_key(key)
        self._part_size = store.part_size_bytes
        # The part being filled: allocated on first use, handed to the upload thread when full
        # (bytearray bodies go to botocore as they are, so a part is never copied).
        self._buffer = bytearray()
        self._filled = 0
        self._upload_id: str | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(store.max_concurrency)
        self._futures: list[Future[dict[str, Any]]] = []
        self._next_part_number = 1
        self._failure: BaseException | None = None

    def _write(self, view: memoryview) -> None:
        self._raise_failure()
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        while view.nbytes:
            if not self._buffer:
                self._buffer = bytearray(self._part_size)
            take = min(self._part_size - self._filled, view.nbytes)
            self._buffer[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == self._part_size:
                self._submit_part(self._take_buffer())

    def _take_buffer(self) -> bytearray:
        """Return the filled bytes of the current part (trimmed in place) and start a new one."""
        part = self._buffer
        del part[self._filled :]
        self._buffer = bytearray()
        self._filled = 0
        return part

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _submit_part(self, data: bytearray) -> None:
        if self._upload_id is None:
            with self._store._errors("start an upload to", self.key):
                response = self._client.create_multipart_upload(Bucket=self._store.bucket, Key=self._object_key)
            self._upload_id = response["UploadId"]
            self._executor = ThreadPoolExecutor(
                max_workers=self._store.max_concurrency, thread_name_prefix="conch-s3-part"
            )
        if self._next_part_number > MAX_PARTS:
            raise PayloadTooLarge(
                f"Object {self.key!r} needs more than {MAX_PARTS} parts of {self._part_size} bytes; "
                "raise the part size.",
                field="file",
            )
        part_number = self._next_part_number
        self._next_part_number += 1
        self._slots.acquire()
        if self._failure is not None:
            self._slots.release()
            raise self._failure
        assert self._executor is not None
        future = self._executor.submit(self._upload_part, part_number, data)
        future.add_done_callback(lambda _done: self._slots.release())
        self._futures.append(future)

    def _upload_part(self, part_number: int, data: bytearray) -> dict[str, Any]:
        try:
            with self._store._errors("upload a part of", self.key):
                response = self._client.upload_part(
                    Bucket=self._store.bucket,
                    Key=self._object_key,
                    UploadId=self._upload_id,
                    PartNumber=part_number,
                    Body=data,
                )
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
            raise
        return {"PartNumber": part_number, "ETag": response["ETag"]}

    def _commit(self) -> None:
        if self._upload_id is None:
            body = self._take_buffer()
            with self._store._errors("write", self.key):
                self._client.put_object(Bucket=self._store.bucket, Key=self._object_key, Body=body)
            return
        if self._filled:
            self._submit_part(self._take_buffer())
        parts = [future.result() for future in self._futures]
        assert self._executor is not None
        self._executor.shutdown(wait=True)
        with self._store._errors("finish the upload of", self.key):
            self._client.complete_multipart_upload(
                Bucket=self._store.bucket,
                Key=self._object_key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": parts},
            )

    def _abort(self) -> None:
        self._buffer = bytearray()
        self._filled = 0
        if self._executor is not None:
            # Parts still uploading would otherwise land after the abort and be kept by S3.
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self._upload_id is None:
            return
        try:
            self._client.abort_multipart_upload(
                Bucket=self._store.bucket, Key=self._object_key, UploadId=self._upload_id
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
                return
            raise self._store._translate(exc, "abort the upload of", self.key) from exc
        except _S3_ERRORS as exc:
            raise self._store._translate(exc, "abort the upload of", self.key) from exc


class S3ObjectStore(ObjectStore):
    """An object store in an S3 bucket (AWS S3 or an S3-compatible server such as MinIO).

    Key `a/b` is the object `<prefix>/a/b` in `bucket`. Every request has connect/read timeouts
    and bounded retries (botocore "standard" mode). With `endpoint_url` set, path-style
    addressing is used (what MinIO and most S3-compatible servers expect). Empty `access_key`/
    `secret_key` fall back to boto3's default credential chain (environment, ~/.aws, instance role).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str = "",
        region: str = "",
        access_key: str = "",
        secret_key: str = "",
        *,
        part_size_bytes: int = DEFAULT_PART_SIZE_BYTES,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        public_endpoint_url: str = "",
    ) -> None:
        """Configure the client; no request is made here.

        `part_size_bytes` (>= 5 MiB) is the multipart part size; `max_concurrency` parts upload
        at once. `public_endpoint_url` is the endpoint as clients outside Conch reach it (a browser, the CLI),
        used in presigned part URLs; empty: `endpoint_url`. Raises ObjectStoreConfigError for an empty bucket,
        a malformed endpoint, a part size under 5 MiB, or only one of access key / secret key.
        """
        if not bucket:
            raise ObjectStoreConfigError("The S3 bucket name is empty; set CONCH_STORAGE_URL=s3://bucket/prefix.")
        if part_size_bytes < MIN_PART_SIZE_BYTES:
            raise ObjectStoreConfigError(f"The S3 part size must be at least {MIN_PART_SIZE_BYTES} bytes.")
        if max_concurrency < 1:
            raise ObjectStoreConfigError("The S3 upload concurrency must be at least 1.")
        if bool(access_key) != bool(secret_key):
            raise ObjectStoreConfigError(
                "Set both CONCH_S3_ACCESS_KEY_ID and CONCH_S3_SECRET_ACCESS_KEY, or neither "
                "(to use boto3's default credential chain)."
            )
        for variable, url in (
            ("CONCH_S3_ENDPOINT_URL", endpoint_url),
            ("CONCH_S3_PUBLIC_ENDPOINT_URL", public_endpoint_url),
        ):
            if url:
                parts = urlsplit(url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise ObjectStoreConfigError(f"{variable}={url!r} must look like http://host:port or https://host.")
        normalised_prefix = check_prefix(prefix.strip("/")) if prefix.strip("/") else ""
        self.bucket = bucket
        self.prefix = normalised_prefix.rstrip("/")
        self.endpoint_url = endpoint_url.rstrip("/")
        self.part_size_bytes = part_size_bytes
        self.max_concurrency = max_concurrency
        self._access_key = access_key
        self._secret_key = secret_key
        config = Config(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            # Room for the writer's part threads plus managed copies/downloads running alongside.
            max_pool_connections=max(10, 2 * max_concurrency + 4),
            signature_version="s3v4",
            s3={
                "addressing_style": "path" if endpoint_url else "auto",
                # Don't SHA-256 every part for the SigV4 signature (botocore does it over plain http):
                # the writer already hashes every byte once for the object's own SHA-256, and a second
                # hash per byte made uploads through Conch CPU-bound (bench/upload.py). Over https
                # botocore skips payload signing anyway.
                "payload_signing_enabled": False,
            },
            # Checksums only where S3 requires them: S3-compatible servers differ in support for
            # the newer default CRC trailers, and we compute SHA-256 ourselves.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session(
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            region_name=region or (FALLBACK_REGION if endpoint_url else None),
        )
        self._client = session.client("s3", endpoint_url=endpoint_url or None, config=config)
        self.region = self._client.meta.region_name or FALLBACK_REGION
        # Presigned URLs name the host clients reach; a SigV4 signature covers that host, so they are made by a
        # client of the public endpoint (it never sends a request itself).
        self.public_endpoint_url = (public_endpoint_url or endpoint_url).rstrip("/")
        self._presign_client = (
            session.client("s3", endpoint_url=public_endpoint_url, config=config)
            if public_endpoint_url and public_endpoint_url.rstrip("/") != self.endpoint_url
            else self._client
        )
        self._transfer_config = TransferConfig(
            multipart_threshold=part_size_bytes,
            multipart_chunksize=part_size_bytes,
            max_concurrency=max_concurrency,
            use_threads=True,
        )

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self.bucket!r}, prefix={self.prefix!r}, endpoint_url={self.endpoint_url!r})"

    def _object_key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _object_prefix(self, prefix: str) -> str:
        normalised = check_prefix(prefix)
        return f"{self.prefix}/{normalised}" if self.prefix else normalised

    def _store_key(self, object_key: str) -> str:
        return object_key[len(self.prefix) + 1 :] if self.prefix else object_key

    def _translate(self, exc: BaseException, action: str, key: str) -> ConchError:
        """Map a boto3/botocore/s3transfer error to NotFound or Unavailable."""
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _S3_MISSING_KEY_CODES:
                return NotFound(f"Object {key!r} does not exist in the object store.")
            if code == "NoSuchBucket":
                return Unavailable(
                    f"Bucket {self.bucket!r} does not exist at the object store; create it or fix CONCH_STORAGE_URL."
                )
            if code in _S3_CREDENTIAL_CODES:
                return Unavailable(
                    f"The object store refused our credentials ({code}) for bucket {self.bucket!r}; "
                    "check CONCH_S3_ACCESS_KEY_ID and CONCH_S3_SECRET_ACCESS_KEY."
                )
            return Unavailable(
                f"The object store answered {code or 'an error'} (HTTP {status}) when asked to {action} {key!r}; "
                "retry later."
            )
        where = self.endpoint_url or "AWS S3"
        return Unavailable(f"The object store at {where} failed when asked to {action} {key!r}: {exc}.")

    @contextlib.contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        try:
            yield
        except _S3_ERRORS as exc:
            raise self._translate(exc, action, key) from exc

    def open_writer(self, key: str) -> ObjectWriter:
        """Return a writer streaming to object `key` (see ObjectWriter and _S3ObjectWriter).

        Memory per writer stays under (max_concurrency + 1) * part_size_bytes.
        """
        check_key(key)
        return _S3ObjectWriter(self, key)

    def open_reader(self, key: str) -> BinaryIO:
        """Return a buffered stream over GetObject of `key`. Raises NotFound, Unavailable."""
        with self._errors("read", key):
            response = self._client.get_object(Bucket=self.bucket, Key=self._object_key(key))
        return io.BufferedReader(_S3BodyReader(response["Body"], key), buffer_size=_COPY_BUFFER_BYTES)  # type: ignore[return-value]

    def read_bytes(self, key: str) -> bytes:
        """Return the whole content of object `key`. Raises NotFound, Unavailable."""
        with self._errors("read", key):
            response = self._client.get_object(Bucket=self.bucket, Key=self._object_key(key))
            body = response["Body"]
            try:
                return body.read()
            finally:
                body.close()

    def put_bytes(self, key: str, data: bytes) -> StoredObject:
        """Store `data` as object `key` with one PutObject. Raises Unavailable."""
        with self._errors("write", key):
            self._client.put_object(Bucket=self.bucket, Key=self._object_key(key), Body=bytes(data))
        return StoredObject(key=key, size_bytes=len(data), sha256_hex=hashlib.sha256(data).hexdigest())

    def download_to(self, key: str, path: Path | str) -> None:
        """Download object `key` to local file `path` (boto3 managed, ranged parts in parallel).

        boto3 writes a temp file and renames it into place. Raises NotFound, Unavailable.
        """
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f"Cannot write {target}: {exc.strerror or exc}.") from exc
        with self._errors("download", key):
            self._client.download_file(self.bucket, self._object_key(key), str(target), Config=self._transfer_config)

    def copy(self, src_key: str, dst_key: str) -> None:
        """Copy `src_key` to `dst_key` server-side (CopyObject, or UploadPartCopy parts when large).

        Raises NotFound when `src_key` does not exist, Unavailable.
        """
        source = {"Bucket": self.bucket, "Key": self._object_key(src_key)}
        destination = self._object_key(dst_key)
        with self._errors("copy", src_key):
            self._client.copy(source, self.bucket, destination, Config=self._transfer_config)

    def _head(self, key: str) -> dict[str, Any]:
        with self._errors("look up", key):
            return self._client.head_object(Bucket=self.bucket, Key=self._object_key(key))

    def exists(self, key: str) -> bool:
        """Return whether object `key` exists (HeadObject). Raises Unavailable."""
        try:
            self._head(key)
        except NotFound:
            return False
        return True

    def size(self, key: str) -> int:
        """Return the size of object `key` in bytes (HeadObject). Raises NotFound, Unavailable."""
        return int(self._head(key)["ContentLength"])

    def delete(self, key: str) -> None:
        """Delete object `key` (DeleteObject; a missing key is fine). Raises Unavailable."""
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._object_key(key))

    def _iter_object_keys(self, prefix: str) -> Iterator[str]:
        object_prefix = self._object_prefix(prefix)
        with self._errors("list", prefix or "/"):
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=object_prefix):
                for item in page.get("Contents", ()):
                    yield item["Key"]

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under folder `prefix` (DeleteObjects, 1000 at a time); return how many.

        Raises InvalidInput for an empty prefix, Unavailable when a delete fails.
        """
        if not check_prefix(prefix):
            raise InvalidInput("Refusing to delete the whole object store (empty prefix).", field="prefix")
        object_keys = list(self._iter_object_keys(prefix))
        for start in range(0, len(object_keys), 1000):
            batch = [{"Key": object_key} for object_key in object_keys[start : start + 1000]]
            with self._errors("delete", prefix):
                response = self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            failures = response.get("Errors") or []
            if failures:
                first = failures[0]
                raise Unavailable(
                    f"The object store could not delete {len(failures)} objects under {prefix!r} "
                    f"(first: {first.get('Key')!r}, {first.get('Code')}); retry later."
                )
        return len(object_keys)

    def list_keys(self, prefix: str = "") -> list[str]:
        """Return the keys under folder `prefix`, sorted (ListObjectsV2, paginated). Raises Unavailable."""
        return sorted(self._store_key(object_key) for object_key in self._iter_object_keys(prefix))

    def abort_multipart_uploads(self, key: str) -> int:
        """Abort the open multipart uploads of exactly `key` (ListMultipartUploads, AbortMultipartUpload).

        Returns how many were aborted; one that vanished meanwhile (NoSuchUpload) is not counted.
        S3 API reference, "AbortMultipartUpload": the parts of an aborted upload are freed. Raises Unavailable.
        """
        object_key = self._object_key(key)
        with self._errors("list the unfinished uploads of", key):
            paginator = self._client.get_paginator("list_multipart_uploads")
            upload_ids = [
                upload["UploadId"]
                for page in paginator.paginate(Bucket=self.bucket, Prefix=object_key)
                for upload in page.get("Uploads", ())
                if upload["Key"] == object_key
            ]
        aborted = 0
        for upload_id in upload_ids:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=object_key, UploadId=upload_id)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
                    continue
                raise self._translate(exc, "abort an unfinished upload of", key) from exc
            except _S3_ERRORS as exc:
                raise self._translate(exc, "abort an unfinished upload of", key) from exc
            aborted += 1
        return aborted

    # --- Resumable uploads: an S3 multipart upload whose parts clients PUT to presigned URLs -----------------
    transport = "s3"

    def _no_such_upload(self, exc: BaseException) -> bool:
        return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "NoSuchUpload"

    def start_multipart(self, key: str, *, checksum_algorithm: str = "") -> str:
        """CreateMultipartUpload for `key`; return its UploadId. Raises Unavailable.

        `checksum_algorithm` CRC32 declares ChecksumAlgorithm CRC32, as boto3's transfer manager does: S3 then
        checks each part's `x-amz-checksum-crc32` as it arrives (BadDigest on a mismatch), and the object's checksum
        is COMPOSITE, the CRC32 of the parts' CRC32s (S3 User Guide, "Checking object integrity", "Using part-level
        checksums for multipart uploads": COMPOSITE is CRC32's default type, so ChecksumType is not sent, which
        S3-compatible servers that predate it would refuse). Without it S3 gives the object a full-object
        CRC64NVME, which some S3 servers (moto) compute by reading the whole object at completion.
        """
        extra = {"ChecksumAlgorithm": CRC32} if checksum_algorithm == CRC32 else {}
        with self._errors("start an upload to", key):
            response = self._client.create_multipart_upload(Bucket=self.bucket, Key=self._object_key(key), **extra)
        return response["UploadId"]

    def presign_part(
        self, key: str, upload_id: str, number: int, *, expires_in_s: int, checksum_crc32: str = ""
    ) -> PartTarget | None:
        """Presign UploadPart of part `number` (boto3 `generate_presigned_url`, SigV4 in the query string).

        The client PUTs exactly the part's bytes to the URL, with the target's `headers`, and keeps the ETag
        response header (a browser reads it only where the bucket's CORS rule exposes it: README, "Uploads
        straight to the bucket"). With `checksum_crc32` the URL signs the headers `x-amz-checksum-crc32` (that
        value) and `x-amz-sdk-checksum-algorithm` (CRC32), botocore's SigV4 `X-Amz-SignedHeaders`
        (host;x-amz-checksum-crc32;x-amz-sdk-checksum-algorithm): the client must send both, exactly, and S3
        refuses bytes with another CRC32 (400 BadDigest), so a part damaged on the way is never stored.
        """
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._object_key(key),
            "UploadId": upload_id,
            "PartNumber": number,
        }
        headers: dict[str, str] = {}
        if checksum_crc32:
            params.update(ChecksumAlgorithm=CRC32, ChecksumCRC32=checksum_crc32)
            headers = {CHECKSUM_CRC32_HEADER: checksum_crc32, "x-amz-sdk-checksum-algorithm": CRC32}
        with self._errors("sign an upload part of", key):
            url = self._presign_client.generate_presigned_url(
                "upload_part", Params=params, ExpiresIn=expires_in_s, HttpMethod="PUT"
            )
        return PartTarget(number=number, method="PUT", url=url, headers=headers, expires_in_s=expires_in_s)

    def write_part(
        self, key: str, upload_id: str, number: int, stream: BinaryIO, size_bytes: int, *, checksum_crc32: str = ""
    ) -> StoredPart:
        """Refuse: clients PUT the parts of an S3 upload to the bucket themselves (Conflict, field `number`)."""
        raise Conflict(
            "This upload goes straight to the bucket: PUT each part to the URL that POST .../parts/ gives, "
            "not to Conch.",
            field="number",
        )

    def list_parts(self, key: str, upload_id: str) -> list[StoredPart]:
        """ListParts of the upload, every page (1,000 parts a page), each part's ChecksumCRC32 kept (an upload
        started with CRC32). Raises NotFound when it is gone."""
        parts = []
        try:
            paginator = self._client.get_paginator("list_parts")
            pages = paginator.paginate(Bucket=self.bucket, Key=self._object_key(key), UploadId=upload_id)
            for page in pages:
                for part in page.get("Parts", ()):
                    parts.append(
                        StoredPart(
                            number=int(part["PartNumber"]),
                            size_bytes=int(part["Size"]),
                            etag=part["ETag"],
                            checksum_crc32=part.get("ChecksumCRC32") or "",
                        )
                    )
        except _S3_ERRORS as exc:
            if self._no_such_upload(exc):
                raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id") from exc
            raise self._translate(exc, "list the parts of", key) from exc
        return sorted(parts, key=lambda part: part.number)

    def complete_multipart(self, key: str, upload_id: str, parts: list[StoredPart]) -> None:
        """CompleteMultipartUpload with `parts`' numbers, ETags and, where a part has one, ChecksumCRC32 (S3
        requires every part's checksum to complete an upload started with CRC32); see
        ObjectStore.complete_multipart."""
        listed = [
            {"PartNumber": part.number, "ETag": part.etag}
            | ({"ChecksumCRC32": part.checksum_crc32} if part.checksum_crc32 else {})
            for part in parts
        ]
        try:
            self._client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self._object_key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": listed},
            )
        except _S3_ERRORS as exc:
            if self._no_such_upload(exc):
                if self.exists(key):
                    return
                raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id") from exc
            code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
            if code in ("EntityTooSmall", "InvalidPart", "InvalidPartOrder"):
                message = exc.response.get("Error", {}).get("Message", "")
                raise InvalidInput(
                    f"The object store refused the parts ({code}: {message}); every part but the last must be at "
                    "least 5 MiB. Start a new upload with a larger part size.",
                    field="parts",
                ) from exc
            raise self._translate(exc, "finish the upload of", key) from exc

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """AbortMultipartUpload (S3 frees the parts); an upload already gone is fine. Raises Unavailable."""
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=self._object_key(key), UploadId=upload_id)
        except _S3_ERRORS as exc:
            if self._no_such_upload(exc):
                return
            raise self._translate(exc, "abort the upload of", key) from exc

    def triton_repository_location(self, prefix: str) -> str:
        """Return the S3 location Triton reads the repository at folder `prefix` from.

        Forms (Triton docs, user_guide/model_repository.md, "Model Repository Locations" > "S3"):
        `s3://bucket/path` for AWS S3; `s3://http://host:port/bucket/path` (or `https://`) for an
        S3-compatible endpoint. Triton's parser (core `S3FileSystem::s3_regex_`) needs an explicit
        port, a bucket of `[0-9a-z.-]` and path segments of `[0-9a-zA-Z._-]`; the endpoint's
        default port (80/443) is written out. Raises ObjectStoreConfigError (or InvalidInput for
        a malformed prefix) when the location is not one Triton can parse.
        """
        path = "/".join(part for part in (self.prefix, check_prefix(prefix).rstrip("/")) if part)
        if not _TRITON_BUCKET_RE.fullmatch(self.bucket):
            raise ObjectStoreConfigError(
                f"Triton cannot read bucket {self.bucket!r}: its name may only use 0-9, a-z, '.' and '-'."
            )
        for segment in path.split("/") if path else ():
            if not _TRITON_SEGMENT_RE.fullmatch(segment):
                raise ObjectStoreConfigError(
                    f"Triton cannot read the S3 path {path!r}: segment {segment!r} may only use "
                    "letters, digits, '.', '-' and '_'."
                )
        tail = f"/{path}" if path else ""
        if not self.endpoint_url:
            return f"s3://{self.bucket}{tail}"
        endpoint = urlsplit(self.endpoint_url)
        host = endpoint.hostname or ""
        port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
        if not _TRITON_HOST_RE.fullmatch(host) or endpoint.path not in ("", "/"):
            raise ObjectStoreConfigError(
                f"Triton cannot use CONCH_S3_ENDPOINT_URL={self.endpoint_url!r}: it needs a host name or "
                "IPv4 address, a port and no path."
            )
        return f"s3://{endpoint.scheme}://{host}:{port}/{self.bucket}{tail}"

    def triton_environment(self) -> dict[str, str]:
        """Return AWS_DEFAULT_REGION, plus AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY when configured.

        Without explicit keys Triton's AWS SDK uses its own default chain (e.g. the pod's role),
        which refreshes temporary credentials that a copy here would let expire.
        """
        environment = {"AWS_DEFAULT_REGION": self.region}
        if self._access_key:
            environment["AWS_ACCESS_KEY_ID"] = self._access_key
            environment["AWS_SECRET_ACCESS_KEY"] = self._secret_key
        return environment


# --------------------------------------------------------------------------------------------
# Factories


def build_object_store(
    url: str,
    *,
    endpoint_url: str = "",
    region: str = "",
    access_key: str = "",
    secret_key: str = "",
    **s3_tuning: Any,
) -> ObjectStore:
    """Build the store named by `url`, without reading Django settings.

    `url` is `file:///abs/path` (FileObjectStore) or `s3://bucket/optional/prefix`
    (S3ObjectStore with the given endpoint, region and keys; `s3_tuning` passes
    part_size_bytes, max_concurrency, timeouts). Raises ObjectStoreConfigError for any
    other form, a relative file path, or a missing bucket.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ObjectStoreConfigError(
                f"CONCH_STORAGE_URL={url!r} must name an absolute folder: file:///absolute/path."
            )
        return FileObjectStore(Path(unquote(parts.path)))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ObjectStoreConfigError(f"CONCH_STORAGE_URL={url!r} has no bucket: use s3://bucket/prefix.")
        return S3ObjectStore(
            parts.netloc,
            unquote(parts.path).strip("/"),
            endpoint_url,
            region,
            access_key,
            secret_key,
            **s3_tuning,
        )
    raise ObjectStoreConfigError(
        f"CONCH_STORAGE_URL={url!r} is not supported: use file:///absolute/path or s3://bucket/prefix."
    )


_cache_lock = threading.Lock()
_cached: tuple[tuple[str, ...], ObjectStore] | None = None


def get_object_store() -> ObjectStore:
    """Return the store configured in Django settings (built once per distinct configuration).

    Reads CONCH_STORAGE_URL, CONCH_S3_ENDPOINT_URL, CONCH_S3_REGION, CONCH_S3_ACCESS_KEY_ID,
    CONCH_S3_SECRET_ACCESS_KEY and CONCH_S3_PUBLIC_ENDPOINT_URL at call time, so tests may override them. Raises
    ObjectStoreConfigError when CONCH_STORAGE_URL is missing or malformed.
    """
    from django.conf import settings

    global _cached
    configuration = (
        getattr(settings, "CONCH_STORAGE_URL", "") or "",
        getattr(settings, "CONCH_S3_ENDPOINT_URL", "") or "",
        getattr(settings, "CONCH_S3_REGION", "") or "",
        getattr(settings, "CONCH_S3_ACCESS_KEY_ID", "") or "",
        getattr(settings, "CONCH_S3_SECRET_ACCESS_KEY", "") or "",
        getattr(settings, "CONCH_S3_PUBLIC_ENDPOINT_URL", "") or "",
    )
    if not configuration[0]:
        raise ObjectStoreConfigError("CONCH_STORAGE_URL is not set; see .env.example.")
    with _cache_lock:
        if _cached is None or _cached[0] != configuration:
            url, endpoint_url, region, access_key, secret_key, public_endpoint_url = configuration
            tuning = {"public_endpoint_url": public_endpoint_url} if url.startswith("s3:") else {}
            store = build_object_store(
                url, endpoint_url=endpoint_url, region=region, access_key=access_key, secret_key=secret_key, **tuning
            )
            _cached = (configuration, store)
        return _cached[1]
