"""The interface every model format implements, and what a conversion reports.

A format is one module of `builds.formats` holding one `ModelFormat` subclass. What it must say and do:
- which files it is, from their name (`suffixes`) and first bytes (`matches_head`): both, never the name alone;
- how Triton serves it (`served_as`, a Triton backend) and, when Triton cannot serve the file as uploaded, how it
  is converted (`converter`: the tool) into an ONNX model that the `onnxruntime` backend serves;
- whether it arrives as a folder (`find_in_folder`: its entry in an unpacked archive), and whether the file is a
  container of other formats (`container`: an archive);
- `convert` and `run_source`, which run in the build's sandbox child (`builds.conversion`), never in the worker:
  they import the source framework themselves, so importing a format module costs nothing.

Pure: no Django, no framework imported at module level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

__all__ = ["NO_HINTS", "Conversion", "ConversionHints", "ModelFormat"]


@dataclass(frozen=True)
class Conversion:
    """What a conversion did, for the build log and the version's page.

    Attributes:
        tool: the converter and its version ("onnxmltools 1.16.0").
        source: the source framework and its version ("lightgbm 4.7.0").
        opset: the ONNX opsets of the converted model, domain -> version ({"": 15, "ai.onnx.ml": 1}).
        notes: what was assumed or renamed, one sentence each ("input: one FP32 tensor 'input' [-1, 5]").
        seconds: wall-clock seconds the conversion took (the sandbox's start excluded).
    """

    tool: str
    source: str
    opset: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON data: the attributes, `opset` as a dict, `notes` as a list."""
        return {
            "tool": self.tool,
            "source": self.source,
            "opset": dict(self.opset),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Conversion:
        """Inverse of `to_dict`."""
        return cls(
            tool=str(data["tool"]),
            source=str(data["source"]),
            opset={str(k): int(v) for k, v in dict(data.get("opset") or {}).items()},
            notes=tuple(str(n) for n in data.get("notes") or ()),
            seconds=float(data.get("seconds") or 0.0),
        )

    def describe(self) -> list[str]:
        """Build-log lines: the tool and framework, the opsets, the time, then each note."""
        opsets = ", ".join(f"{domain or 'ai.onnx'} {version}" for domain, version in sorted(self.opset.items()))
        lines = [f"converted with {self.tool} from {self.source} in {self.seconds:.2f} s (opsets: {opsets or '-'})"]
        lines += [f"assumed: {note}" for note in self.notes]
        return lines


@dataclass(frozen=True)
class ConversionHints:
    """What the user said about a model's interface that its file cannot tell (build options), for the formats
    that take it (`ModelFormat.hint_options`).

    Attributes:
        inputs: node names to take as the inputs, in place of those discovered (`graph_inputs`); () = discovered.
        outputs: node names to take as the outputs (`graph_outputs`); () = discovered.
    """

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, list[str]]:
        """JSON data: {"inputs": [...], "outputs": [...]}."""
        return {"inputs": list(self.inputs), "outputs": list(self.outputs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ConversionHints:
        """Inverse of `to_dict`; None gives no hints."""
        data = data or {}
        return cls(inputs=tuple(data.get("inputs") or ()), outputs=tuple(data.get("outputs") or ()))

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)


#: No hints: every format's interface as its file tells it.
NO_HINTS = ConversionHints()


class ModelFormat:
    """One model format Conch accepts. Subclasses set the class attributes and override what their format needs.

    Class attributes:
        key: stable identifier ("onnx", "lightgbm"), what the API and the build record name.
        title: what a person calls the format ("LightGBM model (text)").
        suffixes: file name endings (lower case, with the dot) that may hold it.
        served_as: the Triton backend that serves the packaged model ("onnxruntime"; "pytorch" for TorchScript).
        model_filename: the model file's name in `<model>/<version>/` (the backend's default: "model.onnx",
            "model.pt").
        converter: the conversion tool, "" when the file is served as uploaded.
        hint_options: the build options naming the model's interface that this format takes (`ConversionHints`:
            "graph_inputs", "graph_outputs"); a build of another format given one fails naming it.
        container: whether the file holds other files (an archive) that the build unpacks and tells the format of.
        runs_code: whether loading the file runs code from it (a pickle): only for teams a platform admin allowed,
            and only in the sandbox with its network cut.
        upload_hint: what to upload, for the formats list ("the file Booster.save_model writes").
    """

    key: ClassVar[str]
    title: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    served_as: ClassVar[str] = "onnxruntime"
    model_filename: ClassVar[str] = "model.onnx"
    converter: ClassVar[str] = ""
    container: ClassVar[bool] = False
    hint_options: ClassVar[tuple[str, ...]] = ()
    runs_code: ClassVar[bool] = False
    upload_hint: ClassVar[str] = ""

    @property
    def converted(self) -> bool:
        """Whether the build converts the file (to ONNX) before packaging it."""
        return bool(self.converter)

    def matches_head(self, head: bytes) -> bool:
        """Whether a file's first bytes (up to `builds.formats.HEAD_BYTES`) are this format's. Pure and cheap."""
        raise NotImplementedError

    def explain_head(self, head: bytes) -> str:
        """What to do about a file named like this format whose first bytes are a well-known relative of it that
        Conch cannot build alone (a SavedModel's saved_model.pb under a GraphDef's `.pb`), or "" for none."""
        return ""

    def local_name(self, head: bytes) -> str:
        """The file name the build gives its local copy of an upload that begins with `head`: some frameworks read
        a file by its ending. Default: "source" and the format's first ending."""
        return "source" + self.suffixes[0]

    def find_in_folder(self, folder: Path, files: Sequence[str]) -> Path | None:
        """The entry of this format in an unpacked archive, or None when the folder does not hold this format.

        `folder` is where the archive was unpacked, `files` the regular files' names in it (relative, "/"-separated).
        A format that arrives as several files (an ONNX model with external data) names its main file; one that is
        a folder names the folder. Raises `conch.errors.InvalidInput` (field "file") for a folder that holds the
        format ambiguously (two ONNX models), saying what to upload instead. Default: None (single-file formats;
        a lone file in an archive is told by `builds.formats.find_model_in_folder`).
        """
        return None

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        """Sandbox child only: convert the file `source` into an ONNX model written to `target`, with the
        interface `hints` the user gave (only for a format whose `hint_options` names them).

        Raises `conch.errors.InvalidInput` (field "file") with the tool's reason and what to do when the model
        cannot be converted. Formats served as uploaded never have this called.
        """
        raise NotImplementedError(f"{self.key} models are served as uploaded")

    #: Whether the upload declares the model's interface in build options because the file cannot tell it without
    #: hardware Conch's builds lack (a TensorRT plan: `declared_signature`, `prepare`).
    declares_interface: ClassVar[bool] = False

    @property
    def verifiable_here(self) -> bool:
        """Whether the verify step can load the model on Conch's CPU-only verify Triton (not a TensorRT plan)."""
        return True

    def declared_signature(self, options: Any) -> tuple[dict[str, Any], list[str]]:
        """For a format that `declares_interface`: the signature (`ModelSignature.to_dict()`) the build options
        declare, and notes for the build log. Raises InvalidInput naming a missing or contradictory option."""
        raise NotImplementedError(f"{self.key} models tell their interface themselves")

    def prepare(self, source: Path) -> str:
        """For a format that `declares_interface`: make the local copy `source` the file Triton loads, in place;
        return a note for the build log ("" for none). Raises InvalidInput (field "file")."""
        return ""

    @property
    def serves_onnx(self) -> bool:
        """Whether the packaged model is an ONNX file (uploaded or converted), inspected as one."""
        return self.served_as == "onnxruntime"

    def inspect_source(
        self, source: Path, specs: Mapping[str, tuple[str, Sequence[int]]], *, from_samples: bool
    ) -> tuple[dict[str, Any], Conversion]:
        """Sandbox child only, for a format served as uploaded by a backend other than onnxruntime: the model's
        signature (`ModelSignature.to_dict()`) and a report, the inputs' datatypes and shapes taken from `specs`
        (name -> (Triton datatype, full shape)) where the file does not record them. Raises InvalidInput."""
        raise NotImplementedError(f"{self.key} models are inspected as ONNX")

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        """Sandbox child only (`hints` as for `convert`): run `inputs` (the converted model's input names -> full
        arrays, batch axis included) through the source framework; return arrays keyed by the converted model's
        output names, in the shapes the converted model gives them."""
        raise NotImplementedError(f"{self.key} models are served as uploaded")

    def describe(self) -> dict[str, Any]:
        """The format as `GET /api/v1/formats/` lists it."""
        return {
            "key": self.key,
            "title": self.title,
            "suffixes": list(self.suffixes),
            "served_as": self.served_as,
            "conversion": self.converter or None,
            "container": self.container,
            "runs_code": self.runs_code,
            "upload": self.upload_hint,
        }
