"""Model registry rules: naming, race-free version numbers, upload bookkeeping, rebuilds.

The bytes themselves go through `models_registry.storage` (the object-store adapter);
builds are run by the `builds` app, which reports back through `record_build_*` here.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from conch.errors import Conflict, InvalidInput, NotFound
from models_registry.choices import VersionStatus
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.naming import validate_model_name
from models_registry.storage import StoredObject, get_object_store
from tenancy.services import get_team_for_user, teams_for_user

log = logging.getLogger(__name__)


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


def repository_prefix(*, model_id: int, number: int) -> str:
    """Object-store prefix of the Triton model repository a version's build writes."""
    return f"models/{model_id}/versions/{number}/repository"


def visible_models(*, user: AbstractBaseUser) -> QuerySet[RegisteredModel]:
    """Models of the caller's teams."""
    return RegisteredModel.objects.filter(team__in=teams_for_user(user=user)).select_related("team")


def visible_versions(*, user: AbstractBaseUser) -> QuerySet[ModelVersion]:
    """Versions of models of the caller's teams."""
    return ModelVersion.objects.filter(model__team__in=teams_for_user(user=user)).select_related("model__team")


def get_model(*, user: AbstractBaseUser, model_id: int) -> RegisteredModel:
    """Return a model the caller may see. Raises NotFound."""
    model = visible_models(user=user).filter(pk=model_id).first()
    if model is None:
        raise NotFound(f"Model {model_id} does not exist or is not in one of your teams.")
    return model


def get_version(*, user: AbstractBaseUser, version_id: int) -> ModelVersion:
    """Return a version the caller may see. Raises NotFound."""
    version = visible_versions(user=user).filter(pk=version_id).first()
    if version is None:
        raise NotFound(f"Model version {version_id} does not exist or is not in one of your teams.")
    return version


def create_model(*, user: AbstractBaseUser, team_slug: str, name: str) -> RegisteredModel:
    """Register a model name in a team.

    The name is also the Triton model name and part of Kubernetes object names, so it must be
    a lowercase RFC 1123 DNS label of at most 63 characters. Raises InvalidInput (field
    `name`), NotFound (field `team`), Conflict (field `name`) for a duplicate in the team.
    """
    validate_model_name(name)
    team = get_team_for_user(user=user, slug=team_slug)
    try:
        with transaction.atomic():
            return RegisteredModel.objects.create(team=team, name=name, created_by=user)
    except IntegrityError:
        raise Conflict(f"Team '{team.slug}' already has a model named '{name}'.", field="name") from None


def reserve_version(*, model: RegisteredModel, user: AbstractBaseUser | None) -> ModelVersion:
    """Allocate the next version number of `model` (1, 2, 3…) and its source key.

    Race-free: the model row is locked while the number is chosen, and a unique
    constraint on (model, number) backs it up. The row starts as `uploading`.
    """
    with transaction.atomic():
        RegisteredModel.objects.select_for_update().filter(pk=model.pk).first()
        number = (model.versions.aggregate(top=Max("number"))["top"] or 0) + 1
        return ModelVersion.objects.create(
            model=model,
            number=number,
            status=VersionStatus.UPLOADING,
            source_key=source_key(model_id=model.pk, number=number),
            repository_prefix=repository_prefix(model_id=model.pk, number=number),
            created_by=user,
        )


def discard_upload(*, version: ModelVersion) -> None:
    """Forget a version whose upload failed: delete its row and any stored bytes (model file, sample inputs)."""
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
    ModelVersion.objects.filter(pk=version.pk, status=VersionStatus.UPLOADING).delete()


def complete_upload(
    *, version: ModelVersion, stored: StoredObject, filename: str, build_options: dict[str, Any]
) -> ModelVersion:
    """Record a finished upload as `queued` for build attempt 1 (or the next attempt).

    `build_options` are already-validated build options (a plain dict). The caller queues the build in the
    same transaction (`builds.services.submit_upload`). Raises InvalidInput naming `file` for an empty file;
    the caller then discards the upload (`discard_upload`), as it does for any failure while the body is
    received.
    """
    if stored.size_bytes == 0:
        raise InvalidInput("The uploaded file is empty (0 bytes); send the model file in field 'file'.", field="file")
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().get(pk=version.pk)
        version.source_filename = filename[:255]
        version.source_size_bytes = stored.size_bytes
        version.source_sha256 = stored.sha256_hex
        version.build_options = build_options
        version.status = VersionStatus.QUEUED
        version.build_attempt += 1
        version.save()
    log.info("version.uploaded", extra={"version_id": version.pk, "size_bytes": stored.size_bytes})
    return version


def mark_rebuild(
    *, version: ModelVersion, allow_building: bool = False, build_options: dict[str, Any] | None = None
) -> ModelVersion:
    """Start a new build attempt of a stored version: status `queued`, attempt + 1, error cleared.

    `build_options`, when given, replaces the stored (already validated) build options, e.g. with sample inputs
    added. Raises Conflict while the upload has not finished, or while a build is queued or running (unless
    `allow_building`: the caller found that build's worker dead). The caller queues the build in the same
    transaction.
    """
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if version.status == VersionStatus.UPLOADING:
            raise Conflict("The upload of this version has not finished.", field=None)
        if version.status in (VersionStatus.QUEUED, VersionStatus.BUILDING) and not allow_building:
            raise Conflict(f"This version is already {version.status}; wait for its build to finish.", field=None)
        version.status = VersionStatus.QUEUED
        version.error = ""
        version.error_field = ""
        version.build_attempt += 1
        if build_options is not None:
            version.build_options = build_options
        version.save()
    return version


def record_build_result(
    *,
    version_id: int,
    attempt: int,
    succeeded: bool,
    error: str = "",
    error_field: str = "",
) -> bool:
    """Store the outcome of build `attempt`; a stale attempt (a newer rebuild exists) is ignored.

    Returns whether the result was recorded.
    """
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().get(pk=version_id)
        if version.build_attempt != attempt or version.status not in (VersionStatus.QUEUED, VersionStatus.BUILDING):
            return False
        version.status = VersionStatus.BUILT if succeeded else VersionStatus.FAILED
        version.error = error
        version.error_field = error_field
        version.built_at = timezone.now() if succeeded else None
        version.save()
    return True


def record_build_artifacts(*, version_id: int, **fields: Any) -> None:
    """Store what a build step produced (`signature`, `config_pbtxt`)."""
    allowed = {"signature", "config_pbtxt"}
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"unknown build artifacts: {sorted(unknown)}")
    ModelVersion.objects.filter(pk=version_id).update(**fields)


def claim_build(*, version_id: int, attempt: int) -> ModelVersion | None:
    """Mark build `attempt` of a version as taken by a worker (`building`) and return the version.

    Returns None when the attempt is stale (a newer rebuild exists) or already finished. A redelivered task
    claims a `building` attempt again and redoes it (builds are idempotent).
    """
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().filter(pk=version_id).first()
        if version is None or version.build_attempt != attempt:
            return None
        if version.status not in (VersionStatus.QUEUED, VersionStatus.BUILDING):
            return None
        version.status = VersionStatus.BUILDING
        version.save(update_fields=["status"])
    return ModelVersion.objects.select_related("model__team").get(pk=version_id)
