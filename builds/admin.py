from django.contrib import admin

from builds.models import BuildStep
from conch.admin_base import ReadOnlyModelAdmin


@admin.register(BuildStep)
class BuildStepAdmin(ReadOnlyModelAdmin):
    """The steps of builds, for staff to read; the build pipeline writes them."""

    list_display = ["version", "name", "status", "started_at", "finished_at"]
    list_filter = ["status", "name"]
