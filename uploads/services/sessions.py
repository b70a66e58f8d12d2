"""The resumable upload session: a model file sent part by part into a multipart upload of the object store, then
checked. This module starts, finds, aborts and expires uploads; `parts` sends the parts, `checks` completes them.

The life of an `Upload` (API contract: UPLOAD-API in docs/uploads.md, "Resumable uploads"):

1. `start_upload`: the promised size is reserved in the team's storage quota (under the team's lock, before
   anything is started in the store), then the store starts a multipart upload (`ObjectStore.start_multipart`).
2. Parts: with S3 storage `sign_parts` gives presigned UploadPart URLs and the client PUTs the bytes straight to
   the bucket (they never pass through Conch); with folder storage the client PUTs them to Conch, which streams
   them to the store's staging folder (`receive_part`). `stored_parts` lists what the store holds, so a client
   that stopped sends only the rest.
3. `request_completion` checks that the store holds every part at its size and marks the upload `completing`;
   a worker (`uploads.tasks.finish_upload`) joins the parts (`assemble_upload`), checks the joined object's size
   and makes the version (`create_version_from_upload`) with the promised SHA-256 marked unchecked, or fails
   the upload (`fail_upload`: the object is deleted). The version's build checks the SHA-256 on the file it
   downloads (`models_registry.services.check_version_source`): a mismatch fails the version, naming `sha256`.
4. An upload left `uploading` past `expires_at` is aborted by the sweeper (`abort_expired_uploads`); a
   `completing` one whose worker stopped is checked again (`stalled_upload_checks`, `requeue_upload_check`).

Quota: an upload counts `size_bytes` in storage while `uploading` and not expired, and while `completing`; its
version counts the same bytes from the transaction that ends the upload, so nothing is counted twice or missed.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from builds.formats import check_format_allowed, check_model_filename, check_model_head
from builds.model_config import BUILD_OPTION_FIELDS, parse_build_options
from conch.errors import ConchError, Conflict, InvalidInput, NotFound, PayloadTooLarge, refuse_each
from conch.limits import describe_bytes
from models_registry.services import lock_model, refuse_duplicate_version
from models_registry.storage import get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction
from tenancy.quotas import reserve_quota
from tenancy.services import TokenGrant, teams_for_user
from uploads.choices import PartChecksumAlgorithm, UploadStatus
from uploads.models import Upload
from uploads.services.parts import plan_parts, require_upload_writer, upload_expiry

if TYPE_CHECKING:
    from models_registry.models import RegisteredModel

log = logging.getLogger(__name__)

OPEN_STATUSES = (UploadStatus.UPLOADING, UploadStatus.COMPLETING)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: Build option names a resumable upload takes in `build_options` (as the version upload's form fields).
BUILD_OPTION_NAMES = BUILD_OPTION_FIELDS


def upload_key(*, model_id: int, upload_id: uuid.UUID | str) -> str:
    """Object-store key the joined file of an upload gets (under the model's folder; the version's `source_key`)."""
    return f"models/{model_id}/uploads/{upload_id}/model.onnx"


# --- reading ---------------------------------------------------------------------------------


def visible_uploads(*, user: User, token: TokenGrant | None = None) -> QuerySet[Upload]:
    """Uploads of models of the caller's teams (of the token's team, for a team-bound token)."""
    teams = teams_for_user(user=user, token=token)
    return Upload.objects.filter(model__team__in=teams).select_related("model__team")


def get_upload(*, user: User, model_id: int, upload_id: str | uuid.UUID, token: TokenGrant | None = None) -> Upload:
    """Return upload `upload_id` of model `model_id` if the caller may see it. Raises NotFound."""
    try:
        key = uuid.UUID(str(upload_id))
    except ValueError:
        raise NotFound(f"Upload {upload_id} does not exist or is not in one of your teams.") from None
    upload = visible_uploads(user=user, token=token).filter(pk=key, model_id=model_id).first()
    if upload is None:
        raise NotFound(f"Upload {upload_id} does not exist or is not in one of your teams.")
    return upload


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
    found = Upload.objects.filter(model=model).filter(
        Q(status=UploadStatus.UPLOADING, expires_at__gt=now) | Q(status=UploadStatus.COMPLETING)
    )
    if filename is not None:
        found = found.filter(filename=filename)
    if size_bytes is not None:
        found = found.filter(size_bytes=size_bytes)
    if head_sha256 is not None:
        found = found.filter(head_sha256=head_sha256.lower()).exclude(head_sha256="")
    return found.select_related("model__team").order_by("created_at", "pk")


def check_sha256(sha256: str | None, *, required: bool) -> str:
    """The SHA-256 in lowercase hex ("" when none was sent and none is required). Raises InvalidInput (field
    `sha256`) for anything but 64 hex digits, or for none when `required`."""
    digest = (sha256 or "").strip().lower()
    if (digest or required) and not _SHA256_RE.fullmatch(digest):
        raise InvalidInput("sha256 must be the file's SHA-256 as 64 hex digits (sha256sum FILE).", field="sha256")
    return digest


# --- starting ----------------------------------------------------------------------------------


def start_resumable_upload(
    *,
    user: User,
    model: RegisteredModel,
    filename: str,
    size_bytes: int,
    sha256: str,
    part_size_bytes: int | None = None,
    build_options: Mapping[str, Any] | None = None,
    head: bytes | None = None,
    part_checksum_algorithm: str | None = None,
    token: TokenGrant | None = None,
    allow_duplicate: bool = False,
) -> tuple[Upload, bool]:
    """Check the file's name, first bytes and build options, then start the upload (`start_upload`).

    `head` is the file's first bytes (up to `builds.formats.HEAD_BYTES`; None when the client sent none): checked
    with `check_model_head`, so a file that is not an ONNX model is refused before any of it is sent, and its
    SHA-256 is stored on the upload (`head_sha256`), by which a client finds the upload of the same file again.

    `build_options` is a JSON object with any of BUILD_OPTION_NAMES (values as the version upload takes them).
    Raises InvalidInput naming `filename` when its name says the file is not an ONNX model (an ending other than
    .onnx: `builds.formats.check_model_filename`), `head` when its first bytes are not an ONNX model's, or
    `build_options.<name>`, and whatever `start_upload` raises (`part_checksum_algorithm` is passed on to it).
    Nothing is reserved or started then.
    """
    check_model_filename(filename or "", field="filename")
    if head is not None:
        check_format_allowed(
            check_model_head(head, size_bytes=size_bytes, field="head", filename=filename or ""),
            team=model.team,
            field="head",
        )
    options = dict(build_options or {})
    unknown = sorted(set(options) - set(BUILD_OPTION_NAMES))
    if unknown:
        raise InvalidInput(
            f"build_options has no option {unknown[0]!r}; it takes {', '.join(BUILD_OPTION_NAMES)}.",
            field=f"build_options.{unknown[0]}",
        )
    try:
        parsed = parse_build_options({k: v for k, v in options.items() if v not in (None, "")}).to_dict()
    except InvalidInput as error:
        raise refuse_each(
            [
                InvalidInput(one.detail, field=f"build_options.{one.field}" if one.field else "build_options")
                for one in error.refusals or (error,)
            ]
        ) from None
    return start_upload(
        user=user,
        model=model,
        filename=filename,
        size_bytes=size_bytes,
        sha256=sha256,
        part_size_bytes=part_size_bytes,
        build_options=parsed,
        head_sha256=hashlib.sha256(head).hexdigest() if head else "",
        part_checksum_algorithm=part_checksum_algorithm,
        token=token,
        allow_duplicate=allow_duplicate,
    )


def start_upload(
    *,
    user: User,
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

    `build_options` are already validated (`start_resumable_upload` parses them with the builds app's rule). The
    same model, filename, size and SHA-256 while an upload of them is `uploading` gives that upload back (new:
    False), so a client re-run resumes. `sha256` may be "": it is then promised at completion
    (`request_completion`), so a client hashes the file while it sends the parts; such a start always makes a new
    upload, and a later start of the same filename and size with a SHA-256 takes that open upload over (its parts
    are the same file's unless the file changed, which the build's SHA-256 check of the joined file finds), unless
    both starts carried the file's first bytes and their digests differ (`head_sha256`, hex SHA-256 of those bytes:
    stored, so `open_uploads` finds the upload again). Otherwise the size is reserved in the team's storage quota
    under the team's lock, and only then is the multipart upload started in the store. Raises Forbidden (role
    developer, token scope `models:write`), InvalidInput naming `filename`, `size_bytes`, `sha256`,
    `part_size_bytes` or `part_checksum_algorithm`, PayloadTooLarge (field `size_bytes`) over
    CONCH_MAX_UPLOAD_BYTES, Conflict when the model is being deleted, QuotaExceeded (field `storage_bytes`),
    Unavailable when the store cannot be reached (the upload is then aborted).
    """
    require_upload_writer(user=user, token=token, team=model.team, action="Uploading a model version")
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name or len(name) > 255 or any(ord(char) < 32 for char in name):
        raise InvalidInput(
            "filename must be the file's name: 1 to 255 characters, no control characters.", field="filename"
        )
    digest = check_sha256(sha256, required=False)
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
        locked = lock_model(model_id=model.pk)
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
            expires_at=upload_expiry(),
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
        end_upload(
            upload.pk, UploadStatus.ABORTED, error=f"The object store could not start the upload: {error.detail}"
        )
        raise
    Upload.objects.filter(pk=upload.pk).update(store_upload_id=store_upload_id)
    upload.store_upload_id = store_upload_id
    log.info("upload.started", extra={"upload_id": str(upload.pk), "size_bytes": size_bytes, "parts": part_count})
    return upload, True


