"""Build the Triton model configuration (`config.pbtxt`) for an inspected ONNX model.

This module owns the rules that turn a `ModelSignature` plus the user's build options into a
`inference.ModelConfig` protobuf, and the rules for changing one at deployment time. It is pure: the only
Triton import is `tritonclient.grpc.model_config_pb2`, the generated schema of `model_config.proto` (no client,
no network), so the text is always produced by protobuf's own `text_format`, never by a string template.

The same repository must load unchanged on two runtimes: the local CPU `tritonserver`, where a Python-based
backend named `onnxruntime` runs the file, and GPU pods running Triton's C++ onnxruntime backend. Every server
Conch starts runs with `--disable-auto-complete-config` (Triton "Model Configuration" -> "Auto-Generated Model
Configuration"), so the configuration written here is served as written: it states everything a backend's
auto-complete would otherwise fill in (backend, max_batch_size, every input and output with its dims, the
dynamic batcher, the instance group and default_model_filename; Triton's core derives `platform` from
`backend` itself). An explicit `max_batch_size: 0` therefore stays 0 on both runtimes.

Batching is decided from the model, never guessed (`read_batch_axis`): axis 0 is taken for the batch axis only
when every input and output has a dynamic axis 0 under the same symbolic name (or all unnamed), and the build's
verify step then proves it by running two samples joined on axis 0 (`without_batching` is its fallback).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2

from builds.inspection import ModelSignature, TensorSpec, short_dim_name
from conch.errors import ConchError, InvalidInput, attempt, refuse_each
from models_registry.naming import validate_model_name
from tritonserving.config import ModelConfig

__all__ = [
    "DEFAULT_INSTANCE_COUNT",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_QUEUE_DELAY_MICROSECONDS",
    "MAX_INSTANCE_COUNT",
    "MAX_MAX_BATCH_SIZE",
    "adds_served_axis",
    "MAX_QUEUE_DELAY_MICROSECONDS",
    "MODEL_FILENAME",
    "OUTPUT_DIMS_FIELD",
    "BUILD_OPTION_FIELDS",
    "GRAPH_INPUTS_FIELD",
    "GPU_PRODUCT_FIELD",
    "INPUT_SPEC_FIELD",
    "OUTPUT_SPEC_FIELD",
    "TENSORRT_VERSION_FIELD",
    "GRAPH_OUTPUTS_FIELD",
    "TOLERANCE_FIELD",
    "BuildOptions",
    "BatchAxisReading",
    "apply_deployment_overrides",
    "build_model_config",
    "parse_build_options",
    "parse_output_dims",
    "parse_graph_nodes",
    "parse_tolerance",
    "read_batch_axis",
    "supports_batching",
    "validate_build_options",
    "with_output_shapes",
    "without_batching",
]

#: File name of the model inside `<model>/<version>/`; the onnxruntime backend's own default.
MODEL_FILENAME = "model.onnx"
#: max_batch_size used when the model can batch and the user gave none.
DEFAULT_MAX_BATCH_SIZE = 8
#: Dynamic batcher queue delay used when the user gave none, in microseconds (0.1 ms).
DEFAULT_MAX_QUEUE_DELAY_MICROSECONDS = 100
#: Model instances per instance group (per GPU on GPU pods) when the user gave none.
DEFAULT_INSTANCE_COUNT = 1
#: Largest accepted max_batch_size; beyond it memory per batch grows with no latency benefit for online serving.
MAX_MAX_BATCH_SIZE = 1024
#: Largest accepted queue delay: 1 second, in microseconds. Longer waits only add latency.
MAX_QUEUE_DELAY_MICROSECONDS = 1_000_000
#: Largest accepted instance count: each instance holds its own onnxruntime session and copy of the weights.
MAX_INSTANCE_COUNT = 16

#: Build option (form field, JSON key, `build_options` key) giving outputs' shapes in place of those the model file
#: declares, for a file that declares them wrongly.
OUTPUT_DIMS_FIELD = "output_dims"
#: Build options naming a TensorFlow frozen graph's input and output nodes, in place of those discovered (its
#: Placeholders and its sinks): a frozen graph records no signature.
GRAPH_INPUTS_FIELD = "graph_inputs"
GRAPH_OUTPUTS_FIELD = "graph_outputs"
#: Build option giving a TorchScript model's inputs (name -> datatype and full shape): TorchScript records neither.
INPUT_SPEC_FIELD = "input_spec"
#: Build options a TensorRT plan is uploaded with: its outputs (as input_spec gives its inputs), and the GPU product
#: and TensorRT version it was built for (a plan runs only there).
OUTPUT_SPEC_FIELD = "output_spec"
GPU_PRODUCT_FIELD = "gpu_product"
TENSORRT_VERSION_FIELD = "tensorrt_version"
#: Every build option an upload or a rebuild takes by name (the version upload's form fields, a resumable upload's
#: `build_options` keys); a rebuild also takes `dynamic_batching`.
BUILD_OPTION_FIELDS = (
    "max_batch_size",
    "max_queue_delay_microseconds",
    "preferred_batch_size",
    "instance_count",
    "output_dims",
    "tolerance",
    "graph_inputs",
    "graph_outputs",
    "input_spec",
    "output_spec",
    "gpu_product",
    "tensorrt_version",
)
#: The most nodes one of them may name.
MAX_GRAPH_NODES = 64
#: What a TensorFlow node name may be (TensorFlow's NodeDef name rule: `[A-Za-z0-9.][A-Za-z0-9_>./-]*`).
_NODE_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_>./-]*")
#: The build option that accepts a looser tolerance when a converted model is compared with its source.
TOLERANCE_FIELD = "tolerance"
#: The loosest tolerance a user may accept (as atol and rtol of floating outputs): beyond it nothing is proven.
MAX_TOLERANCE = 0.5
#: Most axes an output shape given in `output_dims` may have.
_MAX_OUTPUT_RANK = 32
#: Largest size of one axis in `output_dims`: Triton's dims are int64 (model_config.proto).
_MAX_DIM = 2**63 - 1

_INTEGER_RE = re.compile(r"[+-]?\d+")
# An axis name that says "batch" ("batch", "batch_size", as torch.onnx.export's dynamic_axes={"x": {1: "batch"}}
# writes it). Only ever used to turn batching off, never on.
_BATCH_NAME_RE = re.compile(r"batch", re.IGNORECASE)

# Triton datatype string (TensorSpec.datatype) -> model_config.proto DataType. BYTES is TYPE_STRING in the config
# (Triton "Model Configuration" -> "Datatypes").
_CONFIG_TYPES: dict[str, int] = {
    "BOOL": model_config_pb2.TYPE_BOOL,
    "UINT8": model_config_pb2.TYPE_UINT8,
    "UINT16": model_config_pb2.TYPE_UINT16,
    "UINT32": model_config_pb2.TYPE_UINT32,
    "UINT64": model_config_pb2.TYPE_UINT64,
    "INT8": model_config_pb2.TYPE_INT8,
    "INT16": model_config_pb2.TYPE_INT16,
    "INT32": model_config_pb2.TYPE_INT32,
    "INT64": model_config_pb2.TYPE_INT64,
    "FP16": model_config_pb2.TYPE_FP16,
    "FP32": model_config_pb2.TYPE_FP32,
    "FP64": model_config_pb2.TYPE_FP64,
    "BYTES": model_config_pb2.TYPE_STRING,
}

# Instance kind. KIND_AUTO (the proto default, so it is not printed in config.pbtxt) lets Triton's core pick per
# machine: GPU instances when GPUs are visible, CPU instances otherwise (Triton "Model Configuration" ->
# "Instance Groups"). KIND_CPU would pin GPU pods to the CPU; KIND_GPU would fail to load on the local CPU-only
# server. AUTO is resolved by the core before any backend sees it, so the local Python-based onnxruntime backend
# gets KIND_CPU and the C++ onnxruntime backend on a GPU pod gets KIND_GPU with the CUDA execution provider.
_INSTANCE_KIND = model_config_pb2.ModelInstanceGroup.KIND_AUTO
#: Instance kinds a deployment may choose, by their config.pbtxt names (Triton "Instance Groups" -> kind).
#: KIND_MODEL (the model places itself) is left out: only backends written for it honour it.
INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU")


@dataclass(frozen=True)
class BuildOptions:
    """What the user may choose when building a model; None means "use the default for this model".

    Attributes:
        max_batch_size: largest batch Triton may form (Triton "Model Configuration" -> "Maximum Batch Size").
            None: DEFAULT_MAX_BATCH_SIZE when the model can batch, else 0. 0..MAX_MAX_BATCH_SIZE.
        max_queue_delay_microseconds: how long the dynamic batcher may hold a request waiting for others, in
            microseconds (Triton "Dynamic Batcher" -> "Delayed Batching"). 0..MAX_QUEUE_DELAY_MICROSECONDS.
        preferred_batch_size: batch sizes the dynamic batcher should aim for (Triton "Dynamic Batcher" ->
            "Preferred Batch Sizes"); each 1..max_batch_size, no repeats; stored sorted.
        instance_count: model instances per instance group (Triton "Instance Groups"). 1..MAX_INSTANCE_COUNT.
        output_dims: output name -> the full shape the model really produces (axis 0 included; -1 = any size), in
            place of the shape the model file declares (`parse_output_dims`). Each name must be an output of the
            model (checked by `build_model_config`); the verify step checks the shapes against real inferences.
        tolerance: for a converted model, the absolute and relative tolerance (one number, used as both) its
            floating outputs may differ from the source framework's by, in place of the datatype's default
            (`builds.comparison.DEFAULT_TOLERANCES`). None: the defaults. Greater than 0, at most MAX_TOLERANCE.
        graph_inputs, graph_outputs: for a TensorFlow frozen graph, the nodes that are its inputs (Placeholders; a
            PlaceholderWithDefault named here becomes an input instead of keeping its default) and its outputs, in
            place of those discovered (`parse_graph_nodes`). None: discovered. The conversion checks them against
            the graph.
        input_spec: for a TorchScript model, input name (a `forward` argument) -> (Triton datatype, full shape with
            axis 0, -1 = any size), which TorchScript does not record (`parse_input_spec`). None: read from the
            sample inputs. The inspect step checks the names against `forward`. A TensorRT plan's inputs too.
        output_spec: a TensorRT plan's outputs, as input_spec gives its inputs (a plan's bindings cannot be read
            without TensorRT).
        gpu_product, tensorrt_version: the GPU product (`nvidia.com/gpu.product` label value) and the TensorRT
            version a TensorRT plan was built for; deployments of the plan are refused elsewhere.
    """

    max_batch_size: int | None = None
    max_queue_delay_microseconds: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None
    instance_count: int | None = None
    output_dims: Mapping[str, tuple[int, ...]] | None = None
    tolerance: float | None = None
    graph_inputs: tuple[str, ...] | None = None
    graph_outputs: tuple[str, ...] | None = None
    input_spec: Mapping[str, tuple[str, tuple[int, ...]]] | None = None
    output_spec: Mapping[str, tuple[str, tuple[int, ...]]] | None = None
    gpu_product: str | None = None
    tensorrt_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict with the four option names as keys (lists for preferred_batch_size), and
        `output_dims` ({name: [dims]}) when it is set."""
        result: dict[str, Any] = {
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_microseconds": self.max_queue_delay_microseconds,
            "preferred_batch_size": None if self.preferred_batch_size is None else list(self.preferred_batch_size),
            "instance_count": self.instance_count,
        }
        if self.output_dims is not None:
            result[OUTPUT_DIMS_FIELD] = {name: list(dims) for name, dims in self.output_dims.items()}
        if self.tolerance is not None:
            result[TOLERANCE_FIELD] = self.tolerance
        if self.graph_inputs is not None:
            result[GRAPH_INPUTS_FIELD] = list(self.graph_inputs)
        if self.graph_outputs is not None:
            result[GRAPH_OUTPUTS_FIELD] = list(self.graph_outputs)
        for field, spec in ((INPUT_SPEC_FIELD, self.input_spec), (OUTPUT_SPEC_FIELD, self.output_spec)):
            if spec is not None:
                result[field] = {
                    name: {"datatype": datatype, "dims": list(dims)} for name, (datatype, dims) in spec.items()
                }
        if self.gpu_product is not None:
            result[GPU_PRODUCT_FIELD] = self.gpu_product
        if self.tensorrt_version is not None:
            result[TENSORRT_VERSION_FIELD] = self.tensorrt_version
        return result


