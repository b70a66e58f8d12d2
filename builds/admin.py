from django.contrib import admin

from builds.models import BuildStep


@admin.register(BuildStep)
class BuildStepAdmin(admin.ModelAdmin):
    list_display = ["version", "name", "status", "started_at", "finished_at"]
    list_filter = ["status", "name"]
