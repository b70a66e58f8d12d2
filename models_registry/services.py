"""Model registry rules: naming, race-free version numbers, upload bookkeeping, quotas.

The bytes themselves go through `models_registry.storage` (the object-store adapter). A version's builds are the
`builds` app's (`builds.services.state` changes them, and the version's `status` with them); the upload's part of
a version's life (`uploading` until `complete_upload` or `create_uploaded_version`, heartbeats, `abort_stale_uploads`)
happens here, under a row lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.utils import timezone

from conch.errors import ConchError, Conflict, Duplicate, InvalidInput, NotFound
from models_registry.choices import VersionStatus
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.naming import validate_model_name
from models_registry.storage import MIB, StoredObject, get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.quotas import QuotaRoom, quota_room, register_usage_counter, reserve_quota
from tenancy.services import TokenGrant, get_team_for_user, require_role, teams_for_user

log = logging.getLogger(__name__)

#: Bytes read at a time while a build hashes the model file it downloaded.
HASH_CHUNK_BYTES = 8 * MIB


def source_key(*, model_id: int, number: int) -> str:
    """Object-store key of a version's uploaded file (deterministic: one key per version)."""
    return f"models/{model_id}/versions/{number}/source/model.onnx"


def sample_inputs_key(*, model_id: int, number: int, incoming: bool = False) -> str:
    """Object-store key of a version's sample inputs (`.npz`), stored beside its source file.

    `incoming=True` gives the key an upload streams into before the builds app has checked the file and moved
    it to the plain key, so a bad file sent with a rebuild never replaces good samples.
    """
    name = "sample_inputs.incoming.npz" if incoming else "sample_inputs.npz"
    return f"models/{model_id}/versions/{number}/source/{name}"


def measure_unmeasured_samples(*, limit: int = 100) -> int:
    """Record the size (bytes) of sample inputs stored before Conch counted them in storage: a database from then has
    `samples_size_bytes` 0 on versions that already had a `.npz` (a build's `options["samples"]["key"]`). Each such
    version gets the stored object's size, at most `limit` a call; returns how many were measured. A version whose
    object is gone keeps 0; a store that cannot be reached ends the call (the next one goes on). Run by the builds
    app's periodic sweep, so usage heals by itself after an upgrade."""
    store = get_object_store()
    measured = 0
    # `builds` is the related name of the builds app's attempts, whose options describe the samples.
    unmeasured = (
        ModelVersion.objects.filter(samples_size_bytes=0, builds__options__samples__has_key="key")
        .exclude(status=VersionStatus.DELETING)
        .values_list("pk", "model_id", "number")
        .distinct()[:limit]
    )
    for pk, model_id, number in unmeasured:
        try:
            size = store.size(sample_inputs_key(model_id=model_id, number=number))
        except NotFound:
            continue
        except ConchError as error:
            log.warning("samples.measure_failed", extra={"version_id": pk, "error": error.detail})
            break
        measured += ModelVersion.objects.filter(pk=pk, samples_size_bytes=0).update(samples_size_bytes=size)
    return measured


def model_root(*, model_id: int) -> str:
    """Object-store folder holding every object of a model (all its versions' keys are under it)."""
    return f"models/{model_id}"


def version_root(*, model_id: int, number: int) -> str:
    """Object-store folder holding every object of a version: its source, sample inputs and build repositories."""
    return f"{model_root(model_id=model_id)}/versions/{number}"


def repositories_root(*, model_id: int, number: int) -> str:
    """Object-store folder holding the repositories of every build attempt of a version."""
    return f"models/{model_id}/versions/{number}/repository"


def repository_prefix(*, model_id: int, number: int, attempt: int = 1) -> str:
    """Object-store prefix of the Triton model repository build `attempt` of a version writes.

    One prefix per attempt (`.../repository/attempt-<k>`), so a rebuild never rewrites what a running
    deployment serves; `attempt` is the build's `attempt` (1 for its first build).
    """
    return f"{repositories_root(model_id=model_id, number=number)}/attempt-{attempt}"


