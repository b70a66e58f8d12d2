"""A resumable upload of a model file (the session); its parts live in the object store until it is joined."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from uploads.choices import PartChecksumAlgorithm, UploadStatus, UploadTransport


class Upload(models.Model):
    """A resumable upload of one model file: a multipart upload in the object store that clients fill part by part.

    Promised at the start: `filename`, `size_bytes` and `sha256`; split into `part_count` parts of
    `part_size_bytes` (the last one smaller). `head_sha256` is the SHA-256 of the first bytes the start carried
    (`head`; "" when it carried none): a client that lost its own record of the upload finds it again by filename,
    size and this digest, without hashing the whole file first. `object_key` is where the joined object goes,
    `store_upload_id` the store's reference to the unfinished upload (S3's UploadId, or the folder store's staging
    folder). While `uploading` (and until `expires_at`) or `completing`, `size_bytes` counts in the team's storage
    quota. Once a worker has checked the joined object, `version` is the ModelVersion made from it (its
    `source_key` is `object_key`). `heartbeat_at` is when the completion was requested or a worker last showed
    progress on it; `check_started_at` is when a worker took the check (None: queued, not taken).
    `allow_duplicate`: the client asked (at the start or the completion) for a new version even if the file already
    is a live version of the model; otherwise such a file is refused
    (`models_registry.services.refuse_duplicate_version`).
    `part_checksum_algorithm` is "CRC32" when the client chose to send each part with the CRC32 of its bytes (the
    store checks each part as it arrives), "" when it sends parts without checksums.

    The table was `models_registry_upload` until the upload moved to its own app (migrations
    `models_registry.0002_move_upload_to_uploads` and `uploads.0001_initial` renamed it and kept its rows).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    model = models.ForeignKey("models_registry.RegisteredModel", on_delete=models.CASCADE, related_name="uploads")
    filename = models.CharField(max_length=255)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    head_sha256 = models.CharField(max_length=64, blank=True)
    part_size_bytes = models.BigIntegerField()
    part_count = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=UploadStatus.choices, default=UploadStatus.UPLOADING)
    transport = models.CharField(max_length=8, choices=UploadTransport.choices)
    object_key = models.CharField(max_length=500)
    store_upload_id = models.CharField(max_length=1024, blank=True)
    build_options = models.JSONField(default=dict, blank=True)
    allow_duplicate = models.BooleanField(default=False)
    part_checksum_algorithm = models.CharField(
        max_length=16, choices=PartChecksumAlgorithm.choices, blank=True, default=""
    )
    expires_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    check_started_at = models.DateTimeField(null=True, blank=True)
    version = models.OneToOneField(
        "models_registry.ModelVersion", on_delete=models.SET_NULL, null=True, blank=True, related_name="upload"
    )
    error = models.TextField(blank=True)
    error_field = models.CharField(max_length=100, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["model_id", "created_at"]
        # The sweeper's queries (expired uploads, stalled completions) and the quota's count of open uploads.
        indexes = [models.Index(fields=["status", "expires_at"], name="upload_status_expires")]

    def __str__(self) -> str:
        return f"{self.model}:upload {self.id}"
