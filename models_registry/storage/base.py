"""The object store's interface: keys, the stored-object values, the streaming writer, and the store's contract.

Implementations: `models_registry.storage.folder` (a local folder) and `models_registry.storage.s3` (an S3 bucket).
Callers use the package (`models_registry.storage`), whose `get_object_store()` picks one from the settings.
"""

from __future__ import annotations

import abc
import base64
import binascii
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Self

from conch.errors import ConchError, InvalidInput, Unavailable

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# S3 rejects multipart parts under 5 MiB (except the last) and uploads of more than 10,000 parts.
MIN_PART_SIZE_BYTES = 5 * MIB
MAX_PARTS = 10_000
# S3's largest part (S3 API reference, "UploadPart"): 5 GiB.
MAX_PART_SIZE_BYTES = 5 * 1024 * MIB
# In-progress files of FileObjectStore writers start with this; they are never listed as keys.
_TEMP_MARKER = ".conch-tmp-"
# Characters of the target file name kept in a temp file's name (the rest of a 255-byte name is mkstemp's).
_TEMP_NAME_CHARS = 100
_MAX_KEY_BYTES = 1024
_COPY_BUFFER_BYTES = 1 * MIB
#: The per-part checksum algorithm a multipart upload may declare, and the header a part's CRC32 travels in
#: (S3 API reference, "Checking object integrity": base64 of the 4 big-endian bytes of the CRC32 of the part).
CRC32 = "CRC32"
CHECKSUM_CRC32_HEADER = "x-amz-checksum-crc32"


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

    def presign_object(self, key: str, *, method: str, expires_in_s: int, endpoint_url: str = "") -> str | None:
        """A URL through which a client without credentials GETs object `key` or PUTs it (`method` "GET" or
        "PUT": the whole object in one request), valid for `expires_in_s` seconds, for a client that reaches the
        store at `endpoint_url` ("" : where Conch reaches it). None for a store clients cannot reach themselves
        (a folder on Conch's disk). Makes no request."""
        return None

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