def visible_models(*, user: User, token: TokenGrant | None = None) -> QuerySet[RegisteredModel]:
    """Models of the caller's teams (of the token's team, for a request made with a team-bound token)."""
    return RegisteredModel.objects.filter(team__in=teams_for_user(user=user, token=token)).select_related("team")


def visible_versions(*, user: User, token: TokenGrant | None = None) -> QuerySet[ModelVersion]:
    """Versions of models of the caller's teams."""
    teams = teams_for_user(user=user, token=token)
    return ModelVersion.objects.filter(model__team__in=teams).select_related("model__team")


def get_model(*, user: User, model_id: int, token: TokenGrant | None = None) -> RegisteredModel:
    """Return a model the caller may see. Raises NotFound."""
    model = visible_models(user=user, token=token).filter(pk=model_id).first()
    if model is None:
        raise NotFound(f"Model {model_id} does not exist or is not in one of your teams.")
    return model


def get_version(*, user: User, version_id: int, token: TokenGrant | None = None) -> ModelVersion:
    """Return a version the caller may see. Raises NotFound."""
    version = visible_versions(user=user, token=token).filter(pk=version_id).first()
    if version is None:
        raise NotFound(f"Model version {version_id} does not exist or is not in one of your teams.")
    return version


def open_version_source(*, version: ModelVersion) -> BinaryIO:
    """Open the uploaded model file of `version` (one the caller may see: `get_version`) for reading, streamed
    from the object store. Raises Conflict (field `status`) while it is uploading or being deleted (no complete
    file), NotFound when the store holds no file, Unavailable when the store fails."""
    if version.status in (VersionStatus.UPLOADING, VersionStatus.DELETING) or not version.source_key:
        raise Conflict(
            f"Model version {version.pk} is '{version.status}'; its file can be downloaded once uploaded.",
            field="status",
        )
    store = get_object_store()
    if not store.exists(version.source_key):
        raise NotFound(f"The file of model version {version.pk} is missing from the object store.")
    return store.open_reader(version.source_key)


def model_named(*, team_slug: str, name: str) -> RegisteredModel | None:
    """The model named `name` in team `team_slug`, or None. For services acting for a user whose role they check
    next (no visibility check here)."""
    return RegisteredModel.objects.filter(team__slug=team_slug, name=name).select_related("team").first()


def create_model(*, user: User, team_slug: str, name: str, token: TokenGrant | None = None) -> RegisteredModel:
    """Register a model name in a team (the developer role and, with a token, the `models:write` scope).

    The name is also the Triton model name and part of Kubernetes object names, so it must be
    a lowercase RFC 1123 DNS label of at most 63 characters. Raises InvalidInput (field
    `name`), NotFound (field `team`), Forbidden (role or scope), Conflict (field `name`) for a duplicate in the
    team, QuotaExceeded (field `models`) when the team has as many models as its quota allows.
    """
    validate_model_name(name)
    team = get_team_for_user(user=user, slug=team_slug, token=token)
    require_role(
        user=user, team=team, role=Role.DEVELOPER, action="Registering a model", token=token, scope=Scope.MODELS_WRITE
    )
    try:
        with transaction.atomic():
            reserve_quota(team=team, requested={"models": 1}, what="this model")
            model = RegisteredModel.objects.create(team=team, name=name, created_by=user)
            record_audit(action=AuditAction.MODEL_CREATED, team=team, target=model)
            return model
    except IntegrityError:
        raise Conflict(f"Team '{team.slug}' already has a model named '{name}'.", field="name") from None


def reserve_version(*, model: RegisteredModel, user: User, token: TokenGrant | None = None) -> ModelVersion:
    """Allocate the next version number of `model` (1, 2, 3…; never one a deleted version had) and its source key.

    Uploading needs the developer role in the model's team and, with a token, the `models:write` scope
    (Forbidden otherwise), checked before any byte is stored. Race-free: the model row is locked while the
    number is chosen, and a unique constraint on (model, number) backs it up. The row starts as `uploading`.
    """
    require_role(
        user=user,
        team=model.team,
        role=Role.DEVELOPER,
        action="Uploading a model version",
        token=token,
        scope=Scope.MODELS_WRITE,
    )
    with transaction.atomic():
        locked = RegisteredModel.objects.select_for_update().filter(pk=model.pk).first()
        if locked is None or locked.deletion_requested_at is not None:
            raise Conflict(f"Model '{model.name}' is being deleted; register it again to upload.", field="model")
        number = allocate_version_number(model=locked)
        version = ModelVersion.objects.create(
            model=model,
            number=number,
            status=VersionStatus.UPLOADING,
            source_key=source_key(model_id=model.pk, number=number),
            heartbeat_at=timezone.now(),
            created_by=user,
        )
        record_audit(
            action=AuditAction.VERSION_CREATED, team=model.team, target=version, after={"status": version.status}
        )
        return version


