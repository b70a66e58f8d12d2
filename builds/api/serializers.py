"""Serializers of model versions and their builds (upload form, version detail with build steps)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers

from builds.model_config import (
    DEFAULT_INSTANCE_COUNT,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_DELAY_MICROSECONDS,
    MAX_INSTANCE_COUNT,
    MAX_MAX_BATCH_SIZE,
    MAX_QUEUE_DELAY_MICROSECONDS,
)
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

OUTPUT_DIMS_HELP = (
    "Optional: outputs' full shapes (axis 0 included, -1 for an axis of any size) in place of those the model file "
    "declares, for a file that declares them wrongly: text such as 387=-1,1,8210 (entries separated by ';') or a "
    'JSON object {"387": [-1, 1, 8210]}. Each name must be an output of the model; the verify step checks them. '
    "Left out, an output that comes back in another shape than declared gets the shape observed on the samples."
)

ALLOW_DUPLICATE_HELP = (
    "Make a new version even when the file (its SHA-256) already is a live version of the model. Left out or false, "
    "such a file is refused with 409 naming `sha256`, the body's `existing_version` ({id, number, status}) saying "
    "which version it is."
)


class BuildStepSerializer(serializers.ModelSerializer):
    """One build step: name, status, log lines (each "HH:MM:SS message"), start and finish times."""

    class Meta:
        model = BuildStep
        fields = ["name", "status", "log", "started_at", "finished_at"]


class UploadVersionSerializer(serializers.Serializer):
    """Multipart form of a version upload: the model file and optional build options.

    A build option left out or empty gets the value that suits the model.
    """

    file = serializers.FileField(help_text="The ONNX model file.")
    max_batch_size = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_MAX_BATCH_SIZE,
        help_text="Largest batch Triton may form; 0 turns batching off. Leave empty for the model's default "
        f"({DEFAULT_MAX_BATCH_SIZE} when the model can batch, else 0).",
    )
    max_queue_delay_microseconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_QUEUE_DELAY_MICROSECONDS,
        help_text="How long the dynamic batcher may hold a request to batch it with others, in microseconds. "
        f"Needs max_batch_size above 0. Leave empty for {DEFAULT_MAX_QUEUE_DELAY_MICROSECONDS}.",
    )
    preferred_batch_size = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="Batch sizes the dynamic batcher aims for, comma-separated (e.g. 4,8), each at most "
        "max_batch_size. Leave empty for none.",
    )
    instance_count = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_INSTANCE_COUNT,
        help_text=f"Model instances Triton runs. Leave empty for {DEFAULT_INSTANCE_COUNT}.",
    )

    output_dims = serializers.CharField(required=False, allow_blank=True, help_text=OUTPUT_DIMS_HELP)
    sample_inputs = serializers.FileField(required=False, help_text=_SAMPLE_INPUTS_HELP)
    sample_values = serializers.CharField(required=False, allow_blank=True, help_text=_SAMPLE_VALUES_HELP)
    allow_duplicate = serializers.BooleanField(required=False, default=False, help_text=ALLOW_DUPLICATE_HELP)


class BuildOptionsSerializer(serializers.Serializer):
    """Build options as a rebuild or an options check takes them (documented for the OpenAPI schema; the build's
    own rules check the values)."""

    max_batch_size = serializers.JSONField(required=False, help_text="0..1024; 0 turns batching off.")
    max_queue_delay_microseconds = serializers.JSONField(required=False, help_text="0..1000000, needs batching.")
    preferred_batch_size = serializers.JSONField(required=False, help_text="A list, or text such as '4, 8'.")
    instance_count = serializers.JSONField(required=False, help_text="1..16 model instances.")
    dynamic_batching = serializers.JSONField(
        required=False, help_text="false (or 'off') is max_batch_size 0: no dynamic batcher."
    )
    output_dims = serializers.JSONField(required=False, help_text=OUTPUT_DIMS_HELP)


class OptionsCheckSerializer(serializers.Serializer):
    """The answer of an options check: every field at fault, and the configuration the options would give."""

    errors = serializers.ListField(child=serializers.DictField(child=serializers.CharField()))
    config_pbtxt = serializers.CharField()


class SignatureRowSerializer(serializers.Serializer):
    role = serializers.CharField()
    name = serializers.CharField()
    datatype = serializers.CharField()
    dims = serializers.ListField(child=serializers.IntegerField())
    dim_names = serializers.ListField(child=serializers.CharField(allow_null=True))
    shape = serializers.CharField(help_text="E.g. [batch*, 3, 224, 224]; * marks Triton's batch axis.")
    batch_axis = serializers.BooleanField()


class VersionReviewSerializer(serializers.Serializer):
    """What a build found and wrote, for review (documented for the OpenAPI schema)."""

    version = serializers.IntegerField()
    status = serializers.CharField()
    signature = SignatureRowSerializer(many=True)
    batching_reason = serializers.CharField()
    config_pbtxt = serializers.CharField()
    previous_version_number = serializers.IntegerField(allow_null=True)
    config_diff = serializers.CharField()


class RebuildSerializer(BuildOptionsSerializer):
    """Optional body of a rebuild: new sample inputs for the verify step and new build options (documented for
    the OpenAPI schema)."""

    sample_inputs = serializers.FileField(required=False, help_text=_SAMPLE_INPUTS_HELP)
    sample_values = serializers.CharField(required=False, allow_blank=True, help_text=_SAMPLE_VALUES_HELP)


class UploadVersionFormScheme(OpenApiSerializerExtension):
    """The upload form's optional fields carry the example `null`, so Swagger UI's "Try it out" leaves them empty.

    Swagger UI pre-fills each form field with a sample made from its schema (the field's `example`, else
    `default`, else one built from the type: "string", 0), and sends what is pre-filled. Such samples are
    build options the API rejects ("string" is no list of batch sizes; a queue delay with max_batch_size 0).
    An empty field is not sent, so the build uses the model's defaults.
    """

    target_class = UploadVersionSerializer

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        required = set(schema.get("required", ()))
        for name, field_schema in schema["properties"].items():
            if name not in required:
                field_schema["example"] = None
        return schema


class RebuildFormScheme(UploadVersionFormScheme):
    """The rebuild form's fields are all optional: "Try it out" leaves them empty too."""

    target_class = RebuildSerializer


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
            "sha256_checked": obj.source_checked,
            "key": obj.source_key,
        }
