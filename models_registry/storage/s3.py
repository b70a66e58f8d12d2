"""The object store in an S3-compatible bucket (AWS S3, MinIO) through boto3 and s3transfer; Triton reads the
repository itself over S3. Only this module of Conch imports boto3, botocore and s3transfer."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import boto3
import s3transfer.exceptions
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.futures import TransferFuture
from s3transfer.manager import TransferConfig as S3TransferConfig
from s3transfer.manager import TransferManager
from s3transfer.subscribers import BaseSubscriber

from conch.errors import ConchError, Conflict, InvalidInput, NotFound, PayloadTooLarge, Unavailable
from models_registry.storage.base import (
    _COPY_BUFFER_BYTES,
    CHECKSUM_CRC32_HEADER,
    CRC32,
    MAX_PARTS,
    MIB,
    MIN_PART_SIZE_BYTES,
    ObjectStore,
    ObjectStoreConfigError,
    ObjectWriter,
    PartTarget,
    StoredObject,
    StoredPart,
    check_key,
    check_prefix,
)

#: The multipart part size of objects Conch writes itself (build repositories, single-request uploads): the
#: writer keeps about (max_concurrency + 1) parts of it in memory. Not the resumable upload's plan, whose part size
#: `models_registry.resumable.plan_parts` chooses.
WRITER_PART_SIZE_BYTES = 8 * MIB
# Parts uploading at once. A writer buffers at most this many parts plus the one it is filling,
# so its memory stays under (DEFAULT_MAX_CONCURRENCY + 1) * part size (32 MiB by default).
DEFAULT_MAX_CONCURRENCY = 3
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 60.0
# Total attempts per request (first try included), botocore "standard" retry mode.
DEFAULT_MAX_ATTEMPTS = 4
# Region sent to S3-compatible servers (MinIO, moto) when none is configured; they accept any.
FALLBACK_REGION = "us-east-1"

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


class _WriterAborted(Exception):
    """Raised inside s3transfer's read of a `_Pipe` whose writer aborted, so that the transfer ends at once."""