def lock_model(*, model_id: int) -> RegisteredModel | None:
    """Lock model `model_id`'s row (select_for_update, inside the caller's transaction) and return it with its
    team; None when it is gone. Whoever makes a version of the model or reserves room for one takes this lock
    first, so duplicate checks and version numbers of one model take turns; a model being deleted has
    `deletion_requested_at` set."""
    return RegisteredModel.objects.select_for_update().select_related("team").filter(pk=model_id).first()


def create_uploaded_version(
    *,
    model: RegisteredModel,
    source_key: str,
    filename: str,
    size_bytes: int,
    sha256: str,
    created_by: User | None,
    upload_id: str,
) -> ModelVersion:
    """Make the model's next version from a file already in the store (a resumable upload's joined object), `queued`
    for its first build.

    `model` is locked by the caller's transaction (`lock_model`), which also starts and queues the build
    (`builds.services.start_first_build`). `sha256` is the
    SHA-256 the upload promised, marked unchecked (`source_checked` False): the build hashes the file it downloads
    (`check_version_source`). Audited as created (naming `upload_id`) and uploaded. The storage quota was reserved
    by the upload; the version's bytes count from the same commit that ends the upload's reservation.
    """
    number = allocate_version_number(model=model)
    version = ModelVersion.objects.create(
        model=model,
        number=number,
        status=VersionStatus.QUEUED,
        source_key=source_key,
        source_filename=filename,
        source_size_bytes=size_bytes,
        source_sha256=sha256,
        source_checked=False,
        heartbeat_at=timezone.now(),
        created_by=created_by,
    )
    record_audit(action=AuditAction.VERSION_CREATED, team=model.team, target=version, after={"upload": upload_id})
    record_audit(
        action=AuditAction.VERSION_UPLOADED,
        team=model.team,
        target=version,
        after={
            "status": version.status,
            "filename": version.source_filename,
            "size_bytes": version.source_size_bytes,
            "sha256": version.source_sha256,
        },
    )
    return version


