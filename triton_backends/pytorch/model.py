"""Python-based Triton backend named `pytorch`: runs TorchScript files with the torch package on the CPU.

Triton loads `<backend-directory>/pytorch/model.py` as the backend for every model whose configuration says
`backend: "pytorch"` when no `libtriton_pytorch.so` sits in that folder (Triton docs, Python backend, "Python-based
Backends"). One model repository then serves unchanged on a CPU-only machine here and on GPU pods that carry
Triton's own C++ (LibTorch) pytorch backend.

What it honours from the model configuration, by the C++ backend's rules (pytorch_backend `NamingConvention`):
- inputs: named as `forward`'s arguments (FORWARD_ARGUMENT), else `<name>__<index>` (NAMED_INDEX: the index is the
  argument's position), else passed in the configuration's order (STRICT_CONFIG_ORDERING);
- outputs: `<name>__<index>`, the index being the position in the tuple `forward` returns (one tensor is index 0);
  otherwise the configuration's order;
- `max_batch_size` > 0: every tensor carries a leading batch axis. The dynamic batcher hands `execute()` several
  requests; those whose non-batch dimensions agree are joined along axis 0 into one `forward` call and each output
  is split back per request; a joined call that fails, or an output that does not keep the joined batch size, is
  run again one request at a time, so one bad request cannot fail the others;
- `default_model_filename` (else `model.pt`) inside `<model>/<version>/`;
- threads: `max(1, cpus // instances)` intra-op threads per instance, so the instances of an `instance_group` share
  the CPUs instead of oversubscribing them.

This file is copied into Triton's backend directory by `tritonserving.server.ensure_backend_directory` and runs
inside the Python backend stub, so it imports only numpy, torch and `triton_python_backend_utils`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

DEFAULT_MODEL_FILENAME = "model.pt"
_INDEXED = re.compile(r".+__(\d+)")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _error_response(message: str, *, invalid_argument: bool) -> pb_utils.InferenceResponse:
    code = pb_utils.TritonError.INVALID_ARG if invalid_argument else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class _RequestError(Exception):
    """A problem with one request; it becomes that request's error response, the others still run."""


def _positions(names: list[str], arguments: list[str], role: str) -> list[int]:
    """Each configured tensor's position among `forward`'s arguments (or outputs), by the backend's conventions."""
    if role == "input" and set(names) == set(arguments):
        return [arguments.index(name) for name in names]
    indexed = [_INDEXED.fullmatch(name) for name in names]
    if all(indexed):
        return [int(match.group(1)) for match in indexed if match]
    return list(range(len(names)))


