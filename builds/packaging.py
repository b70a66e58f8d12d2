"""The model file a build puts in the Triton model repository, and the output shapes that file declares.

Triton's C++ onnxruntime backend (the one GPU pods serve with) loads a model only when each configured output
agrees with the shape the ONNX file declares for it (onnxruntime_backend, `ValidateOutputs` ->
`CompareDimsSupported` with exact comparison): the ranks must be equal, every axis must be equal (-1 for an axis the
file leaves dynamic), axis 0 must be dynamic when the model batches, and an output the file declares as a scalar
may only be configured with dims of 1. When the build configures an output with another shape than the file's (the
shape the verify step observed, or the user's `output_dims`), the repository's copy of the file is rewritten to
declare the configured shape; the uploaded source stays as it was. The rewrite parses the untrusted file, so it
runs in the sandbox (`builds.sandbox.run_in_sandbox`), with `onnx` loading the ModelProto without external data.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from builds.inspection import ModelSignature
from builds.sandbox import SandboxLimits, run_in_sandbox
from models_registry.storage import ObjectStore
from tritonserving.config import ModelConfig

__all__ = [
    "PackagedModel",
    "configured_output_shapes",
    "describe_packaging",
    "outputs_to_redeclare",
    "package_external_data",
    "package_model_file",
    "redeclare_outputs",
    "upload_file",
]

#: The name given to an axis of any size in a rewritten output shape: `conch_<output index>_dim_<axis>`.
DIM_PARAM_FORMAT = "conch_{output}_dim_{axis}"

_UPLOAD_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class PackagedModel:
    """What `package_model_file` stored: its size in bytes, and the outputs whose declared shape it rewrote
    (name -> (shape the uploaded file declares, shape the repository copy declares); -1 = any size)."""

    size_bytes: int
    redeclared: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]


def configured_output_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Return the full model shape each output of `config` asks for (name -> shape, -1 = any size).

    The output's `reshape` when it has one, else its `dims`, with -1 (the batch axis) first when max_batch_size > 0
    (Triton "Model Configuration" -> "Inputs and Outputs", "Reshape").
    """
    batching = config.max_batch_size > 0
    shapes = {}
    for tensor in config.output:
        body = [int(d) for d in (tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)]
        shapes[tensor.name] = tuple([-1, *body] if batching else body)
    return shapes


def outputs_to_redeclare(config: ModelConfig, signature: ModelSignature) -> dict[str, tuple[int, ...]]:
    """Return the outputs whose declared shape Triton's C++ onnxruntime backend would refuse with `config`.

    name -> the full shape the file must declare instead (`configured_output_shapes`). The rule is the backend's
    (onnxruntime_backend `CompareDimsSupported`, exact): a file's scalar output accepts configured dims that are all
    1; any other output needs the configured full shape exactly (same rank, -1 where the file's axis is dynamic,
    equal sizes elsewhere). Outputs not in the signature are left to the load to refuse.
    """
    if config.backend != "onnxruntime":
        return {}  # only an ONNX file declares its outputs' shapes; other backends take the configured ones
    declared = {spec.name: tuple(spec.dims) for spec in signature.outputs}
    configured = configured_output_shapes(config)
    wanted = {}
    for tensor in config.output:
        if tensor.name not in declared:
            continue
        file_shape = declared[tensor.name]
        body = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        if not file_shape and all(int(d) == 1 for d in body):
            continue
        if file_shape != configured[tensor.name]:
            wanted[tensor.name] = configured[tensor.name]
    return wanted


def redeclare_outputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """Make the graph outputs named in `shapes` declare those shapes, in place; nothing else of `model` changes.

    A size >= 0 becomes a `dim_value`; -1 becomes a `dim_param`: the file's own name for that axis when the output
    keeps its rank and the file named the axis, else `DIM_PARAM_FORMAT` (a name of its own per output and axis, so
    that no two axes are claimed equal). The element type is kept. Raises KeyError naming an output that the graph
    does not have.
    """
    outputs = {value.name: (index, value) for index, value in enumerate(model.graph.output)}
    for name, shape in shapes.items():
        if name not in outputs:
            raise KeyError(f"the model has no output {name!r}")
        index, value = outputs[name]
        tensor_type = value.type.tensor_type
        old = list(tensor_type.shape.dim) if tensor_type.HasField("shape") else []
        new = onnx.TensorShapeProto()
        for axis, size in enumerate(shape):
            dim = new.dim.add()
            if size >= 0:
                dim.dim_value = int(size)
            elif len(old) == len(shape) and old[axis].dim_param:
                dim.dim_param = old[axis].dim_param
            else:
                dim.dim_param = DIM_PARAM_FORMAT.format(output=index, axis=axis)
        tensor_type.shape.CopyFrom(new)


