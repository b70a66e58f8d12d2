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
    """One uploaded file of a model, numbered 1, 2, 3… per model (a deleted number is never reused), and its build.

    `source_key` is where the uploaded bytes live in the object store. Each build attempt writes its
    own Triton model repository under its own prefix and never touches another attempt's;
    `repository_prefix` is the one of the latest successful build (`<prefix>/<model name>/config.pbtxt`,
    `<prefix>/<model name>/<number>/model.onnx`), empty until a build succeeds.

    `source_checked` says whether `source_sha256` was computed from the stored bytes. A version made from a
    resumable upload starts with the SHA-256 its client promised, unchecked (False): the first build reads the
    file anyway, hashes it in its inspect step and sets it True, or fails the version naming `sha256`.

    `heartbeat_at` is the last sign of life of the current phase: while `uploading`, when bytes last
    arrived; while `queued`, when it was queued; while `building`, the worker's last heartbeat. The
    sweeper (`builds.services.sweep_stalled_versions`) acts on versions whose heartbeat is too old.
    `lost_attempts` counts the attempts of the current build whose worker stopped mid-build. While `deleting`,
    `heartbeat_at` is when the deletion started.
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.UPLOADING)
    error = models.TextField(blank=True)
    error_field = models.CharField(max_length=100, blank=True)
    source_key = models.CharField(max_length=500, blank=True)
    source_filename = models.CharField(max_length=255, blank=True)
    source_size_bytes = models.BigIntegerField(default=0)
    # Bytes of the version's stored sample inputs (`sample_inputs.npz` beside its source, for the verify step's and
    # a hot update's test inferences); 0 without. Counted in the team's storage quota with the source.
    samples_size_bytes = models.PositiveBigIntegerField(default=0)
    source_sha256 = models.CharField(max_length=64, blank=True)
    source_checked = models.BooleanField(default=True)
    build_options = models.JSONField(default=dict, blank=True)
    build_attempt = models.PositiveIntegerField(default=0)
    signature = models.JSONField(null=True, blank=True)
    config_pbtxt = models.TextField(blank=True)
    repository_prefix = models.CharField(max_length=500, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lost_attempts = models.PositiveSmallIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    built_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["model_id", "number"]
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="modelversion_unique_model_number")]
        # The sweeper's query: versions in one status whose heartbeat is older than a bound.
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="modelversion_status_heartbeat")]

    def __str__(self) -> str:
        return f"{self.model}:{self.number}"
