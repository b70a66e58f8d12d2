"""Serializers of model versions and their builds (upload form, version detail with build steps)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from builds.choices import BuildStatus
from builds.model_config import (
    DEFAULT_INSTANCE_COUNT,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_DELAY_MICROSECONDS,
    MAX_INSTANCE_COUNT,
    MAX_MAX_BATCH_SIZE,
    MAX_QUEUE_DELAY_MICROSECONDS,
)
from builds.models import Build, BuildStep, CustomBackend, Pipeline, PipelineVersion
from builds.services import state
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
TOLERANCE_HELP = (
    "Optional, for a converted model (LightGBM, XGBoost…): one number, greater than 0 and at most 0.5, that its "
    "floating outputs may differ from the source framework's by, used as both the absolute and the relative "
    "tolerance in place of the datatype's default (FP32: 1e-4). Give it on rebuild after a comparison failed."
)

GRAPH_INPUTS_HELP = (
    "Optional, for a TensorFlow frozen graph (.pb): its input nodes, separated by commas (for example x, keep_prob), "
    "in place of its Placeholders; a PlaceholderWithDefault named here becomes an input instead of keeping its "
    "default."
)
GRAPH_OUTPUTS_HELP = (
    "Optional, for a TensorFlow frozen graph (.pb): its output nodes, separated by commas (for example logits), in "
    "place of its sinks (the nodes nothing else reads)."
)

INPUT_SPEC_HELP = (
    "For a TorchScript model (.pt), which does not record its inputs: each forward argument's datatype and full "
    "shape (-1 for an axis of any size), as name=DATATYPE:dims separated by ';' (for example features=FP32:-1,5; "
    "mask=BOOL:-1,-1); left out, they are read from the sample inputs. For a TensorRT plan: its input bindings."
)

OUTPUT_SPEC_HELP = (
    "For a TensorRT plan (.plan, .engine), whose bindings cannot be read without TensorRT: each output's datatype and "
    "full shape, as input_spec gives the inputs (for example output0=FP32:-1,84,8400)."
)
GPU_PRODUCT_HELP = (
    "For a TensorRT plan: the GPU product it was built on, as the nodes' nvidia.com/gpu.product label (for example "
    "NVIDIA-A10). The plan deploys only on nodes with that label."
)
TENSORRT_VERSION_HELP = (
    "For a TensorRT plan: the TensorRT version it was built with (10.7.0 or 10.7.0.23). The plan deploys only on a "
    "cluster whose Triton carries that TensorRT."
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


class BuildSerializer(serializers.ModelSerializer):
    """One build attempt of a version: its number, status, the options it used, the worker that ran it, its times,
    the repository it wrote, the configuration it generated, its error and its steps with their logs."""

    steps = BuildStepSerializer(many=True, read_only=True)
    version = serializers.PrimaryKeyRelatedField(read_only=True)
    lost_attempts = serializers.IntegerField(
        read_only=True, help_text="Attempts lost in a row just before this one (their worker stopped mid-build)."
    )
    worker = serializers.CharField(read_only=True, help_text="The worker that claimed it (host:process id).")

    class Meta:
        model = Build
        fields = [
            "id",
            "version",
            "attempt",
            "status",
            "options",
            "worker",
            "lost_attempts",
            "queued_at",
            "started_at",
            "finished_at",
            "repository_prefix",
            "config_pbtxt",
            "error",
            "error_field",
            "source_format",
            "conversion",
            "environment",
            "steps",
        ]
        extra_kwargs = {
            "environment": {
                "help_text": "For a Python model: its execution environment (key, size_bytes of the packed archive, "
                "reused: built by an earlier build, target: the Triton's Python and platform, pins: every package "
                "with its version and wheel sha256); null for other models."
            },
            "source_format": {"help_text": 'The uploaded file\'s format as the build told it ("onnx", "lightgbm"…).'},
            "conversion": {
                "help_text": "For a converted format: the tool and its version, the source framework, the opsets, the "
                "seconds taken, what was assumed, and `comparison` (per output: the datatype, atol/rtol, the largest "
                "absolute and relative difference from the source framework, the top-class agreement, ok)."
            },
        }


class ModelFormatSerializer(serializers.Serializer):
    """One format Conch builds (`builds.formats.ModelFormat.describe`)."""

    key = serializers.CharField(help_text='Identifier: "onnx", "lightgbm", "xgboost".')
    title = serializers.CharField()
    suffixes = serializers.ListField(child=serializers.CharField(), help_text="File name endings that may hold it.")
    served_as = serializers.CharField(help_text="The Triton backend that serves the built model.")
    conversion = serializers.CharField(allow_null=True, help_text="The conversion tool; null when served as uploaded.")
    runs_code = serializers.BooleanField(
        help_text="Loading the file runs code from it (a pickle): built only for teams a platform admin allowed."
    )
    upload = serializers.CharField(help_text="What to upload.")


class BuildSummarySerializer(serializers.ModelSerializer):
    """The current build attempt of a version, without its logs (GET /versions/{id}/builds/ has them all): with the
    format the upload was told as (`source_format`) and the conversion report (`conversion`: the tool, its version,
    the opsets, the seconds, what was renamed or assumed, and the comparison with the source framework per output;
    null for a model served as uploaded without a comparison) and a Python model's execution environment
    (`environment`: its key, packed size in bytes, whether an earlier build's was reused, the Triton it was built
    for and the pinned wheels; null for other models)."""

    class Meta:
        model = Build
        fields = [
            "attempt",
            "status",
            "worker",
            "lost_attempts",
            "queued_at",
            "started_at",
            "finished_at",
            "source_format",
            "conversion",
            "environment",
        ]


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
    tolerance = serializers.CharField(required=False, allow_blank=True, help_text=TOLERANCE_HELP)
    graph_inputs = serializers.CharField(required=False, allow_blank=True, help_text=GRAPH_INPUTS_HELP)
    graph_outputs = serializers.CharField(required=False, allow_blank=True, help_text=GRAPH_OUTPUTS_HELP)
    input_spec = serializers.CharField(required=False, allow_blank=True, help_text=INPUT_SPEC_HELP)
    output_spec = serializers.CharField(required=False, allow_blank=True, help_text=OUTPUT_SPEC_HELP)
    gpu_product = serializers.CharField(required=False, allow_blank=True, help_text=GPU_PRODUCT_HELP)
    tensorrt_version = serializers.CharField(required=False, allow_blank=True, help_text=TENSORRT_VERSION_HELP)
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
    tolerance = serializers.JSONField(required=False, help_text=TOLERANCE_HELP)
    graph_inputs = serializers.JSONField(required=False, help_text=GRAPH_INPUTS_HELP)
    graph_outputs = serializers.JSONField(required=False, help_text=GRAPH_OUTPUTS_HELP)
    input_spec = serializers.JSONField(required=False, help_text=INPUT_SPEC_HELP)
    output_spec = serializers.JSONField(required=False, help_text=OUTPUT_SPEC_HELP)
    gpu_product = serializers.JSONField(required=False, help_text=GPU_PRODUCT_HELP)
    tensorrt_version = serializers.JSONField(required=False, help_text=TENSORRT_VERSION_HELP)


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
    served_note = serializers.CharField(
        allow_blank=True,
        help_text="Empty, or how Triton serves a tensor whose only axis is the batch axis: as [batch*, 1].",
    )


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
    """A version and its current build.

    `status` sums the version up (uploading, then its current build's: queued, building, built, failed; or
    deleting). `error`, `error_field`, `build_options`, `steps` and `build` are the current build attempt's;
    `config_pbtxt` is the latest configured attempt's; `repository_prefix` and `built_at` are the served build's
    (the latest that succeeded; empty/null while none did, and `built_at` null while the current attempt is not
    the one that succeeded). Every attempt: GET /versions/{id}/builds/.
    """

    model = serializers.PrimaryKeyRelatedField(read_only=True)
    model_name = serializers.CharField(source="model.name", read_only=True)
    team = serializers.CharField(source="model.team.slug", read_only=True)
    source = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    error_field = serializers.SerializerMethodField()
    build_options = serializers.SerializerMethodField()
    config_pbtxt = serializers.SerializerMethodField()
    repository_prefix = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()
    built_at = serializers.SerializerMethodField()
    build = serializers.SerializerMethodField()

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
            "build",
            "created_at",
            "built_at",
        ]

    def to_representation(self, instance: ModelVersion) -> dict:
        # The fields below all read the version's builds: read them once (a queryset may have fetched them already).
        return super().to_representation(state.read_history_once(instance))

    def get_error(self, obj: ModelVersion) -> str:
        return state.current_error(obj)

    def get_error_field(self, obj: ModelVersion) -> str:
        build = state.current_build(obj)
        return build.error_field if build is not None else ""

    def get_build_options(self, obj: ModelVersion) -> dict:
        return state.current_options(obj)

    def get_config_pbtxt(self, obj: ModelVersion) -> str:
        return state.latest_config_pbtxt(obj)

    def get_repository_prefix(self, obj: ModelVersion) -> str:
        return state.served_repository_prefix(obj)

    @extend_schema_field(BuildStepSerializer(many=True))
    def get_steps(self, obj: ModelVersion) -> list:
        build = state.current_build(obj)
        return BuildStepSerializer(build.steps.all(), many=True).data if build is not None else []

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_built_at(self, obj: ModelVersion) -> str | None:
        build = state.current_build(obj)
        if build is None or build.status != BuildStatus.SUCCEEDED or build.finished_at is None:
            return None
        return serializers.DateTimeField().to_representation(build.finished_at)

    @extend_schema_field(BuildSummarySerializer(allow_null=True))
    def get_build(self, obj: ModelVersion) -> dict | None:
        build = state.current_build(obj)
        return BuildSummarySerializer(build).data if build is not None else None

    def get_source(self, obj: ModelVersion) -> dict:
        return {
            "filename": obj.source_filename,
            "size_bytes": obj.source_size_bytes,
            "sha256": obj.source_sha256,
            "sha256_checked": obj.source_checked,
            "key": obj.source_key,
        }


class CustomBackendSerializer(serializers.ModelSerializer):
    """A custom backend a team registered: its name and version (models name the backend in config.pbtxt,
    `backend: "<name>"`), its kind (`python`: a Python-based backend, model.py; `library`: libtriton_<name>.so), its
    files and their bytes, and what the checks found (`report`: a library's entry points, needed libraries and the
    Triton backend API version it was checked against; a Python backend's methods)."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = CustomBackend
        fields = ["id", "team", "name", "version", "kind", "files", "size_bytes", "report", "created_by", "created_at"]
        read_only_fields = fields


class RegisterBackendSerializer(serializers.Serializer):
    """Multipart form registering a custom backend."""

    team = serializers.CharField(help_text="The team's slug.")
    name = serializers.CharField(help_text="The backend's name, as models' config.pbtxt names it (backend: NAME).")
    version = serializers.CharField(help_text="Its version, e.g. 1.0.0: a name may have several.")
    file = serializers.FileField(
        help_text="A zip or tar of the backend's folder: libtriton_NAME.so with the libraries it needs, or model.py "
        "(a Python-based backend)."
    )
    api_version = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="For a library: the TRITONBACKEND API version it was built against (MAJOR.MINOR), checked against "
        "the Triton release Conch runs.",
    )