def parse_build_options(fields: Mapping[str, Any]) -> BuildOptions:
    """Parse build options from form fields (strings) or JSON values (ints, lists) and validate them.

    Blank strings and missing keys mean "default" (None). Integers are written in decimal ("8", " 16 ");
    preferred_batch_size is a list of integers or a string of them separated by commas or spaces ("4, 8").
    Keys other than the four option names are ignored, so a whole form's data can be passed.

    Returns:
        A validated `BuildOptions` (preferred sizes sorted).

    Raises:
        InvalidInput: field = the option name, with a message that says what values are allowed; with several
            fields at fault, the first carries every one of them as `refusals` (`conch.errors.refuse_each`: the
            API lists them under `errors`).
    """
    refusals: list[ConchError] = []
    # Keyed by form field, each the name of the BuildOptions attribute it sets.
    parsers: dict[str, Callable[[Any], Any]] = {
        "max_batch_size": lambda raw: _parse_integer("max_batch_size", raw),
        "max_queue_delay_microseconds": lambda raw: _parse_integer("max_queue_delay_microseconds", raw),
        "preferred_batch_size": _parse_sizes,
        "instance_count": lambda raw: _parse_integer("instance_count", raw),
        OUTPUT_DIMS_FIELD: parse_output_dims,
        TOLERANCE_FIELD: parse_tolerance,
        GRAPH_INPUTS_FIELD: lambda raw: parse_graph_nodes(GRAPH_INPUTS_FIELD, raw),
        GRAPH_OUTPUTS_FIELD: lambda raw: parse_graph_nodes(GRAPH_OUTPUTS_FIELD, raw),
        INPUT_SPEC_FIELD: parse_input_spec,
        OUTPUT_SPEC_FIELD: lambda raw: parse_input_spec(raw, OUTPUT_SPEC_FIELD),
        GPU_PRODUCT_FIELD: parse_gpu_product,
        TENSORRT_VERSION_FIELD: parse_tensorrt_version,
    }
    values = {}
    for name, parse in parsers.items():
        _, values[name] = attempt(refusals, parse, fields.get(name))
    options = BuildOptions(**values)  # a field that did not parse is None here: its range is not checked
    refusals.extend(_range_refusals(options))
    if refusals:
        order = list(parsers)
        refusals.sort(key=lambda refusal: order.index(refusal.field) if refusal.field in order else len(order))
        raise refuse_each(refusals)
    validate_build_options(options)
    if options.preferred_batch_size is not None:
        options = dataclasses.replace(options, preferred_batch_size=tuple(sorted(options.preferred_batch_size)))
    return options


