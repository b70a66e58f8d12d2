from django.contrib import admin
from django.http import HttpRequest
from unfold.admin import ModelAdmin

from builds.models import BuildStep


@admin.register(BuildStep)
class BuildStepAdmin(ModelAdmin):
    """The steps of builds, for staff to read; the build pipeline writes them."""

    list_display = ["version", "name", "status", "started_at", "finished_at"]
    list_filter = ["status", "name"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
