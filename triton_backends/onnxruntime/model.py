"""Python-based Triton backend named `onnxruntime`: runs ONNX files with the onnxruntime package on the CPU.

Triton loads `<backend-directory>/onnxruntime/model.py` as the backend for every model whose configuration says
`backend: "onnxruntime"` when no `libtriton_onnxruntime.so` sits in that folder (Triton docs, Python backend,
"Python-based Backends"). This lets one model repository serve unchanged on a CPU-only machine here and on GPU pods
that carry Triton's own C++ onnxruntime backend.

What it honours from the model configuration (Triton docs, "Model Configuration"):
- `input` / `output`: names and `data_type`; an input's `reshape` (an empty one turns a `[batch, 1]` request
  into the model's `[batch]`, Triton "Reshape") and `optional` flag. Only outputs listed in the configuration,
  and requested by the client, are returned; an output's `reshape` is applied by Triton's core to every backend's
  responses. A scalar (rank-0) model input is configured as `dims: [1]` without batching (Triton refuses an empty
  reshape there): its `[1]` request tensor is fed as the scalar, and a scalar output is returned as `[1]`, as
  Triton's C++ onnxruntime backend does.
- `max_batch_size`: when > 0 every tensor carries a leading batch dimension. The dynamic batcher hands `execute()`
  several requests without joining them; requests whose non-batch dimensions agree are concatenated along axis 0
  into ONE onnxruntime run and the outputs are split back per request (Triton docs, "Dynamic Batcher"). With
  `max_batch_size: 0` the configured dims are full shapes and each request runs alone, as it does when the graph
  fixes its first dimension to a number.
- `parameters`: `intra_op_thread_count` and `inter_op_thread_count` (the names Triton's C++ onnxruntime backend
  reads). Without them each instance gets `max(1, cpus // instances)` intra-op threads, so the instances of an
  `instance_group` share the CPUs instead of oversubscribing them.
- `default_model_filename` (else `model.onnx`) inside `<model>/<version>/`.

At load time each configured output must agree with the shape the ONNX file declares for it, by the rule of
Triton's C++ onnxruntime backend (onnxruntime_backend `ValidateOutputs` -> `CompareDimsSupported`, exact
comparison), so that a configuration refused on a GPU pod is refused here too: the configured full shape (the
output's `reshape`, else its `dims`, after a -1 batch axis when max_batch_size > 0) must have the file's rank and
equal it axis by axis (-1 where the file's axis is symbolic or unknown); a file's scalar output only takes dims of 1.
It deliberately does NOT check or fix the shapes outputs come back in at run time: the build's verify step compares
what the model really produces with the configuration, and hiding a mismatch here would defeat it.

This file is copied into Triton's backend directory by `tritonserving.server.ensure_backend_directory` and runs
inside the Python backend stub, so it imports only numpy, onnxruntime and `triton_python_backend_utils`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

# Triton data types (Model Configuration, "Datatypes") -> (numpy dtype, onnxruntime type string).
# TYPE_BF16 has no numpy dtype, so a model using it cannot run through this backend.
_TRITON_TYPES: dict[str, tuple[np.dtype, str]] = {
    "TYPE_BOOL": (np.dtype(np.bool_), "tensor(bool)"),
    "TYPE_UINT8": (np.dtype(np.uint8), "tensor(uint8)"),
    "TYPE_UINT16": (np.dtype(np.uint16), "tensor(uint16)"),
    "TYPE_UINT32": (np.dtype(np.uint32), "tensor(uint32)"),
    "TYPE_UINT64": (np.dtype(np.uint64), "tensor(uint64)"),
    "TYPE_INT8": (np.dtype(np.int8), "tensor(int8)"),
    "TYPE_INT16": (np.dtype(np.int16), "tensor(int16)"),
    "TYPE_INT32": (np.dtype(np.int32), "tensor(int32)"),
    "TYPE_INT64": (np.dtype(np.int64), "tensor(int64)"),
    "TYPE_FP16": (np.dtype(np.float16), "tensor(float16)"),
    "TYPE_FP32": (np.dtype(np.float32), "tensor(float)"),
    "TYPE_FP64": (np.dtype(np.float64), "tensor(double)"),
    "TYPE_STRING": (np.dtype(np.object_), "tensor(string)"),
}

DEFAULT_MODEL_FILENAME = "model.onnx"


@dataclass(frozen=True)
class _InputSpec:
    name: str
    is_string: bool
    is_optional: bool
    reshape: tuple[int, ...] | None  # per-item shape the model wants, batch dimension excluded
    is_scalar: bool  # the graph input has rank 0


@dataclass
class _Prepared:
    """One request after reading its inputs: what to feed onnxruntime and which outputs to return."""

    index: int
    feeds: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    batch_size: int


class _RequestError(Exception):
    """A problem with one request; it becomes that request's error response, the others still run."""


