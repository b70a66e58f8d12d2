"""scikit-learn models saved as Python pickles (`joblib.dump`, `pickle.dump`: `.joblib`, `.pkl`, `.pickle`),
converted to ONNX with skl2onnx.

Loading a pickle runs code from the file. So a build loads one only for a team a platform admin allowed
(`tenancy.models.Team.allow_pickled_models`, checked by the build before the sandbox starts), and only in the
sandbox child, after its network was cut (`builds.conversion` calls `builds.sandbox.cut_network` first for a format
that `runs_code`) and under its CPU and memory limits.
The converted model has one FP32 input `input` [-1, features]; a classifier gives `label` (its classes: INT64, or
BYTES for text classes) and `probabilities` (FP32 [-1, classes], no ZipMap), a regressor `variable` (FP32 [-1, 1]).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from builds.formats._trees import INPUT_NAME, declare_batch_axis, onnx_opsets, package_version, tool_reason
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["SklearnPickleFormat"]

# Pickle protocols 2 to 5 open with PROTO (0x80) and the protocol number (pickletools); joblib writes the same.
_PROTOCOLS = range(2, 6)


class SklearnPickleFormat(ModelFormat):
    """A scikit-learn estimator or pipeline in a pickle, converted with skl2onnx (only for allowed teams)."""

    key: ClassVar[str] = "sklearn"
    title: ClassVar[str] = "scikit-learn model (pickle)"
    suffixes: ClassVar[tuple[str, ...]] = (".joblib", ".pkl", ".pickle")
    converter: ClassVar[str] = "skl2onnx"
    runs_code: ClassVar[bool] = True
    upload_hint: ClassVar[str] = (
        "the file joblib.dump(model, path) or pickle.dump writes (uncompressed); a platform admin must allow "
        "pickled models for the team"
    )

    def matches_head(self, head: bytes) -> bool:
        return len(head) >= 2 and head[0] == 0x80 and head[1] in _PROTOCOLS

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        from skl2onnx import to_onnx
        from skl2onnx.common.data_types import FloatTensorType
        from sklearn.base import is_classifier

        model = _load(source)
        features = _features(model)
        classifier = is_classifier(model)
        started = time.monotonic()
        try:
            converted = to_onnx(
                model,
                initial_types=[(INPUT_NAME, FloatTensorType([None, features]))],
                options={"zipmap": False} if classifier else None,
            )
        except Exception as error:  # skl2onnx raises RuntimeError/NotImplementedError/MissingShapeCalculator…
            raise InvalidInput(
                f"skl2onnx could not convert this scikit-learn model ({type(model).__name__}): {tool_reason(error)}. "
                "skl2onnx converts scikit-learn's own estimators and pipelines of them; a custom step needs a "
                "converter of its own. Convert the model to ONNX yourself (skl2onnx.to_onnx with your converters) "
                "and upload the .onnx file.",
                field="file",
            ) from None
        redeclared = declare_batch_axis(converted)
        seconds = time.monotonic() - started
        target.write_bytes(converted.SerializeToString())
        kind = f"a classifier ({len(getattr(model, 'classes_', ()))} classes)" if classifier else "a regressor"
        return Conversion(
            tool=package_version("skl2onnx"),
            source=package_version("scikit-learn"),
            opset=onnx_opsets(converted),
            notes=(
                f"{type(model).__name__}: served as {kind}",
                f"input: one FP32 tensor {INPUT_NAME!r} [-1, {features}], column j is the model's feature j",
                *redeclared,
            ),
            seconds=seconds,
        )

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        from sklearn.base import is_classifier

        model = _load(source)
        rows = np.asarray(inputs[INPUT_NAME], dtype=np.float32)
        if not is_classifier(model):
            predicted = np.asarray(model.predict(rows))
            return {"variable": predicted.reshape(predicted.shape[0], -1).astype(np.float32)}
        labels = np.asarray(model.predict(rows))
        outputs = {"label": labels.astype(str) if labels.dtype.kind in "OSU" else labels.astype(np.int64)}
        if hasattr(model, "predict_proba"):
            outputs["probabilities"] = np.asarray(model.predict_proba(rows), dtype=np.float32)
        return outputs


def _load(source: Path) -> Any:
    """Unpickle the model: in the sandbox child only, after `builds.conversion` cut its network (`runs_code`)."""
    import joblib

    try:
        # joblib reads its own files (arrays stored beside the pickle stream) and plain pickles alike.
        model = joblib.load(source)  # the sandbox, no network: see the module docstring
    except Exception as error:
        raise InvalidInput(
            f"This pickle could not be loaded: {tool_reason(error)}. Save the model with joblib.dump(model, path) "
            "(no compression) in an environment with the scikit-learn version Conch runs, and upload that file.",
            field="file",
        ) from None
    if not hasattr(model, "predict") or not type(model).__module__.startswith(("sklearn.", "sklearn")):
        raise InvalidInput(
            f"This pickle holds a {type(model).__module__}.{type(model).__name__}, not a scikit-learn estimator or "
            "pipeline. Pickle the fitted scikit-learn model itself.",
            field="file",
        )
    return model


def _features(model: Any) -> int:
    features = getattr(model, "n_features_in_", None)
    if features is None:
        raise InvalidInput(
            f"This {type(model).__name__} does not say how many features it takes (no n_features_in_): it may not "
            "be fitted. Fit it, then save it again.",
            field="file",
        )
    return int(features)
