"""Pure helpers for the build's verify step: make a sample request, and judge the shapes that come back.

The verify step runs one real inference (on the local Triton, or straight through onnxruntime) because some
models declare shapes their graph does not produce, and only running them shows it. This module owns the two
pure halves of that step: building inputs from a model configuration, and comparing the output shapes with
what the configuration promises. It performs no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from conch.errors import InvalidInput
from tritonserving.config import ModelConfig

__all__ = [
    "DEFAULT_DYNAMIC_SIZE",
    "SAMPLE_BYTES",
    "VerificationError",
    "check_output_shapes",
    "make_sample_inputs",
]

#: Size given to every dynamic (-1) axis of a sample input. 64 is a multiple of 32, the total stride of
#: detection backbones such as PP-OCR's (smaller or odd sizes break their feature-pyramid additions), it is small
#: enough for recognition models whose height must pool down to 1, and it is a short valid sequence length for
#: text models. Checked against every model in DESIGN.md "Real models for demos and tests".
DEFAULT_DYNAMIC_SIZE = 64

#: Element used to fill BYTES (TYPE_STRING) inputs.
SAMPLE_BYTES = b"conch"

_NUMPY_TYPES: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    # numpy has no bfloat16; Triton clients send BF16 from float32 arrays.
    "TYPE_BF16": np.float32,
    "TYPE_STRING": np.object_,
}


class VerificationError(InvalidInput):
    """A sample inference showed the model does not behave as its configuration says (HTTP 400, field "file")."""

    def __init__(self, detail: str, *, field: str = "file") -> None:
        super().__init__(detail, field=field)


def make_sample_inputs(
    config: ModelConfig, *, dynamic_size: int = DEFAULT_DYNAMIC_SIZE, seed: int = 0
) -> dict[str, np.ndarray]:
    """Build one valid request's inputs from a model configuration, keyed by input name, in config order.

    Shapes: `[1, *dims]` when max_batch_size > 0 (a batch of one, Triton "Model Configuration" -> "Maximum
    Batch Size"), else `dims`; every -1 becomes `dynamic_size`. The shapes follow the config's `dims`, i.e. what a
    Triton client sends; for a tensor with a `reshape` the model itself sees the reshape shape.

    Values: floats (FP16/FP32/FP64, BF16 as float32) uniform in [0, 1) from a generator seeded with `seed`, so
    two calls give equal arrays; integers are all 1, a valid token id / mask / index / byte value for the
    models here; BOOL is all True; BYTES (TYPE_STRING) is an object array of `SAMPLE_BYTES`.

    Raises:
        ValueError: dynamic_size < 1, or an input with a datatype Triton's config schema does not define.
    """
    if dynamic_size < 1:
        raise ValueError(f"dynamic_size must be at least 1, got {dynamic_size}")
    generator = np.random.default_rng(seed)
    batch = [1] if config.max_batch_size > 0 else []
    samples: dict[str, np.ndarray] = {}
    for tensor in config.input:
        shape = tuple(batch + [dynamic_size if dim == -1 else int(dim) for dim in tensor.dims])
        type_name = _type_name(tensor.data_type)
        dtype = _NUMPY_TYPES.get(type_name)
        if dtype is None:
            raise ValueError(f"input {tensor.name!r} has datatype {type_name}, which has no sample value")
        samples[tensor.name] = _sample(dtype, shape, generator)
    return samples


def check_output_shapes(config: ModelConfig, outputs: Mapping[str, Sequence[int]], *, batch_size: int) -> None:
    """Check that each output the configuration declares came back, with a shape the configuration allows.

    Declared shape: `[batch_size, *dims]` when max_batch_size > 0, else `dims`; -1 matches any size, every other
    axis and the rank must match exactly. A tensor with a `reshape` may also come back in the reshape shape (as
    the model produces it), and a non-batching `dims: [1]` may come back as a scalar. Outputs the configuration
    does not declare are ignored (Triton only returns declared outputs).

    Args:
        config: the model configuration that was served.
        outputs: output name -> actual shape (e.g. `{name: array.shape}` from the inference result).
        batch_size: size of axis 0 of the sample request; only used when max_batch_size > 0.

    Raises:
        VerificationError: naming the tensor, the declared shape and the actual shape (or the missing output)
            and what to do.
        ValueError: batch_size < 1 while the configuration batches.
    """
    batching = config.max_batch_size > 0
    if batching and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    for tensor in config.output:
        if tensor.name not in outputs:
            returned = ", ".join(repr(name) for name in outputs) or "nothing"
            raise VerificationError(
                f"The sample inference did not return output {tensor.name!r}, which the configuration declares; it "
                f"returned {returned}. The model's outputs differ from what inspection found: upload the model "
                "again, and if this repeats, export it with fixed output names."
            )
        actual = tuple(int(dim) for dim in outputs[tensor.name])
        allowed = _allowed_shapes(tensor, batching, batch_size)
        if any(_matches(shape, actual) for shape in allowed):
            continue
        declared = allowed[0]
        rank_note = (
            f" (rank {len(actual)} produced, rank {len(declared)} declared)" if len(actual) != len(declared) else ""
        )
        batch_note = f", where the first axis is the batch of {batch_size}" if batching else ""
        raise VerificationError(
            f"Output {tensor.name!r} came back with shape {_text(actual)}, but the configuration declares "
            f"{_text(declared)}{batch_note}; -1 means any size{rank_note}. The model file declares the wrong "
            "shape for this output, so Triton would describe it wrongly to clients and may refuse it. Fix the "
            "output's declared shape in the ONNX graph (for example export again with correct dynamic_axes, or "
            "edit graph.output with the onnx package) and upload the model again."
        )


def _sample(dtype: Any, shape: tuple[int, ...], generator: np.random.Generator) -> np.ndarray:
    if dtype is np.object_:
        array = np.empty(shape, dtype=np.object_)
        array.fill(SAMPLE_BYTES)
        return array
    if dtype is np.bool_:
        return np.ones(shape, dtype=np.bool_)
    if np.issubdtype(dtype, np.floating):
        return generator.random(shape, dtype=np.float64).astype(dtype)
    return np.ones(shape, dtype=dtype)


def _type_name(data_type: int) -> str:
    try:
        return model_config_pb2.DataType.Name(data_type)
    except ValueError:
        return f"number {data_type}"


def _allowed_shapes(tensor: Any, batching: bool, batch_size: int) -> list[tuple[int, ...]]:
    prefix = [batch_size] if batching else []
    shapes = [tuple(prefix + list(tensor.dims))]
    if tensor.HasField("reshape"):
        shapes.append(tuple(prefix + list(tensor.reshape.shape)))
    if not batching and list(tensor.dims) == [1]:
        shapes.append(())
    return shapes


def _matches(declared: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    return len(declared) == len(actual) and all(d in (-1, a) for d, a in zip(declared, actual, strict=True))


def _text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(dim) for dim in shape) + "]"