def parse_graph_nodes(field: str, raw: Any) -> tuple[str, ...] | None:
    """Parse `graph_inputs` or `graph_outputs` (`field`): node names of a TensorFlow frozen graph, as a list or as
    text separated by commas or spaces ("x, keep_prob"); a trailing output index ":0" is dropped. Blank or None
    gives None (discovered from the graph).

    Raises:
        InvalidInput: field `field`, naming the name at fault or saying how many are allowed.
    """
    if raw is None:
        return None
    if isinstance(raw, str):
        items = [item for item in re.split(r"[\s,]+", raw.strip()) if item]
    elif isinstance(raw, list | tuple):
        items = list(raw)
    else:
        raise InvalidInput(
            f"{field} must be node names separated by commas (for example x, keep_prob), not {raw!r}.", field=field
        )
    if not items:
        return None
    names: list[str] = []
    for item in items:
        name = item[:-2] if isinstance(item, str) and item.endswith(":0") else item
        if not isinstance(name, str) or not _NODE_NAME.fullmatch(name):
            raise InvalidInput(
                f"{field}: {item!r} is not a TensorFlow node name (letters, digits and _ . / - >, not starting "
                "with _ / - >). Give the graph's node names, separated by commas.",
                field=field,
            )
        if name in names:
            raise InvalidInput(f"{field} names {name!r} twice; name each node once.", field=field)
        names.append(name)
    if len(names) > MAX_GRAPH_NODES:
        raise InvalidInput(f"{field} names {len(names)} nodes; at most {MAX_GRAPH_NODES} are accepted.", field=field)
    return tuple(names)


