"""Deployment statuses and runtimes."""

from django.db import models


class DeploymentStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    # Serving, but with fewer ready pods than desired (some are pending, crashing or unschedulable).
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"


class RuntimeName(models.TextChoices):
    LOCAL = "local", "Local Triton process"
    KUBERNETES = "kubernetes", "Kubernetes"


class DesiredState(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"


class UpdateStatus(models.TextChoices):
    """Where a deployment's last hot version update stands ("" when it never had one)."""

    NONE = "", "None"
    QUEUED = "queued", "Queued"
    UPDATING = "updating", "Updating"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class PlanStatus(models.TextChoices):
    """Where a TensorRT plan of a version stands (`deployments.services.plans`)."""

    PENDING = "pending", "Pending"  # asked for; its Job not created yet
    BUILDING = "building", "Building"  # its Job exists (waiting for a GPU, or running trtexec)
    SUCCEEDED = "succeeded", "Succeeded"  # built, run and compared: deployments on its GPU product use it
    FAILED = "failed", "Failed"


#: Plan statuses from which nothing moves on.
FINAL_PLAN_STATUSES = (PlanStatus.SUCCEEDED, PlanStatus.FAILED)
