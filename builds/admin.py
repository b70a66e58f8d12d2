from django.contrib import admin

from builds.models import Build, BuildStep
from conch.admin_base import ReadOnlyModelAdmin


@admin.register(Build)
class BuildAdmin(ReadOnlyModelAdmin):
    """Build attempts, for staff to read; `builds.services.state` writes them."""

    list_display = ["version", "attempt", "status", "worker", "queued_at", "started_at", "finished_at"]
    list_filter = ["status"]


@admin.register(BuildStep)
class BuildStepAdmin(ReadOnlyModelAdmin):
    """The steps of builds, for staff to read; the build pipeline writes them."""

    list_display = ["build", "name", "status", "started_at", "finished_at"]
    list_filter = ["status", "name"]
