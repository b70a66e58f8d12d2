"""PyTorch 2 exported programs (`torch.export.save`, `.pt2`), converted to ONNX with `torch.onnx.export`.

A `.pt2` file is a zip of one folder (`<name>/`) holding `models/model.json` (the graph, as JSON), `data/weights/…`,
`data/constants/…`, `archive_format` and `archive_version` (torch.export's serialization); unlike TorchScript it
carries no code. The converted model's inputs are named as the program's user inputs (the exported `forward`'s
arguments), its outputs as the keys of a returned dict, else `output_0`, `output_1`, ... in the order `forward`
returns them. The dynamic axes the program was exported with (`torch.export.Dim`) stay symbolic; an axis 0 that
every input and output shares is named `N` (the batch axis). The source outputs come from the program itself
(`ExportedProgram.module()`). Sandbox child only for `convert` and `run_source`: torch is imported in the calls.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from builds.formats._trees import onnx_opsets, package_version, tool_reason
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["OPSET", "TorchExportFormat", "first_zip_member"]

#: The ONNX opset torch.onnx.export's dynamo exporter converts to: 18 is its lowest, and every onnxruntime Triton
#: has shipped since 23.04 (onnxruntime 1.14) runs it.
OPSET = 18
#: The symbolic name given to an axis 0 every input and output shares (one row per sample).
BATCH_AXIS_NAME = "N"
#: The paths inside a `.pt2` zip's folder that torch.export.save writes (torch/export/pt2_archive/constants.py).
_PT2_MEMBERS = (
    "data/weights/",
    "data/constants/",
    "data/sample_inputs/",
    "models/",
    "archive_format",
    "archive_version",
)


def first_zip_member(head: bytes) -> str:
    """The name of a zip's first member from its local file header (`head`: the file's first bytes), or "" when
    `head` is no zip or the name does not fit in it (PKWARE APPNOTE 4.3.7: the name's length at bytes 26-27, the
    name from byte 30)."""
    if not head.startswith(b"PK\x03\x04") or len(head) < 30:
        return ""
    length = int.from_bytes(head[26:28], "little")
    name = head[30 : 30 + length]
    return name.decode("utf-8", "replace") if len(name) == length else ""


class TorchExportFormat(ModelFormat):
    """A PyTorch 2 `ExportedProgram` (`torch.export.save`), converted with `torch.onnx.export` and served by the
    `onnxruntime` backend."""

    key: ClassVar[str] = "torch_export"
    title: ClassVar[str] = "PyTorch ExportedProgram"
    suffixes: ClassVar[tuple[str, ...]] = (".pt2",)
    converter: ClassVar[str] = "torch.onnx"
    upload_hint: ClassVar[str] = "the .pt2 file torch.export.save(torch.export.export(model, args), path) writes"

    def matches_head(self, head: bytes) -> bool:
        _, _, inside = first_zip_member(head).partition("/")
        return inside.startswith(_PT2_MEMBERS)

    def local_name(self, head: bytes) -> str:
        return "model.pt2"

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        import logging

        import torch

        logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" notices
        program = _load(source)
        inputs, outputs = _names(program)
        started = time.monotonic()
        try:
            exported = torch.onnx.export(
                program,
                (),
                dynamo=True,
                opset_version=OPSET,
                input_names=inputs,
                output_names=outputs,
                optimize=True,
                verbose=False,
            )
            model = exported.model_proto
        except Exception as error:  # the exporter raises its own errors (an op without an ONNX counterpart...)
            raise InvalidInput(
                f"torch.onnx.export could not convert this exported program: {tool_reason(error)}. If it names an "
                "operator, the model uses one ONNX has no counterpart for: replace it with standard operations and "
                "export again, or convert it yourself (torch.onnx.export(model, args, dynamo=True) with a custom "
                "translation) and upload the .onnx file.",
                field="file",
            ) from None
        notes = [f"inputs named as forward's arguments: {', '.join(inputs)}"]
        notes.append(f"outputs named {', '.join(outputs)}" + ("" if _dict_keys(program) else " (forward's order)"))
        if _name_batch_axis(model):
            notes.append(f"axis 0, dynamic and shared by every input and output, is the batch axis {BATCH_AXIS_NAME}")
        target.write_bytes(model.SerializeToString())
        return Conversion(
            tool=f"torch.onnx (dynamo exporter, {package_version('torch')})",
            source=f"torch {torch.__version__} (torch.export)",
            opset=onnx_opsets(model),
            notes=tuple(notes),
            seconds=time.monotonic() - started,
        )

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        import torch

        program = _load(source)
        names, outputs = _names(program)
        with torch.no_grad():
            results = program.module()(*(torch.from_numpy(np.ascontiguousarray(inputs[name])) for name in names))
        keys = _dict_keys(program)
        flat = [results[key] for key in keys] if keys else torch.utils._pytree.tree_leaves(results)
        return {name: value.detach().cpu().numpy() for name, value in zip(outputs, flat, strict=True)}


def _load(source: Path) -> Any:
    import torch

    try:
        return torch.export.load(str(source))
    except Exception as error:  # torch raises RuntimeError/KeyError/ValueError for an archive it cannot read
        raise InvalidInput(
            f"torch.export cannot load this file: {tool_reason(error)}. Upload the .pt2 file "
            "torch.export.save(torch.export.export(model, args), 'model.pt2') writes, unchanged, with a torch no "
            "newer than the one Conch converts with.",
            field="file",
        ) from None


def _names(program: Any) -> tuple[list[str], list[str]]:
    """The converted model's input names (the user inputs, forward's arguments) and output names.

    Raises InvalidInput (field "file") for an input that is not a tensor (torch.export keeps a symbolic int as an
    input) or a program with no tensor input or output.
    """
    import torch

    signature = program.graph_signature
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    inputs = list(signature.user_inputs)
    for name in inputs:
        value = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            raise InvalidInput(
                f"forward's argument {name!r} is not a tensor ({type(value).__name__}), and a served model takes "
                "only tensors. Export the model with that argument fixed (a constant in forward, or a tensor "
                "input), then save it again with torch.export.save.",
                field="file",
            )
    keys = _dict_keys(program)
    count = len(signature.user_outputs)
    outputs = list(keys) if keys else [f"output_{index}" for index in range(count)]
    if not inputs or not outputs:
        raise InvalidInput(
            "This exported program has no tensor inputs or no tensor outputs, so there is nothing to serve. Export "
            "a forward that takes and returns tensors.",
            field="file",
        )
    return inputs, outputs


def _dict_keys(program: Any) -> list[str]:
    """The keys of the dict forward returns (string keys, each a tensor), else []."""
    spec = program.call_spec.out_spec
    context = getattr(spec, "context", None)
    if spec is None or getattr(spec, "type", None) is not dict or not isinstance(context, list | tuple):
        return []
    keys = [str(key) for key in context]
    children = getattr(spec, "children_specs", [])
    return keys if len(keys) == len(program.graph_signature.user_outputs) == len(children) else []


def _name_batch_axis(model: Any) -> bool:
    """Name axis 0 `N` on every input and output of an `onnx.ModelProto` when all of them share one symbolic
    axis 0 (the exporter names it "s0", "s17"...); return whether it did."""
    values = [*model.graph.input, *model.graph.output]
    firsts = [value.type.tensor_type.shape.dim[:1] for value in values]
    if not values or any(not first or not first[0].dim_param for first in firsts):
        return False
    symbols = {first[0].dim_param for first in firsts}
    if len(symbols) != 1:
        return False
    (symbol,) = symbols
    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == symbol:
                dim.dim_param = BATCH_AXIS_NAME
    return True
