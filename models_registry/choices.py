"""Statuses owned by the model registry."""

from django.db import models


class VersionStatus(models.TextChoices):
    UPLOADING = "uploading", "Uploading"
    BUILDING = "building", "Building"
    BUILT = "built", "Built"
    FAILED = "failed", "Failed"
