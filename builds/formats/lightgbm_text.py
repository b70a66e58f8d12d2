"""LightGBM models in LightGBM's own text format (`Booster.save_model`, `.txt`), converted to ONNX with onnxmltools.

LightGBM writes no pickles here: the file is text that LightGBM parses (no code runs). The converted model has one
FP32 input `input` [-1, features]; classifiers (objectives `binary*`, `multiclass*`) give `label` and
`probabilities` (no ZipMap: Triton cannot serve its sequence-of-maps output), other objectives give `variable`
(`builds.formats._trees`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from builds.formats._trees import (
    INPUT_NAME,
    arrange_predictions,
    declare_batch_axis,
    onnx_opsets,
    package_version,
    tool_reason,
)
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["LightGBMFormat"]

#: How a LightGBM text model begins (LightGBM `GBDT::SaveModelToString`: "tree", then "version=v2|v3|v4").
_HEAD = b"tree\nversion=v"
_HEAD_CRLF = b"tree\r\nversion=v"
#: Lines of the header read for the objective and class count (they come before the first "Tree=").
_HEADER_LINES = 200


class LightGBMFormat(ModelFormat):
    """A LightGBM text model, converted with onnxmltools and served by the `onnxruntime` backend."""

    key: ClassVar[str] = "lightgbm"
    title: ClassVar[str] = "LightGBM model (text)"
    suffixes: ClassVar[tuple[str, ...]] = (".txt", ".model", ".lgb")
    converter: ClassVar[str] = "onnxmltools"
    upload_hint: ClassVar[str] = "the text file lightgbm.Booster.save_model (or LGBMModel.booster_.save_model) writes"

    def matches_head(self, head: bytes) -> bool:
        return head.startswith((_HEAD, _HEAD_CRLF))

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType

        booster = _load(source)
        features = int(booster.num_feature())
        objective, classes = _objective(source)
        started = time.monotonic()
        try:
            model = onnxmltools.convert_lightgbm(
                booster,
                name="lightgbm",
                initial_types=[(INPUT_NAME, FloatTensorType([None, features]))],
                zipmap=False,
            )
        except Exception as error:  # the tool's own exceptions are plain RuntimeError/ValueError/NotImplementedError
            raise InvalidInput(
                f"onnxmltools could not convert this LightGBM model (objective {objective or 'unknown'}): "
                f"{tool_reason(error)}. Conch converts models trained with LightGBM's binary, multiclass and "
                "regression objectives; train with one of them, or convert the model to ONNX yourself and upload "
                "the .onnx file.",
                field="file",
            ) from None
        redeclared = declare_batch_axis(model)
        seconds = time.monotonic() - started
        target.write_bytes(model.SerializeToString())
        kind = f"a classifier ({classes} classes)" if _is_classifier(objective) else "a regressor"
        return Conversion(
            tool=package_version("onnxmltools"),
            source=package_version("lightgbm"),
            opset=onnx_opsets(model),
            notes=(
                f"objective {objective or 'unknown'}: served as {kind}",
                f"input: one FP32 tensor {INPUT_NAME!r} [-1, {features}], column j is the model's feature j "
                f"({_feature_names(booster)})",
                *redeclared,
            ),
            seconds=seconds,
        )

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        booster = _load(source)
        objective, classes = _objective(source)
        rows = np.asarray(inputs[INPUT_NAME], dtype=np.float32)
        return arrange_predictions(booster.predict(rows), classifier=_is_classifier(objective), classes=classes)


def _load(source: Path) -> Any:
    import lightgbm

    try:
        return lightgbm.Booster(model_file=str(source))
    except Exception as error:  # lightgbm.basic.LightGBMError
        raise InvalidInput(
            f"LightGBM cannot read this file as a model: {tool_reason(error)}. Upload the text file that "
            "Booster.save_model writes, unchanged.",
            field="file",
        ) from None


def _objective(source: Path) -> tuple[str, int]:
    """The `objective=` and `num_class=` lines of the model's header ("" and 1 when absent)."""
    objective, classes = "", 1
    with source.open("r", encoding="utf-8", errors="replace") as handle:
        for _, line in zip(range(_HEADER_LINES), handle, strict=False):
            if line.startswith("Tree="):
                break
            if line.startswith("objective="):
                objective = line.split("=", 1)[1].strip()
            elif line.startswith("num_class="):
                classes = int(line.split("=", 1)[1].strip() or 1)
    return objective, max(classes, 2) if _is_classifier(objective) else classes


def _is_classifier(objective: str) -> bool:
    return objective.startswith(("binary", "multiclass"))


def _feature_names(booster: Any) -> str:
    names = list(booster.feature_name())
    shown = ", ".join(names[:5]) + (f", … {names[-1]}" if len(names) > 5 else "")
    return f"names: {shown}"