def check_channel(upload_id: uuid.UUID | str) -> str:
    """The PostgreSQL NOTIFY channel on which the end of an upload's check is announced: `conch_upload_<32 hex>` (an
    identifier of 45 characters; PostgreSQL allows 63)."""
    return f"conch_upload_{uuid.UUID(str(upload_id)).hex}"


def announce_check_end(upload_id: uuid.UUID | str) -> None:
    """Wake the requests waiting for this upload's check (`wait_for_check`). Call inside the transaction that moves
    the upload out of `completing`: PostgreSQL delivers a NOTIFY when that transaction commits, and never when it
    rolls back (PostgreSQL docs, "NOTIFY"). Nothing on SQLite, whose waiters look at the row themselves."""
    db = transaction.get_connection()
    if db.vendor == "postgresql":
        with db.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [check_channel(upload_id)])


def drop_from_store(upload: Upload, *, delete_object: bool) -> bool:
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


def end_upload(upload_id: Any, status: str, *, error: str = "", field: str = "", reason: str = "") -> bool:
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
            announce_check_end(upload.pk)
        record_audit(
            action=AuditAction.UPLOAD_FAILED if status == UploadStatus.FAILED else AuditAction.UPLOAD_ABORTED,
            team=upload.model.team,
            target=upload,
            before={"status": before},
            after={"status": status, "error": error.splitlines()[0] if error else "", "reason": reason},
        )
    return True


