"""Inspect an uploaded ONNX file and describe what Triton will see of it.

This module owns `ModelSignature` / `TensorSpec`: the names, Triton datatypes and shapes of a model's inputs and
outputs, plus the few facts about the file (IR version, opsets, producer) that later build steps and the console
need. It is pure: it reads one file from the local disk and talks to nothing else.

Two libraries look at the file, in this order, never holding two whole copies of it at once:
1. `onnx` parses the protobuf and checks what only the file can tell (element types, missing external data,
   declared ranks); the parsed model is dropped before step 2.
2. An `onnxruntime` CPU session loads the file by path. Triton's onnxruntime backend asks a session the same
   questions (names, element types, dims) when it validates a config, so the session, not the graph
   declarations, is the authority for the signature (Triton onnxruntime_backend, `InputInfos`/`OutputInfos`).

Every failure raises `InspectionError` (field "file") whose message says what is wrong and what to do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import onnx
import onnxruntime
from google.protobuf.message import DecodeError
from onnx import TensorProto
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from builds.formats import HEAD_BYTES, check_model_head
from conch.errors import InvalidInput

__all__ = [
    "TRITON_DATATYPES",
    "InspectionError",
    "ModelSignature",
    "TensorSpec",
    "inspect_onnx",
]


class InspectionError(InvalidInput):
    """The uploaded file cannot be served as an ONNX model; `detail` says why and what to do (HTTP 400)."""

    def __init__(self, detail: str, *, field: str = "file") -> None:
        super().__init__(detail, field=field)


# ONNX element type -> Triton datatype, for the types Triton's onnxruntime backend can exchange
# (onnxruntime_backend `ConvertFromOnnxDataType`; Triton "Model Configuration" -> "Datatypes").
# BFLOAT16, COMPLEX*, FLOAT8*, FLOAT4 and the 2/4-bit integers are absent on purpose: that backend maps them
# to TYPE_INVALID and refuses to load the model.
_ONNX_TO_TRITON: dict[int, str] = {
    TensorProto.BOOL: "BOOL",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.FLOAT16: "FP16",
    TensorProto.FLOAT: "FP32",
    TensorProto.DOUBLE: "FP64",
    TensorProto.STRING: "BYTES",
}

# The same mapping keyed by the type strings an onnxruntime session reports (NodeArg.type).
_ORT_TO_TRITON: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

#: Triton datatypes this module can produce, in Triton's documentation order.
TRITON_DATATYPES: tuple[str, ...] = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
)

_SUPPORTED_TYPES_TEXT = (
    "Triton's onnxruntime backend supports bool, uint8, uint16, uint32, uint64, int8, int16, int32, int64, "
    "float16, float (float32), double (float64) and string, which Triton calls " + ", ".join(TRITON_DATATYPES)
)

# Real models have a few dozen top-level fields at most; stop walking (and leave the rest to the parser) after
# this many so a crafted file of tiny fields cannot keep the walk busy.
_MAX_TOP_LEVEL_FIELDS = 100_000


#: Characters of a symbolic axis name shown in logs, messages and tables; a longer one (an exporter may write a
#: whole formula, hundreds of characters) is shortened by `short_dim_name`, its full text kept in the signature.
DIM_NAME_SHOWN = 32


def short_dim_name(name: str) -> str:
    """`name` as logs and tables show it: whole up to DIM_NAME_SHOWN characters, else its first 20 and last 8
    characters around an ellipsis, with its length ("(seq_len + 2 * pad) …en // 4) [412 chars]"). The console
    shows the full name when the pointer rests on the short one (a `title`)."""
    if len(name) <= DIM_NAME_SHOWN:
        return name
    return f"{name[:20]}…{name[-8:]} [{len(name)} chars]"


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton sees it.

    Attributes:
        name: the tensor name in the ONNX graph (may contain `/`, `.` or `:`; Triton accepts them).
        datatype: Triton datatype string, one of `TRITON_DATATYPES` ("FP32", "INT64", "BYTES", ...).
        dims: the full model shape including axis 0, one int per axis; -1 marks an axis whose size is decided
            per request (symbolic, unknown, or stored as a negative number in the file). A rank-0 (scalar)
            tensor has `dims == ()`.
        dim_names: per axis, the symbolic name the file gives a dynamic axis ("batch", "sequence"), else None.
            Same length as `dims`.
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
    dim_names: tuple[str | None, ...]

    @property
    def rank(self) -> int:
        """Number of axes (0 for a scalar)."""
        return len(self.dims)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: {"name", "datatype", "dims": [int], "dim_names": [str|None]}."""
        return {
            "name": self.name,
            "datatype": self.datatype,
            "dims": list(self.dims),
            "dim_names": list(self.dim_names),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        """Rebuild a spec from `to_dict()` output. Raises KeyError/TypeError on a malformed dict."""
        dims = tuple(int(d) for d in data["dims"])
        names = data.get("dim_names")
        return cls(
            name=str(data["name"]),
            datatype=str(data["datatype"]),
            dims=dims,
            dim_names=tuple(names) if names is not None else (None,) * len(dims),
        )


@dataclass(frozen=True)
class ModelSignature:
    """What an ONNX file offers to Triton: its tensors plus facts about the file.

    Attributes:
        inputs: the inputs a request must send, in session order (initializers are not inputs).
        outputs: the outputs the model returns, in session order.
        ir_version: ONNX IR version of the file (e.g. 8).
        opset: version of the default ("ai.onnx") operator set, or None if the file imports none.
        opset_imports: every imported (domain, version), default domain as "".
        producer_name: tool that wrote the file ("pytorch", "tf2onnx", "" when unset).
        producer_version: that tool's version, "" when unset.
        external_data_files: file names (relative to the model) holding external tensor data; they must be
            copied next to `model.onnx` in the repository. Empty for self-contained files.
        warnings: problems that do not stop serving, e.g. an `onnx.checker` complaint onnxruntime tolerates.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ir_version: int
    opset: int | None
    opset_imports: tuple[tuple[str, int], ...]
    producer_name: str = ""
    producer_version: str = ""
    external_data_files: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict with the same keys as the attributes; opset_imports as [[domain, version]]."""
        return {
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
            "ir_version": self.ir_version,
            "opset": self.opset,
            "opset_imports": [[domain, version] for domain, version in self.opset_imports],
            "producer_name": self.producer_name,
            "producer_version": self.producer_version,
            "external_data_files": list(self.external_data_files),
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSignature:
        """Rebuild a signature from `to_dict()` output. Raises KeyError/TypeError on a malformed dict."""
        return cls(
            inputs=tuple(TensorSpec.from_dict(item) for item in data["inputs"]),
            outputs=tuple(TensorSpec.from_dict(item) for item in data["outputs"]),
            ir_version=int(data["ir_version"]),
            opset=None if data.get("opset") is None else int(data["opset"]),
            opset_imports=tuple((str(d), int(v)) for d, v in data.get("opset_imports", ())),
            producer_name=str(data.get("producer_name", "")),
            producer_version=str(data.get("producer_version", "")),
            external_data_files=tuple(data.get("external_data_files", ())),
            warnings=tuple(data.get("warnings", ())),
        )


def inspect_onnx(path: Path) -> ModelSignature:
    """Read the ONNX file at `path` and return the signature Triton's onnxruntime backend will see.

    Checks, in order: the file exists and is not empty; it is not another format (Git LFS pointer, image,
    archive, checkpoint, text/HTML); its top-level protobuf framing is complete (catches truncated uploads and
    reports the size the file should at least have); it parses as an ONNX ModelProto with a graph; external
    data files it references exist next to it and are long enough; it has at least one input and one output;
    every input/output is a tensor of a type Triton supports (Triton "Model Configuration" -> "Datatypes"),
    with a declared rank and no zero-size axis; finally onnxruntime (CPU) can load it.

    Memory: the file is parsed once by `onnx` (load_external_data=False), that copy is released, then
    onnxruntime reads it by path; models here are up to ~54 MB.

    Args:
        path: local path of the uploaded file (any name; the extension is not trusted).

    Returns:
        The frozen `ModelSignature`; dims use -1 for every dynamic axis.

    Raises:
        InspectionError: (field "file") with a message naming the problem and the fix.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise InspectionError(
            f"The model file {path.name!r} was not found where the build expected it. Upload the model again."
        ) from None
    if not path.is_file():
        raise InspectionError(f"{path.name!r} is a folder, not a file. Upload the .onnx file itself.")
    if size == 0:
        raise InspectionError(
            "The uploaded file is empty (0 bytes). Upload the .onnx model file itself, and check that the "
            "copy on your machine is not empty (`ls -l model.onnx`)."
        )

    with path.open("rb") as handle:
        try:
            check_model_head(handle.read(HEAD_BYTES), size_bytes=size, filename="model.onnx")
        except InvalidInput as error:
            raise InspectionError(error.detail) from None
        _check_top_level_framing(handle, size)

    model = _parse_model(path)
    facts = _ModelFacts.from_model(model, path)
    del model  # release the parsed copy before onnxruntime reads the file

    warnings = []
    checker_problem = _checker_problem(path)
    if checker_problem:
        warnings.append(
            "onnx.checker reports a problem that onnxruntime tolerates; Triton may still refuse the model "
            f"with a stricter runtime: {checker_problem}"
        )

    session = _open_session(path, checker_problem)
    inputs = tuple(_tensor_spec(arg, "input") for arg in session.get_inputs())
    outputs = tuple(_tensor_spec(arg, "output") for arg in session.get_outputs())
    del session

    return ModelSignature(
        inputs=inputs,
        outputs=outputs,
        ir_version=facts.ir_version,
        opset=facts.opset,
        opset_imports=facts.opset_imports,
        producer_name=facts.producer_name,
        producer_version=facts.producer_version,
        external_data_files=facts.external_data_files,
        warnings=tuple(warnings),
    )


# --- framing: is the protobuf complete? ----------------------------------------------------------------------


def _check_top_level_framing(handle: BinaryIO, size: int) -> None:
    """Walk the top-level ModelProto fields by seeking; raise when the file ends inside one.

    Only a few field headers are read, so a 54 MB file costs a handful of small reads. Protobuf wire format:
    tag varint (field number << 3 | wire type), then a varint (type 0), 8 bytes (type 1), a length varint plus
    that many bytes (type 2) or 4 bytes (type 5).
    """
    position = 0
    for _ in range(_MAX_TOP_LEVEL_FIELDS):
        if position >= size:
            return
        start = position
        tag, position = _read_varint(handle, position, size)
        field_number, wire_type = tag >> 3, tag & 0x7
        if field_number == 0:
            raise _corrupt(f"an invalid field header at byte {start:,}")
        if wire_type == 0:
            _, position = _read_varint(handle, position, size)
            continue
        if wire_type == 1:
            end = position + 8
        elif wire_type == 5:
            end = position + 4
        elif wire_type == 2:
            length, position = _read_varint(handle, position, size)
            end = position + length
        else:
            raise _corrupt(f"an unknown field encoding (wire type {wire_type}) at byte {start:,}")
        if end > size:
            raise _truncated(size, end, _model_field_name(field_number))
        position = end


def _read_varint(handle: BinaryIO, position: int, size: int) -> tuple[int, int]:
    """Read a protobuf varint at `position`; return (value, position after it)."""
    handle.seek(position)
    chunk = handle.read(10)
    value = 0
    for index, byte in enumerate(chunk):
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, position + index + 1
    if len(chunk) < 10:
        raise _truncated(size, size + 1, "a field header")
    raise _corrupt(f"a malformed number at byte {position:,}")


def _model_field_name(field_number: int) -> str:
    field = onnx.ModelProto.DESCRIPTOR.fields_by_number.get(field_number)
    return f"its {field.name!r} section" if field is not None else f"field {field_number}"


def _truncated(size: int, needed: int, where: str) -> InspectionError:
    return InspectionError(
        f"The ONNX file is truncated: it is {size:,} bytes, but {where} runs to at least byte {needed:,}, so the "
        "upload or an earlier download stopped early. Upload the complete file again; compare its size and "
        "sha256 with the original (`ls -l model.onnx`, `sha256sum model.onnx`)."
    )


def _corrupt(what: str) -> InspectionError:
    return InspectionError(
        f"The file starts like an ONNX model but is damaged: it has {what}. Export or download the model again "
        "and upload the fresh copy; if you transferred it by FTP or e-mail, use binary mode or zip it first."
    )


# --- parsing and facts from the protobuf ---------------------------------------------------------------------


def _parse_model(path: Path) -> onnx.ModelProto:
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except DecodeError as error:
        raise _corrupt(f"content that does not decode as an ONNX ModelProto ({error})") from None
    if not model.HasField("graph"):
        raise InspectionError(
            "The file is a protobuf message but holds no graph, the part of an ONNX model that contains its "
            "layers, inputs and outputs. The file is incomplete or is not a model: export it again to .onnx "
            "and upload that file."
        )
    return model


@dataclass(frozen=True)
class _ModelFacts:
    ir_version: int
    opset: int | None
    opset_imports: tuple[tuple[str, int], ...]
    producer_name: str
    producer_version: str
    external_data_files: tuple[str, ...]

    @classmethod
    def from_model(cls, model: onnx.ModelProto, path: Path) -> _ModelFacts:
        """Check the graph's interface and external data; collect the file facts."""
        graph = model.graph
        initializers = {tensor.name for tensor in graph.initializer}
        inputs = [value for value in graph.input if value.name not in initializers]
        if not graph.output:
            raise InspectionError(
                "The model's graph declares no outputs, so Triton would have nothing to return. Export it again "
                "with named outputs (for example torch.onnx.export(..., output_names=['logits']))."
            )
        if not inputs:
            raise InspectionError(
                "The model's graph declares no inputs (every graph input is a stored constant), so a request "
                "would have nothing to send. Export it again with at least one real input "
                "(for example torch.onnx.export(..., input_names=['input']))."
            )
        for value in inputs:
            _check_value_type(value, "input")
        for value in graph.output:
            _check_value_type(value, "output")

        opsets = tuple(
            (entry.domain if entry.domain != "ai.onnx" else "", entry.version) for entry in model.opset_import
        )
        default = [version for domain, version in opsets if domain == ""]
        return cls(
            ir_version=model.ir_version,
            opset=default[0] if default else None,
            opset_imports=opsets,
            producer_name=model.producer_name,
            producer_version=model.producer_version,
            external_data_files=_check_external_data(model, path),
        )


def _check_value_type(value: onnx.ValueInfoProto, role: str) -> None:
    """Raise unless `value` is a tensor with a Triton-supported element type and a declared rank."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        described = {
            "sequence_type": "a sequence of tensors",
            "map_type": "a map (dictionary)",
            "optional_type": "an optional value",
            "sparse_tensor_type": "a sparse tensor",
        }.get(kind or "", "a value of unknown type")
        hint = (
            " Models converted from scikit-learn classifiers output a list of maps by default: convert them "
            "with skl2onnx options={id(model): {'zipmap': False}} to get a plain probability tensor."
            if kind in ("sequence_type", "map_type")
            else ""
        )
        raise InspectionError(
            f"The model's {role} {value.name!r} is {described}, but Triton's onnxruntime backend only exchanges "
            f"dense tensors. Export the model so that this {role} is a plain tensor.{hint}"
        )
    elem_type = value.type.tensor_type.elem_type
    if elem_type not in _ONNX_TO_TRITON:
        raise InspectionError(
            f"The model's {role} {value.name!r} has element type {_onnx_type_name(elem_type)}, which Triton "
            f"cannot carry. {_SUPPORTED_TYPES_TEXT}. Add a Cast to a supported type (e.g. float) at that "
            f"{role} in the model and export it again."
        )
    if not value.type.tensor_type.HasField("shape"):
        raise InspectionError(
            f"The model's {role} {value.name!r} has no declared shape, not even its number of axes, and a "
            "Triton configuration must state the rank of every tensor. Export the model with shapes (for "
            "example with dynamic_axes in torch.onnx.export), or add them with "
            "onnx.shape_inference.infer_shapes, and upload it again."
        )


def _onnx_type_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"number {elem_type} (unknown to onnx {onnx.__version__})"


def _iter_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Yield every stored tensor of `graph`, including those inside node attributes and subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _iter_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _iter_tensors(subgraph)


def _check_external_data(model: onnx.ModelProto, path: Path) -> tuple[str, ...]:
    """Return the external data files the model needs; raise if any is missing, outside, or too short."""
    needed: dict[str, int] = {}  # location -> bytes the furthest tensor needs
    for tensor in _iter_tensors(model.graph):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location", "")
        offset = int(entries.get("offset") or 0)
        length = entries.get("length")
        end = offset + int(length) if length else -1
        needed[location] = max(needed.get(location, -1), end)
    if not needed:
        return ()

    folder = path.parent.resolve()
    missing, short = [], []
    for location, end in sorted(needed.items()):
        target = (folder / location).resolve()
        if not location or folder not in target.parents:
            raise InspectionError(
                f"The model refers to external data at {location!r}, outside the model's own folder. Save the "
                "model again with its weights inside it: onnx.save(onnx.load('model.onnx'), 'single.onnx') and "
                "upload single.onnx."
            )
        if not target.is_file():
            missing.append(location)
        elif end > target.stat().st_size:
            short.append(location)
    if missing:
        raise InspectionError(
            "The model keeps its weights in separate external data files that were not uploaded: "
            f"{', '.join(missing)}. Upload a zip of the model and those files (zip -r model.zip <folder>, or "
            "a .tar.gz), or one self-contained file: for models under 2 GB run "
            "onnx.save(onnx.load('model.onnx'), 'single.onnx', save_as_external_data=False) next to those "
            "files and upload single.onnx."
        )
    if short:
        raise InspectionError(
            f"The external data file(s) {', '.join(short)} are shorter than the model expects, so they were "
            "cut off. Copy them again completely, or save a self-contained model with "
            "onnx.save(onnx.load('model.onnx'), 'single.onnx', save_as_external_data=False) and upload that."
        )
    return tuple(needed)


def _checker_problem(path: Path) -> str:
    """Run onnx.checker on the file by path (its C++ loader also reads external data); return its complaint."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as error:
        return _first_lines(str(error))
    return ""


# --- onnxruntime: the authority for names and shapes ---------------------------------------------------------

_ORT_ERRORS = (
    ort_state.Fail,
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NotImplemented,
    ort_state.RuntimeException,
    ort_state.EPFail,
)


def _open_session(path: Path, checker_problem: str) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    # Optimizations do not change the interface; skipping them makes inspection of big models fast.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except _ORT_ERRORS as error:
        also = f" onnx.checker also reports: {checker_problem}" if checker_problem else ""
        raise InspectionError(
            f"onnxruntime {onnxruntime.__version__}, the runtime Triton uses for ONNX models, cannot load this "
            f"model: {_first_lines(str(error))}.{also} Export the model again with an operator set this runtime "
            "supports (opset 21 or lower is a safe choice) and without custom operators, then upload it again."
        ) from None


def _tensor_spec(arg: Any, role: str) -> TensorSpec:
    """Build a TensorSpec from an onnxruntime NodeArg (name, type like 'tensor(float)', shape list)."""
    datatype = _ORT_TO_TRITON.get(arg.type)
    if datatype is None:
        raise InspectionError(
            f"The model's {role} {arg.name!r} has type {arg.type} in onnxruntime, which Triton cannot carry. "
            f"{_SUPPORTED_TYPES_TEXT}. Change that {role} to a supported tensor type and export again."
        )
    dims: list[int] = []
    names: list[str | None] = []
    for axis, dim in enumerate(arg.shape):
        if isinstance(dim, int) and dim > 0:
            dims.append(dim)
            names.append(None)
        elif isinstance(dim, int) and dim == 0:
            raise InspectionError(
                f"The model's {role} {arg.name!r} declares axis {axis} with size 0, so it could never hold "
                "data. Export the model with that axis dynamic or with its real size."
            )
        else:
            # None (no value, or a negative value stored in the file) or a symbolic name: sized per request.
            dims.append(-1)
            names.append(dim if isinstance(dim, str) and dim not in ("", "?") else None)
    return TensorSpec(name=arg.name, datatype=datatype, dims=tuple(dims), dim_names=tuple(names))


def _first_lines(message: str, limit: int = 400) -> str:
    text = " ".join(line.strip() for line in message.strip().splitlines() if line.strip())
    text = text.rstrip(".")
    return text if len(text) <= limit else text[: limit - 1] + "…"
