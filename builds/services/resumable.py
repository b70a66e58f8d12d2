"""Resumable uploads, the builds app's part: check build options at the start, queue the worker's check at the
end, and turn a joined upload into a version whose build is queued; that build checks the file's SHA-256
(`models_registry.resumable` owns the rest).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from builds.formats import check_model_filename, check_model_head
from builds.model_config import OUTPUT_DIMS_FIELD, parse_build_options
from builds.services.submission import queue_build
from conch.errors import ConchError, InvalidInput
from models_registry import resumable as uploads
from models_registry.choices import UploadStatus

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from models_registry.models import RegisteredModel, Upload
    from tenancy.services import TokenGrant

log = logging.getLogger(__name__)

#: Build option names a resumable upload takes in `build_options` (as the version upload's form fields).
BUILD_OPTION_NAMES = (
    "max_batch_size",
    "max_queue_delay_microseconds",
    "preferred_batch_size",
    "instance_count",
    OUTPUT_DIMS_FIELD,
)
CHECK_TASK = "builds.finish_upload"


def check_stale_before() -> datetime:
    """A `completing` upload with no sign of its worker since this moment has lost it (CONCH_UPLOAD_STALE_SECONDS)."""
    return timezone.now() - timedelta(seconds=settings.CONCH_UPLOAD_STALE_SECONDS)


def queue_upload_check(*, upload_id: uuid.UUID | str) -> None:
    """Queue the worker's check of a `completing` upload once the current transaction commits."""
    # By name, as queue_build does: the tasks module imports the services.
    transaction.on_commit(lambda: current_app.signature(CHECK_TASK, args=(str(upload_id),)).delay())


def check_upload_file(*, filename: str, head: bytes, size_bytes: int | None = None) -> str:
    """Tell whether Conch can build a file from its name and first bytes, before the file is hashed or sent.

    `head` is the file's first bytes (up to `builds.formats.HEAD_BYTES`), `size_bytes` its size when known. Returns
    the format the file will be built as ("onnx"). Raises InvalidInput naming `filename` or `head` with what the file
    looks like and what to do: the same rules, and the same messages, as the upload's start
    (`start_resumable_upload`), so a client (`conch upload`) asks once and keeps no copy of them.
    """
    check_model_filename(filename or "", field="filename")
    check_model_head(head, size_bytes=size_bytes, field="head")
    return "onnx"


def start_resumable_upload(
    *,
    user: AbstractBaseUser,
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
    """Check the file's name, first bytes and build options, then start the upload (`resumable.start_upload`).

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
        check_model_head(head, size_bytes=size_bytes, field="head")
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
        field = f"build_options.{error.field}" if error.field else "build_options"
        raise InvalidInput(error.detail, field=field) from None
    return uploads.start_upload(
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


def complete_resumable_upload(
    *,
    user: AbstractBaseUser,
    upload: Upload,
    client_parts: Sequence[dict[str, Any]] | None = None,
    sha256: str | None = None,
    token: TokenGrant | None = None,
    allow_duplicate: bool = False,
) -> Upload:
    """Mark the upload `completing` (every part is in the store) and queue the worker that checks it. `sha256` is
    the file's SHA-256 when the start left it out; `allow_duplicate` lets a file that already is a version of the
    model make another one.

    Raises what `models_registry.resumable.request_completion` raises (Conflict naming the first missing part,
    Duplicate naming `sha256`: the upload then stays open).
    """
    with transaction.atomic():
        was_completing = upload.status == UploadStatus.COMPLETING
        upload = uploads.request_completion(
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
    upload = uploads.claim_upload_check(upload_id=upload_id, stale_before=check_stale_before())
    if upload is None:
        return "skipped"
    try:
        stored = uploads.assemble_upload(upload=upload)
    except InvalidInput as error:
        uploads.fail_upload(upload_id=upload_id, error=error.detail, field=error.field or "")
        return "failed"
    except ConchError:
        uploads.release_upload_check(upload_id=upload_id)
        raise
    try:
        with transaction.atomic():
            version = uploads.create_version_from_upload(upload_id=upload_id, stored=stored)
            if version is None:
                return "skipped"
            queue_build(version_id=version.pk, attempt=version.build_attempt)
    except ConchError as error:  # the model is being deleted, or an identical upload made its version first
        uploads.fail_upload(upload_id=upload_id, error=error.detail, field=error.field or "")
        return "failed"
    return "completed"


def sweep_uploads() -> dict[str, int]:
    """Abort uploads past their expiry and queue again the checks whose worker stopped; return the counts
    (`expired_uploads`, `requeued_upload_checks`). Part of `sweep_stalled_versions`."""
    counts = {"expired_uploads": uploads.abort_expired_uploads(), "requeued_upload_checks": 0}
    stale_before = check_stale_before()
    for upload_id in uploads.stalled_upload_checks(stale_before=stale_before):
        with transaction.atomic():
            if not uploads.requeue_upload_check(upload_id=upload_id, stale_before=stale_before):
                continue
            queue_upload_check(upload_id=upload_id)
        counts["requeued_upload_checks"] += 1
        log.warning("upload.check.requeued", extra={"upload_id": str(upload_id)})
    return counts
