"""Streaming of uploaded model files from the HTTP request body straight into the object store.

`ObjectStoreUploadHandler` is a Django upload handler: as Django's multipart parser reads the
body, each chunk of the multipart field `file` goes to `ObjectStore.open_writer(key)`, so the web
process neither keeps the file in memory nor spools it to disk, and SHA-256 and size come out
of the same pass. The size limit (`settings.CONCH_MAX_UPLOAD_BYTES`) is enforced while streaming.

How an upload view uses it with DRF::

    check_content_length(request, max_bytes)          # 413 before reading a byte, when declared
    handler = ObjectStoreUploadHandler(store, key, max_bytes=max_bytes)
    request._request.upload_handlers = [handler]      # before anything touches request.data/POST/FILES
    with handler:                                     # on any error: abort the writer, drop the object
        upload = request.data.get("file")             # a StoredUpload, or None when no file was sent
    stored = upload.stored                            # StoredObject(key, size_bytes, sha256_hex)

DRF's `MultiPartParser` hands the Django request's `upload_handlers` to Django's parser, which is
why the handler goes on `request._request`. Exceptions raised by the handler (PayloadTooLarge,
InvalidInput, Unavailable, or any other) propagate out of `request.data` unchanged: DRF resets
its parsed data and re-raises.

The body must not be parsed before the handler is installed. Django's CSRF check reads
`request.POST` for a POST, and DRF runs that check inside `SessionAuthentication` (during
`initial()`, before the view method); the body would then be parsed by Django's default
handlers (spooled to a temp file) and installing ours raises AttributeError. Upload views
therefore authenticate sessions with `conch.authentication.HeaderCsrfSessionAuthentication`, which takes the
CSRF token from the `X-CSRFToken` header only and leaves the body unread.

This is HTTP plumbing of the API edge, with no rule of its own: the views that stream a body (the version upload and
the rebuild's sample inputs, in the builds app) hand it their checks, heartbeat and quota room. Resumable uploads
(the `uploads` app) send their parts as raw bodies instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO, Self

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopFutureHandlers

from conch.errors import ConchError, InvalidInput, PayloadTooLarge
from conch.limits import describe_bytes

if TYPE_CHECKING:
    from models_registry.storage import ObjectStore, ObjectWriter, StoredObject
    from tenancy.quotas import QuotaRoom

log = logging.getLogger(__name__)

# Bytes Django's parser hands over per call: large chunks keep the parser's per-chunk Python
# work small next to the bytes moved; memory per upload stays a few chunks plus the writer's parts.
UPLOAD_CHUNK_BYTES = 2 * 1024 * 1024
# Room in CONTENT_LENGTH for the multipart framing and the small form fields sent with the file.
MULTIPART_SLACK_BYTES = 1024 * 1024


def _too_large(max_bytes: int, field: str = "file") -> PayloadTooLarge:
    raise_it = "; an administrator can raise it with the CONCH_MAX_UPLOAD_BYTES setting" if field == "file" else ""
    return PayloadTooLarge(
        f"The file in '{field}' is larger than the {describe_bytes(max_bytes)} ({max_bytes} bytes) this endpoint "
        f"accepts{raise_it}.",
        field=field,
    )


def check_content_length(request: Any, max_bytes: int, *, slack_bytes: int = MULTIPART_SLACK_BYTES) -> None:
    """Raise PayloadTooLarge (field `file`) when the declared body size already exceeds the limit.

    `request` is a Django HttpRequest or a DRF Request; its CONTENT_LENGTH (bytes) is compared
    with `max_bytes + slack_bytes`, the slack covering multipart framing and small form fields.
    A missing or malformed CONTENT_LENGTH passes (the streaming check still applies).
    """
    raw = request.META.get("CONTENT_LENGTH") or ""
    try:
        content_length = int(raw)
    except ValueError:
        return
    _check_declared_length(content_length, max_bytes, slack_bytes)


def declared_file_bytes(request: Any, *, slack_bytes: int = MULTIPART_SLACK_BYTES) -> int | None:
    """The least the uploaded file can be, from the request's CONTENT_LENGTH: the body less `slack_bytes` (the
    most the multipart framing and the other fields may take). None when no length was declared or it tells
    nothing (a body within the slack)."""
    raw = request.META.get("CONTENT_LENGTH") or ""
    try:
        content_length = int(raw)
    except ValueError:
        return None
    return content_length - slack_bytes if content_length > slack_bytes else None


def _check_declared_length(content_length: int | None, max_bytes: int, slack_bytes: int) -> None:
    if content_length is not None and content_length > max_bytes + slack_bytes:
        raise _too_large(max_bytes)


class StoredUpload(UploadedFile):
    """The uploaded file as the view sees it: already in the object store.

    `stored` is the StoredObject (key, size_bytes, sha256_hex); `name`, `content_type`, `charset`
    come from the multipart headers (the name sanitised by Django); `size` is in bytes. `open()`
    streams the content back from the store; otherwise nothing is held open.
    """

    def __init__(
        self,
        *,
        store: ObjectStore,
        stored: StoredObject,
        name: str | None,
        content_type: str | None,
        charset: str | None,
        content_type_extra: dict[str, Any] | None,
    ) -> None:
        super().__init__(
            file=None,
            name=name,
            content_type=content_type,
            size=stored.size_bytes,
            charset=charset,
            content_type_extra=content_type_extra,
        )
        self.stored = stored
        self._store = store

    @property
    def key(self) -> str:
        """Object-store key of the content."""
        return self.stored.key

    @property
    def sha256_hex(self) -> str:
        """SHA-256 of the content, 64 lowercase hex digits."""
        return self.stored.sha256_hex

    def open(self, mode: str | None = None) -> StoredUpload:
        """Open a stream over the stored content (read-only). Raises NotFound, Unavailable."""
        if mode not in (None, "rb"):
            raise InvalidInput(f"An uploaded model can only be opened for reading, not {mode!r}.")
        self.close()
        self.file: BinaryIO | None = self._store.open_reader(self.stored.key)
        return self

    def close(self) -> None:
        """Close the stream opened by `open()`, if any (Django closes uploads after each request)."""
        if self.file is not None:
            self.file.close()
            self.file = None

    @property
    def closed(self) -> bool:
        """Whether no stream is open."""
        return self.file is None or self.file.closed


class ObjectStoreUploadHandler(FileUploadHandler):
    """Stream the multipart file field `field_name` (default `file`) into `store` under `key`.

    Must be the request's only upload handler (or the first: it stops the others). Limits and
    errors, all raised out of the parser (so out of DRF's `request.data`):

    - PayloadTooLarge (field `file`) once more than `max_bytes` bytes of the file arrive, or when
      the declared request or part length already exceeds it; the writer is aborted first, so
      no object or partial upload is left;
    - QuotaExceeded (field `storage_bytes`) past the storage `room`, see below;
    - InvalidInput for a file in another field (other than `other_fields`), or a second file;
    - Unavailable when the store fails (the writer aborts itself).

    `file_complete` commits the object and returns a `StoredUpload`; an empty file is still
    stored and returned (size 0) so the view can reject it with a clear message. When the body
    ends in the middle of the file (`upload_interrupted`) the writer is aborted. For errors raised
    outside the handler (a later form field too big, a broken connection), use the handler as a
    context manager around `request.data`, or call `abort()` and delete `key` yourself.

    `heartbeat`, when given, is called as chunks of the file arrive, at most once per
    `heartbeat_interval_s` seconds (the first chunk always beats): the registry records it so the
    sweeper can tell a live upload from one whose web worker died (`touch_upload`). A heartbeat
    that raises is logged and never fails the upload. Note a beat can only come once per chunk
    (2 MiB), so a client slower than 2 MiB per stale bound looks dead.

    `check_name` and `check_head`, when given, refuse another format before a byte is stored: `check_name(filename)`
    runs when the file's part begins, `check_head(head, size_bytes, file_name)` once the first `head_bytes` bytes
    (or the whole file, when shorter; `size_bytes` is then its size, else None) have arrived; those bytes are held
    back until it passes. Whatever they raise (InvalidInput naming the field) aborts the writer and propagates. An
    empty file is not checked (the view refuses it with its own message).

    `room`, when given, is the team's storage quota room: a file whose declared part length, or whose bytes
    received so far, exceed what is free is refused with QuotaExceeded (field `storage_bytes`) as soon as that
    is known, and the writer is aborted. The registry reserves the stored size again when the upload completes.

    Several file fields: list one handler per field, the first with `other_fields` naming the fields the later
    handlers take (it passes their chunks on and refuses any other field); give every handler the body's whole
    allowance in `slack_bytes` beyond its own `max_bytes`, since each one checks the declared body length.
    """

    chunk_size = UPLOAD_CHUNK_BYTES

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        *,
        max_bytes: int,
        field_name: str = "file",
        other_fields: tuple[str, ...] = (),
        slack_bytes: int = MULTIPART_SLACK_BYTES,
        request: Any = None,
        heartbeat: Callable[[], None] | None = None,
        heartbeat_interval_s: float = 5.0,
        room: QuotaRoom | None = None,
        check_name: Callable[[str], None] | None = None,
        check_head: Callable[[bytes, int | None, str], object] | None = None,
        head_bytes: int = 512,
    ) -> None:
        super().__init__(request)
        self.check_name = check_name
        self.check_head = check_head
        self.head_bytes = head_bytes
        self._head: bytes | None = None
        self.room = room
        self.store = store
        self.key = key
        self.max_bytes = max_bytes
        self.expected_field_name = field_name
        self.other_fields = other_fields
        self.slack_bytes = slack_bytes
        self.upload: StoredUpload | None = None
        self._writer: ObjectWriter | None = None
        self._received_bytes = 0
        self._heartbeat = heartbeat
        self._heartbeat_interval_s = heartbeat_interval_s
        self._last_beat: float | None = None

    def handle_raw_input(
        self,
        input_data: Any,
        meta: dict[str, Any],
        content_length: int,
        boundary: bytes,
        encoding: str | None = None,
    ) -> None:
        """Refuse a body whose declared length is over the limit; let Django parse the rest."""
        _check_declared_length(content_length, self.max_bytes, self.slack_bytes)

    def new_file(
        self,
        field_name: str,
        file_name: str,
        content_type: str,
        content_length: int | None,
        charset: str | None = None,
        content_type_extra: dict[str, Any] | None = None,
    ) -> None:
        """Open the store writer for the expected field; leave `other_fields` to later handlers; refuse the rest."""
        if field_name in self.other_fields:
            return
        super().new_file(field_name, file_name, content_type, content_length, charset, content_type_extra)
        if field_name != self.expected_field_name:
            accepted = " and ".join(repr(name) for name in (self.expected_field_name, *self.other_fields))
            raise InvalidInput(
                f"Unexpected file field {field_name!r}; this request takes files in the field(s) {accepted} only.",
                field=field_name,
            )
        if self._writer is not None or self.upload is not None:
            raise InvalidInput(
                f"Send exactly one file in the field {self.expected_field_name!r}.", field=self.expected_field_name
            )
        if content_length is not None and content_length > self.max_bytes:
            raise _too_large(self.max_bytes, self.expected_field_name)
        if content_length is not None and self.room is not None:
            self.room.check(content_length, "this upload needs")
        if self.check_name is not None:
            self.check_name(file_name or "")
        self._received_bytes = 0
        # The first bytes wait here until `check_head` has seen them (b"" while waiting, None once checked).
        self._head = None if self.check_head is None else b""
        self._writer = self.store.open_writer(self.key)
        raise StopFutureHandlers()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        """Write one chunk to the store; over `max_bytes` abort and raise PayloadTooLarge.

        Returns None, which tells Django's parser not to pass the chunk to later handlers; a chunk of a field this
        handler does not take is returned unchanged, for the next handler.
        """
        if self._writer is None:
            return raw_data
        self._received_bytes += len(raw_data)
        if self._received_bytes > self.max_bytes:
            self.abort()
            raise _too_large(self.max_bytes, self.expected_field_name)
        if self.room is not None and self._received_bytes > self.room.free:
            self.abort()
            raise self.room.exceeded(self._received_bytes, "this upload needs at least")
        if self._head is not None:
            self._head += raw_data
            if len(self._head) < self.head_bytes:
                self._beat()
                return None
            raw_data, self._head = self._head, None
            self._run_head_check(raw_data[: self.head_bytes], None)
        self._writer.write(raw_data)
        self._beat()
        return None

    def _beat(self) -> None:
        if self._heartbeat is None:
            return
        now = time.monotonic()
        if self._last_beat is not None and now - self._last_beat < self._heartbeat_interval_s:
            return
        self._last_beat = now
        try:
            self._heartbeat()
        except Exception as error:  # the heartbeat only informs the sweeper; the upload goes on without it
            log.warning("upload.heartbeat_failed", extra={"key": self.key, "error": str(error)})

    def file_complete(self, file_size: int) -> StoredUpload | None:
        """Commit the object and return it as a StoredUpload. Raises Unavailable."""
        if self._writer is None:
            return None
        if self._head:  # a file shorter than `head_bytes`: check it whole, then write it
            head, self._head = self._head, None
            self._run_head_check(head, len(head))
            self._writer.write(head)
        writer, self._writer = self._writer, None
        stored = writer.commit()
        self.upload = StoredUpload(
            store=self.store,
            stored=stored,
            name=self.file_name,
            content_type=self.content_type,
            charset=self.charset,
            content_type_extra=self.content_type_extra,
        )
        return self.upload

    def _run_head_check(self, head: bytes, size_bytes: int | None) -> None:
        """Run `check_head` on the first bytes; abort the writer when it raises."""
        if self.check_head is None:
            return
        try:
            self.check_head(head, size_bytes, self.file_name or "")
        except BaseException:
            self.abort()
            raise

    def upload_interrupted(self) -> None:
        """The body ended inside the file: drop what was written."""
        self.abort()

    def abort(self) -> None:
        """Abort the writer if one is open (no object, no partial upload left). Idempotent.

        An object already committed by `file_complete` is not touched; see `discard()`.
        """
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.abort()
        except ConchError as error:
            log.warning("upload.abort_failed", extra={"key": self.key, "error": error.detail})

    def discard(self) -> None:
        """Abort an open writer and delete the object if it was already committed."""
        self.abort()
        if self.upload is not None:
            self.upload = None
            try:
                self.store.delete(self.key)
            except ConchError as error:
                log.warning("upload.discard_failed", extra={"key": self.key, "error": error.detail})

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is not None:
            self.discard()