def allocate_version_number(*, model: RegisteredModel) -> int:
    """Take the next version number of `model`, whose row the caller's transaction has locked (select_for_update).

    Never a number a deleted version had: a deployment's repository may still hold that version's folder.
    """
    number = max(model.last_version_number, model.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    RegisteredModel.objects.filter(pk=model.pk).update(last_version_number=number)
    return number


def find_duplicate_version(
    *, model: RegisteredModel, sha256: str, exclude_id: int | None = None
) -> ModelVersion | None:
    """The model's oldest live version whose file has SHA-256 `sha256` (lowercase hex), or None.

    Live: not `deleting`. A version that failed its build on a SHA-256 mismatch does not count: its `source_sha256`
    was a promise its file did not keep. `exclude_id` leaves out one version (the one being recorded). Another
    model's versions never count, even in the same team: one file may well serve as two models.
    """
    if not sha256:
        return None
    versions = ModelVersion.objects.filter(model_id=model.pk, source_sha256=sha256).exclude(
        status=VersionStatus.DELETING
    )
    # (`builds` is the related name of the builds app's attempts; a mismatch fails one with error_field sha256)
    versions = versions.exclude(status=VersionStatus.FAILED, builds__error_field="sha256")
    if exclude_id is not None:
        versions = versions.exclude(pk=exclude_id)
    return versions.order_by("number").first()


#: The build options a version's `build_options` holds (the builds app parses them; "samples" is not one).
VERSION_BUILD_OPTIONS = ("max_batch_size", "max_queue_delay_microseconds", "preferred_batch_size", "instance_count")
#: What a refused duplicate may do instead of using the version that exists.
ALLOW_DUPLICATE_HINT = "or send allow_duplicate: true to make another version from the same file"


def refuse_duplicate_version(
    *,
    model: RegisteredModel,
    sha256: str,
    allow_duplicate: bool,
    exclude_id: int | None = None,
    otherwise: str = ALLOW_DUPLICATE_HINT,
    build_options: Mapping[str, Any] | None = None,
) -> None:
    """Refuse an upload of a file that already is a live version of `model` (`find_duplicate_version`), unless
    `allow_duplicate`.

    Call it after the caller's role is checked (a caller who may not upload learns nothing of the versions), under
    the model's row lock where a version is about to be made (so of two identical uploads finishing at once the
    first wins and the second is refused). Raises Duplicate (HTTP 409, field `sha256`, `existing_version`:
    {"id", "number", "status"}) whose detail names the version and what to do: deploy it, wait for its build or
    rebuild it, or (`otherwise`) send `allow_duplicate: true` to make another version from the same file.
    `build_options`: the options sent with the refused upload (a parsed dict; None values and keys that are not
    build options are left out): the detail then says they were not applied to the version, and how to rebuild it
    with them (`POST /api/v1/versions/ID/rebuild` with those options, the builds app's rebuild).
    """
    if allow_duplicate:
        return
    existing = find_duplicate_version(model=model, sha256=sha256, exclude_id=exclude_id)
    if existing is None:
        return
    status = existing.status
    if status == VersionStatus.BUILT:
        todo = f"deploy that version (POST /api/v1/deployments/ with version {existing.pk})"
    elif status == VersionStatus.FAILED:
        todo = f"rebuild it if its build failed for a reason since fixed (POST /api/v1/versions/{existing.pk}/rebuild)"
    else:
        todo = f"wait for its build (GET /api/v1/versions/{existing.pk}/)"
    sent = {
        key: value for key, value in (build_options or {}).items() if key in VERSION_BUILD_OPTIONS and value is not None
    }
    unapplied = ""
    if sent:
        listed = ", ".join(f"{key}={value}" for key, value in sent.items())
        unapplied = (
            f" The build options sent with it ({listed}) were not applied: version {existing.number} keeps its own; "
            f"to build it with them, POST /api/v1/versions/{existing.pk}/rebuild with {json.dumps(sent)}."
        )
    raise Duplicate(
        f"This file (sha256 {sha256}) already is version {existing.number} (id {existing.pk}, {status}) of model "
        f"'{model.name}'. Use it: {todo}; {otherwise}.{unapplied}",
        field="sha256",
        existing_name="existing_version",
        existing={"id": existing.pk, "number": existing.number, "status": status},
    )


def check_upload_room(*, model: RegisteredModel, declared_bytes: int | None) -> QuotaRoom:
    """Refuse an upload whose declared size cannot fit in the team's storage quota, before its bytes are read.

    `declared_bytes` is the least the file can be, from what the client declared (None: nothing declared).
    Returns the team's storage room, for the upload handler to stop the stream once more bytes than are free
    have arrived. Raises QuotaExceeded (field `storage_bytes`). An advisory check, without a lock:
    `complete_upload` reserves the stored size under the team's lock.
    """
    room = quota_room(team=model.team, field="storage_bytes")
    if declared_bytes:
        room.check(declared_bytes, "this upload needs at least")
    return room


def touch_upload(*, version_id: int) -> None:
    """Record that bytes of a version's upload are still arriving (its heartbeat while `uploading`).

    The upload handler calls this as the body streams (throttled); `abort_stale_uploads` removes
    uploads whose heartbeat stopped.
    """
    ModelVersion.objects.filter(pk=version_id, status=VersionStatus.UPLOADING).update(heartbeat_at=timezone.now())


def abort_stale_uploads(*, stale_before: datetime) -> int:
    """Remove versions still `uploading` whose last bytes arrived before `stale_before`; return how many.

    Such an upload's web worker died or was stopped mid-body (Ctrl-C, a killed web worker). For each:
    the open multipart upload of its source key is aborted and any stored object deleted (no lock is held
    while the store is called), then the row is deleted if it is still `uploading` and stale. A store that
    fails leaves the row for the next sweep (logged, not raised).
    """
    stale = ModelVersion.objects.filter(status=VersionStatus.UPLOADING).filter(
        Q(heartbeat_at__lt=stale_before) | Q(heartbeat_at__isnull=True)
    )
    store = get_object_store()
    removed = 0
    for version in stale.select_related("model__team"):
        version_id, key = version.pk, version.source_key
        try:
            aborted = store.abort_multipart_uploads(key)
            store.delete(key)
        except ConchError as error:
            log.warning("upload.abort_stale.failed", extra={"version_id": version_id, "error": error.detail})
            continue
        with transaction.atomic():
            RegisteredModel.objects.select_for_update().filter(pk=version.model_id).first()  # as reserve_version
            deleted, _ = (
                ModelVersion.objects.filter(pk=version_id, status=VersionStatus.UPLOADING)
                .filter(Q(heartbeat_at__lt=stale_before) | Q(heartbeat_at__isnull=True))
                .delete()
            )
            if deleted:
                _give_back_number(model_id=version.model_id, number=version.number)
                record_audit(
                    action=AuditAction.VERSION_DISCARDED,
                    team=version.model.team,
                    target=version,
                    before={"status": VersionStatus.UPLOADING},
                    after={"reason": "no bytes arrived for CONCH_UPLOAD_STALE_SECONDS"},
                )
        if deleted:
            removed += 1
            log.warning(
                "upload.aborted_stale",
                extra={"version_id": version_id, "key": key, "multipart_uploads_aborted": aborted},
            )
    return removed


def _give_back_number(*, model_id: int, number: int) -> None:
    """Let the model's next upload take `number` again when it was the last one taken and its version, deleted
    while still uploading, never held a build (so no deployment's repository can hold its folder). The caller
    holds the model's row lock (as `reserve_version` does) and has just deleted that version's row."""
    RegisteredModel.objects.filter(pk=model_id, last_version_number=number).update(last_version_number=number - 1)


def discard_upload(*, version: ModelVersion) -> None:
    """Forget a version whose upload failed: delete its row and any stored bytes (model file, sample inputs).

    Audited (`version.discarded`) when the row was still there. Its number goes back to the model when no later
    upload took one since (`_give_back_number`): a refused upload leaves no gap in the version numbers.
    """
    store = get_object_store()
    keys = [version.source_key] + [
        sample_inputs_key(model_id=version.model_id, number=version.number, incoming=incoming)
        for incoming in (False, True)
    ]
    for key in keys:
        try:
            store.delete(key)
        except NotFound:
            pass
    with transaction.atomic():
        RegisteredModel.objects.select_for_update().filter(pk=version.model_id).first()  # as reserve_version
        deleted, _ = ModelVersion.objects.filter(pk=version.pk, status=VersionStatus.UPLOADING).delete()
        if deleted:
            _give_back_number(model_id=version.model_id, number=version.number)
            record_audit(
                action=AuditAction.VERSION_DISCARDED,
                team=version.model.team,
                target=version,
                before={"status": VersionStatus.UPLOADING},
                after={"reason": "the upload failed"},
            )


def complete_upload(
    *,
    version: ModelVersion,
    stored: StoredObject,
    filename: str,
    build_options: dict[str, Any],
    allow_duplicate: bool = False,
    samples_size_bytes: int = 0,
) -> ModelVersion:
    """Record a finished upload as `queued` for its first build.

    A file that already is a live version of the model (its SHA-256) is refused with Duplicate (409, field
    `sha256`, `refuse_duplicate_version`) unless `allow_duplicate`; the check runs under the model's row lock, so
    of two identical uploads finishing at once the first wins. The caller then discards the upload.

    `build_options` are the already-validated build options sent with it (a plain dict), named in a refusal of a
    duplicate (the builds app records them on the build). `samples_size_bytes`: bytes of the sample
    inputs stored with the upload (`sample_inputs_key`), 0 without; they count in storage beside the file. The
    caller starts and queues the build in the same transaction (`builds.services.submit_upload`). Raises
    InvalidInput naming `file` for an empty file; the caller then discards the upload (`discard_upload`, which
    deletes the samples too), as it does for any failure while the body is received. Raises Conflict (field
    `file`) when the sweeper already gave the upload up (no bytes arrived for longer than
    CONCH_UPLOAD_STALE_SECONDS), QuotaExceeded (field `storage_bytes`) when the file and its sample inputs do
    not fit in the team's storage quota.
    """
    if stored.size_bytes == 0:
        raise InvalidInput("The uploaded file is empty (0 bytes); send the model file in field 'file'.", field="file")
    with transaction.atomic():
        # The model first (as reserve_version locks it), so that duplicate checks of one model take turns.
        RegisteredModel.objects.select_for_update().filter(pk=version.model_id).first()
        locked = ModelVersion.objects.select_for_update(of=("self",)).select_related("model__team")
        current = locked.filter(pk=version.pk).first()
        if current is None or current.status != VersionStatus.UPLOADING:
            raise Conflict(
                "This upload was given up because no bytes arrived for too long (CONCH_UPLOAD_STALE_SECONDS); "
                "upload the file again.",
                field="file",
            )
        version = current
        refuse_duplicate_version(
            model=version.model,
            sha256=stored.sha256_hex,
            allow_duplicate=allow_duplicate,
            exclude_id=version.pk,
            build_options=build_options,
        )
        reserve_quota(
            team=version.model.team,
            requested={"storage_bytes": stored.size_bytes + samples_size_bytes},
            what="this upload" + (" with its sample inputs" if samples_size_bytes else ""),
        )
        version.source_filename = filename[:255]
        version.source_size_bytes = stored.size_bytes
        version.samples_size_bytes = samples_size_bytes
        version.source_sha256 = stored.sha256_hex
        version.source_checked = True  # hashed while the body was streamed to the store
        version.status = VersionStatus.QUEUED
        version.heartbeat_at = timezone.now()
        version.save()
        record_audit(
            action=AuditAction.VERSION_UPLOADED,
            team=version.model.team,
            target=version,
            before={"status": VersionStatus.UPLOADING},
            after={
                "status": version.status,
                "filename": version.source_filename,
                "size_bytes": version.source_size_bytes,
                "sha256": version.source_sha256,
            },
        )
    log.info("version.uploaded", extra={"version_id": version.pk, "size_bytes": stored.size_bytes})
    return version


def check_version_source(*, version: ModelVersion, path: Path) -> bool:
    """Check the version's file, as its build downloaded it to `path`, against the SHA-256 its upload promised.

    Only a version whose source is not checked yet (`source_checked` False: made from a resumable upload, whose
    client promised `source_sha256`) is read: it is hashed HASH_CHUNK_BYTES at a time and, on a match, marked
    checked (True returned). Returns False at once for a version already checked. Raises InvalidInput (field
    `sha256`; expected, got and what to do) on a mismatch — permanent: the version stays unchecked, so a
    rebuild fails the same way until the version is deleted and the file uploaded again.
    """
    if version.source_checked:
        return False
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    got, expected = digest.hexdigest(), version.source_sha256
    if got != expected:
        log.warning("version.source.sha256_mismatch", extra={"version_id": version.pk})
        raise InvalidInput(
            f"The uploaded file's SHA-256 is {got}, not the {expected} promised when its upload started (sha256): "
            f"expected {expected}, got {got}. The file changed during the upload or a part was sent wrongly, so "
            f"this version cannot be built. Delete this version (DELETE /api/v1/versions/{version.pk}/, or Delete "
            "on the model's page) and upload the file again (re-run `conch upload MODEL FILE`; check the file "
            "first with sha256sum FILE).",
            field="sha256",
        )
    ModelVersion.objects.filter(pk=version.pk).update(source_checked=True)
    version.source_checked = True
    log.info("version.source.checked", extra={"version_id": version.pk})
    return True


def lock_version(*, version_id: int) -> ModelVersion | None:
    """Lock a version's row until the caller's transaction ends (select_for_update) and return it with its model and
    team; None when it is gone. The builds app takes this lock before it changes one of the version's builds, so
    that a rebuild, a worker's claim, its result, the sweeper and a deletion take turns."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_version must run inside the caller's transaction")
    locked = ModelVersion.objects.select_for_update(of=("self",)).select_related("model__team")
    return locked.filter(pk=version_id).first()


def set_version_status(*, version_id: int, status: str) -> None:
    """Set a version's `status` to `status` (a VersionStatus), the builds app's summary of its current build; the
    caller holds the version's lock (`lock_version`)."""
    ModelVersion.objects.filter(pk=version_id).update(status=status)


def set_samples_size(*, version_id: int, size_bytes: int) -> None:
    """Record the size (bytes) of the version's stored sample inputs; the caller reserved it in the team's storage
    quota under the version's lock."""
    ModelVersion.objects.filter(pk=version_id).update(samples_size_bytes=size_bytes)


def record_signature(*, version_id: int, signature: dict[str, Any]) -> None:
    """Store the signature a build inspected in the version's file (`ModelSignature.to_dict()`: inputs and outputs
    with name, datatype, dims). A version id that matches no row writes nothing."""
    ModelVersion.objects.filter(pk=version_id).update(signature=signature)


def versions_past_upload() -> QuerySet[ModelVersion]:
    """Versions whose upload finished and that are not being deleted (queued, building, built or failed)."""
    return ModelVersion.objects.exclude(status__in=(VersionStatus.UPLOADING, VersionStatus.DELETING))


def lock_built_version(*, version_id: int) -> None:
    """Lock a version's row until the caller's transaction ends, and check it is still `built`.

    A layer above calls this in the transaction that makes something use the version (a deployment), so a
    deletion (`models_registry.deletion`), which locks the same row, either runs first and is seen here, or runs
    after and sees the new user. Raises Conflict (field `model_version`) when the version is no longer built.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_built_version must run inside the transaction that starts using the version")
    status = ModelVersion.objects.select_for_update().filter(pk=version_id).values_list("status", flat=True).first()
    if status != VersionStatus.BUILT:
        raise Conflict(
            f"Model version {version_id} is '{status or 'deleted'}'; only a built version can be served.",
            field="model_version",
        )


# --- quotas ------------------------------------------------------------------------


def count_teams_models(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """The `models` quota's usage of each team: its registered models ({team id: {"models": n}}, one query)."""
    rows = RegisteredModel.objects.filter(team_id__in=team_ids).order_by().values("team_id").annotate(n=Count("pk"))
    return {team_id: {"models": n} for team_id, n in rows.values_list("team_id", "n")}


def count_teams_storage(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """The `storage_bytes` quota's part of uploads for each team, in one query: bytes of its uploaded model files
    and of their sample inputs (every stored version, until its row is deleted), {team id: {"bytes of storage":
    n}}. Build outputs are counted by the builds app (`builds.services.storage`), deployments' own repositories
    by the deployments app.
    """
    rows = (
        ModelVersion.objects.filter(model__team_id__in=team_ids)
        .order_by()
        .values("model__team_id")
        .annotate(total=Sum("source_size_bytes") + Sum("samples_size_bytes"))
        .values_list("model__team_id", "total")
    )
    return {team_id: {"bytes of storage": total or 0} for team_id, total in rows}


def count_team_models(team: Any) -> dict[str, int]:
    """The `models` quota's usage: the team's registered models."""
    return count_teams_models([team.pk]).get(team.pk, {"models": 0})


def count_team_storage(team: Any) -> dict[str, int]:
    """The `storage_bytes` quota's usage: bytes of the team's uploaded model files and sample inputs
    (`count_teams_storage`)."""
    return count_teams_storage([team.pk]).get(team.pk, {"bytes of storage": 0})


def register_quota_counters() -> None:
    """Tell tenancy how this app's quotas are counted (from AppConfig.ready)."""
    register_usage_counter("models", count_team_models, for_teams=count_teams_models)
    register_usage_counter("storage_bytes", count_team_storage, for_teams=count_teams_storage)
