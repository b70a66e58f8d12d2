"""An upload's checks: the file check before anything is sent (`check_upload_file`), the completion (every part in
the store), and the worker's check that joins the parts, checks the size and makes the version whose build it queues
(that build checks the file's SHA-256); the sweeper's part (expired uploads, checks whose worker stopped).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from builds.formats import check_format_allowed, check_model_filename, check_model_head
from builds.services import start_first_build
from conch.errors import ConchError, Conflict, InvalidInput, NotFound
from models_registry.services import create_uploaded_version, lock_model, refuse_duplicate_version
from models_registry.storage import StoredObject, StoredPart, get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction
from tenancy.services import TokenGrant
from uploads.choices import UploadStatus
from uploads.models import Upload
from uploads.services.parts import part_range, require_upload_writer, require_uploading, stored_parts
from uploads.services.sessions import (
    abort_expired_uploads,
    announce_check_end,
    check_channel,
    check_sha256,
    drop_from_store,
    end_upload,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

#: The worker's check of a completed upload (`uploads.tasks.finish_upload`), by its task name: the name it had
#: when the builds app ran it, so messages queued before the move still find it.
CHECK_TASK = "builds.finish_upload"


def check_stale_before() -> datetime:
    """A `completing` upload with no sign of its worker since this moment has lost it (CONCH_UPLOAD_STALE_SECONDS)."""
    return timezone.now() - timedelta(seconds=settings.CONCH_UPLOAD_STALE_SECONDS)


def queue_upload_check(*, upload_id: uuid.UUID | str) -> None:
    """Queue the worker's check of a `completing` upload once the current transaction commits."""
    # By name, as queue_build does: the tasks module imports the services.
    transaction.on_commit(lambda: current_app.signature(CHECK_TASK, args=(str(upload_id),)).delay())


def check_upload_file(*, filename: str, head: bytes, size_bytes: int | None = None, team: Any = None) -> str:
    """Tell whether Conch can build a file from its name and first bytes, before the file is hashed or sent.

    `head` is the file's first bytes (up to `builds.formats.HEAD_BYTES`), `size_bytes` its size when known, `team`
    the `tenancy.models.Team` the file is for (None when the caller did not say: the team's rules are then left to
    the upload's start). Returns the key of the format the file will be built as ("onnx", "lightgbm"…:
    `builds.formats.FORMATS`). Raises InvalidInput naming `filename` or `head` with what the file looks like and what
    to do, and naming `head` for a pickle when no platform admin allowed pickled models for `team`
    (`check_format_allowed`): the same rules, and the same messages, as the upload's start (`start_resumable_upload`),
    so a client (`conch upload`) asks once and keeps no copy of them.
    """
    check_model_filename(filename or "", field="filename")
    found = check_model_head(head, size_bytes=size_bytes, field="head", filename=filename or "")
    if team is not None:
        check_format_allowed(found, team=team, field="head")
    return found.key


#: A GET that waits for the worker's check (`wait_for_check`) is held at most MAX_WAIT_S seconds: a web thread is held
#: that long, so the bound is short and a client asks again. On PostgreSQL the wait is woken by the worker's
#: NOTIFY on the upload's channel (`check_channel`); on SQLite (the one-machine demo, which has no server to carry a
#: notification) it looks at the row's status every WAIT_POLL_S seconds.
WAIT_POLL_S = 0.1
MAX_WAIT_S = 10.0


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


def _still_completing(upload_id: uuid.UUID) -> bool:
    return Upload.objects.filter(pk=upload_id).values_list("status", flat=True).first() == UploadStatus.COMPLETING


