"""Statuses owned by the model registry (an upload's are in `uploads.choices`)."""

from django.db import models


class VersionStatus(models.TextChoices):
    UPLOADING = "uploading", "Uploading"
    # Uploaded and waiting for a worker; `building` once a worker has claimed it.
    QUEUED = "queued", "Queued"
    BUILDING = "building", "Building"
    BUILT = "built", "Built"
    FAILED = "failed", "Failed"
    # Being deleted: its objects are being removed from the store; the row goes last (see services.deletion).
    DELETING = "deleting", "Deleting"