# --- aborting and sweeping ---------------------------------------------------------------------------


def abort_upload(*, user: User, upload: Upload, token: TokenGrant | None = None) -> None:
    """Abort an `uploading` upload: the store drops its parts, the quota reservation ends.

    An upload already aborted or failed is left as it is (no error). Raises Forbidden, Conflict (field
    `status`) while `completing` or once `completed`, Unavailable when the store cannot be reached (the upload
    stays `uploading`; send the DELETE again).
    """
    require_upload_writer(user=user, token=token, team=upload.model.team, action="Aborting an upload")
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
    end_upload(upload.pk, UploadStatus.ABORTED, error="Aborted by its client.", reason="aborted by its client")


def abort_expired_uploads(*, now: datetime | None = None) -> int:
    """Abort `uploading` uploads past their `expires_at`; return how many.

    Each one's multipart upload is aborted in the store (its parts freed), then it becomes `aborted` with an
    error naming `expires_at`. A store that fails leaves it for the next sweep (logged); its quota reservation
    ended at `expires_at` anyway.
    """
    now = now or timezone.now()
    aborted = 0
    for upload in Upload.objects.filter(status=UploadStatus.UPLOADING, expires_at__lte=now).order_by("expires_at"):
        if not drop_from_store(upload, delete_object=False):
            continue
        error = (
            f"The upload expired at {upload.expires_at.isoformat()}: no part arrived for "
            f"{settings.CONCH_UPLOAD_EXPIRES_HOURS:g} hours (CONCH_UPLOAD_EXPIRES_HOURS), so its parts were "
            "discarded. Upload the file again."
        )
        if end_upload(upload.pk, UploadStatus.ABORTED, error=error, field="expires_at", reason="expired"):
            aborted += 1
            log.warning("upload.expired", extra={"upload_id": str(upload.pk)})
    return aborted


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