class PipelineVersionSerializer(serializers.ModelSerializer):
    """A checked version of a pipeline: what was given (`spec`: inputs, outputs, max_batch_size, steps with their
    model versions and tensor mappings), what the check found (`graph`: the steps in the order they run, each
    tensor's datatype, full shape and producer) and the ensemble's generated model configuration."""

    class Meta:
        model = PipelineVersion
        fields = ["id", "number", "spec", "graph", "config_pbtxt", "created_at"]
        read_only_fields = fields


class PipelineSerializer(serializers.ModelSerializer):
    """A pipeline (a Triton ensemble of the team's model versions) and its versions, oldest first."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    versions = PipelineVersionSerializer(many=True, read_only=True)

    class Meta:
        model = Pipeline
        fields = ["id", "team", "name", "created_at", "versions"]
        read_only_fields = fields


class CreatePipelineSerializer(serializers.Serializer):
    """A pipeline to register: its team and name (the ensemble's Triton model name)."""

    team = serializers.CharField()
    name = serializers.CharField()


class PipelineVersionSpecSerializer(serializers.Serializer):
    """A pipeline version to check and make."""

    inputs = serializers.JSONField(help_text='Pipeline inputs: {"image": {"datatype": "UINT8", "dims": [-1, -1, 3]}}.')
    outputs = serializers.JSONField(help_text='The tensors returned: ["text"].')
    max_batch_size = serializers.IntegerField(required=False, help_text="0 (the default): no batching.")
    steps = serializers.JSONField(
        help_text='[{"name": "det", "model_version": 12, "inputs": {"x": "image"}, "outputs": {"y": "boxes"}}]: '
        "each step's model version, its inputs fed by pipeline tensors and its outputs named as pipeline tensors."
    )
