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
