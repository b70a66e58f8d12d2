"""Triton model configuration as data: the `inference.ModelConfig` protobuf and its text and JSON forms.

Owns the conversions between `config.pbtxt` text (protobuf text format, Triton "Model Configuration"), the
`ModelConfig` message (`tritonclient.grpc.model_config_pb2`, the generated schema of `model_config.proto`) and the
JSON that Triton's repository load API takes ("Model Repository Extension" -> "Load", parameter "config"). Pure:
no network, no Django.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TypeAlias

import numpy as np
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2

from conch.errors import InvalidInput

__all__ = [
    "ModelConfig",
    "config_from_pbtxt",
    "config_to_json",
    "datatype_name",
    "datatype_of_numpy",
    "datatype_value",
    "numpy_of_datatype",
    "config_to_pbtxt",
    "same_apart_from_versions",
    "serving_versions",
]

#: The protobuf message class of a Triton model configuration (`inference.ModelConfig`). tritonclient ships no type
#: information for its generated protobuf modules (no .pyi), so to the type checker this alias is Any.
ModelConfig: TypeAlias = model_config_pb2.ModelConfig


def datatype_name(data_type: int) -> str:
    """The Triton datatype name ("FP32", "INT64", "BYTES") of a model configuration's `data_type` enum value
    (`TYPE_FP32` -> "FP32", `TYPE_STRING` -> "BYTES", as the inference protocol names it; Triton "Model
    Configuration" -> "Datatypes"). Raises ValueError for an unknown value."""
    name = str(model_config_pb2.DataType.Name(data_type)).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def datatype_value(name: str) -> int:
    """Inverse of `datatype_name`: the `data_type` enum value of a Triton datatype name ("FP32" -> TYPE_FP32,
    "BYTES" -> TYPE_STRING). Raises ValueError for an unknown name."""
    return int(model_config_pb2.DataType.Value("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}"))


def datatype_of_numpy(dtype: Any) -> str:
    """The Triton datatype name of a numpy dtype (float32 -> "FP32", object or bytes -> "BYTES"), by tritonclient's
    own mapping (`tritonclient.utils.np_to_triton_dtype`). Raises ValueError for a dtype Triton has no name for."""
    from tritonclient.utils import np_to_triton_dtype

    name = np_to_triton_dtype(np.dtype(dtype))
    if name is None:
        raise ValueError(f"numpy dtype {dtype} has no Triton datatype")
    return str(name)


def numpy_of_datatype(datatype: str) -> Any:
    """The numpy dtype of a Triton datatype name ("FP32" -> float32, "BYTES" -> object), by tritonclient's own
    mapping (`tritonclient.utils.triton_to_np_dtype`). Raises ValueError for a name Triton does not have."""
    from tritonclient.utils import triton_to_np_dtype

    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise ValueError(f"Triton has no datatype {datatype!r}")
    return np.dtype(dtype)


def config_to_pbtxt(config: ModelConfig) -> str:
    """Render `config` as protobuf text, the `config.pbtxt` format Triton reads (Triton "Model Configuration").

    Fields at their proto3 default (max_batch_size 0, kind KIND_AUTO) are not printed; Triton reads them back as
    the same defaults.
    """
    return text_format.MessageToString(config, as_utf8=True)


def config_from_pbtxt(text: str) -> ModelConfig:
    """Parse `config.pbtxt` text into a `ModelConfig`.

    Raises:
        InvalidInput: field "config" when the text is not a valid Triton model configuration.
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise InvalidInput(
            f"This is not a valid Triton model configuration: {error}. Fix that line of config.pbtxt (see "
            "Triton's model_config.proto for the field names) and try again.",
            field="config",
        ) from None
    return config


def config_to_json(config: ModelConfig) -> str:
    """Render `config` as the JSON Triton's repository load API takes in its "config" parameter.

    Shape: protobuf JSON with the proto field names ("max_batch_size", "data_type": "TYPE_FP32", ...), and 64-bit
    integers written as JSON numbers rather than protobuf's quoted strings, matching the JSON Triton itself
    returns for a model's configuration (Triton "Model Repository Extension" -> "Load", parameter "config").
    """
    data = json_format.MessageToDict(config, preserving_proto_field_name=True)
    _int64_strings_to_numbers(config.DESCRIPTOR, data)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def serving_versions(config: ModelConfig, versions: Iterable[int]) -> ModelConfig:
    """Return a copy of `config` whose version policy serves exactly `versions` (Triton "Model Configuration" ->
    "Version Policy": `specific { versions: [...] }`); the versions are sorted, duplicates dropped.

    Raises ValueError for an empty list or a version below 1 (Triton version directories are positive numbers).
    """
    wanted = sorted(set(versions))
    if not wanted or wanted[0] < 1:
        raise ValueError(f"versions must be one or more numbers >= 1, got {wanted}")
    result = ModelConfig()
    result.CopyFrom(config)
    result.version_policy.Clear()
    result.version_policy.specific.versions.extend(wanted)
    return result


def same_apart_from_versions(first: ModelConfig, second: ModelConfig) -> bool:
    """Whether two configurations differ at most in their version policy, so one of them can serve the model
    files of both (e.g. a deployment's configuration of its old and of its new version)."""
    left, right = ModelConfig(), ModelConfig()
    left.CopyFrom(first)
    right.CopyFrom(second)
    left.ClearField("version_policy")
    right.ClearField("version_policy")
    return left == right


_INT64_FIELD_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _int64_strings_to_numbers(descriptor: Descriptor, data: dict[str, Any]) -> None:
    """Turn protobuf-JSON's quoted 64-bit integers back into numbers, recursively, guided by the schema."""
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for map_key, item in value.items():
                if value_field.message_type is not None:
                    _int64_strings_to_numbers(value_field.message_type, item)
                elif value_field.type in _INT64_FIELD_TYPES:
                    value[map_key] = int(item)
        elif field.message_type is not None:
            for item in value if field.is_repeated else [value]:
                _int64_strings_to_numbers(field.message_type, item)
        elif field.type in _INT64_FIELD_TYPES:
            data[key] = [int(item) for item in value] if field.is_repeated else int(value)
