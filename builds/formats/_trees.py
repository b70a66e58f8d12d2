"""What the gradient-boosted tree formats share: their converted models' outputs, and the source framework's
predictions arranged as those outputs.

onnxmltools converts a tree ensemble into `ai.onnx.ml` TreeEnsemble operators with one FP32 input `input`
[-1, features]. A classifier gives `label` (INT64 [-1], the top class index) and `probabilities` (FP32
[-1, classes]; a binary model's two columns are 1 - p and p); a regressor (and any other objective) gives `variable`
(FP32 [-1, 1]). Sandbox child only: the framework imports happen in the calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "BATCH_AXIS_NAME",
    "INPUT_NAME",
    "arrange_predictions",
    "declare_batch_axis",
    "onnx_opsets",
    "package_version",
    "tool_reason",
]

#: The converted model's one input.
INPUT_NAME = "input"
#: The symbolic name the converted model's axis 0 (one row per sample) gets on its input and every output.
BATCH_AXIS_NAME = "N"


def declare_batch_axis(model: Any) -> list[str]:
    """Name axis 0 of the input and of every output of a converted tree model BATCH_AXIS_NAME; return a note per
    output whose declared shape was changed.

    Every output of a tree ensemble has one row per input row, but onnxmltools declares some outputs with axis 0
    fixed at 1 (a classifier's `label` as [1]) and leaves the input's axis 0 unnamed; Triton's onnxruntime backend
    and Conch's batching rule read axis 0 from these declarations, so they are made to say what the model does.
    """
    notes = []
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if not dims:
            continue
        first = dims[0]
        if first.HasField("dim_value") and value in model.graph.output:
            notes.append(
                f"output {value.name!r}: declared with axis 0 fixed at {first.dim_value} by the converter, but it "
                f"has one row per input row; declared as [{BATCH_AXIS_NAME}"
                + "".join(f", {d.dim_value or d.dim_param or '?'}" for d in list(dims)[1:])
                + "]"
            )
        first.ClearField("dim_value")
        first.dim_param = BATCH_AXIS_NAME
    return notes


def arrange_predictions(predicted: np.ndarray, *, classifier: bool, classes: int) -> dict[str, np.ndarray]:
    """The source framework's predictions as the converted model's outputs.

    `predicted`: what the framework's predict gives, probabilities for a classifier ([N] for a binary one: the
    positive class's, else [N, classes]), the prediction [N] (or [N, k]) for anything else.
    """
    predicted = np.asarray(predicted)
    if not classifier:
        rows = predicted.shape[0] if predicted.ndim else 1
        return {"variable": predicted.reshape(rows, -1).astype(np.float32)}
    if predicted.ndim == 1 or (predicted.ndim == 2 and predicted.shape[1] == 1 and classes <= 2):
        positive = predicted.reshape(-1)
        probabilities = np.stack([1.0 - positive, positive], axis=1)
    else:
        probabilities = predicted.reshape(predicted.shape[0], -1)
    return {
        "label": np.argmax(probabilities, axis=1).astype(np.int64),
        "probabilities": probabilities.astype(np.float32),
    }


def onnx_opsets(model: Any) -> dict[str, int]:
    """The opset imports of an `onnx.ModelProto`, domain -> version ("" is the default domain)."""
    return {entry.domain: int(entry.version) for entry in model.opset_import}


def package_version(name: str) -> str:
    """ "<distribution> <version>" of an installed distribution ("onnxmltools 1.16.0")."""
    from importlib.metadata import version

    return f"{name} {version(name)}"


def tool_reason(error: BaseException) -> str:
    """A tool's exception as one line of at most 500 characters (its type's name when it has no message)."""
    text = " ".join(str(error).split()).rstrip(".") or type(error).__name__
    return text[:500]
