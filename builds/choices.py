"""Build steps and their statuses."""

from django.db import models


class StepName(models.TextChoices):
    INSPECT = "inspect", "Inspect"
    CONFIGURE = "configure", "Configure"
    WRITE_REPOSITORY = "write_repository", "Write repository"
    VERIFY = "verify", "Verify"


class StepStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"


STEP_ORDER = [StepName.INSPECT, StepName.CONFIGURE, StepName.WRITE_REPOSITORY, StepName.VERIFY]


class BuildStatus(models.TextChoices):
    """Where one build attempt stands (`builds.models.Build.status`)."""

    # Waiting for a worker to claim it; `building` once one has.
    QUEUED = "queued", "Queued"
    BUILDING = "building", "Building"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    # Its worker stopped mid-build (no heartbeat): the next attempt took over.
    LOST = "lost", "Lost"
    # A rebuild started before it finished (it had stalled); what it records is ignored.
    SUPERSEDED = "superseded", "Superseded"


#: Statuses of an attempt that is not over: a worker has it, or will.
OPEN_BUILD_STATUSES = (BuildStatus.QUEUED, BuildStatus.BUILDING)
