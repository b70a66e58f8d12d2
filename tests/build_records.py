"""Test set-up of build records: put a version's current build attempt in a given state without running a build."""

from __future__ import annotations

from django.utils import timezone

from builds.models import Build
from models_registry.models import ModelVersion


def end_current_build(version: ModelVersion, status: str, *, error: str = "", error_field: str = "") -> Build:
    """End `version`'s current build attempt as `status` ("built" or "failed") says, with `error` naming
    `error_field` for a failure, and set the version's status to match, as the end of a build leaves them.
    Returns the attempt."""
    build = Build.objects.filter(version=version).order_by("-attempt").first()
    assert build is not None, f"version {version.pk} has no build attempt"
    build.status = {"built": "succeeded", "failed": "failed"}[status]
    build.error, build.error_field, build.finished_at = error, error_field, timezone.now()
    build.save(update_fields=["status", "error", "error_field", "finished_at"])
    ModelVersion.objects.filter(pk=version.pk).update(status=status)
    version.status = status
    return build


def fail_current_build(version: ModelVersion, error: str, *, error_field: str = "") -> Build:
    """End `version`'s current build attempt `failed` with `error` (naming `error_field`), the version `failed`."""
    return end_current_build(version, "failed", error=error, error_field=error_field)
