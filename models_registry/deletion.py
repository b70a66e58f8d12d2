"""Deleting models and versions: refused while something uses them or a build runs; then their objects leave the
store, then their rows go (which frees their storage and, for a model, its place in the models quota).

What uses a version lives in apps above this one (deployments), which this app may not import: they register a
`VersionUser` at start (`register_version_user`, from their AppConfig.ready), as quota counters are registered. So
does what a model leaves in the store outside its folder (the uploads app's open multipart uploads:
`register_model_cleanup`).

Retry-safe in three steps: (1) under row locks, check and mark: the versions become `deleting` (the model gets
`deletion_requested_at`), so nothing new starts using them (`services.lock_built_version`, `reserve_version`,
`mark_rebuild`, `uploads.services.start_upload` refuse); (2) delete the objects (every key under the version's or
model's folder, the file of a version made from a resumable upload, and the parts of the model's open uploads:
`register_model_cleanup`) and let each `VersionUser` forget what only remembers the versions (stopped deployments:
their repositories, then their rows); (3) delete the rows. Each step may run again: deleting what is gone is no
error. When the store fails in (2) the rows stay, marked, still counted in the storage quota; `DELETE` again, or
the sweeper (`finish_stalled_deletions`, run by `builds.sweep_stalled_versions`), finishes the job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from conch.errors import Conflict, InUse, Unavailable
from models_registry.choices import VersionStatus
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.services import model_root, source_key, version_root
from models_registry.storage import get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.services import TokenGrant, require_role

log = logging.getLogger(__name__)

#: Statuses whose version cannot be deleted now, and what to do about each.
_BUSY = {
    VersionStatus.UPLOADING: "its upload has not finished; wait for it to end (or be given up)",
    VersionStatus.QUEUED: "its build is queued; wait for the build to finish",
    VersionStatus.BUILDING: "it is being built; wait for the build to finish",
}


@dataclass(frozen=True)
class VersionUse:
    """One thing that uses a model version: `kind` ("deployment"), its `id` and `name`, which version, and whether
    it is already on its way out (`ending`: a deployment stopping), so a refusal can say to wait instead."""

    kind: str
    id: int
    name: str
    version_id: int
    ending: bool = False


@dataclass(frozen=True)
class VersionUser:
    """How an app above this one uses model versions.

    `uses(version_ids)` returns what still uses any of them (a deletion is then refused, naming them);
    `forget(version_ids)` removes what only remembers them, objects first then rows (idempotent; may raise
    Unavailable), before their rows are deleted.
    """

    kind: str
    uses: Callable[[list[int]], list[VersionUse]]
    forget: Callable[[list[int]], None]


class ModelCleanup(Protocol):
    """What an app above this one removes from the store when a model is deleted (`register_model_cleanup`)."""

    def __call__(self, *, model_id: int) -> object: ...


_users: list[VersionUser] = []
_model_cleanups: list[ModelCleanup] = []


def register_version_user(user: VersionUser) -> None:
    """Tell this app how another app uses model versions (once, from that app's AppConfig.ready)."""
    if all(known.kind != user.kind for known in _users):
        _users.append(user)


def register_model_cleanup(cleanup: ModelCleanup) -> None:
    """Run `cleanup(model_id=...)` when a model's objects leave the store, before its rows go (once, from an app's
    AppConfig.ready). It must be idempotent and may raise Unavailable (the deletion is then finished later)."""
    if cleanup not in _model_cleanups:
        _model_cleanups.append(cleanup)


def delete_model_version(*, user: AbstractBaseUser, version: ModelVersion, token: TokenGrant | None = None) -> None:
    """Delete a model version: its uploaded file, sample inputs and every build repository, then its row.

    Needs the developer role in its team and, with a token, the `models:write` scope (Forbidden). Raises InUse
    (409, field `deployments`, naming each deployment not stopped that serves it or is being updated to it),
    Conflict (409) while it is uploading or being built, Unavailable (503) when the object store fails (the
    version then stays `deleting`, and a retry or the sweeper finishes it). A version already `deleting` is
    finished without the checks.
    """
    require_role(
        user=user,
        team=version.model.team,
        role=Role.DEVELOPER,
        action="Deleting a model version",
        token=token,
        scope=Scope.MODELS_WRITE,
    )
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().filter(pk=version.pk).first()
        if locked is None:
            return
        if locked.status != VersionStatus.DELETING:
            _refuse_if_busy([locked], f"Model version {locked.pk} ({version.model.name} version {locked.number})")
            ModelVersion.objects.filter(pk=locked.pk).update(status=VersionStatus.DELETING, heartbeat_at=timezone.now())
            record_audit(
                action=AuditAction.VERSION_DELETED,
                team=version.model.team,
                target=locked,
                before={"status": locked.status, "source_size_bytes": locked.source_size_bytes},
            )
    log.info("version.deletion.started", extra={"version_id": version.pk})
    try:
        _finish_version(version.model_id, version.pk, version.number)
    except Unavailable as exc:
        raise Unavailable(
            f"Model version {version.pk} is marked 'deleting' but the object store failed ({exc.detail}); send the "
            "DELETE again, or the sweeper finishes it.",
        ) from exc


def delete_model(*, user: AbstractBaseUser, model: RegisteredModel, token: TokenGrant | None = None) -> None:
    """Delete a model with every version (their objects, then the rows); frees its storage and its models quota.

    Same rules as `delete_model_version`, for all of its versions at once: InUse naming every deployment that
    uses any version, Conflict while any version uploads or builds, Unavailable when the store fails (the model
    then stays marked and its versions `deleting`; a retry or the sweeper finishes it).
    """
    require_role(
        user=user,
        team=model.team,
        role=Role.DEVELOPER,
        action="Deleting a model",
        token=token,
        scope=Scope.MODELS_WRITE,
    )
    with transaction.atomic():
        locked = RegisteredModel.objects.select_for_update().filter(pk=model.pk).first()
        if locked is None:
            return
        versions = list(ModelVersion.objects.select_for_update().filter(model_id=model.pk).order_by("number"))
        if locked.deletion_requested_at is None:
            _refuse_if_busy(
                [version for version in versions if version.status != VersionStatus.DELETING], f"Model '{model.name}'"
            )
            now = timezone.now()
            RegisteredModel.objects.filter(pk=model.pk).update(deletion_requested_at=now)
            ModelVersion.objects.filter(model_id=model.pk).update(status=VersionStatus.DELETING, heartbeat_at=now)
            record_audit(
                action=AuditAction.MODEL_DELETED, team=model.team, target=locked, before={"versions": len(versions)}
            )
    log.info("model.deletion.started", extra={"model_id": model.pk})
    try:
        _finish_model(model.pk)
    except Unavailable as exc:
        raise Unavailable(
            f"Model '{model.name}' is marked for deletion but the object store failed ({exc.detail}); send the "
            "DELETE again, or the sweeper finishes it.",
        ) from exc


def finish_stalled_deletions(*, started_before: datetime) -> int:
    """Finish deletions that started before `started_before` and did not end (the store failed, or the process
    died); returns how many models and versions went. A store that fails again is logged; the next sweep retries.
    """
    finished = 0
    models = RegisteredModel.objects.filter(deletion_requested_at__lt=started_before)
    for model_id in models.values_list("pk", flat=True):
        try:
            _finish_model(model_id)
        except Unavailable as exc:
            log.warning("model.deletion.failed", extra={"model_id": model_id, "error": exc.detail})
            continue
        finished += 1
    versions = ModelVersion.objects.filter(status=VersionStatus.DELETING).filter(
        Q(heartbeat_at__lt=started_before) | Q(heartbeat_at__isnull=True)
    )
    for version_id, model_id, number in versions.values_list("pk", "model_id", "number"):
        try:
            _finish_version(model_id, version_id, number)
        except Unavailable as exc:
            log.warning("version.deletion.failed", extra={"version_id": version_id, "error": exc.detail})
            continue
        finished += 1
    return finished


def _refuse_if_busy(versions: list[ModelVersion], what: str) -> None:
    """Raise Conflict when a version uploads or builds, InUse when something of an app above uses one."""
    for version in versions:
        if version.status in _BUSY:
            raise Conflict(
                f"{what} cannot be deleted now: version {version.number} is '{version.status}' and "
                f"{_BUSY[version.status]}, then delete again.",
                field="status",
            )
    ids = [version.pk for version in versions]
    uses = [use for user in _users for use in user.uses(ids)] if ids else []
    if uses:
        named = ", ".join(f"'{use.name}' (id {use.id}{', stopping' if use.ending else ''})" for use in uses)
        if all(use.ending for use in uses):
            todo = "They are stopping: delete again once they have stopped (a few seconds)."
        else:
            todo = "Stop them (DELETE /api/v1/deployments/{id}/), or move them to another version, then delete again."
        raise InUse(
            f"{what} is used by {len(uses)} deployment{'s' if len(uses) != 1 else ''} not stopped: {named}. {todo}",
            field="deployments",
            users=[{"id": use.id, "name": use.name} for use in uses],
        )


def _finish_version(model_id: int, version_id: int, number: int) -> None:
    store = get_object_store()
    store.abort_multipart_uploads(source_key(model_id=model_id, number=number))
    root = version_root(model_id=model_id, number=number)
    removed = store.delete_prefix(root + "/")
    # A version made from a resumable upload keeps its file where the upload joined it, outside its folder.
    key = ModelVersion.objects.filter(pk=version_id).values_list("source_key", flat=True).first()
    if key and not key.startswith(root + "/"):
        store.delete(key)
    _forget([version_id])
    with transaction.atomic():
        ModelVersion.objects.filter(pk=version_id, status=VersionStatus.DELETING).delete()
    log.info("version.deleted", extra={"version_id": version_id, "objects_deleted": removed})


def _finish_model(model_id: int) -> None:
    store = get_object_store()
    version_ids = list(ModelVersion.objects.filter(model_id=model_id).values_list("pk", flat=True))
    for number in ModelVersion.objects.filter(model_id=model_id).values_list("number", flat=True):
        store.abort_multipart_uploads(source_key(model_id=model_id, number=number))
    for cleanup in _model_cleanups:
        cleanup(model_id=model_id)
    removed = store.delete_prefix(model_root(model_id=model_id) + "/")
    _forget(version_ids)
    with transaction.atomic():
        RegisteredModel.objects.filter(pk=model_id, deletion_requested_at__isnull=False).delete()
    log.info("model.deleted", extra={"model_id": model_id, "objects_deleted": removed})


def _forget(version_ids: list[int]) -> None:
    for user in _users:
        user.forget(version_ids)
    # What is left pointing at the versions must be something their users still use: never deleted under them.
    leftover = [use for user in _users for use in user.uses(version_ids)]
    if leftover:
        raise InUse(
            f"Deployment '{leftover[0].name}' (id {leftover[0].id}) started using this version while it was being "
            "deleted; stop it, then delete again.",
            field="deployments",
            users=[{"id": use.id, "name": use.name} for use in leftover],
        )
