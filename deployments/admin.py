from django.contrib import admin

from deployments.models import Deployment


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "model_version", "runtime", "status", "desired_state", "restart_count"]
    list_filter = ["status", "runtime", "team"]
    readonly_fields = ["runtime_state", "repository_prefix", "heartbeat_at"]