def parse_tolerance(raw: Any) -> float | None:
    """Parse the `tolerance` option: a number greater than 0 and at most MAX_TOLERANCE ("0.001", 1e-3); blank or
    None gives None (the datatype's default tolerance).

    Raises:
        InvalidInput: field "tolerance", saying what values are allowed.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    allowed = (
        f"give one number greater than 0 and at most {MAX_TOLERANCE:g}, used as both the absolute and the relative "
        "tolerance of a converted model's floating outputs (for example 0.001)"
    )
    if isinstance(raw, bool):
        raise InvalidInput(f"tolerance {raw!r} is not a number; {allowed}.", field=TOLERANCE_FIELD)
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        raise InvalidInput(f"tolerance {raw!r} is not a number; {allowed}.", field=TOLERANCE_FIELD) from None
    if not math.isfinite(value) or not 0 < value <= MAX_TOLERANCE:
        raise InvalidInput(f"tolerance {raw!r} is out of range; {allowed}.", field=TOLERANCE_FIELD)
    return value


def parse_output_dims(raw: Any) -> dict[str, tuple[int, ...]] | None:
    """Parse the `output_dims` option: outputs' full shapes, given in place of what the model file declares.

    Forms: a JSON object {"387": [-1, 1, 8210]} (also as text), or text entries `name=dims` separated by ';' or
    newlines, dims written as "-1, 1, 8210" or "[-1, 1, 8210]" ("[]" for a scalar). Each dim is a whole number,
    -1 for an axis of any size (Triton "Model Configuration" -> "Inputs and Outputs"). Empty or None gives None
    (the model file's shapes).

    Raises:
        InvalidInput: field "output_dims", naming the tensor (or the entry) at fault and the expected form.
    """
    if raw is None:
        return None
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            return None
        if text.startswith("{"):
            try:
                raw = json.loads(text)
            except ValueError as error:
                raise _dims_error(f"output_dims is not a JSON object ({error}); {_DIMS_FORM}") from None
        else:
            entries = {}
            for entry in (part.strip() for part in re.split(r"[;\n]", text)):
                if not entry:
                    continue
                name, sep, dims = entry.partition("=")
                if not sep or not name.strip():
                    raise _dims_error(f"output_dims entry {entry!r} is not of the form name=dims; {_DIMS_FORM}")
                if name.strip() in entries:
                    raise _dims_error(f"output_dims gives output {name.strip()!r} more than once; give each once.")
                entries[name.strip()] = [item for item in re.split(r"[\s,]+", dims.strip().strip("[]")) if item]
            raw = entries
    if not isinstance(raw, Mapping):
        raise _dims_error(f"output_dims must be an object of output name -> dims; {_DIMS_FORM}")
    if not raw:
        return None
    result: dict[str, tuple[int, ...]] = {}
    for name, dims in raw.items():
        if not isinstance(name, str) or not name:
            raise _dims_error(f"output_dims names an output {name!r}; give the output's name as the model has it.")
        if isinstance(dims, str):
            dims = [item for item in re.split(r"[\s,]+", dims.strip().strip("[]")) if item]
        if not isinstance(dims, list | tuple):
            raise _dims_error(f"output_dims gives output {name!r} {dims!r}, not a list of dims; {_DIMS_FORM}")
        if len(dims) > _MAX_OUTPUT_RANK:
            raise _dims_error(f"output_dims gives output {name!r} {len(dims)} dims; at most {_MAX_OUTPUT_RANK}.")
        parsed = []
        for dim in dims:
            value = _parse_dim(dim)
            if value is None or not -1 <= value <= _MAX_DIM:
                raise _dims_error(
                    f"output_dims gives output {name!r} the dim {dim!r}; each dim is a whole number from 0 to "
                    f"{_MAX_DIM}, or -1 for an axis of any size. {_DIMS_FORM}"
                )
            parsed.append(value)
        result[name] = tuple(parsed)
    return result


#: The Triton datatypes a torch tensor or a TensorRT binding declared in input_spec or output_spec may have.
TORCH_INPUT_DATATYPES = ("BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")
#: The datatypes an input_spec or output_spec tensor may have: those, and BYTES (strings) for a Python model, whose
#: code takes any numpy array Triton's Python backend gives it (the build refuses BYTES for the other formats).
SPEC_DATATYPES = (*TORCH_INPUT_DATATYPES, "BYTES")


def _spec_form(field: str) -> str:
    role = "output" if field == OUTPUT_SPEC_FIELD else "input"
    example = "probs=FP32:-1,3" if role == "output" else "features=FP32:-1,5; mask=BOOL:-1,-1"
    return (
        f"give each {role} as name=DATATYPE:dims separated by ';', for example {example} "
        f"(datatypes {', '.join(SPEC_DATATYPES)}; -1 for an axis of any size, axis 0 included)."
    )


def parse_input_spec(raw: Any, field: str = INPUT_SPEC_FIELD) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """Parse the `input_spec` option (or `output_spec`, with `field`): tensors whose datatypes and shapes the model
    file does not describe (a TorchScript model's inputs, a TensorRT plan's inputs and outputs).

    Forms: text entries `name=DATATYPE:dims` separated by ';' or newlines ("features=FP32:-1,5; mask=BOOL:-1,-1"),
    or a JSON object {"features": {"datatype": "FP32", "dims": [-1, 5]}} (also as text). DATATYPE is a Triton
    datatype of SPEC_DATATYPES ("FP32"; "TYPE_FP32" and lower case are read too); dims the full shape, axis
    0 included, each a whole number or -1 for an axis of any size. Empty or None gives None.

    Raises:
        InvalidInput: field `field`, naming the tensor (or the entry) at fault and the expected form.
    """
    form = _spec_form(field)
    role = "output" if field == OUTPUT_SPEC_FIELD else "input"

    def error(detail: str) -> InvalidInput:
        return InvalidInput(detail, field=field)

    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, str) and raw.strip().startswith("{"):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise error(f"{field} is not a JSON object ({exc}); {form}") from None
    entries: dict[str, tuple[Any, Any]] = {}
    if isinstance(raw, str):
        for entry in (part.strip() for part in re.split(r"[;\n]", raw)):
            if not entry:
                continue
            name, sep, rest = entry.partition("=")
            datatype, colon, dims = rest.partition(":")
            if not sep or not colon or not name.strip():
                raise error(f"{field} entry {entry!r} is not of the form name=DATATYPE:dims; {form}")
            if name.strip() in entries:
                raise error(f"{field} gives {role} {name.strip()!r} more than once; give each once.")
            entries[name.strip()] = (datatype, [d for d in re.split(r"[\s,]+", dims.strip().strip("[]")) if d])
    elif isinstance(raw, Mapping):
        for name, item in raw.items():
            if not isinstance(item, Mapping):
                raise error(f"{field} gives {role} {name!r} {item!r}, not an object; {form}")
            entries[str(name)] = (item.get("datatype"), item.get("dims"))
    else:
        raise error(f"{field} must be text or an object of {role} name -> datatype and dims; {form}")
    if not entries:
        return None
    result: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (datatype, dims) in entries.items():
        wanted = str(datatype or "").strip().upper().removeprefix("TYPE_")
        if wanted not in SPEC_DATATYPES:
            raise error(f"{field} gives {role} {name!r} the datatype {datatype!r}; {form}")
        if not isinstance(dims, list | tuple) or len(dims) > _MAX_OUTPUT_RANK:
            raise error(f"{field} gives {role} {name!r} the dims {dims!r}; {form}")
        parsed = []
        for dim in dims:
            value = _parse_dim(dim)
            if value is None or not -1 <= value <= _MAX_DIM or value == 0:
                raise error(
                    f"{field} gives {role} {name!r} the dim {dim!r}; each dim is a whole number from 1 to "
                    f"{_MAX_DIM}, or -1 for an axis of any size. {form}"
                )
            parsed.append(value)
        result[name] = (wanted, tuple(parsed))
    return result


#: What a GPU product is named by (the `nvidia.com/gpu.product` node label NVIDIA GPU Feature Discovery sets:
#: "NVIDIA-A10", "NVIDIA-H100-80GB-HBM3"; Kubernetes label values: 63 characters of [A-Za-z0-9_.-]).
_GPU_PRODUCT = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
#: A TensorRT version: major.minor.patch, optionally .build ("10.7.0", "10.7.0.23").
_TENSORRT_VERSION = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}(\.\d{1,6})?")


def parse_gpu_product(raw: Any) -> str | None:
    """Parse the `gpu_product` option: the GPU a TensorRT plan was built on, as its `nvidia.com/gpu.product` label
    value ("NVIDIA-A10"). Empty or None gives None. Raises InvalidInput (field "gpu_product")."""
    if raw is None or not str(raw).strip():
        return None
    value = str(raw).strip()
    if not _GPU_PRODUCT.fullmatch(value):
        raise InvalidInput(
            f"gpu_product {value!r} is not a GPU product name: give the nvidia.com/gpu.product label of the nodes "
            "the plan was built on (for example NVIDIA-A10 or NVIDIA-H100-80GB-HBM3; kubectl get nodes -L "
            "nvidia.com/gpu.product shows it).",
            field=GPU_PRODUCT_FIELD,
        )
    return value


def parse_tensorrt_version(raw: Any) -> str | None:
    """Parse the `tensorrt_version` option: the TensorRT a plan was built with, "10.7.0" or "10.7.0.23" (what
    `trtexec` prints first, or `tensorrt.__version__`). Empty or None gives None. Raises InvalidInput (field
    "tensorrt_version")."""
    if raw is None or not str(raw).strip():
        return None
    value = str(raw).strip()
    if not _TENSORRT_VERSION.fullmatch(value):
        raise InvalidInput(
            f"tensorrt_version {value!r} is not a TensorRT version: give major.minor.patch (10.7.0) or with the "
            "build (10.7.0.23), as trtexec prints it ('TensorRT version: 100700' is 10.7.0).",
            field=TENSORRT_VERSION_FIELD,
        )
    return value


def validate_build_options(options: BuildOptions) -> None:
    """Check each option on its own and against the others; the model-dependent rules are in build_model_config.

    Rules: max_batch_size 0..MAX_MAX_BATCH_SIZE; max_queue_delay_microseconds 0..MAX_QUEUE_DELAY_MICROSECONDS;
    preferred_batch_size non-empty, each 1..max_batch_size, no repeats; instance_count 1..MAX_INSTANCE_COUNT;
    a queue delay or preferred sizes with max_batch_size 0 is meaningless (no batcher runs).

    Raises:
        InvalidInput: field = the offending option name; each option out of its own range is refused at once (the
            first carrying all as `refusals`), before the rules between options are checked.
    """
    refusals = _range_refusals(options)
    if refusals:
        raise refuse_each(refusals)
    sizes = options.preferred_batch_size
    if options.max_batch_size == 0:
        if options.max_queue_delay_microseconds is not None:
            raise _needs_batching("max_queue_delay_microseconds", "max_batch_size is 0")
        if sizes is not None:
            raise _needs_batching("preferred_batch_size", "max_batch_size is 0")
    if sizes is not None and options.max_batch_size and max(sizes) > options.max_batch_size:
        raise _preferred_too_large(sizes, options.max_batch_size)


def _range_refusals(options: BuildOptions) -> list[ConchError]:
    """The refusal of each option out of its own range (`validate_build_options`' first rules), in field order."""
    refusals: list[ConchError] = []
    attempt(
        refusals,
        _check_range,
        "max_batch_size",
        options.max_batch_size,
        0,
        MAX_MAX_BATCH_SIZE,
        "0 turns Triton batching off",
    )
    attempt(
        refusals,
        _check_range,
        "max_queue_delay_microseconds",
        options.max_queue_delay_microseconds,
        0,
        MAX_QUEUE_DELAY_MICROSECONDS,
        "microseconds, i.e. up to 1 second; it is how long Triton may hold a request to batch it with others",
    )
    attempt(
        refusals,
        _check_range,
        "instance_count",
        options.instance_count,
        1,
        MAX_INSTANCE_COUNT,
        "model instances per group",
    )
    attempt(refusals, _check_preferred_sizes, options.preferred_batch_size)
    return refusals


def _check_preferred_sizes(sizes: Any) -> None:
    """preferred_batch_size on its own: None, or a non-empty list of sizes 1..MAX_MAX_BATCH_SIZE, each once."""
    if sizes is None:
        return
    if not isinstance(sizes, tuple | list) or not sizes:
        raise InvalidInput(
            "preferred_batch_size must be a list of whole numbers such as 4, 8, or left empty.",
            field="preferred_batch_size",
        )
    for size in sizes:
        _check_range("preferred_batch_size", size, 1, MAX_MAX_BATCH_SIZE, "each size is a batch of requests")
    if len(set(sizes)) != len(sizes):
        raise InvalidInput(
            f"preferred_batch_size lists a size more than once ({_join(sizes)}); list each size once.",
            field="preferred_batch_size",
        )


@dataclass(frozen=True)
class BatchAxisReading:
    """What a model's shapes and axis names say about batching along axis 0.

    Triton batches along axis 0 only: with max_batch_size > 0, axis 0 of every input and output is the batch
    axis and is left out of `dims` (Triton "Model Configuration" -> "Maximum Batch Size"). Joining two requests
    along an axis that is not a batch axis (the sequence axis of a time-major RNN, a detector's box axis) mixes
    their data, so Conch only batches when the model itself says axis 0 is one batch axis.

    Attributes:
        blockers: reasons axis 0 cannot be a batch axis at all (a scalar tensor, an axis 0 of fixed size); with
            any of them, max_batch_size > 0 is refused. Each names the tensor and its shape.
        doubts: reasons the axis names do not show that axis 0 is the batch axis although it is dynamic
            everywhere (different symbols, a mix of named and unnamed, an axis named like "batch" elsewhere).
            The model is built without batching unless the user asks for max_batch_size > 0 explicitly; the
            verify step then proves batching safe or fails the build.
    """

    blockers: tuple[str, ...]
    doubts: tuple[str, ...]

    @property
    def batchable(self) -> bool:
        """True when the names show axis 0 is the batch axis (still to be proven by running the model)."""
        return not self.blockers and not self.doubts

    def explain(self) -> str:
        """One sentence for the build log: why the model is built without batching ("" when batchable)."""
        reasons = [*self.blockers, *self.doubts]
        if not reasons:
            return ""
        return (
            "Triton batches along axis 0 only, and axis 0 is not the same dynamic batch axis on every input and "
            "output: " + "; ".join(reasons) + "."
        )


def read_batch_axis(signature: ModelSignature) -> BatchAxisReading:
    """Decide from the shapes and symbolic axis names whether axis 0 is the batch axis of every tensor.

    Axis 0 is the batch axis only when every input and output has a dynamic axis 0 and those axes carry the same
    symbolic name (ONNX `dim_param`), or none of them is named. Blockers: a scalar (rank-0) tensor, an axis 0 of
    fixed size. Doubts: axis 0 names that differ (a detector's `[batch, 3, H, W]` input with a `[num_boxes, 6]`
    output, a `[samples]` waveform with `[frames, 40]` features), named and unnamed axes 0 mixed, and an axis
    other than 0 whose name says "batch" (a time-major RNN's `[seq, batch, feat]`: its batch axis is axis 1).
    """
    tensors = [("input", spec) for spec in signature.inputs] + [("output", spec) for spec in signature.outputs]
    blockers: list[str] = []
    doubts: list[str] = []
    for role, spec in tensors:
        if not spec.dims:
            blockers.append(f"{role} {spec.name!r} is a scalar (rank 0) with no batch axis")
        elif spec.dims[0] != -1:
            blockers.append(f"{role} {spec.name!r} has axis 0 fixed at {spec.dims[0]}, shape {_shape_text(spec.dims)}")
        for axis, dim_name in enumerate(spec.dim_names):
            if axis > 0 and dim_name and _BATCH_NAME_RE.search(dim_name):
                doubts.append(
                    f"{role} {spec.name!r} names axis {axis} {short_dim_name(dim_name)!r}, so its batch axis is axis "
                    f"{axis}, not axis 0"
                )
    if not blockers:
        names = {spec.dim_names[0] for _, spec in tensors}
        if len(names) > 1:
            listed = ", ".join(f"{role} {spec.name!r} {_axis_name(spec.dim_names[0])}" for role, spec in tensors)
            doubts.append(f"axis 0 is not one symbol on every tensor ({listed})")
    return BatchAxisReading(blockers=tuple(blockers), doubts=tuple(doubts))


def supports_batching(signature: ModelSignature) -> bool:
    """True when the shapes and axis names show axis 0 is the batch axis of every tensor (`read_batch_axis`).

    This is a stricter test than Triton's own auto-complete (`AutoCompleteMaxBatch` only asks for a dynamic axis
    0), which would batch a time-major RNN along its sequence axis.
    """
    return read_batch_axis(signature).batchable


def build_model_config(
    *,
    name: str,
    signature: ModelSignature,
    options: BuildOptions,
    backend: str = "onnxruntime",
    model_filename: str = MODEL_FILENAME,
) -> ModelConfig:
    """Build the Triton model configuration for a model served by `backend` from `<version>/<model_filename>`: an
    ONNX model by the onnxruntime backend (the default), a TorchScript one by the pytorch backend (`model.pt`).

    Batching (Triton "Model Configuration" -> "Maximum Batch Size", "Dynamic Batcher"):
    - with no max_batch_size given, the model batches when `read_batch_axis` shows axis 0 is the batch axis of
      every input and output. Then max_batch_size = DEFAULT_MAX_BATCH_SIZE, `dims` leave out axis 0, and the
      dynamic batcher is on with options.max_queue_delay_microseconds (default 100 µs) and the preferred sizes
      if given. A tensor whose only axis is the batch axis gets `dims: [1]` with an empty `reshape` (Triton
      "Reshape"). The verify step must still prove batching safe (builds.verify_step).
    - max_batch_size 0 may always be asked for; > 0 is allowed whenever axis 0 is dynamic everywhere, even when
      the names do not show it is the batch axis (the verify step proves it or fails the build).
    - otherwise max_batch_size is 0, `dims` are the full shape, no dynamic batcher. A scalar tensor gets
      `dims: [1]` without reshape: Triton refuses an empty reshape without batching ("scalar tensors are not
      supported"), and both onnxruntime backends map `[1]` to the model's scalar.
    - other dynamic axes are -1 (Triton "Model Configuration" -> "Inputs and Outputs", variable-size dims).
    Instances: one group of options.instance_count (default 1) with kind KIND_AUTO, which serves on the CPU
    locally and on the GPU in GPU pods (Triton "Instance Groups").

    Args:
        name: the model's repository folder name; must pass `validate_model_name`.
        signature: from `inspect_onnx`; datatypes must be Triton datatype strings.
        options: validated or not; validated again here.

    Returns:
        A new `ModelConfig` with `backend` and default_model_filename `model_filename`.

    Raises:
        InvalidInput: field "name" for a bad name; field "max_batch_size" when max_batch_size > 0 is asked of a
            model with a scalar tensor or a fixed axis 0; field of the option for any other meaningless option.
    """
    validate_model_name(name)
    validate_build_options(options)
    signature = _with_output_dims(signature, options.output_dims)
    reading = read_batch_axis(signature)

    if options.max_batch_size is None:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if reading.batchable else 0
    elif options.max_batch_size > 0 and reading.blockers:
        raise _batching_refused(options.max_batch_size, reading.blockers[0])
    else:
        max_batch_size = options.max_batch_size

    if max_batch_size == 0 and options.max_batch_size is None:
        reason = f"this model is built without batching ({'; '.join([*reading.blockers, *reading.doubts])})"
        if options.max_queue_delay_microseconds is not None:
            raise _needs_batching("max_queue_delay_microseconds", reason)
        if options.preferred_batch_size is not None:
            raise _needs_batching("preferred_batch_size", reason)
    if options.preferred_batch_size is not None and max(options.preferred_batch_size) > max_batch_size:
        raise _preferred_too_large(options.preferred_batch_size, max_batch_size)

    batching = max_batch_size > 0
    config = ModelConfig(
        name=name,
        backend=backend,
        max_batch_size=max_batch_size,
        default_model_filename=model_filename,
    )
    for spec in signature.inputs:
        _set_shape(config.input.add(name=spec.name, data_type=_config_type(spec)), spec.dims, batching)
    for spec in signature.outputs:
        _set_shape(config.output.add(name=spec.name, data_type=_config_type(spec)), spec.dims, batching)
    if batching:
        _enable_dynamic_batcher(config, options.max_queue_delay_microseconds, options.preferred_batch_size)
    config.instance_group.add(
        kind=_INSTANCE_KIND,
        count=options.instance_count if options.instance_count is not None else DEFAULT_INSTANCE_COUNT,
    )
    return config


def with_output_shapes(config: ModelConfig, shapes: Mapping[str, Sequence[int]]) -> ModelConfig:
    """Return a copy of `config` whose outputs named in `shapes` have those full model shapes (axis 0 included,
    -1 = any size): with batching, `dims` leave out axis 0 (which must then be -1, the batch), as
    `build_model_config` writes them (Triton "Model Configuration" -> "Inputs and Outputs", "Reshape").

    Raises:
        ValueError: a name that is not an output of `config`, or a batching shape whose axis 0 is not -1.
    """
    result = ModelConfig()
    result.CopyFrom(config)
    batching = result.max_batch_size > 0
    by_name = {tensor.name: tensor for tensor in result.output}
    for name, shape in shapes.items():
        if name not in by_name:
            raise ValueError(f"{name!r} is not an output of the configuration")
        if batching and (not shape or shape[0] != -1):
            raise ValueError(f"output {name!r} shape {list(shape)} has no batch axis 0 (-1) for a batching config")
        _set_shape(by_name[name], list(shape), batching)
    return result


def without_batching(config: ModelConfig) -> ModelConfig:
    """Return a copy of `config` served without Triton batching: max_batch_size 0, full shapes, no batcher.

    Each tensor's `dims` become the full model shape with axis 0 as -1 (a `[batch]` tensor written as `dims: [1]`
    with an empty `reshape` becomes `dims: [-1]`), and the dynamic batcher is removed (Triton "Model
    Configuration" -> "Maximum Batch Size"). A config that does not batch is returned as an equal copy.
    """
    result = ModelConfig()
    result.CopyFrom(config)
    if result.max_batch_size == 0:
        return result
    for tensor in [*result.input, *result.output]:
        _set_shape(tensor, _model_shape(tensor, batching=True), batching=False)
    result.max_batch_size = 0
    result.ClearField("dynamic_batching")
    return result


def instance_kind_of(config: ModelConfig) -> str:
    """The kind of `config`'s first instance group by its config.pbtxt name ("KIND_AUTO" without a group)."""
    if not config.instance_group:
        return "KIND_AUTO"
    return model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind)


def apply_deployment_overrides(
    config: ModelConfig,
    *,
    instance_count: int | None = None,
    max_batch_size: int | None = None,
    max_queue_delay_microseconds: int | None = None,
    instance_kind: str | None = None,
) -> ModelConfig:
    """Return a copy of `config` with a deployment's choices applied; None leaves a setting as built.

    Same bounds as building (`validate_build_options`: the MAX_* constants of this module): instance_count
    1..MAX_INSTANCE_COUNT sets the count of every instance group; max_batch_size 0..MAX_MAX_BATCH_SIZE. A
    deployment may always turn batching off (0: `without_batching`) and may change the batch size of a config
    built with batching, but may not turn batching on for a config built without it: only a build's verify
    step proves that joining requests along axis 0 is safe. Existing preferred batch sizes must stay <=
    max_batch_size; max_queue_delay_microseconds 0..MAX_QUEUE_DELAY_MICROSECONDS needs batching (Triton "Model
    Configuration" -> "Maximum Batch Size", "Dynamic Batcher", "Instance Groups"). `instance_kind`, one of
    INSTANCE_KINDS, sets the kind of every instance group (whether the place it runs has GPUs is the deployment's
    rule, not the configuration's: `deployments.services.placement.check_instance_kind`).

    Raises:
        InvalidInput: field = the override's name.
    """
    if instance_kind is not None and instance_kind not in INSTANCE_KINDS:
        raise InvalidInput(
            f"instance_kind must be one of {', '.join(INSTANCE_KINDS)}; got {instance_kind!r}.", field="instance_kind"
        )
    validate_build_options(
        BuildOptions(
            max_batch_size=max_batch_size,
            max_queue_delay_microseconds=max_queue_delay_microseconds,
            instance_count=instance_count,
        )
    )
    result = ModelConfig()
    result.CopyFrom(config)
    was_batching = result.max_batch_size > 0

    if max_batch_size == 0:
        result = without_batching(result)
    elif max_batch_size is not None and max_batch_size != result.max_batch_size:
        if not was_batching:
            raise InvalidInput(
                f"max_batch_size {max_batch_size} cannot be used: this model version was built without batching "
                "(its build log says why), and only a build can prove that joining requests along axis 0 gives "
                "each request its own result. Deploy it with max_batch_size empty or 0, or upload the model again "
                "with max_batch_size set so that the build checks batching.",
                field="max_batch_size",
            )
        preferred = tuple(result.dynamic_batching.preferred_batch_size)
        if preferred and max(preferred) > max_batch_size:
            raise InvalidInput(
                f"max_batch_size {max_batch_size} is smaller than the preferred batch sizes this model was built "
                f"with ({_join(preferred)}); choose at least {max(preferred)}, or rebuild the model with smaller "
                "preferred sizes.",
                field="max_batch_size",
            )
        result.max_batch_size = max_batch_size

    if max_queue_delay_microseconds is not None:
        if result.max_batch_size == 0:
            raise _needs_batching("max_queue_delay_microseconds", "this model is served without batching")
        result.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_microseconds

    if instance_count is not None or instance_kind is not None:
        if not result.instance_group:
            result.instance_group.add(kind=_INSTANCE_KIND)
        for group in result.instance_group:
            if instance_count is not None:
                group.count = instance_count
            if instance_kind is not None:
                group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value(instance_kind)
    return result


# --- helpers -------------------------------------------------------------------------------------------------


_DIMS_FORM = (
    "write for example 387=-1,1,8210 (entries separated by ';'), or a JSON object {\"387\": [-1, 1, 8210]}: the "
    "output's full shape, axis 0 included, -1 for an axis of any size."
)


def _dims_error(detail: str) -> InvalidInput:
    return InvalidInput(detail, field=OUTPUT_DIMS_FIELD)


def _parse_dim(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and _INTEGER_RE.fullmatch(raw.strip()):
        return int(raw.strip())
    return None


def _with_output_dims(signature: ModelSignature, output_dims: Mapping[str, Sequence[int]] | None) -> ModelSignature:
    """`signature` with the outputs named in `output_dims` given those shapes (their axis names dropped)."""
    if not output_dims:
        return signature
    names = [spec.name for spec in signature.outputs]
    unknown = [name for name in output_dims if name not in names]
    if unknown:
        raise _dims_error(
            f"output_dims names {', '.join(repr(n) for n in unknown)}, which is not an output of the model; its "
            f"outputs are {', '.join(repr(n) for n in names)}."
        )
    outputs = tuple(
        TensorSpec(spec.name, spec.datatype, tuple(output_dims[spec.name]), (None,) * len(output_dims[spec.name]))
        if spec.name in output_dims
        else spec
        for spec in signature.outputs
    )
    return dataclasses.replace(signature, outputs=outputs)


def _config_type(spec: TensorSpec) -> int:
    try:
        return _CONFIG_TYPES[spec.datatype]
    except KeyError:
        raise InvalidInput(
            f"Tensor {spec.name!r} has datatype {spec.datatype!r}, which Triton's onnxruntime backend does not "
            f"support; supported: {', '.join(_CONFIG_TYPES)}. Export the model with a supported type.",
            field="file",
        ) from None


def adds_served_axis(rank: int, *, batching: bool) -> bool:
    """Whether the configuration Conch writes gives a tensor of `rank` (the model's own, batch axis included) an
    axis the model does not have: one with no axis besides the batch axis (rank 1 when batching, a scalar
    otherwise) gets `dims: [1]`, since Triton needs at least one (`_set_shape`; Triton "Model Configuration" ->
    "Reshape"). Clients then send and receive a last axis of 1 (a non-batching scalar output may come back as a
    scalar)."""
    return (rank - 1 if batching else rank) <= 0


def _set_shape(tensor: Any, model_shape: Sequence[int], batching: bool) -> None:
    """Write `dims` (and `reshape` where needed) of a ModelInput/ModelOutput for the full model shape."""
    del tensor.dims[:]
    tensor.ClearField("reshape")
    body = list(model_shape[1:] if batching else model_shape)
    if not adds_served_axis(len(model_shape), batching=batching):
        tensor.dims.extend(body)
        return
    # Triton needs at least one dim. With batching, [batch] -> dims [1] + empty reshape (Triton "Reshape"); without,
    # a scalar is dims [1] and Triton refuses an empty reshape, the onnxruntime backend maps [1] to the scalar.
    tensor.dims.append(1)
    if batching:
        tensor.reshape.SetInParent()


def _model_shape(tensor: Any, batching: bool) -> list[int]:
    """The full shape the model itself sees for a config tensor (batch axis as -1 when batching)."""
    body = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    return [-1, *body] if batching else body


def _enable_dynamic_batcher(config: ModelConfig, delay: int | None, preferred: Sequence[int] | None) -> None:
    batcher = config.dynamic_batching
    batcher.SetInParent()
    batcher.max_queue_delay_microseconds = delay if delay is not None else DEFAULT_MAX_QUEUE_DELAY_MICROSECONDS
    if preferred:
        del batcher.preferred_batch_size[:]
        batcher.preferred_batch_size.extend(sorted(preferred))


def _axis_name(name: str | None) -> str:
    return f"axis 0 {short_dim_name(name)!r}" if name else "axis 0 unnamed"


def _batching_refused(requested: int, blocker: str) -> InvalidInput:
    return InvalidInput(
        f"max_batch_size {requested} needs axis 0 of every input and output to be dynamic, because Triton uses "
        f"axis 0 as the batch axis, but {blocker}. Leave max_batch_size empty or set it to 0: "
        "the model is then served without Triton batching, one request per run. To batch, export the model with "
        "a dynamic first axis (e.g. dynamic_axes={'input': {0: 'batch'}} in torch.onnx.export).",
        field="max_batch_size",
    )


def _needs_batching(option: str, reason: str) -> InvalidInput:
    what = "a queue delay" if option == "max_queue_delay_microseconds" else "preferred batch sizes"
    return InvalidInput(
        f"{option} only applies when Triton batches requests, but {reason}, so {what} would have no effect. "
        f"Leave {option} empty.",
        field=option,
    )


def _preferred_too_large(sizes: Sequence[int], max_batch_size: int) -> InvalidInput:
    return InvalidInput(
        f"preferred_batch_size {_join(sizes)} includes sizes above max_batch_size {max_batch_size}; each "
        f"preferred size must be between 1 and {max_batch_size}.",
        field="preferred_batch_size",
    )


def _check_range(option: str, value: Any, low: int, high: int, meaning: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(
            f"{option} must be a whole number between {low} and {high} ({meaning}); got {value!r}.", field=option
        )
    if not low <= value <= high:
        raise InvalidInput(f"{option} must be between {low} and {high} ({meaning}); got {value}.", field=option)


def _parse_integer(option: str, raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise InvalidInput(f"{option} must be a whole number such as 8; got {raw!r}.", field=option)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            return None
        if _INTEGER_RE.fullmatch(text):
            return int(text)
    raise InvalidInput(
        f"{option} must be a whole number such as 8 (digits only, no decimals or units), or left empty; got {raw!r}.",
        field=option,
    )


def _parse_sizes(raw: Any) -> tuple[int, ...] | None:
    option = "preferred_batch_size"
    if raw is None:
        return None
    if isinstance(raw, str):
        items: Sequence[Any] = [item for item in re.split(r"[\s,]+", raw.strip()) if item]
    elif isinstance(raw, list | tuple):
        items = raw
    else:
        items = [raw]
    if not items:
        return None
    sizes = []
    for item in items:
        value = _parse_integer(option, item)
        if value is None:
            raise InvalidInput(
                f"{option} must be whole numbers separated by commas, such as 4, 8; got {raw!r}.", field=option
            )
        sizes.append(value)
    return tuple(sizes)


def _join(sizes: Sequence[int]) -> str:
    return ", ".join(str(size) for size in sizes)


def _shape_text(dims: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"
