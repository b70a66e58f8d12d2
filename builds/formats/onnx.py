"""ONNX models: a binary protobuf `ModelProto`, served as uploaded by Triton's `onnxruntime` backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from builds.formats.base import NO_HINTS, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["OnnxFormat", "starts_like_onnx"]

# Highest IR version accepted in the first field when sniffing; onnx 1.23 writes 11, leave headroom.
_MAX_SNIFF_IR_VERSION = 30


def starts_like_onnx(head: bytes) -> bool:
    """True when the file opens with ModelProto field 1 (ir_version, varint) holding a plausible version.

    Protobuf serializers write fields in field-number order, and every exporter sets ir_version, so a real
    ONNX file starts with tag byte 0x08 followed by a small varint. Two bytes are enough.
    """
    return len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= _MAX_SNIFF_IR_VERSION


class OnnxFormat(ModelFormat):
    """An ONNX model file (`.onnx`), served as uploaded (the build may redeclare its outputs' shapes).

    It may come in an archive with its external data files (ONNX "external data": tensors stored in files beside
    the model, named relative to it, which models over 2 GB must use): the repository then holds `model.onnx` and
    those files, at the same paths relative to it.
    """

    key: ClassVar[str] = "onnx"
    title: ClassVar[str] = "ONNX model"
    suffixes: ClassVar[tuple[str, ...]] = (".onnx",)
    upload_hint: ClassVar[str] = "the .onnx file (torch.onnx.export, tf2onnx, skl2onnx and others write one)"

    def matches_head(self, head: bytes) -> bool:
        return starts_like_onnx(head)

    def local_name(self, head: bytes) -> str:
        return "model.onnx"

    def find_in_folder(self, folder: Path, files: Sequence[str]) -> Path | None:
        models = [name for name in files if name.lower().endswith(".onnx")]
        if len(models) > 1:
            shown = ", ".join(models[:5]) + (f" and {len(models) - 5} more" if len(models) > 5 else "")
            raise InvalidInput(
                f"The archive holds {len(models)} ONNX models ({shown}); Conch builds one model per upload. Upload "
                "each model separately: its .onnx file alone, or a zip of it with its external data files.",
                field="file",
            )
        return folder / models[0] if models else None

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        """Sandbox child only: run `inputs` through the ONNX model with onnxruntime on the CPU (the reference a
        TensorRT plan of it is compared with); outputs keyed by the graph's output names."""
        import onnxruntime as ort

        session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        wanted = {item.name for item in session.get_inputs()}
        results = session.run(names, {name: np.asarray(array) for name, array in inputs.items() if name in wanted})
        return {name: np.asarray(value) for name, value in zip(names, results, strict=True)}