def _listen_for_check_end(db: BaseDatabaseWrapper, upload_id: uuid.UUID, timeout_s: float) -> None:
    """Wait up to `timeout_s` seconds for the NOTIFY that ends the upload's check, on a new connection made with the
    request's own database settings (a LISTEN inside the request's transaction would hear nothing until it ends)."""
    listener = db.get_new_connection(db.get_connection_params())
    try:
        listener.autocommit = True
        listener.execute(f"LISTEN {check_channel(upload_id)}")
        if not _still_completing(upload_id):
            return
        for _notice in listener.notifies(timeout=timeout_s, stop_after=1):
            return
    finally:
        listener.close()


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
        named: object = given.get("number")
        etag = str(given.get("etag") or "")
        if not isinstance(named, int) or not 1 <= named <= upload.part_count:
            raise InvalidInput(
                f"parts names part {named!r}, which this upload does not have: its parts are 1 to "
                f"{upload.part_count}. Send the numbers and ETags of those parts, or no `parts` at all.",
                field="parts",
            )
        stored = by_number.get(named)
        if stored is not None and etag and etag.strip('"') != stored.etag.strip('"'):
            raise Conflict(
                f"Part {named} in the object store has ETag {stored.etag}, not {etag}: another copy of the part "
                "arrived last. Send it again, then complete again.",
                field="parts",
            )


def request_completion(
    *,
    user: User,
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

    The caller queues the worker's check (`queue_upload_check`) in the same transaction. `client_parts`, when given, are
    the client's `{"number", "etag"}`: an ETag that differs from the store's refuses the completion. Asking
    again while `completing` changes nothing. Raises Forbidden, Conflict naming `parts` (the first missing part,
    a part of the wrong size or another ETag), `status` or `expires_at`, InvalidInput (field `parts`) for a client
    part number the upload does not have, Unavailable when the store cannot be reached.
    """
    require_upload_writer(user=user, token=token, team=upload.model.team, action="Uploading a model version")
    if upload.status == UploadStatus.COMPLETING:
        return upload
    require_uploading(upload)
    digest = check_sha256(sha256, required=not upload.sha256)
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
        require_uploading(locked)
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


def complete_resumable_upload(
    *,
    user: User,
    upload: Upload,
    client_parts: Sequence[dict[str, Any]] | None = None,
    sha256: str | None = None,
    token: TokenGrant | None = None,
    allow_duplicate: bool = False,
) -> Upload:
    """Mark the upload `completing` (every part is in the store) and queue the worker that checks it. `sha256` is
    the file's SHA-256 when the start left it out; `allow_duplicate` lets a file that already is a version of the
    model make another one.

    Raises what `request_completion` raises (Conflict naming the first missing part,
    Duplicate naming `sha256`: the upload then stays open).
    """
    with transaction.atomic():
        was_completing = upload.status == UploadStatus.COMPLETING
        upload = request_completion(
            user=user,
            upload=upload,
            client_parts=client_parts,
            sha256=sha256,
            token=token,
            allow_duplicate=allow_duplicate,
        )
        if not was_completing:
            queue_upload_check(upload_id=upload.pk)
    return upload


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


def fail_upload(*, upload_id: uuid.UUID | str, error: str, field: str) -> None:
    """Mark an open upload `failed` with `error` naming `field`, and delete its object and parts from the store.

    Its quota reservation ends with the status. A store that fails leaves the object behind (logged).
    """
    upload = Upload.objects.filter(pk=upload_id).first()
    if upload is None:
        return
    if end_upload(upload_id, UploadStatus.FAILED, error=error, field=field, reason="check failed"):
        drop_from_store(upload, delete_object=True)
        log.warning("upload.failed", extra={"upload_id": str(upload_id), "field": field})


def create_version_from_upload(*, upload_id: uuid.UUID | str, stored: StoredObject) -> ModelVersion | None:
    """Make the model's next version from a joined upload, `queued` for build attempt 1, and end the upload.

    Call inside the transaction that starts and queues the build with the upload's build options
    (`builds.services.start_first_build`, as `finish_upload` does). The version is recorded as an ordinary upload
    records it (source key, filename, size),
    with the promised SHA-256 marked unchecked (`source_checked` False: its build checks it); the upload becomes
    `completed` and names it. The storage quota was reserved when the upload started: the version's bytes are
    counted from the same commit that ends the upload's reservation. Returns None when the upload is not
    `completing` any more (another worker finished it). Raises Conflict (field `model`) when the model is being
    deleted, Duplicate (field `sha256`) when, the upload not allowing it, its file already is a live version of the
    model: the start and the completion checked that, but two identical uploads completed at once pass both checks;
    under the model's lock the first to get here makes its version and the second is refused (the caller fails it,
    deleting its object; its error names the version that won).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("create_version_from_upload must run inside the transaction that queues the build")
    upload = Upload.objects.select_for_update(of=("self",)).filter(pk=upload_id).first()
    if upload is None or upload.status != UploadStatus.COMPLETING:
        return None
    model = lock_model(model_id=upload.model_id)
    if model is None or model.deletion_requested_at is not None:
        name = model.name if model is not None else upload.model_id
        raise Conflict(f"Model '{name}' is being deleted; no version is made from this upload.", field="model")
    refuse_duplicate_version(
        model=model,
        sha256=upload.sha256,
        allow_duplicate=upload.allow_duplicate,
        build_options=upload.build_options,
        otherwise="this upload made no version and its file was deleted (to make another version from the same file, "
        "upload it again with allow_duplicate: true)",
    )
    version = create_uploaded_version(
        model=model,
        source_key=stored.key,
        filename=upload.filename,
        size_bytes=stored.size_bytes,
        sha256=stored.sha256_hex,
        created_by=upload.created_by,
        upload_id=str(upload.pk),
    )
    upload.status = UploadStatus.COMPLETED
    upload.version = version
    upload.finished_at = timezone.now()
    upload.save(update_fields=["status", "version", "finished_at"])
    announce_check_end(upload.pk)
    record_audit(
        action=AuditAction.UPLOAD_COMPLETED,
        team=model.team,
        target=upload,
        before={"status": UploadStatus.COMPLETING},
        after={"status": upload.status, "version": version.pk},
    )
    log.info("upload.completed", extra={"upload_id": str(upload.pk), "version_id": version.pk})
    return version


