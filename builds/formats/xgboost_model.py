"""XGBoost models in XGBoost's own formats (`Booster.save_model` to `.json` or `.ubj`), converted to ONNX with
onnxmltools.

Both are data that XGBoost parses (no code runs, unlike a pickle). The converted model has one FP32 input `input`
[-1, features]; classifiers (objectives `binary:*`, `multi:*`) give `label` and `probabilities`, other objectives
give `variable` (`builds.formats._trees`).
"""

from __future__ import annotations

import json
import re
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

__all__ = ["XGBoostFormat"]

# JSON: an object whose first key is "learner" (what XGBoost writes) or "version" (key order of a re-serialized one).
_JSON_HEAD = re.compile(rb'\A\s*\{\s*"(learner|version)"\s*:')
# UBJSON (Universal Binary JSON): "{", a length-typed key ('i'/'U' 1 byte, 'I' 2, 'l' 4, 'L' 8 bytes) and its text.
_UBJ_HEAD = re.compile(rb"\A\{(?:[iU].|I.{2}|l.{4}|L.{8})(learner|version)", re.DOTALL)


class XGBoostFormat(ModelFormat):
    """An XGBoost model (JSON or UBJSON), converted with onnxmltools and served by the `onnxruntime` backend."""

    key: ClassVar[str] = "xgboost"
    title: ClassVar[str] = "XGBoost model (JSON or UBJSON)"
    suffixes: ClassVar[tuple[str, ...]] = (".json", ".ubj")
    converter: ClassVar[str] = "onnxmltools"
    upload_hint: ClassVar[str] = "the .json or .ubj file xgboost.Booster.save_model (or XGBModel.save_model) writes"

    def matches_head(self, head: bytes) -> bool:
        return bool(_JSON_HEAD.match(head) or _UBJ_HEAD.match(head))

    def local_name(self, head: bytes) -> str:
        # XGBoost tells JSON from UBJSON by the file's ending.
        return "source.json" if _JSON_HEAD.match(head) else "source.ubj"

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType

        booster, names = _load(source)
        features = int(booster.num_features())
        learner = _learner(booster)
        objective, classes = _objective(learner)
        kind_of_booster = str(learner.get("gradient_booster", {}).get("name", ""))
        if kind_of_booster not in ("gbtree", "dart"):
            raise InvalidInput(
                f"This XGBoost model's booster is {kind_of_booster or 'unknown'} (a linear model, not trees), which "
                "onnxmltools cannot convert: Conch converts tree boosters (gbtree, dart). Train with "
                "booster='gbtree', or convert the model to ONNX yourself and upload the .onnx file.",
                field="file",
            )
        started = time.monotonic()
        try:
            model = onnxmltools.convert_xgboost(
                booster, name="xgboost", initial_types=[(INPUT_NAME, FloatTensorType([None, features]))]
            )
        except Exception as error:  # the tool's own exceptions are plain RuntimeError/ValueError/NotImplementedError
            raise InvalidInput(
                f"onnxmltools could not convert this XGBoost model (objective {objective or 'unknown'}): "
                f"{tool_reason(error)}. Conch converts tree models (booster gbtree) trained with XGBoost's "
                "binary:logistic, multi:softprob, multi:softmax and reg:* objectives; train with one of them, or "
                "convert the model to ONNX yourself and upload the .onnx file.",
                field="file",
            ) from None
        redeclared = declare_batch_axis(model)
        seconds = time.monotonic() - started
        target.write_bytes(model.SerializeToString())
        kind = f"a classifier ({classes} classes)" if _is_classifier(objective) else "a regressor"
        if objective == "multi:softmax":
            kind += "; its output 'probabilities' holds the raw class scores (margins), not probabilities"
        names = names or [f"f{index}" for index in range(features)]
        shown = ", ".join(names[:5]) + (f", … {names[-1]}" if len(names) > 5 else "")
        return Conversion(
            tool=package_version("onnxmltools"),
            source=package_version("xgboost-cpu") if _installed("xgboost-cpu") else package_version("xgboost"),
            opset=onnx_opsets(model),
            notes=(
                f"objective {objective or 'unknown'}: served as {kind}",
                f"input: one FP32 tensor {INPUT_NAME!r} [-1, {features}], column j is the model's feature j "
                f"(names: {shown})",
                *redeclared,
            ),
            seconds=seconds,
        )

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        import xgboost

        booster, _ = _load(source)
        objective, classes = _objective(_learner(booster))
        rows = xgboost.DMatrix(np.asarray(inputs[INPUT_NAME], dtype=np.float32))
        if objective == "multi:softmax":
            # predict gives the class; onnxmltools' `probabilities` holds the raw scores (margins) for this objective
            predicted = booster.predict(rows, output_margin=True).reshape(rows.num_row(), -1)
        else:
            predicted = booster.predict(rows)
        return arrange_predictions(predicted, classifier=_is_classifier(objective), classes=classes)


def _load(source: Path) -> tuple[Any, list[str]]:
    """The booster in `source`, with its feature names cleared, and those names ([] when it has none).

    A model trained on a named table (a pandas DataFrame) keeps its column names, and then XGBoost refuses rows
    without them and onnxmltools refuses names other than f0, f1, ...; the served model takes features by
    position (column j is feature j), so both are given the model without its names.
    """
    import xgboost

    booster = xgboost.Booster()
    try:
        booster.load_model(str(source))
    except Exception as error:  # xgboost.core.XGBoostError
        raise InvalidInput(
            f"XGBoost cannot read this file as a model: {tool_reason(error)}. Upload the .json or .ubj file that "
            "Booster.save_model writes, unchanged.",
            field="file",
        ) from None
    names = list(booster.feature_names or [])
    booster.feature_names = None
    booster.feature_types = None
    return booster, names


def _learner(booster: Any) -> dict[str, Any]:
    """The "learner" section of the booster's saved configuration (objective, booster, class count)."""
    return dict(json.loads(booster.save_config())["learner"])


def _objective(learner: dict[str, Any]) -> tuple[str, int]:
    """The objective's name and the class count (at least 2 for a classifier), from `_learner`'s section."""
    objective = str(learner.get("objective", {}).get("name", ""))
    classes = int(float(learner.get("learner_model_param", {}).get("num_class", "0") or 0))
    return objective, max(classes, 2) if _is_classifier(objective) else max(classes, 1)


def _is_classifier(objective: str) -> bool:
    return objective.startswith(("binary:", "multi:"))


def _installed(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True
