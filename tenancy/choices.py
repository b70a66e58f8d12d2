"""Statuses and kinds owned by the tenancy app."""

from django.db import models


class Role(models.TextChoices):
    """A member's role in one team, weakest first (each role may do what the ones before it may)."""

    VIEWER = "viewer", "Viewer"
    DEVELOPER = "developer", "Developer"
    ADMIN = "admin", "Admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)


class Scope(models.TextChoices):
    """What an API token may be used for (on top of its user's role in the token's team)."""

    READ = "read", "Read"
    MODELS_WRITE = "models:write", "Register and upload models, rebuild versions"
    DEPLOYMENTS_WRITE = "deployments:write", "Create, change and stop deployments"
    INFER = "infer", "Send inference requests"
