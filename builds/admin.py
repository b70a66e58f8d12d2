from django.contrib import admin
from unfold.admin import ModelAdmin

from builds.models import BuildStep


@admin.register(BuildStep)
class BuildStepAdmin(ModelAdmin):
    list_display = ["version", "name", "status", "started_at", "finished_at"]
    list_filter = ["status", "name"]