def _error_response(message: str, *, invalid_argument: bool) -> pb_utils.InferenceResponse:
    code = pb_utils.TritonError.INVALID_ARG if invalid_argument else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _is_invalid_argument(exc: Exception) -> bool:
    # onnxruntime raises InvalidArgument for a bad shape/dtype fed to the graph: the caller's fault (HTTP 400).
    return type(exc).__name__ == "InvalidArgument" or "INVALID_ARGUMENT" in str(exc)


def _parameter(config: dict, key: str) -> str | None:
    value = config.get("parameters", {}).get(key)
    if value is None:
        return None
    return str(value.get("string_value", "")).strip() or None


def _thread_count(config: dict, key: str, default: int) -> int:
    raw = _parameter(config, key)
    if raw is None:
        return default
    try:
        count = int(raw)
    except ValueError:
        raise pb_utils.TritonModelException(
            f"parameter '{key}' must be a whole number of threads, got {raw!r}"
        ) from None
    if count < 0:
        raise pb_utils.TritonModelException(f"parameter '{key}' must be >= 0 (0 = onnxruntime's default), got {count}")
    return count


def _instance_count(config: dict) -> int:
    groups = config.get("instance_group") or [{}]
    return max(1, sum(int(group.get("count", 1)) for group in groups))


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _to_onnx_strings(array: np.ndarray, name: str) -> np.ndarray:
    # Triton hands BYTES tensors over as object arrays of `bytes`; onnxruntime would str() them into "b'..'".
    try:
        decoded = [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in array.ravel()]
    except UnicodeDecodeError as exc:
        raise _RequestError(f"input tensor '{name}' holds bytes that are not UTF-8 text: {exc}") from None
    return np.array(decoded, dtype=np.object_).reshape(array.shape)


def _to_triton_bytes(array: np.ndarray) -> np.ndarray:
    encoded = [item.encode("utf-8") if isinstance(item, str) else item for item in array.ravel()]
    return np.array(encoded, dtype=np.object_).reshape(array.shape)


