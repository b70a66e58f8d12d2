"""Teams, their members, API tokens, quotas and the audit log. Every model and deployment belongs to a team."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenancy.choices import Role


class Team(models.Model):
    """A team: its members share models, deployments and quotas.

    `allow_pickled_models`: whether its builds may load Python pickles (scikit-learn `.joblib`/`.pkl` models).
    Unpickling runs code from the file, so only a platform admin turns it on, and even then the file is loaded only
    in the build's sandbox with no network (`builds.sandbox.cut_network`).
    """

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    allow_pickled_models = models.BooleanField(
        default=False,
        help_text="Let this team's builds load Python pickles (scikit-learn .joblib/.pkl). Loading a pickle runs "
        "code from the file; Conch does it only in the build's sandbox, with no network.",
    )

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
    # Inference gateway requests this token may send per minute; null: CONCH_GATEWAY_REQUESTS_PER_MINUTE.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    is_revoked = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class TeamQuota(models.Model):
    """Limits a staff member set for one team; a null limit means the default in settings (CONCH_QUOTA_*).

    Usage is not stored: `tenancy.quotas` counts it from the tables that own each resource, under a lock on the
    team's row (see that module).
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    # nvidia.com/gpu per team, and the same number of slices of each MIG profile (nvidia.com/mig-<profile>).
    gpus = models.PositiveIntegerField(null=True, blank=True)
    # Model instances of local-runtime deployments (each one a copy of the model in a tritonserver's memory).
    instances = models.PositiveIntegerField(null=True, blank=True)
    storage_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    registered_models = models.PositiveIntegerField(null=True, blank=True)
    deployments = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.team}"


class AuditEntry(models.Model):
    """One mutation: who did it (user and token prefix, or "system"), where from, in which team, to what.

    Written only by `tenancy.audit.record_audit`; never changed or deleted (a database trigger refuses UPDATE
    and DELETE, migration 0001). `team` and `user` keep no foreign-key constraint and are not cleared when the
    row they name is deleted: the entry keeps `team_slug` and `actor` as they were.
    """

    created_at = models.DateTimeField(db_index=True)
    team = models.ForeignKey(
        Team, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True, related_name="+"
    )
    team_slug = models.CharField(max_length=63, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    # The username, or "system" for a management command, a Celery task or other code without a request.
    actor = models.CharField(max_length=150)
    token_prefix = models.CharField(max_length=16, blank=True)
    source = models.CharField(max_length=16)
    # The command or task name, or the request's method and path.
    source_detail = models.CharField(max_length=200, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=40, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["team", "-created_at"], name="audit_team_time"),
            models.Index(fields=["action", "-created_at"], name="audit_action_time"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_repr}"