class TritonPythonModel:
    """One model instance: a TorchScript module on the CPU plus the configuration's tensor names."""

    def initialize(self, args: dict) -> None:
        """Load the TorchScript file named by the configuration.

        `args` (Python backend, "initialize"): `model_config` (JSON text), `model_repository` (the model's folder),
        `model_version`. Raises `TritonModelException` (the load fails with this message) when the file is missing
        or not TorchScript, or when the configuration names more inputs than `forward` takes.
        """
        config = json.loads(args["model_config"])
        self._model_name = config.get("name", "?")
        self._batching = int(config.get("max_batch_size", 0)) > 0
        filename = config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
        model_path = Path(args["model_repository"]) / str(args["model_version"]) / filename
        if not model_path.is_file():
            raise pb_utils.TritonModelException(f"model file not found: {model_path}")
        groups = config.get("instance_group") or [{}]
        instances = max(1, sum(int(group.get("count", 1)) for group in groups))
        torch.set_num_threads(max(1, _cpu_count() // instances))
        try:
            self._module = torch.jit.load(str(model_path), map_location="cpu").eval()
        except Exception as exc:  # noqa: BLE001 - the load must fail with torch's reason
            raise pb_utils.TritonModelException(f"torch.jit.load failed on {model_path}: {exc}") from None
        arguments = [argument.name for argument in list(self._module.forward.schema.arguments)[1:]]
        self._inputs = [entry["name"] for entry in config.get("input", [])]
        if len(self._inputs) > len(arguments):
            raise pb_utils.TritonModelException(
                f"the configuration names {len(self._inputs)} inputs but forward takes {len(arguments)} "
                f"({', '.join(arguments)})"
            )
        order = _positions(self._inputs, arguments, "input")
        self._argument_of = dict(zip(self._inputs, order, strict=True))
        self._arguments = len(arguments)
        self._outputs = [entry["name"] for entry in config.get("output", [])]
        self._output_index = dict(zip(self._outputs, _positions(self._outputs, [], "output"), strict=True))

    def execute(self, requests: list) -> list:
        """Run a list of requests; return one `InferenceResponse` per request, in order (joined along axis 0 where
        batching is on and the other dimensions agree). Errors name the tensor at fault; a failed `forward` comes
        back as INVALID_ARG (HTTP 400) when torch blames the input's shape or type, else INTERNAL."""
        responses: list = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, list[np.ndarray], tuple[str, ...]]]] = {}
        for index, request in enumerate(requests):
            try:
                arrays = self._read(request)
            except _RequestError as exc:
                responses[index] = _error_response(str(exc), invalid_argument=True)
                continue
            wanted = tuple(request.requested_output_names() or self._outputs)
            key = tuple((array.shape[1:], array.dtype.str) for array in arrays) if self._batching else ("alone", index)
            groups.setdefault(key, []).append((index, arrays, wanted))
        for group in groups.values():
            self._run(group, responses)
        return responses

    def _read(self, request) -> list[np.ndarray]:
        arrays: list = [None] * self._arguments
        for name in self._inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise _RequestError(f"input tensor '{name}' is missing from the request")
            arrays[self._argument_of[name]] = tensor.as_numpy()
        if any(array is None for array in arrays):
            raise _RequestError("the configuration does not give every argument of forward")
        return arrays

    def _forward(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            result = self._module(*(torch.from_numpy(np.ascontiguousarray(array)) for array in arrays))
        values = list(result) if isinstance(result, tuple | list) else [result]
        return [value.detach().cpu().numpy() for value in values]

    def _run(self, group: list, responses: list) -> None:
        if len(group) == 1:
            arrays = group[0][1]
        else:
            arrays = [
                np.concatenate([item[1][position] for item in group], axis=0) for position in range(len(group[0][1]))
            ]
        try:
            produced = self._forward(arrays)
        except Exception as exc:  # noqa: BLE001 - any failure must become a response, never fail the whole batch
            if len(group) > 1:
                for item in group:
                    self._run([item], responses)
                return
            invalid = isinstance(exc, RuntimeError | TypeError | ValueError | IndexError)
            responses[group[0][0]] = _error_response(
                f"torch failed on model '{self._model_name}': {exc}", invalid_argument=invalid
            )
            return
        if len(group) > 1:
            total = sum(item[1][0].shape[0] for item in group)
            if any(value.ndim == 0 or value.shape[0] != total for value in produced):
                for item in group:
                    self._run([item], responses)
                return
        start = 0
        for index, arrays_in, wanted in group:
            stop = start + arrays_in[0].shape[0] if len(group) > 1 else None
            tensors = []
            for name in wanted:
                position = self._output_index.get(name)
                if position is None or position >= len(produced):
                    responses[index] = _error_response(
                        f"model '{self._model_name}' has no output '{name}'", invalid_argument=True
                    )
                    break
                array = produced[position] if stop is None else produced[position][start:stop]
                if array.ndim == 0:
                    array = array.reshape((1,))  # a scalar output is configured as dims [1]
                tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(array)))
            else:
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
            if stop is not None:
                start = stop

    def finalize(self) -> None:
        """Release the module when Triton unloads the model instance."""
        self._module = None
