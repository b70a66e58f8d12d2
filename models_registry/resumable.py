"""Resumable uploads: a model file sent part by part into a multipart upload of the object store, then checked.

The life of an `Upload` (API contract: UPLOAD-API in docs/uploads.md, "Resumable uploads"):

1. `start_upload`: the promised size is reserved in the team's storage quota (under the team's lock, before
   anything is started in the store), then the store starts a multipart upload (`ObjectStore.start_multipart`).
2. Parts: with S3 storage `sign_parts` gives presigned UploadPart URLs and the client PUTs the bytes straight to
   the bucket (they never pass through Conch); with folder storage the client PUTs them to Conch, which streams
   them to the store's staging folder (`receive_part`). `stored_parts` lists what the store holds, so a client
   that stopped sends only the rest.
3. `request_completion` checks that the store holds every part at its size and marks the upload `completing`;
   the builds app queues a worker, which joins the parts (`assemble_upload`), checks the joined object's size
   and makes the version (`create_version_from_upload`) with the promised SHA-256 marked unchecked, or fails
   the upload (`fail_upload`: the object is deleted). The version's build checks the SHA-256 on the file it
   downloads (`models_registry.services.check_version_source`): a mismatch fails the version, naming `sha256`.
4. An upload left `uploading` past `expires_at` is aborted by the sweeper (`abort_expired_uploads`); a
   `completing` one whose worker stopped is checked again (`stalled_upload_checks`, `requeue_upload_check`).

Quota: an upload counts `size_bytes` in storage while `uploading` and not expired, and while `completing`; its
version counts the same bytes from the transaction that ends the upload, so nothing is counted twice or missed.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, BinaryIO

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from conch.errors import ConchError, Conflict, InvalidInput, NotFound, PayloadTooLarge
from conch.limits import describe_bytes
from models_registry.choices import PartChecksumAlgorithm, UploadStatus, UploadTransport, VersionStatus
from models_registry.models import ModelVersion, RegisteredModel, Upload
from models_registry.services import allocate_version_number, refuse_duplicate_version
from models_registry.storage import (
    CHECKSUM_CRC32_HEADER,
    MAX_PART_SIZE_BYTES,
    MAX_PARTS,
    MIB,
    MIN_PART_SIZE_BYTES,
    PartTarget,
    StoredObject,
    StoredPart,
    get_object_store,
    is_crc32_base64,
)
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.quotas import reserve_quota
from tenancy.services import TokenGrant, require_role, teams_for_user

log = logging.getLogger(__name__)

#: Part size when the client names none: few enough requests (64 for 1 GiB), little to resend after a dropped
#: connection. bench/upload.py on moto: the worker's CompleteMultipartUpload was fastest with 16 MiB parts (3-5 s
#: for 1 GiB, against 6-9 s with 64 MiB and 8 MiB parts).
DEFAULT_PART_SIZE_BYTES = 16 * MIB
#: Most part numbers one `sign_parts` call takes.
MAX_PARTS_PER_CALL = 100
OPEN_STATUSES = (UploadStatus.UPLOADING, UploadStatus.COMPLETING)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def upload_key(*, model_id: int, upload_id: uuid.UUID | str) -> str:
    """Object-store key the joined file of an upload gets (under the model's folder; the version's `source_key`)."""
    return f"models/{model_id}/uploads/{upload_id}/model.onnx"


def plan_parts(*, size_bytes: int, part_size_bytes: int | None = None) -> tuple[int, int]:
    """Return (part size, part count) for a file of `size_bytes` (> 0) bytes.

    Without `part_size_bytes` the part size is DEFAULT_PART_SIZE_BYTES, or larger (whole MiB) when the file
    would need more than MAX_PARTS parts. A given part size must be 5 MiB to 5 GiB (S3's limits on every part
    but the last) and give at most 10,000 parts. Raises InvalidInput (field `part_size_bytes`).
    """
    if part_size_bytes is None:
        least = math.ceil(size_bytes / MAX_PARTS)
        part_size_bytes = max(DEFAULT_PART_SIZE_BYTES, math.ceil(least / MIB) * MIB)
    elif not MIN_PART_SIZE_BYTES <= part_size_bytes <= MAX_PART_SIZE_BYTES:
        raise InvalidInput(
            f"part_size_bytes must be from {MIN_PART_SIZE_BYTES} (5 MiB) to {MAX_PART_SIZE_BYTES} (5 GiB), got "
            f"{part_size_bytes}; leave it out to let Conch choose.",
            field="part_size_bytes",
        )
    count = math.ceil(size_bytes / part_size_bytes)
    if count > MAX_PARTS:
        raise InvalidInput(
            f"A file of {size_bytes} bytes in parts of {part_size_bytes} bytes needs {count} parts, more than the "
            f"{MAX_PARTS} allowed; use parts of at least {math.ceil(size_bytes / MAX_PARTS)} bytes.",
            field="part_size_bytes",
        )
    return part_size_bytes, count


def part_range(upload: Upload, number: int) -> tuple[int, int]:
    """(first byte, byte after the last) of part `number` (1-based) in the file; the last part may be shorter."""
    start = (number - 1) * upload.part_size_bytes
    return start, min(upload.size_bytes, start + upload.part_size_bytes)


def _expiry() -> datetime:
    return timezone.now() + timedelta(hours=settings.CONCH_UPLOAD_EXPIRES_HOURS)


def _require_writer(*, user: AbstractBaseUser, token: TokenGrant | None, team: Any, action: str) -> None:
    require_role(user=user, team=team, role=Role.DEVELOPER, action=action, token=token, scope=Scope.MODELS_WRITE)


# --- reading ---------------------------------------------------------------------------------


def visible_uploads(*, user: AbstractBaseUser, token: TokenGrant | None = None) -> QuerySet[Upload]:
    """Uploads of models of the caller's teams (of the token's team, for a team-bound token)."""
    teams = teams_for_user(user=user, token=token)
    return Upload.objects.filter(model__team__in=teams).select_related("model__team")


def get_upload(
    *, user: AbstractBaseUser, model_id: int, upload_id: str | uuid.UUID, token: TokenGrant | None = None
) -> Upload:
    """Return upload `upload_id` of model `model_id` if the caller may see it. Raises NotFound."""
    try:
        key = uuid.UUID(str(upload_id))
    except ValueError:
        raise NotFound(f"Upload {upload_id} does not exist or is not in one of your teams.") from None
    upload = visible_uploads(user=user, token=token).filter(pk=key, model_id=model_id).first()
    if upload is None:
        raise NotFound(f"Upload {upload_id} does not exist or is not in one of your teams.")
    return upload


#: A GET that waits for the worker's check (`wait_for_check`) is held at most MAX_WAIT_S seconds: a web thread is held
#: that long, so the bound is short and a client asks again. On PostgreSQL the wait is woken by the worker's
#: NOTIFY on the upload's channel (`_check_channel`); on SQLite (the one-machine demo, which has no server to carry a
#: notification) it looks at the row's status every WAIT_POLL_S seconds.
WAIT_POLL_S = 0.1
MAX_WAIT_S = 10.0


def _check_channel(upload_id: uuid.UUID | str) -> str:
    """The PostgreSQL NOTIFY channel on which the end of an upload's check is announced: `conch_upload_<32 hex>` (an
    identifier of 45 characters; PostgreSQL allows 63)."""
    return f"conch_upload_{uuid.UUID(str(upload_id)).hex}"


def _announce_check_end(upload_id: uuid.UUID | str) -> None:
    """Wake the requests waiting for this upload's check (`wait_for_check`). Call inside the transaction that moves
    the upload out of `completing`: PostgreSQL delivers a NOTIFY when that transaction commits, and never when it
    rolls back (PostgreSQL docs, "NOTIFY"). Nothing on SQLite, whose waiters look at the row themselves."""
    db = transaction.get_connection()
    if db.vendor == "postgresql":
        with db.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [_check_channel(upload_id)])


def wait_for_check(*, upload: Upload, wait_s: float) -> Upload:
    """The upload once it has left `completing` (the worker's check ended: `completed` naming its version, or
    `failed`), else as it is after `wait_s` seconds (at most MAX_WAIT_S); at once when it is not `completing`.

    For a client waiting for the check (a long poll): one request where it would send many, answered as soon as the
    worker commits. On PostgreSQL the request LISTENs on the upload's channel on a connection of its own and reads
    the row twice (once after LISTEN, so a check that ended just before is not missed, and once at the end), not in a
    loop; on SQLite it reads the status every WAIT_POLL_S seconds.
    """
    if upload.status != UploadStatus.COMPLETING:
        return upload
    timeout = min(max(wait_s, 0.0), MAX_WAIT_S)
    db = transaction.get_connection()
    if db.vendor == "postgresql":
        _listen_for_check_end(db, upload.pk, timeout)
    else:
        deadline = time.monotonic() + timeout
        while _still_completing(upload.pk) and time.monotonic() < deadline:
            time.sleep(min(WAIT_POLL_S, max(deadline - time.monotonic(), 0.0)))
    upload.refresh_from_db()
    return upload


def _still_completing(upload_id: Any) -> bool:
    return Upload.objects.filter(pk=upload_id).values_list("status", flat=True).first() == UploadStatus.COMPLETING


def _listen_for_check_end(db: Any, upload_id: Any, timeout_s: float) -> None:
    """Wait up to `timeout_s` seconds for the NOTIFY that ends the upload's check, on a new connection made with the
    request's own database settings (a LISTEN inside the request's transaction would hear nothing until it ends)."""
    listener = db.get_new_connection(db.get_connection_params())
    try:
        listener.autocommit = True
        listener.execute(f"LISTEN {_check_channel(upload_id)}")
        if not _still_completing(upload_id):
            return
        for _notice in listener.notifies(timeout=timeout_s, stop_after=1):
            return
    finally:
        listener.close()


def open_uploads(
    *,
    model: RegisteredModel,
    filename: str | None = None,
    size_bytes: int | None = None,
    head_sha256: str | None = None,
) -> QuerySet[Upload]:
    """The model's uploads still `uploading` (not expired) or `completing`, oldest first.

    Each of `filename`, `size_bytes` and `head_sha256` (hex SHA-256 of the first bytes the start carried), when
    given, keeps only the uploads that have it: how a client that lost its record of an upload finds the one of
    the file it holds. `head_sha256` is compared lower-cased; an upload started without a head never matches one.
    """
    now = timezone.now()
    uploads = Upload.objects.filter(model=model).filter(
        Q(status=UploadStatus.UPLOADING, expires_at__gt=now) | Q(status=UploadStatus.COMPLETING)
    )
    if filename is not None:
        uploads = uploads.filter(filename=filename)
    if size_bytes is not None:
        uploads = uploads.filter(size_bytes=size_bytes)
    if head_sha256 is not None:
        uploads = uploads.filter(head_sha256=head_sha256.lower()).exclude(head_sha256="")
    return uploads.select_related("model__team").order_by("created_at", "pk")


def stored_parts(*, upload: Upload) -> list[StoredPart]:
    """The parts the store holds of an `uploading` upload, by number ([] in any other status).

    Raises Unavailable when the store cannot be reached.
    """
    if upload.status != UploadStatus.UPLOADING or not upload.store_upload_id:
        return []
    try:
        return get_object_store().list_parts(upload.object_key, upload.store_upload_id)
    except NotFound:
        return []


# --- starting ----------------------------------------------------------------------------------


def start_upload(
    *,
    user: AbstractBaseUser,
    model: RegisteredModel,
    filename: str,
    size_bytes: int,
    sha256: str,
    part_size_bytes: int | None = None,
    build_options: dict[str, Any] | None = None,
    head_sha256: str = "",
    part_checksum_algorithm: str | None = None,
    token: TokenGrant | None = None,
    allow_duplicate: bool = False,
) -> tuple[Upload, bool]:
    """Start a resumable upload of a file into `model`; return (upload, whether it is new).

    With a `sha256` that already is a live version's of the model, the start is refused (Duplicate, 409 naming
    `sha256` with `existing_version`: `refuse_duplicate_version`) unless `allow_duplicate`, which the upload keeps
    (its completion and the worker's check then let the file through too).
    `part_checksum_algorithm` "CRC32": every part's URL is then given only with the part's CRC32 (`sign_parts`),
    and the store checks each part against it as it arrives; None or "": parts go without checksums. An open
    upload of the same file is given back whatever algorithm it has when CRC32 is asked for (a client that can send
    checksums can also send none: it reads the upload's `part_checksum_algorithm`), but one with CRC32 is not given
    back to a start without it (a client that sends no checksums could not finish it).

    `build_options` are already validated (the builds app parses them). The same model, filename, size and
    SHA-256 while an upload of them is `uploading` gives that upload back (new: False), so a client re-run
    resumes. `sha256` may be "": it is then promised at completion (`request_completion`), so a client hashes the
    file while it sends the parts; such a start always makes a new upload, and a later start of the same filename
    and size with a SHA-256 takes that open upload over (its parts are the same file's unless the file changed,
    which the build's SHA-256 check of the joined file finds), unless both starts carried the file's first bytes
    and their digests differ (`head_sha256`, hex SHA-256 of those bytes: stored, so `open_uploads` finds the upload
    again). Otherwise the size is reserved in the team's storage
    quota under the team's lock, and only then is the multipart upload started in the store. Raises Forbidden
    (role developer, token scope `models:write`), InvalidInput naming `filename`, `size_bytes`, `sha256`,
    `part_size_bytes` or `part_checksum_algorithm`, PayloadTooLarge (field `size_bytes`) over
    CONCH_MAX_UPLOAD_BYTES, Conflict when the model is being deleted, QuotaExceeded (field `storage_bytes`),
    Unavailable when the store cannot be reached (the upload is then aborted).
    """
    _require_writer(user=user, token=token, team=model.team, action="Uploading a model version")
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name or len(name) > 255 or any(ord(char) < 32 for char in name):
        raise InvalidInput(
            "filename must be the file's name: 1 to 255 characters, no control characters.", field="filename"
        )
    digest = _check_sha256(sha256, required=False)
    algorithm = part_checksum_algorithm or ""
    if algorithm and algorithm not in PartChecksumAlgorithm.values:
        raise InvalidInput(
            f"part_checksum_algorithm must be {' or '.join(map(repr, PartChecksumAlgorithm.values))} (each part sent "
            f"with its CRC32), or null to send parts without checksums; got {algorithm!r}.",
            field="part_checksum_algorithm",
        )
    max_bytes = settings.CONCH_MAX_UPLOAD_BYTES
    if size_bytes > max_bytes:
        raise PayloadTooLarge(
            f"size_bytes {size_bytes} is larger than the {describe_bytes(max_bytes)} ({max_bytes} bytes) a model file "
            "may be; an administrator can raise it with the CONCH_MAX_UPLOAD_BYTES setting.",
            field="size_bytes",
        )
    if size_bytes < 1:
        raise InvalidInput(
            "size_bytes must be the file's size in bytes, at least 1 (the file is empty).", field="size_bytes"
        )
    part_size, part_count = plan_parts(size_bytes=size_bytes, part_size_bytes=part_size_bytes)
    store = get_object_store()
    now = timezone.now()
    with transaction.atomic():
        locked = RegisteredModel.objects.select_for_update().select_related("team").filter(pk=model.pk).first()
        if locked is None or locked.deletion_requested_at is not None:
            raise Conflict(f"Model '{model.name}' is being deleted; register it again to upload.", field="model")
        refuse_duplicate_version(
            model=locked, sha256=digest, allow_duplicate=allow_duplicate, build_options=build_options
        )
        same = Upload.objects.filter(
            model=locked, filename=name, size_bytes=size_bytes, status=UploadStatus.UPLOADING, expires_at__gt=now
        ).exclude(store_upload_id="")
        if not algorithm:
            same = same.filter(part_checksum_algorithm="")
        existing = same.filter(sha256=digest).order_by("-created_at").first() if digest else None
        takeable = same.filter(sha256="")
        if head_sha256:  # a start whose first bytes differ is another file
            takeable = takeable.filter(Q(head_sha256="") | Q(head_sha256=head_sha256))
        unhashed = takeable.order_by("-created_at").first() if digest and existing is None else None
        if unhashed is not None:  # started without its SHA-256 (the client stopped before completing): take it over
            Upload.objects.filter(pk=unhashed.pk).update(sha256=digest)
            unhashed.sha256 = digest
            existing = unhashed
        if existing is not None:
            if allow_duplicate and not existing.allow_duplicate:
                Upload.objects.filter(pk=existing.pk).update(allow_duplicate=True)
                existing.allow_duplicate = True
            return existing, False
        reserve_quota(team=locked.team, requested={"storage_bytes": size_bytes}, what="this upload")
        upload_id = uuid.uuid4()
        upload = Upload.objects.create(
            id=upload_id,
            model=locked,
            filename=name,
            size_bytes=size_bytes,
            sha256=digest,
            head_sha256=head_sha256,
            part_size_bytes=part_size,
            part_count=part_count,
            transport=store.transport,
            object_key=upload_key(model_id=locked.pk, upload_id=upload_id),
            build_options=dict(build_options or {}),
            allow_duplicate=allow_duplicate,
            part_checksum_algorithm=algorithm,
            expires_at=_expiry(),
            created_by=user,
        )
        record_audit(
            action=AuditAction.UPLOAD_STARTED,
            team=locked.team,
            target=upload,
            after={
                "filename": name,
                "size_bytes": size_bytes,
                "sha256": digest,
                "part_count": part_count,
                "part_checksum_algorithm": algorithm,
            },
        )
    try:
        store_upload_id = store.start_multipart(upload.object_key, checksum_algorithm=algorithm)
    except ConchError as error:
        _end(upload.pk, UploadStatus.ABORTED, error=f"The object store could not start the upload: {error.detail}")
        raise
    Upload.objects.filter(pk=upload.pk).update(store_upload_id=store_upload_id)
    upload.store_upload_id = store_upload_id
    log.info("upload.started", extra={"upload_id": str(upload.pk), "size_bytes": size_bytes, "parts": part_count})
    return upload, True


# --- parts ------------------------------------------------------------------------------------


def _require_uploading(upload: Upload) -> None:
    if upload.status != UploadStatus.UPLOADING:
        raise Conflict(
            f"This upload is '{upload.status}', it takes no more parts"
            + (f" ({upload.error})" if upload.error else "")
            + "; start a new upload with POST /api/v1/models/{id}/uploads/ if you still need one.",
            field="status",
        )
    if upload.expires_at <= timezone.now():
        raise Conflict(
            f"This upload expired at {upload.expires_at.isoformat()} (no part for CONCH_UPLOAD_EXPIRES_HOURS); its "
            "parts are being discarded. Start a new upload with POST /api/v1/models/{id}/uploads/.",
            field="expires_at",
        )


def _check_number(upload: Upload, number: Any) -> int:
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= upload.part_count:
        last = upload.size_bytes - (upload.part_count - 1) * upload.part_size_bytes
        raise InvalidInput(
            f"Part number {number!r} is out of range: this upload has parts 1 to {upload.part_count} "
            f"({upload.part_size_bytes} bytes each, the last {last}).",
            field="number",
        )
    return number


def _extend(upload: Upload) -> None:
    """Push the expiry of an upload that is being worked on."""
    upload.expires_at = _expiry()
    Upload.objects.filter(pk=upload.pk, status=UploadStatus.UPLOADING).update(expires_at=upload.expires_at)


def part_checksums(upload: Upload, numbers: Sequence[int], checksums: Mapping[str, Any] | None) -> dict[int, str]:
    """Check the client's per-part checksums of parts `numbers` and return them as {number: CRC32 base64}.

    `checksums` maps a part number (as a string: a JSON object's key) to the base64 of the 4 big-endian bytes of
    the CRC32 of the part's bytes (`zlib.crc32`). An upload with `part_checksum_algorithm` CRC32 needs one for every
    number asked for; an upload without takes none ({} back). Raises InvalidInput naming `checksums.<n>` (missing,
    malformed, or for a part not asked for) or `checksums` (sent to an upload without the algorithm).
    """
    given = dict(checksums or {})
    if not upload.part_checksum_algorithm:
        if given:
            raise InvalidInput(
                "This upload was started without part_checksum_algorithm, so its parts go without checksums; leave "
                "checksums out (or start a new upload with part_checksum_algorithm CRC32).",
                field="checksums",
            )
        return {}
    asked = {str(number) for number in numbers}
    for key in given:
        if key not in asked:
            raise InvalidInput(
                f"checksums names part {key!r}, which numbers does not ask for; send a checksum for each part in "
                "numbers, and only those.",
                field=f"checksums.{key}",
            )
    result = {}
    for number in numbers:
        value = given.get(str(number))
        if not is_crc32_base64(value):
            start, end = part_range(upload, number)
            got = "none" if value is None else repr(value)
            raise InvalidInput(
                f"This upload checks each part's CRC32 (part_checksum_algorithm {upload.part_checksum_algorithm}): "
                f'send checksums {{"{number}": "<base64 of the 4 big-endian bytes of the CRC32 of bytes {start} to '
                f'{end - 1} of the file>"}}, 8 characters (Python: base64.b64encode(zlib.crc32(part).to_bytes(4, '
                f'"big"))); got {got}.',
                field=f"checksums.{number}",
            )
        result[number] = value
    return result


def sign_parts(
    *,
    user: AbstractBaseUser,
    upload: Upload,
    numbers: Sequence[int],
    checksums: Mapping[str, Any] | None = None,
    token: TokenGrant | None = None,
) -> list[PartTarget | None]:
    """Return where the client sends each of parts `numbers`: a presigned URL (S3), or None for Conch's own.

    Up to MAX_PARTS_PER_CALL distinct numbers from 1 to `part_count`. For an upload with `part_checksum_algorithm`
    CRC32, `checksums` gives each part's CRC32 (`part_checksums`), and each S3 target signs it into its URL and
    `headers` (`x-amz-checksum-crc32`, `x-amz-sdk-checksum-algorithm`), which the client sends with the bytes.
    Makes no request to the store; pushes the upload's expiry. Raises Forbidden, InvalidInput (field `numbers`,
    `checksums` or `checksums.<n>`), Conflict when the upload is not `uploading` or has expired (field
    `expires_at`).
    """
    _require_writer(user=user, token=token, team=upload.model.team, action="Uploading a model version")
    _require_uploading(upload)
    if not numbers or len(numbers) > MAX_PARTS_PER_CALL:
        raise InvalidInput(f"numbers must list 1 to {MAX_PARTS_PER_CALL} part numbers.", field="numbers")
    if len(set(numbers)) != len(numbers):
        raise InvalidInput("numbers lists a part number twice; list each part once.", field="numbers")
    for number in numbers:
        try:
            _check_number(upload, number)
        except InvalidInput as error:
            raise InvalidInput(error.detail, field="numbers") from None
    crcs = part_checksums(upload, numbers, checksums)
    if not upload.store_upload_id:
        raise Conflict("This upload is still starting in the object store; ask again in a moment.", field="status")
    store = get_object_store()
    expires_in_s = settings.CONCH_UPLOAD_PART_URL_SECONDS
    targets = [
        store.presign_part(
            upload.object_key,
            upload.store_upload_id,
            number,
            expires_in_s=expires_in_s,
            checksum_crc32=crcs.get(number, ""),
        )
        for number in numbers
    ]
    _extend(upload)
    return targets


def conch_part_headers(upload: Upload, number: int, checksums: Mapping[str, Any] | None) -> dict[str, str]:
    """Headers a client sends with part `number` of a folder-storage upload (to Conch's own part URL): the
    content type, and the part's `x-amz-checksum-crc32` (from `checksums`, already checked by `sign_parts`) for
    an upload with `part_checksum_algorithm`."""
    headers = {"Content-Type": "application/octet-stream"}
    if upload.part_checksum_algorithm and checksums:
        headers[CHECKSUM_CRC32_HEADER] = checksums[str(number)]
    return headers


def receive_part(
    *,
    user: AbstractBaseUser,
    upload: Upload,
    number: int,
    stream: BinaryIO,
    content_length: int | None,
    checksum_crc32: str | None = None,
    token: TokenGrant | None = None,
) -> StoredPart:
    """Stream part `number` of a folder-storage upload from `stream` (the request body) into the store.

    The body must be exactly the part's bytes (`content_length`, the declared Content-Length): the part size, or
    what is left for the last part. `checksum_crc32` is the request's `x-amz-checksum-crc32` header (None when it
    has none): required for an upload with `part_checksum_algorithm` CRC32, checked whenever sent; bytes with
    another CRC32 are not kept (an earlier copy of the part, and the other parts, stay). Raises NotFound for an
    upload straight to the bucket (its parts go to S3), Forbidden, Conflict (not `uploading`, expired),
    InvalidInput naming `number` (out of range), `size_bytes` (a length that is not the part's, or a body that
    ends early), `checksums.<number>` (the header missing or malformed) or `parts[<number>]` (a CRC32 mismatch:
    send the part again), Unavailable when the disk fails.
    """
    _require_writer(user=user, token=token, team=upload.model.team, action="Uploading a model version")
    if upload.transport != UploadTransport.CONCH:
        raise NotFound(
            "This upload goes straight to the bucket: PUT its parts to the URLs POST .../parts/ gives.", field="number"
        )
    _require_uploading(upload)
    _check_number(upload, number)
    start, end = part_range(upload, number)
    expected = end - start
    if content_length != expected:
        sent = "no Content-Length" if content_length is None else f"{content_length} bytes"
        raise InvalidInput(
            f"Part {number} must be exactly {expected} bytes (bytes {start} to {end - 1} of the file); this request "
            f"sends {sent}. Send that slice of the file as the body, with its Content-Length.",
            field="size_bytes",
        )
    if checksum_crc32 is not None or upload.part_checksum_algorithm:
        if not is_crc32_base64(checksum_crc32):
            got = "none" if checksum_crc32 is None else repr(checksum_crc32)
            raise InvalidInput(
                f"Part {number} needs the {CHECKSUM_CRC32_HEADER} header its part URL gave (POST .../parts/ with its "
                f"checksum): base64 of the 4 big-endian bytes of the CRC32 of the part's bytes; got {got}.",
                field=f"checksums.{number}",
            )
    part = get_object_store().write_part(
        upload.object_key, upload.store_upload_id, number, stream, expected, checksum_crc32=checksum_crc32 or ""
    )
    _extend(upload)
    return part


# --- completing --------------------------------------------------------------------------------


def _check_parts(upload: Upload, parts: list[StoredPart], client_parts: Sequence[dict[str, Any]] | None) -> None:
    by_number = {part.number: part for part in parts}
    for number in range(1, upload.part_count + 1):
        part = by_number.get(number)
        if part is None:
            raise Conflict(
                f"Part {number} of {upload.part_count} is missing from the object store; send it (POST .../parts/ "
                "gives its URL), then complete again.",
                field="parts",
            )
        start, end = part_range(upload, number)
        if part.size_bytes != end - start:
            raise Conflict(
                f"Part {number} holds {part.size_bytes} bytes in the object store; it must hold {end - start} (bytes "
                f"{start} to {end - 1} of the file). Send part {number} again, then complete again.",
                field="parts",
            )
    for given in client_parts or ():
        number, etag = given.get("number"), str(given.get("etag") or "")
        if not isinstance(number, int) or not 1 <= number <= upload.part_count:
            raise InvalidInput(
                f"parts names part {number!r}, which this upload does not have: its parts are 1 to "
                f"{upload.part_count}. Send the numbers and ETags of those parts, or no `parts` at all.",
                field="parts",
            )
        stored = by_number.get(number)
        if stored is not None and etag and etag.strip('"') != stored.etag.strip('"'):
            raise Conflict(
                f"Part {number} in the object store has ETag {stored.etag}, not {etag}: another copy of the part "
                "arrived last. Send it again, then complete again.",
                field="parts",
            )


def _check_sha256(sha256: str | None, *, required: bool) -> str:
    """The SHA-256 in lowercase hex ("" when none was sent and none is required). Raises InvalidInput (field
    `sha256`) for anything but 64 hex digits, or for none when `required`."""
    digest = (sha256 or "").strip().lower()
    if (digest or required) and not _SHA256_RE.fullmatch(digest):
        raise InvalidInput("sha256 must be the file's SHA-256 as 64 hex digits (sha256sum FILE).", field="sha256")
    return digest


def request_completion(
    *,
    user: AbstractBaseUser,
    upload: Upload,
    client_parts: Sequence[dict[str, Any]] | None = None,
    sha256: str | None = None,
    token: TokenGrant | None = None,
    allow_duplicate: bool = False,
) -> Upload:
    """Check that the store holds every part at its size, and mark the upload `completing` for a worker.

    `sha256` is the file's SHA-256: required when the start left it out (InvalidInput naming `sha256`), and when
    sent for an upload that has one, it must be the same (InvalidInput naming `sha256`: the file changed).

    A file that already is a live version of the model is refused (Duplicate, 409 naming `sha256` with
    `existing_version`) unless `allow_duplicate` here or at the start; the upload then stays `uploading` with every
    part and no SHA-256 recorded, so the client completes again with `allow_duplicate` or aborts it (else the
    sweeper aborts it when it expires). `allow_duplicate` is kept on the upload for the worker's check.

    The caller queues the worker's check (`builds`) in the same transaction. `client_parts`, when given, are
    the client's `{"number", "etag"}`: an ETag that differs from the store's refuses the completion. Asking
    again while `completing` changes nothing. Raises Forbidden, Conflict naming `parts` (the first missing part,
    a part of the wrong size or another ETag), `status` or `expires_at`, InvalidInput (field `parts`) for a client
    part number the upload does not have, Unavailable when the store cannot be reached.
    """
    _require_writer(user=user, token=token, team=upload.model.team, action="Uploading a model version")
    if upload.status == UploadStatus.COMPLETING:
        return upload
    _require_uploading(upload)
    digest = _check_sha256(sha256, required=not upload.sha256)
    if digest and upload.sha256 and digest != upload.sha256:
        raise InvalidInput(
            f"sha256 {digest} is not the {upload.sha256} this upload was started with: the file changed while it was "
            "sent. Abort this upload and upload the file again.",
            field="sha256",
        )
    allow = allow_duplicate or upload.allow_duplicate
    refuse_duplicate_version(
        model=upload.model,
        sha256=upload.sha256 or digest,
        allow_duplicate=allow,
        build_options=upload.build_options,
    )
    parts = stored_parts(upload=upload)
    _check_parts(upload, parts, client_parts)
    with transaction.atomic():
        locked = Upload.objects.select_for_update(of=("self",)).select_related("model__team").get(pk=upload.pk)
        if locked.status == UploadStatus.COMPLETING:
            return locked
        _require_uploading(locked)
        locked.status = UploadStatus.COMPLETING
        locked.sha256 = locked.sha256 or digest
        locked.allow_duplicate = locked.allow_duplicate or allow
        locked.heartbeat_at = timezone.now()
        locked.check_started_at = None
        locked.save(update_fields=["status", "sha256", "allow_duplicate", "heartbeat_at", "check_started_at"])
        record_audit(
            action=AuditAction.UPLOAD_COMPLETION_REQUESTED,
            team=locked.model.team,
            target=locked,
            before={"status": UploadStatus.UPLOADING},
            after={"status": locked.status, "parts": upload.part_count},
        )
    return locked


def claim_upload_check(*, upload_id: uuid.UUID | str, stale_before: datetime) -> Upload | None:
    """Take the check of a `completing` upload for this worker (heartbeat now) and return it.

    None when it is not `completing` any more, or another worker holds it (heartbeat at or after
    `stale_before`): a duplicate message must not check it twice at once.
    """
    with transaction.atomic():
        upload = (
            Upload.objects.select_for_update(of=("self",)).select_related("model__team").filter(pk=upload_id).first()
        )
        if upload is None or upload.status != UploadStatus.COMPLETING:
            return None
        if upload.check_started_at is not None and upload.heartbeat_at and upload.heartbeat_at >= stale_before:
            log.warning("upload.check.busy", extra={"upload_id": str(upload_id)})
            return None
        upload.check_started_at = upload.heartbeat_at = timezone.now()
        upload.save(update_fields=["check_started_at", "heartbeat_at"])
    return upload


def release_upload_check(*, upload_id: uuid.UUID | str) -> None:
    """Give the check back after a transient failure (the store unreachable): the sweeper queues it again."""
    Upload.objects.filter(pk=upload_id, status=UploadStatus.COMPLETING).update(check_started_at=None)


def assemble_upload(*, upload: Upload) -> StoredObject:
    """Join the upload's parts into its object and check the object's size against the promise.

    Run by a worker. The SHA-256 is not read back here: the returned StoredObject carries the promised one, and
    the version made from it is marked unchecked (`ModelVersion.source_checked`), so its build hashes the file it
    downloads anyway (`models_registry.services.check_version_source`) — one read of the object instead of two.
    Idempotent: an upload the store already joined is only checked. Raises InvalidInput naming `size_bytes`
    (expected and got, and what to do) or `parts` (the store refused them, or they are gone) — permanent: fail
    the upload —, Unavailable when the store cannot be reached (transient).
    """
    store = get_object_store()
    try:
        parts = store.list_parts(upload.object_key, upload.store_upload_id)
    except NotFound:
        if not store.exists(upload.object_key):
            raise InvalidInput(
                "The upload's parts are no longer in the object store; upload the file again.", field="parts"
            ) from None
        parts = None
    if parts is not None:
        try:
            store.complete_multipart(upload.object_key, upload.store_upload_id, parts[: upload.part_count])
        except NotFound:
            raise InvalidInput(
                "The upload's parts are no longer in the object store; upload the file again.", field="parts"
            ) from None
    try:
        size = store.size(upload.object_key)
    except NotFound:
        raise InvalidInput(
            "The joined file is no longer in the object store; upload the file again.", field="parts"
        ) from None
    if size != upload.size_bytes:
        raise InvalidInput(
            f"The joined file is {size} bytes, not the {upload.size_bytes} bytes promised (size_bytes): expected "
            f"{upload.size_bytes}, got {size}. Check the file and upload it again.",
            field="size_bytes",
        )
    return StoredObject(key=upload.object_key, size_bytes=size, sha256_hex=upload.sha256)


def _drop_from_store(upload: Upload, *, delete_object: bool) -> bool:
    """Abort the store's upload (and delete the joined object); False when the store failed (logged)."""
    store = get_object_store()
    try:
        if upload.store_upload_id:
            store.abort_multipart(upload.object_key, upload.store_upload_id)
        if delete_object:
            store.delete(upload.object_key)
    except ConchError as error:
        log.warning("upload.store_cleanup_failed", extra={"upload_id": str(upload.pk), "error": error.detail})
        return False
    return True


def _end(upload_id: Any, status: str, *, error: str = "", field: str = "", reason: str = "") -> bool:
    """Move an open upload to `status` (failed, aborted), audited; False when it had left the open statuses."""
    with transaction.atomic():
        upload = (
            Upload.objects.select_for_update(of=("self",)).select_related("model__team").filter(pk=upload_id).first()
        )
        if upload is None or upload.status not in OPEN_STATUSES:
            return False
        before = upload.status
        upload.status = status
        upload.error = error
        upload.error_field = field
        upload.finished_at = timezone.now()
        upload.save(update_fields=["status", "error", "error_field", "finished_at"])
        if before == UploadStatus.COMPLETING:
            _announce_check_end(upload.pk)
        record_audit(
            action=AuditAction.UPLOAD_FAILED if status == UploadStatus.FAILED else AuditAction.UPLOAD_ABORTED,
            team=upload.model.team,
            target=upload,
            before={"status": before},
            after={"status": status, "error": error.splitlines()[0] if error else "", "reason": reason},
        )
    return True


def fail_upload(*, upload_id: uuid.UUID | str, error: str, field: str) -> None:
    """Mark an open upload `failed` with `error` naming `field`, and delete its object and parts from the store.

    Its quota reservation ends with the status. A store that fails leaves the object behind (logged).
    """
    upload = Upload.objects.filter(pk=upload_id).first()
    if upload is None:
        return
    if _end(upload_id, UploadStatus.FAILED, error=error, field=field, reason="check failed"):
        _drop_from_store(upload, delete_object=True)
        log.warning("upload.failed", extra={"upload_id": str(upload_id), "field": field})


def create_version_from_upload(*, upload_id: uuid.UUID | str, stored: StoredObject) -> ModelVersion | None:
    """Make the model's next version from a joined upload, `queued` for build attempt 1, and end the upload.

    Call inside the transaction that queues the build (`builds`). The version is recorded as an ordinary
    upload records it (source key, filename, size, the upload's build options), with the promised SHA-256
    marked unchecked (`source_checked` False: its build checks it); the upload becomes
    `completed` and names it. The storage quota was reserved when the upload started: the version's bytes are
    counted from the same commit that ends the upload's reservation. Returns None when the upload is not
    `completing` any more (another worker finished it). Raises Conflict (field `model`) when the model is being
    deleted, Duplicate (field `sha256`) when, the upload not allowing it, its file already is a live version of
    the model: the start and the completion checked that, but two identical uploads completed at once pass both
    checks; under the model's lock the first to get here makes its version and the second is refused (the caller
    fails it, deleting its object; its error names the version that won).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("create_version_from_upload must run inside the transaction that queues the build")
    upload = Upload.objects.select_for_update(of=("self",)).filter(pk=upload_id).first()
    if upload is None or upload.status != UploadStatus.COMPLETING:
        return None
    model = RegisteredModel.objects.select_for_update().select_related("team").get(pk=upload.model_id)
    if model.deletion_requested_at is not None:
        raise Conflict(f"Model '{model.name}' is being deleted; no version is made from this upload.", field="model")
    refuse_duplicate_version(
        model=model,
        sha256=upload.sha256,
        allow_duplicate=upload.allow_duplicate,
        build_options=upload.build_options,
        otherwise="this upload made no version and its file was deleted (to make another version from the same file, "
        "upload it again with allow_duplicate: true)",
    )
    number = allocate_version_number(model=model)
    version = ModelVersion.objects.create(
        model=model,
        number=number,
        status=VersionStatus.QUEUED,
        source_key=stored.key,
        source_filename=upload.filename,
        source_size_bytes=stored.size_bytes,
        source_sha256=stored.sha256_hex,
        source_checked=False,
        build_options=upload.build_options,
        build_attempt=1,
        heartbeat_at=timezone.now(),
        created_by=upload.created_by,
    )
    upload.status = UploadStatus.COMPLETED
    upload.version = version
    upload.finished_at = timezone.now()
    upload.save(update_fields=["status", "version", "finished_at"])
    _announce_check_end(upload.pk)
    record_audit(action=AuditAction.VERSION_CREATED, team=model.team, target=version, after={"upload": str(upload.pk)})
    record_audit(
        action=AuditAction.VERSION_UPLOADED,
        team=model.team,
        target=version,
        after={
            "status": version.status,
            "filename": version.source_filename,
            "size_bytes": version.source_size_bytes,
            "sha256": version.source_sha256,
            "attempt": version.build_attempt,
        },
    )
    record_audit(
        action=AuditAction.UPLOAD_COMPLETED,
        team=model.team,
        target=upload,
        before={"status": UploadStatus.COMPLETING},
        after={"status": upload.status, "version": version.pk},
    )
    log.info("upload.completed", extra={"upload_id": str(upload.pk), "version_id": version.pk})
    return version


# --- aborting and sweeping ---------------------------------------------------------------------------


def abort_upload(*, user: AbstractBaseUser, upload: Upload, token: TokenGrant | None = None) -> None:
    """Abort an `uploading` upload: the store drops its parts, the quota reservation ends.

    An upload already aborted or failed is left as it is (no error). Raises Forbidden, Conflict (field
    `status`) while `completing` or once `completed`, Unavailable when the store cannot be reached (the upload
    stays `uploading`; send the DELETE again).
    """
    _require_writer(user=user, token=token, team=upload.model.team, action="Aborting an upload")
    if upload.status in (UploadStatus.ABORTED, UploadStatus.FAILED):
        return
    if upload.status != UploadStatus.UPLOADING:
        raise Conflict(
            f"This upload is '{upload.status}' and can no longer be aborted"
            + ("; delete its version instead." if upload.status == UploadStatus.COMPLETED else "; wait for its check."),
            field="status",
        )
    if upload.store_upload_id:
        get_object_store().abort_multipart(upload.object_key, upload.store_upload_id)
    _end(upload.pk, UploadStatus.ABORTED, error="Aborted by its client.", reason="aborted by its client")


def abort_expired_uploads(*, now: datetime | None = None) -> int:
    """Abort `uploading` uploads past their `expires_at`; return how many.

    Each one's multipart upload is aborted in the store (its parts freed), then it becomes `aborted` with an
    error naming `expires_at`. A store that fails leaves it for the next sweep (logged); its quota reservation
    ended at `expires_at` anyway.
    """
    now = now or timezone.now()
    aborted = 0
    for upload in Upload.objects.filter(status=UploadStatus.UPLOADING, expires_at__lte=now).order_by("expires_at"):
        if not _drop_from_store(upload, delete_object=False):
            continue
        error = (
            f"The upload expired at {upload.expires_at.isoformat()}: no part arrived for "
            f"{settings.CONCH_UPLOAD_EXPIRES_HOURS:g} hours (CONCH_UPLOAD_EXPIRES_HOURS), so its parts were "
            "discarded. Upload the file again."
        )
        if _end(upload.pk, UploadStatus.ABORTED, error=error, field="expires_at", reason="expired"):
            aborted += 1
            log.warning("upload.expired", extra={"upload_id": str(upload.pk)})
    return aborted


def stalled_upload_checks(*, stale_before: datetime) -> list[uuid.UUID]:
    """Ids of `completing` uploads with no sign of a worker since `stale_before`, oldest first."""
    stalled = Upload.objects.filter(status=UploadStatus.COMPLETING).filter(
        Q(heartbeat_at__lt=stale_before) | Q(heartbeat_at__isnull=True)
    )
    return list(stalled.order_by("heartbeat_at").values_list("pk", flat=True))


def requeue_upload_check(*, upload_id: uuid.UUID | str, stale_before: datetime) -> bool:
    """Put the check of a stalled `completing` upload back in the queue (heartbeat now, no worker holds it).

    The caller sends the check task in the same transaction. False when it is no longer stalled.
    """
    with transaction.atomic():
        upload = Upload.objects.select_for_update().filter(pk=upload_id).first()
        if upload is None or upload.status != UploadStatus.COMPLETING:
            return False
        if upload.heartbeat_at is not None and upload.heartbeat_at >= stale_before:
            return False
        upload.heartbeat_at = timezone.now()
        upload.check_started_at = None
        upload.save(update_fields=["heartbeat_at", "check_started_at"])
    return True


def abort_uploads_of_model(*, model_id: int) -> int:
    """Abort in the store every unfinished multipart upload of the model's open uploads (its deletion)."""
    store = get_object_store()
    uploads = Upload.objects.filter(model_id=model_id, status__in=OPEN_STATUSES).exclude(store_upload_id="")
    count = 0
    for upload in uploads:
        store.abort_multipart(upload.object_key, upload.store_upload_id)
        count += 1
    return count


# --- quota ---------------------------------------------------------------------------------------


def count_teams_upload_reservations(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """The `storage_bytes` quota's part of open uploads, per team, in one query: the promised sizes of uploads
    `uploading` (not expired) or `completing` ({team id: {"bytes of storage": n}})."""
    now = timezone.now()
    rows = (
        Upload.objects.filter(model__team_id__in=team_ids)
        .filter(Q(status=UploadStatus.UPLOADING, expires_at__gt=now) | Q(status=UploadStatus.COMPLETING))
        .order_by()
        .values("model__team_id")
        .annotate(total=Sum("size_bytes"))
        .values_list("model__team_id", "total")
    )
    return {team_id: {"bytes of storage": total or 0} for team_id, total in rows}


def count_team_upload_reservations(team: Any) -> dict[str, int]:
    """`count_teams_upload_reservations` of one team."""
    return count_teams_upload_reservations([team.pk]).get(team.pk, {"bytes of storage": 0})
