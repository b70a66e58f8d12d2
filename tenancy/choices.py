"""Statuses and kinds owned by the tenancy app."""

from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