class TritonPythonModel:
    """One model instance: an onnxruntime CPU session plus the configuration rules it must honour.

    Triton creates one object per instance of `instance_group`, each in its own stub process.
    """

    def initialize(self, args: dict) -> None:
        """Open the ONNX file named by the configuration and check it against the configured inputs/outputs.

        `args` (Python backend, "initialize"): `model_config` (JSON text), `model_repository` (the model's folder,
        a local copy when the repository is on S3), `model_version`.
        Raises `TritonModelException` (the load fails with this message) when the file is missing, a configured
        input or output is not in the graph, a graph input is missing from the configuration, an input's data
        type differs from the graph's, a configured output's shape disagrees with the one the file declares
        (`_check_output_dims`), or a thread-count parameter is not a whole number >= 0.
        """
        config = json.loads(args["model_config"])
        self._model_name = config.get("name", "?")
        self._batching = int(config.get("max_batch_size", 0)) > 0
        filename = config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
        model_path = Path(args["model_repository"]) / str(args["model_version"]) / filename
        if not model_path.is_file():
            raise pb_utils.TritonModelException(f"model file not found: {model_path}")

        instances = _instance_count(config)
        intra = _thread_count(config, "intra_op_thread_count", max(1, _cpu_count() // instances))
        inter = _thread_count(config, "inter_op_thread_count", 1)
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra
        options.inter_op_num_threads = inter
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning worker threads burn the CPU that other instances and the server need between runs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(
                str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors share no base class but Exception
            raise pb_utils.TritonModelException(f"onnxruntime cannot open {model_path}: {exc}") from None

        self._inputs = self._read_input_specs(config)
        # Axes the graph names symbolically (e.g. "sequence"): inputs sharing a name must agree on its size.
        self._named_axes = {
            item.name: tuple((axis, dim) for axis, dim in enumerate(item.shape or ()) if isinstance(dim, str) and dim)
            for item in self._session.get_inputs()
        }
        self._output_names, self._string_outputs = self._read_output_specs(config)
        # A graph whose first input dimension is a fixed number (e.g. batch fixed at 1) cannot take joined requests:
        # trying would only fail and re-run every request alone.
        self._joinable = self._batching and all(
            item.shape and not isinstance(item.shape[0], int) for item in self._session.get_inputs()
        )
        pb_utils.Logger.log_info(
            f"conch onnxruntime backend: model '{self._model_name}' file {model_path.name} "
            f"batching={self._batching} joins_requests={self._joinable} instances={instances} "
            f"intra_op_threads={intra} inter_op_threads={inter}"
        )

    def _read_input_specs(self, config: dict) -> tuple[_InputSpec, ...]:
        graph_inputs = {item.name: item for item in self._session.get_inputs()}
        specs = []
        for entry in config.get("input", []):
            name = entry["name"]
            data_type = entry.get("data_type", "")
            if data_type not in _TRITON_TYPES:
                raise pb_utils.TritonModelException(
                    f"input '{name}': data type {data_type} is not supported by the onnxruntime Python backend"
                )
            if name not in graph_inputs:
                raise pb_utils.TritonModelException(
                    f"configured input '{name}' is not an input of the model; the model's inputs are "
                    f"{sorted(graph_inputs)}"
                )
            graph_type = graph_inputs[name].type
            if graph_type != _TRITON_TYPES[data_type][1]:
                raise pb_utils.TritonModelException(
                    f"input '{name}': configuration says {data_type} but the model expects {graph_type}"
                )
            reshape = entry.get("reshape")
            specs.append(
                _InputSpec(
                    name=name,
                    is_string=data_type == "TYPE_STRING",
                    is_optional=bool(entry.get("optional", False)),
                    reshape=tuple(int(d) for d in reshape.get("shape", [])) if reshape is not None else None,
                    is_scalar=graph_inputs[name].shape == [],
                )
            )
        missing = sorted(set(graph_inputs) - {spec.name for spec in specs})
        if missing:
            raise pb_utils.TritonModelException(f"the model's inputs {missing} are missing from the configuration")
        return tuple(specs)

    def _read_output_specs(self, config: dict) -> tuple[tuple[str, ...], frozenset[str]]:
        graph_outputs = {item.name: item for item in self._session.get_outputs()}
        # Outputs that Triton fills from a batch (`batch_output`) need not match the model (as in the C++ backend).
        batch_outputs = {target for entry in config.get("batch_output", []) for target in entry.get("target_name", [])}
        names, strings = [], set()
        for entry in config.get("output", []):
            name = entry["name"]
            if name not in graph_outputs:
                raise pb_utils.TritonModelException(
                    f"configured output '{name}' is not an output of the model; the model's outputs are "
                    f"{sorted(graph_outputs)}"
                )
            if name not in batch_outputs:
                self._check_output_dims(entry, graph_outputs[name].shape)
            names.append(name)
            if graph_outputs[name].type == "tensor(string)":
                strings.add(name)
        return tuple(names), frozenset(strings)

    def _check_output_dims(self, entry: dict, graph_shape: list | None) -> None:
        """Refuse a configured output whose shape disagrees with the file's declared one (C++ backend's rule)."""
        name = entry["name"]
        reshape = entry.get("reshape")
        dims = [int(d) for d in (reshape.get("shape", []) if reshape is not None else entry.get("dims", []))]
        declared = [dim if isinstance(dim, int) and dim >= 0 else -1 for dim in (graph_shape or [])]
        if not declared:
            if any(dim != 1 for dim in dims):
                raise pb_utils.TritonModelException(
                    f"model '{self._model_name}', output '{name}': the model file declares a scalar, so the "
                    f"configuration may only give it dims of 1 without batching, but it gives {dims}"
                )
            return
        configured = [-1, *dims] if self._batching else dims
        if self._batching and declared[0] != -1:
            raise pb_utils.TritonModelException(
                f"model '{self._model_name}', output '{name}': with max_batch_size > 0 the model file must declare "
                f"a dynamic first axis (-1), but it declares {declared}"
            )
        if configured != declared:
            batch_note = " (the batch axis -1, as max_batch_size > 0, then dims)" if self._batching else ""
            raise pb_utils.TritonModelException(
                f"model '{self._model_name}', output '{name}': the model file declares {len(declared)} axes "
                f"{declared} but the configuration gives {len(configured)} axes {configured}{batch_note}; "
                "they must agree axis by axis (-1 for an axis the file leaves dynamic)"
            )

    def execute(self, requests: list) -> list:
        """Run a list of requests; return one `InferenceResponse` per request, in order.

        With batching on (`max_batch_size` > 0, and a graph whose first dimension is not a fixed number) the
        requests whose inputs agree on every non-batch dimension (and on which optional inputs are present) are
        concatenated along axis 0 and run once; each output is
        sliced back by the requests' batch sizes. When a joined run fails, or an output's first dimension is not
        the joined batch size (a model that does not keep the batch axis), the group is re-run one request at a
        time so that one bad request cannot fail the others. Errors name the tensor at fault; errors onnxruntime
        classes as invalid arguments come back as INVALID_ARG (HTTP 400), others as INTERNAL (HTTP 500).
        """
        responses: list = [None] * len(requests)
        groups: dict[tuple, list[_Prepared]] = {}
        for index, request in enumerate(requests):
            try:
                prepared = self._prepare(index, request)
            except _RequestError as exc:
                responses[index] = _error_response(str(exc), invalid_argument=True)
                continue
            if self._joinable and prepared.batch_size >= 0:
                key = tuple((name, array.shape[1:], array.dtype.str) for name, array in prepared.feeds.items())
            else:
                key = ("alone", index)
            groups.setdefault(key, []).append(prepared)

        for group in groups.values():
            self._run_group(group, responses)
        return responses

    def _prepare(self, index: int, request) -> _Prepared:
        feeds: dict[str, np.ndarray] = {}
        batch_size = -1
        for spec in self._inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is None:
                if spec.is_optional:
                    continue
                raise _RequestError(f"input tensor '{spec.name}' is missing from the request")
            array = tensor.as_numpy()
            if spec.is_string:
                array = _to_onnx_strings(array, spec.name)
            if spec.is_scalar and not self._batching and spec.reshape is None:
                if array.size != 1:
                    raise _RequestError(
                        f"input tensor '{spec.name}' is a scalar in the model; send shape [1], got {list(array.shape)}"
                    )
                array = array.reshape(())
            elif spec.reshape is not None:
                target = ((array.shape[0],) if self._batching else ()) + spec.reshape
                try:
                    array = array.reshape(target)
                except ValueError:
                    raise _RequestError(
                        f"input tensor '{spec.name}' of shape {list(array.shape)} cannot be reshaped to "
                        f"{list(target)} as the configuration's reshape asks"
                    ) from None
            if self._batching:
                if array.ndim == 0:
                    raise _RequestError(f"input tensor '{spec.name}' has no batch dimension")
                if batch_size < 0:
                    batch_size = array.shape[0]
                elif array.shape[0] != batch_size:
                    raise _RequestError(
                        f"input tensor '{spec.name}' has batch size {array.shape[0]}, other inputs have {batch_size}"
                    )
            feeds[spec.name] = array

        self._check_named_axes(feeds)
        wanted = set(request.requested_output_names())
        outputs = tuple(name for name in self._output_names if name in wanted) or self._output_names
        return _Prepared(index=index, feeds=feeds, outputs=outputs, batch_size=batch_size)

    def _check_named_axes(self, feeds: dict[str, np.ndarray]) -> None:
        """Refuse inputs that disagree on a dimension the graph names alike (a clear 400, not an ORT crash)."""
        first_seen: dict[str, tuple[str, int]] = {}
        for name, array in feeds.items():
            for axis, symbol in self._named_axes.get(name, ()):
                if axis >= array.ndim:
                    continue
                other = first_seen.setdefault(symbol, (name, array.shape[axis]))
                if other[1] != array.shape[axis]:
                    raise _RequestError(
                        f"input tensors '{other[0]}' and '{name}' must have the same size in dimension "
                        f"'{symbol}' (axis {axis}): got {other[1]} and {array.shape[axis]}"
                    )

    def _run_group(self, group: list[_Prepared], responses: list) -> None:
        fetch = [name for name in self._output_names if any(name in item.outputs for item in group)]
        if len(group) == 1:
            feeds = group[0].feeds
        else:
            # One copy per input into a contiguous batch: unavoidable, each request's tensor lives in its own buffer.
            feeds = {name: np.concatenate([item.feeds[name] for item in group], axis=0) for name in group[0].feeds}
        try:
            results = self._session.run(fetch, feeds)
        except Exception as exc:  # noqa: BLE001 - any failure must become a response, never fail the whole batch
            if len(group) > 1:
                pb_utils.Logger.log_info(
                    f"conch onnxruntime backend: joined run of {len(group)} requests failed; running them one by one"
                )
                self._run_alone(group, responses)
                return
            responses[group[0].index] = _error_response(
                f"onnxruntime failed on model '{self._model_name}': {exc}", invalid_argument=_is_invalid_argument(exc)
            )
            return

        produced = dict(zip(fetch, results, strict=True))
        if len(group) == 1:
            responses[group[0].index] = self._response(group[0], produced, 0, None)
            return
        total = sum(item.batch_size for item in group)
        if any(array.ndim == 0 or array.shape[0] != total for array in results):
            self._run_alone(group, responses)
            return
        start = 0
        for item in group:
            stop = start + item.batch_size
            responses[item.index] = self._response(item, produced, start, stop)
            start = stop

    def _run_alone(self, group: list[_Prepared], responses: list) -> None:
        for item in group:
            self._run_group([item], responses)

    def _response(self, item: _Prepared, produced: dict, start: int, stop: int | None) -> pb_utils.InferenceResponse:
        tensors = []
        for name in item.outputs:
            array = produced[name] if stop is None else produced[name][start:stop]
            if array.ndim == 0:
                array = array.reshape((1,))  # a scalar output is configured as dims [1]
            if name in self._string_outputs:
                array = _to_triton_bytes(array)
            # A slice along axis 0 of a C-ordered array is already contiguous: no copy happens here.
            tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(array)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        """Release the onnxruntime session when Triton unloads the model instance."""
        self._session = None
