"""Build steps of a model version, each with its status and log lines."""

from __future__ import annotations

from django.db import models

from builds.choices import StepName, StepStatus


class BuildStep(models.Model):
    """One step of the latest build of a version; a rebuild resets the four rows in place."""

    version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.CASCADE, related_name="build_steps")
    name = models.CharField(max_length=32, choices=StepName.choices)
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    log = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["version_id", "position"]
        constraints = [models.UniqueConstraint(fields=["version", "name"], name="buildstep_unique_version_name")]

    def __str__(self) -> str:
        return f"{self.version} {self.name}: {self.status}"


class BuildRepository(models.Model):
    """The Triton model repository one build attempt wrote to the object store, and its size in bytes.

    A row is written (storage reserved against the team's quota) just before the attempt writes its objects
    under `prefix`, and deleted once those objects are gone (garbage collection of unused attempts, or the
    version's deletion): the team's storage counts it all that time (`builds.services.storage`).
    """

    version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.CASCADE, related_name="build_repositories"
    )
    attempt = models.PositiveIntegerField()
    prefix = models.CharField(max_length=500)
    size_bytes = models.PositiveBigIntegerField()
    written_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["version_id", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["version", "attempt"], name="buildrepository_unique_version_attempt")
        ]

    def __str__(self) -> str:
        return f"{self.prefix} ({self.size_bytes} bytes)"
