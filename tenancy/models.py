"""Teams, their members, and API tokens. Every model and deployment belongs to a team."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenancy.choices import Role


class Team(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.DEVELOPER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """A bearer token of one user in one team. Only the sha256 of the secret is stored; `prefix` identifies it.

    It may do what its `scopes` name (`tenancy.choices.Scope`) and its user's role in `team` allows, on
    deployments named in `deployments` only when that list is not empty, until `expires_at`. A token made
    before tokens were bound to teams has no `team` and acts in all of its user's teams.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens", null=True, blank=True)
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    scopes = models.JSONField(default=list)
    deployments = models.JSONField(default=list, blank=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    is_revoked = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
