from django.contrib import admin

from deployments.models import Deployment


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "model_version", "runtime", "status", "desired_state", "restart_count"]
    list_filter = ["status", "runtime", "team"]
    readonly_fields = ["pid", "process_create_time", "server_id", "http_port", "grpc_port", "metrics_port"]