def finish_upload(*, upload_id: uuid.UUID | str) -> str:
    """The worker's check of a `completing` upload: join its parts, check the size, make the version.

    On a match the version is made (`queued`, its promised SHA-256 unchecked) and its build queued in one
    transaction; the build's inspect step hashes the file it downloads and fails the version on a SHA-256
    mismatch. On a size mismatch (or parts the store refuses, or a model being deleted) the upload fails with
    the reason and its object is deleted; so it does when, the upload not allowing duplicates, an identical upload
    made its version first (error naming `sha256` and that version: the first wins).
    Returns "completed", "failed" or "skipped" (not `completing`, or another worker holds it). Unavailable
    (the store unreachable) propagates after the check is given back, for the task to retry.
    """
    upload = claim_upload_check(upload_id=upload_id, stale_before=check_stale_before())
    if upload is None:
        return "skipped"
    try:
        stored = assemble_upload(upload=upload)
    except InvalidInput as error:
        fail_upload(upload_id=upload_id, error=error.detail, field=error.field or "")
        return "failed"
    except ConchError:
        release_upload_check(upload_id=upload_id)
        raise
    try:
        with transaction.atomic():
            version = create_version_from_upload(upload_id=upload_id, stored=stored)
            if version is None:
                return "skipped"
            start_first_build(version=version, options=upload.build_options)
    except ConchError as error:  # the model is being deleted, or an identical upload made its version first
        fail_upload(upload_id=upload_id, error=error.detail, field=error.field or "")
        return "failed"
    return "completed"


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


def sweep_uploads() -> dict[str, int]:
    """Abort uploads past their expiry and queue again the checks whose worker stopped; return the counts
    (`expired_uploads`, `requeued_upload_checks`). Part of `sweep_stalled_versions`."""
    counts = {"expired_uploads": abort_expired_uploads(), "requeued_upload_checks": 0}
    stale_before = check_stale_before()
    for upload_id in stalled_upload_checks(stale_before=stale_before):
        with transaction.atomic():
            if not requeue_upload_check(upload_id=upload_id, stale_before=stale_before):
                continue
            queue_upload_check(upload_id=upload_id)
        counts["requeued_upload_checks"] += 1
        log.warning("upload.check.requeued", extra={"upload_id": str(upload_id)})
    return counts