def package_model_file(
    *,
    store: ObjectStore,
    source_key: str | None,
    source_file: Path,
    model_key: str,
    config: ModelConfig,
    signature: ModelSignature,
    limits: SandboxLimits | None = None,
) -> PackagedModel:
    """Store the model file for `config` under `model_key`; return its size and the outputs it redeclared.

    `source_file` is a local copy of the uploaded object `source_key`, or, with `source_key` None, a model converted
    from the upload. When every output of `config` agrees with the file (`outputs_to_redeclare` is empty) the object
    is copied as uploaded (a converted file is uploaded as it is); otherwise the copy is parsed and
    rewritten in the sandbox (`limits`, default `SandboxLimits.from_settings()`) with those outputs redeclared, and
    uploaded. The uploaded object is never changed. Raises what `run_in_sandbox` raises (InvalidInput, field
    `file`, past a limit) and the store's errors.
    """
    wanted = outputs_to_redeclare(config, signature)
    if not wanted:
        if source_key is None:
            upload_file(store, Path(source_file), model_key)
        else:
            store.copy(source_key, model_key)
        return PackagedModel(size_bytes=store.size(model_key), redeclared={})
    declared = {spec.name: tuple(spec.dims) for spec in signature.outputs}
    with tempfile.TemporaryDirectory(prefix="conch-package-") as work:
        job = Path(work) / "job.json"
        target = Path(work) / "model.onnx"
        job.write_text(
            json.dumps(
                {
                    "source": str(Path(source_file).resolve()),
                    "target": str(target),
                    "outputs": {name: list(shape) for name, shape in wanted.items()},
                }
            ),
            encoding="utf-8",
        )
        run_in_sandbox(f"{__name__}:_redeclare_job", job, limits=limits or SandboxLimits.from_settings())
        upload_file(store, target, model_key)
        size = target.stat().st_size
    return PackagedModel(size_bytes=size, redeclared={name: (declared[name], wanted[name]) for name in wanted})


def package_external_data(
    *, store: ObjectStore, source_file: Path, model_key: str, files: Sequence[str]
) -> dict[str, int]:
    """Store an ONNX model's external data files beside its model file; return each stored key's size in bytes.

    `files` are the locations the model names (`ModelSignature.external_data_files`, relative to `source_file`'s
    folder, checked by the inspection to stay inside it); each is uploaded to the same path relative to `model_key`
    (`<prefix>/<model>/<version>/model.onnx`), where onnxruntime looks for it (ONNX external data: a tensor's
    `location` is relative to the model file). Raises the store's errors and ValueError for a location that leaves
    the folder (the inspection refuses those first).
    """
    folder = Path(source_file).resolve().parent
    version_folder = model_key.rsplit("/", 1)[0]
    stored: dict[str, int] = {}
    for location in files:
        path = (folder / location).resolve()
        if folder not in path.parents:
            raise ValueError(f"external data location {location!r} leaves the model's folder")
        key = f"{version_folder}/{path.relative_to(folder).as_posix()}"
        upload_file(store, path, key)
        stored[key] = path.stat().st_size
    return stored


def describe_packaging(packaged: PackagedModel, model_key: str) -> list[str]:
    """Log lines for a packaged model file: one per redeclared output, or none when it is the uploaded file."""
    return [
        f"{model_key}: output {name} now declares {_text(new)} in place of the uploaded file's {_text(old)}, as "
        "config.pbtxt does (Triton's onnxruntime backend loads a model only when the two agree); only the "
        "repository's copy changed, the uploaded file is kept as it was"
        for name, (old, new) in packaged.redeclared.items()
    ]


def _redeclare_job(job_path: Path) -> dict[str, Any]:
    """Sandbox target: rewrite the outputs of the job's source file into its target file (see package_model_file)."""
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    model = onnx.load_model(job["source"], load_external_data=False)
    redeclare_outputs(model, {name: [int(d) for d in shape] for name, shape in job["outputs"].items()})
    data = model.SerializeToString()
    del model
    Path(job["target"]).write_bytes(data)
    return {"size_bytes": len(data)}


def upload_file(store: ObjectStore, path: Path, key: str) -> None:
    """Store the local file `path` as object `key`, streamed in chunks. Raises the store's errors."""
    with store.open_writer(key) as writer, path.open("rb") as handle:
        while chunk := handle.read(_UPLOAD_CHUNK_BYTES):
            writer.write(chunk)
        writer.commit()


def _text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"