class _Pipe:
    """The bytes a writer pushes, read by s3transfer's submission thread as a non-seekable file object.

    It holds at most `capacity` bytes: `put` blocks (back-pressure) until the reader took enough or stopped
    reading (`end_reading`, when the transfer ended), and `read(n)` blocks until it has `n` bytes or the writer
    closed it, because s3transfer takes a short read for the end of the stream (a part under 5 MiB that is not the
    last would be refused). Chunks are kept as they were put, not copied, until read. Every wait is woken by the
    state change it waits for (one condition variable); nothing polls.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._closed = False
        self._aborted = False
        self._reading_ended = False
        self._changed = threading.Condition()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def put(self, data: bytes) -> bool:
        """Append `data` once there is room; returns True. Returns False at once, without taking it, when the reader
        stopped (`end_reading`: the transfer ended, and the caller raises its error) or the pipe was aborted."""
        with self._changed:
            while self._buffered >= self._capacity and not self._aborted and not self._reading_ended:
                self._changed.wait()
            if self._aborted or self._reading_ended:
                return False
            self._chunks.append(data)
            self._buffered += len(data)
            self._changed.notify_all()
            return True

    def end_reading(self) -> None:
        """The reader is gone (the transfer ended: done, failed or cancelled): wake a blocked `put`, refuse more."""
        with self._changed:
            self._reading_ended = True
            self._changed.notify_all()

    def close(self) -> None:
        """End of the stream: a read takes what is left, then gets b""."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def abort(self) -> None:
        """Make the reader's next (or current) read raise _WriterAborted."""
        with self._changed:
            self._aborted = True
            self._chunks.clear()
            self._buffered = 0
            self._changed.notify_all()

    def read(self, amount: int = -1) -> bytes:
        """Return `amount` bytes (all until the end for -1), fewer only at the end of the stream."""
        with self._changed:
            while not self._aborted and not self._closed and (amount < 0 or self._buffered < amount):
                self._changed.wait()
            if self._aborted:
                raise _WriterAborted
            take = self._buffered if amount < 0 else min(amount, self._buffered)
            pieces: list[bytes] = []
            while take:
                chunk = self._chunks.popleft()
                if len(chunk) > take:
                    pieces.append(chunk[:take])
                    self._chunks.appendleft(chunk[take:])
                else:
                    pieces.append(chunk)
                take -= len(pieces[-1])
                self._buffered -= len(pieces[-1])
            self._changed.notify_all()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class _EndReadingWhenDone(BaseSubscriber):
    """s3transfer subscriber that tells the pipe its reader is gone once the transfer is done (in any way)."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe

    def on_done(self, future: TransferFuture, **kwargs: object) -> None:
        self._pipe.end_reading()


class _S3ObjectWriter(ObjectWriter):
    """Streams to one object through s3transfer: an object under one part becomes one PutObject; a larger one
    becomes s3transfer's multipart upload of a non-seekable stream (its own part threads, retries, and the abort
    of the multipart upload when a part fails or the writer aborts).

    Bytes go through a `_Pipe` of one part that s3transfer reads as it sends; with s3transfer keeping at most
    `max_concurrency` parts in memory, a writer holds about (max_concurrency + 2) parts and `write()` blocks
    (back-pressure) rather than buffering more. s3transfer's transfer starts (CreateMultipartUpload) once a whole
    part was written, in its own thread.
    """

    def __init__(self, store: S3ObjectStore, key: str) -> None:
        super().__init__(key)
        self._store = store
        self._object_key = store._object_key(key)
        self._first: list[bytes] = []  # the bytes before the transfer starts (under one part)
        self._first_bytes = 0
        self._pipe: _Pipe | None = None
        self._manager: TransferManager | None = None
        self._future: TransferFuture | None = None

    def _write(self, view: memoryview) -> None:
        if self.size_bytes > MAX_PARTS * self._store.part_size_bytes:
            raise PayloadTooLarge(
                f"Object {self.key!r} needs more than {MAX_PARTS} parts of {self._store.part_size_bytes} bytes; "
                "raise the part size.",
                field="file",
            )
        data = view.obj if isinstance(view.obj, bytes) and view.nbytes == len(view.obj) else view.tobytes()
        if self._pipe is None:
            self._first.append(data)
            self._first_bytes += len(data)
            if self._first_bytes < self._store.part_size_bytes:
                return
            self._start_transfer()
            return
        self._put(data)

    def _start_transfer(self) -> None:
        """Hand the bytes so far to a new s3transfer upload of a non-seekable stream."""
        part = self._store.part_size_bytes
        config = S3TransferConfig(
            multipart_threshold=part,
            multipart_chunksize=part,
            max_request_concurrency=self._store.max_concurrency,
            max_in_memory_upload_chunks=self._store.max_concurrency,
        )
        self._pipe = _Pipe(capacity=part)
        self._manager = TransferManager(self._store._client, config)
        self._future = self._manager.upload(
            self._pipe, self._store.bucket, self._object_key, subscribers=[_EndReadingWhenDone(self._pipe)]
        )
        first, self._first, self._first_bytes = self._first, [], 0
        for data in first:
            self._put(data)

    def _put(self, data: bytes) -> None:
        assert self._pipe is not None and self._future is not None
        if not self._pipe.put(data):
            self._raise_transfer_error()

    def _raise_transfer_error(self) -> None:
        """Raise the transfer's failure as Unavailable (it ended before the writer did)."""
        assert self._future is not None
        try:
            self._future.result()
        except _S3_ERRORS as exc:
            raise self._store._translate(exc, "write", self.key) from exc
        raise Unavailable(f"The upload of {self.key!r} to the object store ended before all of it was written.")

    def _commit(self) -> None:
        if self._pipe is None:
            body = b"".join(self._first)
            self._first = []
            with self._store._errors("write", self.key):
                self._store._client.put_object(Bucket=self._store.bucket, Key=self._object_key, Body=body)
            return
        assert self._future is not None and self._manager is not None
        self._pipe.close()
        try:
            with self._store._errors("write", self.key):
                self._future.result()
        finally:
            self._manager.shutdown()

    def __del__(self) -> None:
        # A writer dropped while open (never committed nor aborted) must not leave s3transfer's thread waiting for
        # bytes for ever: its read raises, and the transfer's clean-up aborts the multipart upload.
        if self._pipe is not None and self._state == "open":
            self._pipe.abort()

    def _abort(self) -> None:
        self._first = []
        if self._pipe is None:
            return
        assert self._future is not None and self._manager is not None
        # The read that s3transfer is waiting in raises, and the transfer's failure clean-up aborts the multipart
        # upload (AbortMultipartUpload) once the parts in flight end: no part is left stored.
        self._pipe.abort()
        self._future.cancel()
        self._manager.shutdown()


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
        part_size_bytes: int = WRITER_PART_SIZE_BYTES,
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
        # Signing-only clients of other endpoints (`presign_object`), one per endpoint.
        self._session, self._config = session, config
        self._signers: dict[str, Any] = {}
        self._signers_lock = threading.Lock()
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
        return io.BufferedReader(_S3BodyReader(response["Body"], key), buffer_size=_COPY_BUFFER_BYTES)

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
        response header (a browser reads it only where the bucket's CORS rule exposes it: docs/uploads.md). With
        `checksum_crc32` the URL signs the headers `x-amz-checksum-crc32` (that value) and
        `x-amz-sdk-checksum-algorithm` (CRC32), botocore's SigV4 `X-Amz-SignedHeaders`
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

    def presign_object(self, key: str, *, method: str, expires_in_s: int, endpoint_url: str = "") -> str | None:
        """Presign GetObject or PutObject of `key` (SigV4 in the query string) for clients that reach the store at
        `endpoint_url` (a SigV4 signature covers the host, so the URL is made by a client of that endpoint; it
        never sends a request itself). Raises ValueError for another `method`."""
        operations = {"GET": "get_object", "PUT": "put_object"}
        if method not in operations:
            raise ValueError(f"presign_object takes GET or PUT, not {method!r}")
        client = self._client_for(endpoint_url.rstrip("/")) if endpoint_url else self._client
        with self._errors("sign a request for", key):
            return str(
                client.generate_presigned_url(
                    operations[method],
                    Params={"Bucket": self.bucket, "Key": self._object_key(key)},
                    ExpiresIn=expires_in_s,
                    HttpMethod=method,
                )
            )

    def _client_for(self, endpoint_url: str) -> Any:
        if endpoint_url == self.endpoint_url:
            return self._client
        with self._signers_lock:
            client = self._signers.get(endpoint_url)
            if client is None:
                client = self._session.client("s3", endpoint_url=endpoint_url, config=self._config)
                self._signers[endpoint_url] = client
            return client

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
            error = exc.response.get("Error", {}) if isinstance(exc, ClientError) else {}
            code = error.get("Code")
            if code in ("EntityTooSmall", "InvalidPart", "InvalidPartOrder"):
                message = error.get("Message", "")
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
