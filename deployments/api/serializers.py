"""Serializers of the deployments API."""

from __future__ import annotations

from rest_framework import serializers

from deployments.models import Deployment, GatewayUsage, TensorRTPlan
from deployments.services import effective_settings, endpoints, gateway_address, log_tail


class CreateDeploymentSerializer(serializers.Serializer):
    name = serializers.CharField(allow_blank=True, help_text="Lowercase DNS label, at most 63 characters.")
    team = serializers.CharField(max_length=63, help_text="Slug of one of your teams.")
    model_version = serializers.JSONField(help_text="Id of a built model version.")
    runtime = serializers.CharField(required=False, default="local")
    instance_count = serializers.JSONField(required=False, default=None)
    instance_kind = serializers.JSONField(
        required=False,
        default=None,
        help_text="Kind of the model instances (Triton instance_group kind): KIND_AUTO, KIND_CPU, or KIND_GPU "
        "(local: only on a worker host with GPUs; kubernetes: only with gpu per pod); omit to keep the build's "
        "(KIND_AUTO).",
    )
    max_batch_size = serializers.JSONField(required=False, default=None)
    max_queue_delay_microseconds = serializers.JSONField(required=False, default=None)
    cluster = serializers.JSONField(
        required=False, default=None, help_text="kubernetes: name of a registered cluster (GET /api/v1/clusters/)."
    )
    replicas = serializers.JSONField(required=False, default=None, help_text="kubernetes: number of pods.")
    autoscaling = serializers.JSONField(
        required=False,
        default=None,
        help_text='kubernetes, instead of replicas: {"min_replicas", "max_replicas", "target_queue_time_us"} '
        '(Triton queue time per request, microseconds) or {"min_replicas", "max_replicas", "target_cpu_percent"}.',
    )
    gpu = serializers.JSONField(
        required=False,
        default=None,
        help_text='kubernetes: GPUs per pod, {"product": "NVIDIA-A10", "count": 1} or {"mig_profile": "1g.10gb"}; '
        "omit for CPU only.",
    )
    cpu = serializers.JSONField(required=False, default=None, help_text="kubernetes: CPU request per pod ('2').")
    memory = serializers.JSONField(required=False, default=None, help_text="kubernetes: memory per pod ('8Gi').")


class UpdateDeploymentSerializer(serializers.Serializer):
    """A partial update of a deployment: send only the fields to change; any other field is refused (400)."""

    model_version = serializers.JSONField(
        required=False,
        help_text="Id of another built version of the deployment's model: every server loads it, warms it up and "
        "unloads the old one, without a restart. Progress shows in update_status; a failure in update_error, and "
        "the deployment keeps serving the old version.",
    )
    replicas = serializers.JSONField(required=False, help_text="kubernetes: the number of pods.")
    autoscaling = serializers.JSONField(
        required=False, help_text="kubernetes: new autoscaling bounds (replaces fixed replicas)."
    )


class DeploymentSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug", read_only=True)
    model = serializers.CharField(source="model_version.model.name", read_only=True)
    model_version_number = serializers.IntegerField(source="model_version.number", read_only=True)
    endpoints = serializers.SerializerMethodField()
    log_tail = serializers.SerializerMethodField(
        help_text="Triton's last log lines (for kubernetes, of the pod in most trouble, read through the cluster's "
        "API: only on a single deployment's GET, not in lists)."
    )
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    replicas = serializers.SerializerMethodField(
        help_text="kubernetes: pods wanted and ready, as last observed ({desired, ready}); null for local."
    )
    pods = serializers.SerializerMethodField(
        help_text="kubernetes: each pod's name, node, phase, ready, restarts and a message when it is not ready."
    )
    effective = serializers.SerializerMethodField(
        help_text="What Triton was told: max_batch_size, instance_count, instance_kind, dynamic batching and its "
        "queue delay (µs) from the effective model configuration (the version's, with this deployment's overrides)."
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
            "cluster",
            "replicas",
            "autoscaling",
            "gpu",
            "cpu",
            "memory",
            "pods",
            "instance_count",
            "max_batch_size",
            "max_queue_delay_microseconds",
            "effective",
            "desired_state",
            "status",
            "status_message",
            "error",
            "last_failure",
            "restart_count",
            "target_model_version",
            "update_status",
            "update_error",
            "endpoints",
            "config_pbtxt",
            "repository_prefix",
            "tensorrt_plan",
            "log_tail",
            "created_at",
            "ready_at",
            "updated_at",
        ]

    def get_endpoints(self, obj: Deployment) -> dict:
        where = endpoints(obj)
        gateway = gateway_address(team_slug=obj.team.slug, name=obj.name)
        return {
            "http": where.http,
            "grpc": where.grpc,
            "metrics": where.metrics,
            "infer": f"{where.http}/v2/models/{obj.model_name}/infer" if where.http else "",
            # Through Conch's inference gateway, with a token (KServe v2 REST; tritonclient takes it without the
            # scheme), and its KServe v2 gRPC service with the metadata each call sends besides the token's
            # `authorization: Bearer …`.
            "gateway": gateway.http,
            "gateway_grpc": gateway.grpc,
            "gateway_grpc_metadata": dict(gateway.grpc_metadata) if gateway.grpc else {},
        }

    def get_replicas(self, obj: Deployment) -> dict | None:
        if obj.runtime != "kubernetes":
            return None
        if obj.desired_state != "running":
            return {"desired": 0, "ready": 0}
        seen = (obj.observed or {}).get("replicas") or {}
        # Fixed replicas: what was asked (a PATCH shows at once); autoscaling: what the autoscaler chose.
        wanted = seen.get("desired", obj.autoscaling["min_replicas"]) if obj.autoscaling else obj.replicas
        return {"desired": wanted, "ready": seen.get("ready", 0)}

    def get_pods(self, obj: Deployment) -> list[dict]:
        return list((obj.observed or {}).get("pods") or [])

    def get_effective(self, obj: Deployment) -> dict:
        return effective_settings(obj)

    def get_log_tail(self, obj: Deployment) -> list[str]:
        view = self.context.get("view")
        if obj.runtime != "local" and getattr(view, "action", None) == "list":
            return []  # two API requests per deployment: only for one deployment at a time
        return log_tail(obj)


class GatewayUsageQuerySerializer(serializers.Serializer):
    """Filters of the gateway usage list: UTC days, both inclusive."""

    since = serializers.DateField(required=False, help_text="First day (YYYY-MM-DD, UTC), inclusive.")
    until = serializers.DateField(required=False, help_text="Last day (YYYY-MM-DD, UTC), inclusive.")

    def validate(self, attrs: dict) -> dict:
        if attrs.get("since") and attrs.get("until") and attrs["since"] > attrs["until"]:
            raise serializers.ValidationError({"until": "until must be on or after since."})
        return attrs


class GatewayUsageSerializer(serializers.ModelSerializer):
    """One token's use of one deployment through the inference gateway on one day (UTC)."""

    token = serializers.SerializerMethodField()
    deployment = serializers.SerializerMethodField()

    class Meta:
        model = GatewayUsage
        fields = ["day", "token", "deployment", "requests", "inferences", "errors", "bytes_in", "bytes_out"]

    def get_token(self, obj: GatewayUsage) -> dict:
        return {"id": obj.token_id, "prefix": obj.token.prefix, "name": obj.token.name}

    def get_deployment(self, obj: GatewayUsage) -> dict:
        return {"id": obj.deployment_id, "name": obj.deployment.name}


class CreateTensorRTPlanSerializer(serializers.Serializer):
    model_version = serializers.JSONField(help_text="Id of a built version served as ONNX.")
    cluster = serializers.CharField(help_text="Name of the Kubernetes cluster whose nodes build (and run) the plan.")
    gpu_product = serializers.CharField(
        help_text="The `nvidia.com/gpu.product` label value of the nodes to build on, e.g. NVIDIA-A10."
    )
    fp16 = serializers.BooleanField(
        required=False, default=False, help_text="Let TensorRT pick FP16 kernels (compared within FP16's tolerance)."
    )


class TensorRTPlanSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug", read_only=True)
    model = serializers.CharField(source="model_version.model.name", read_only=True)
    model_version_number = serializers.IntegerField(source="model_version.number", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = TensorRTPlan
        fields = [
            "id",
            "team",
            "model",
            "model_version",
            "model_version_number",
            "build",
            "cluster",
            "gpu_product",
            "fp16",
            "image",
            "tensorrt_version",
            "status",
            "message",
            "job_name",
            "repository_prefix",
            "config_pbtxt",
            "plan_bytes",
            "report",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields
