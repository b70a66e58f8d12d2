"""Serializers of the deployments API."""

from __future__ import annotations

from rest_framework import serializers

from deployments.models import Deployment
from deployments.services import effective_settings, endpoints, log_tail


class CreateDeploymentSerializer(serializers.Serializer):
    name = serializers.CharField(allow_blank=True, help_text="Lowercase DNS label, at most 63 characters.")
    team = serializers.CharField(max_length=63, help_text="Slug of one of your teams.")
    model_version = serializers.JSONField(help_text="Id of a built model version.")
    runtime = serializers.CharField(required=False, default="local")
    instance_count = serializers.JSONField(required=False, default=None)
    max_batch_size = serializers.JSONField(required=False, default=None)
    max_queue_delay_microseconds = serializers.JSONField(required=False, default=None)


class UpdateDeploymentSerializer(serializers.Serializer):
    """A partial update of a deployment: send only the fields to change; any other field is refused (400)."""

    model_version = serializers.JSONField(
        required=False,
        help_text="Id of another built version of the deployment's model: every server loads it, warms it up and "
        "unloads the old one, without a restart. Progress shows in update_status; a failure in update_error, and "
        "the deployment keeps serving the old version.",
    )


class DeploymentSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug", read_only=True)
    model = serializers.CharField(source="model_version.model.name", read_only=True)
    model_version_number = serializers.IntegerField(source="model_version.number", read_only=True)
    endpoints = serializers.SerializerMethodField()
    log_tail = serializers.SerializerMethodField()
    effective = serializers.SerializerMethodField(
        help_text="What Triton was told: max_batch_size, instance_count, dynamic batching and its queue delay (µs) "
        "from the effective model configuration (the version's, with this deployment's overrides)."
    )

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "team",
            "model",
            "model_version",
            "model_version_number",
            "runtime",
            "instance_count",
            "max_batch_size",
            "max_queue_delay_microseconds",
            "effective",
            "desired_state",
            "status",
            "error",
            "last_failure",
            "restart_count",
            "target_model_version",
            "update_status",
            "update_error",
            "endpoints",
            "config_pbtxt",
            "repository_prefix",
            "log_tail",
            "created_at",
            "ready_at",
            "updated_at",
        ]

    def get_endpoints(self, obj: Deployment) -> dict:
        where = endpoints(obj)
        return {
            "http": where.http,
            "grpc": where.grpc,
            "metrics": where.metrics,
            "infer": f"{where.http}/v2/models/{obj.model_name}/infer" if where.http else "",
        }

    def get_effective(self, obj: Deployment) -> dict:
        return effective_settings(obj)

    def get_log_tail(self, obj: Deployment) -> list[str]:
        return log_tail(obj)
