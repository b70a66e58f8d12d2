"""Serializers of model versions and their builds (upload form, version detail with build steps)."""

from __future__ import annotations

from rest_framework import serializers

from builds.model_config import MAX_INSTANCE_COUNT, MAX_MAX_BATCH_SIZE, MAX_QUEUE_DELAY_MICROSECONDS
from builds.models import BuildStep
from models_registry.models import ModelVersion

_SAMPLE_INPUTS_HELP = (
    "Optional .npz of named arrays (numpy.savez('samples.npz', input_name=array, ...)), each in the shape the model "
    "takes; the verify step runs them instead of generated inputs."
)
_SAMPLE_VALUES_HELP = (
    "Optional per-input values for the verify step, e.g. sr=16000 (entries separated by ';'); a single value fills "
    "the input, a JSON list gives the whole array."
)


class BuildStepSerializer(serializers.ModelSerializer):
    """One build step: name, status, log lines (each "HH:MM:SS message"), start and finish times."""

    class Meta:
        model = BuildStep
        fields = ["name", "status", "log", "started_at", "finished_at"]


class UploadVersionSerializer(serializers.Serializer):
    """Multipart form of a version upload (documented for the OpenAPI schema)."""

    file = serializers.FileField(help_text="The ONNX model file.")
    max_batch_size = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_MAX_BATCH_SIZE,
        help_text="Largest batch Triton may form; 0 serves one request per run; leave out to let the build decide "
        "from the model (8 when its axis 0 is proven to be the batch axis, else 0).",
    )
    max_queue_delay_microseconds = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_QUEUE_DELAY_MICROSECONDS
    )
    preferred_batch_size = serializers.CharField(required=False, help_text="Comma-separated sizes, e.g. 4,8.")
    instance_count = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INSTANCE_COUNT)
    sample_inputs = serializers.FileField(required=False, help_text=_SAMPLE_INPUTS_HELP)
    sample_values = serializers.CharField(required=False, help_text=_SAMPLE_VALUES_HELP)


class RebuildSerializer(serializers.Serializer):
    """Optional body of a rebuild: new sample inputs for the verify step (documented for the OpenAPI schema)."""

    sample_inputs = serializers.FileField(required=False, help_text=_SAMPLE_INPUTS_HELP)
    sample_values = serializers.CharField(required=False, help_text=_SAMPLE_VALUES_HELP)


class ModelVersionSerializer(serializers.ModelSerializer):
    model = serializers.PrimaryKeyRelatedField(read_only=True)
    model_name = serializers.CharField(source="model.name", read_only=True)
    team = serializers.CharField(source="model.team.slug", read_only=True)
    source = serializers.SerializerMethodField()
    steps = BuildStepSerializer(source="build_steps", many=True, read_only=True)

    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "model",
            "model_name",
            "team",
            "number",
            "status",
            "error",
            "error_field",
            "source",
            "build_options",
            "signature",
            "config_pbtxt",
            "repository_prefix",
            "steps",
            "created_at",
            "built_at",
        ]

    def get_source(self, obj: ModelVersion) -> dict:
        return {
            "filename": obj.source_filename,
            "size_bytes": obj.source_size_bytes,
            "sha256": obj.source_sha256,
            "key": obj.source_key,
        }
