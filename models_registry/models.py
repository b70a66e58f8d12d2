"""Registered models and their uploaded versions."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from models_registry.choices import VersionStatus


class RegisteredModel(models.Model):
    """A named model of a team; its name is also the Triton model name (a DNS label)."""

    team = models.ForeignKey("tenancy.Team", on_delete=models.PROTECT, related_name="models")
    name = models.CharField(max_length=63)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when a deletion starts (`models_registry.deletion`): no more uploads; the row goes once the objects have.
    deletion_requested_at = models.DateTimeField(null=True, blank=True)
    # The highest version number ever given, so a deleted version's number is never given again.
    last_version_number = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="registeredmodel_unique_team_name")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"


class ModelVersion(models.Model):
    """One uploaded file of a model, numbered 1, 2, 3… per model (a deleted number is never reused).

    A version is what was uploaded: its model, number, source file (`source_key`: where the uploaded bytes live in
    the object store), SHA-256, sample inputs and the signature its build read from the file. Its builds are the
    `builds` app's records (`builds.models.Build`, one per attempt, related name `builds`); `status` sums up where
    the version stands: `uploading`, then the status of its current build (`queued`, `building`, `built`,
    `failed`), or `deleting`.

    `source_checked` says whether `source_sha256` was computed from the stored bytes. A version made from a
    resumable upload starts with the SHA-256 its client promised, unchecked (False): the first build reads the
    file anyway, hashes it in its inspect step and sets it True, or fails the build naming `sha256`.

    `heartbeat_at` is the last sign of life of an upload or a deletion: while `uploading`, when bytes last
    arrived (the sweeper aborts an upload whose bytes stopped); while `deleting`, when the deletion started. A
    build's heartbeat is its own (`Build.heartbeat_at`).
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.UPLOADING)
    source_key = models.CharField(max_length=500, blank=True)
    source_filename = models.CharField(max_length=255, blank=True)
    source_size_bytes = models.BigIntegerField(default=0)
    # Bytes of the version's stored sample inputs (`sample_inputs.npz` beside its source, for the verify step's and
    # a hot update's test inferences); 0 without. Counted in the team's storage quota with the source.
    samples_size_bytes = models.PositiveBigIntegerField(default=0)
    source_sha256 = models.CharField(max_length=64, blank=True)
    source_checked = models.BooleanField(default=True)
    signature = models.JSONField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model_id", "number"]
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="modelversion_unique_model_number")]
        # The sweepers' query: uploads (and deletions) whose heartbeat is older than a bound.
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="modelversion_status_heartbeat")]

    def __str__(self) -> str:
        return f"{self.model}:{self.number}"
