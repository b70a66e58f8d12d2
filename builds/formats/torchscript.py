"""TorchScript models (`torch.jit.save` of a scripted or traced module: `.pt`, `.pth`, `.jit`), served as uploaded
by Triton's `pytorch` backend (`model.pt`).

A TorchScript file is a zip of one folder holding the module's code (`code/__torch__/…`), its pickled structure
(`data.pkl`, whose first global is a `__torch__` class), `constants.pkl` and the tensors (`data/0`, `data/1`…).
A `torch.save` checkpoint is a zip of the same shape without code: a state_dict or a pickled Python module, which
no server can run without the Python class that made it; it is told apart by its first bytes and refused.

TorchScript records the names of `forward`'s arguments but not their datatypes or shapes, so the inputs come from
the `input_spec` build option (`builds.model_config.parse_input_spec`), else from the user's sample inputs (their
dtype and shape, axis 0 dynamic). The outputs are learned by running the model in the sandbox twice, with other
sizes on every dynamic axis: an axis whose size changed is -1, and an axis 0 that followed the inputs' batch size
is the batch axis `N`. Names follow the pytorch backend's conventions (pytorch_backend `NamingConvention`): inputs by
`forward`'s argument names (FORWARD_ARGUMENT), outputs `OUTPUT__<index>` in the order `forward` returns them
(NAMED_INDEX). A `forward` argument that is not a tensor (an `int`, a list) is refused naming it. Sandbox child only
for `inspect_source` and `run_source`: torch is imported in the calls.
"""

from __future__ import annotations

import re
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from builds.formats._trees import tool_reason
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from builds.formats.torch_export import first_zip_member
from conch.errors import InvalidInput
from tritonserving.config import datatype_of_numpy, numpy_of_datatype

__all__ = ["TorchScriptFormat", "output_name"]

#: The paths inside a TorchScript zip's folder its first member may have (torch/csrc/jit/serialization/export.cpp).
_FIRST_MEMBER = re.compile(r"[^/]+/(data/\d+|code/|constants\.pkl|extra/|data\.pkl)")
#: What a TorchScript `data.pkl` begins with: pickle protocol 2, then the GLOBAL of its module's `__torch__` class.
_SCRIPT_PICKLE = b"\x80\x02c__torch__\n"
_INPUT_INDEX = re.compile(r"^INPUT__(\d+)$")
#: Triton datatype <- torch dtype name, for the dtypes a served tensor may have.
_TRITON_OF_TORCH = {
    "torch.bool": "BOOL",
    "torch.uint8": "UINT8",
    "torch.int8": "INT8",
    "torch.int16": "INT16",
    "torch.int32": "INT32",
    "torch.int64": "INT64",
    "torch.float16": "FP16",
    "torch.float32": "FP32",
    "torch.float64": "FP64",
}
#: The symbolic name of the batch axis: axis 0 of every input and output, following the request's batch size.
BATCH_AXIS_NAME = "N"
#: Sizes the two trial runs give every dynamic axis (axis 0 first, then the others): outputs' axes that change
#: between them are dynamic.
_TRIAL_SIZES = ((2, 3), (3, 5))


def output_name(index: int) -> str:
    """The configuration's name of `forward`'s output `index`: "OUTPUT__0" (pytorch backend, NAMED_INDEX)."""
    return f"OUTPUT__{index}"


def _local_header_data(head: bytes) -> bytes:
    """The first bytes of a zip's first member's data (stored uncompressed, as torch writes members), from `head`."""
    if len(head) < 30:
        return b""
    start = 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")
    return head[start:]


def _is_checkpoint(head: bytes) -> bool:
    """Whether `head` opens a `torch.save` zip: its first member `<folder>/data.pkl` holds no TorchScript module."""
    member = first_zip_member(head)
    if not member.endswith("/data.pkl") or member.count("/") != 1:
        return False
    data = _local_header_data(head)
    return len(data) >= len(_SCRIPT_PICKLE) and not data.startswith(_SCRIPT_PICKLE)


class TorchScriptFormat(ModelFormat):
    """A TorchScript module, served as uploaded by the `pytorch` backend; its inputs from `input_spec` or samples."""

    key: ClassVar[str] = "torchscript"
    title: ClassVar[str] = "TorchScript model"
    suffixes: ClassVar[tuple[str, ...]] = (".pt", ".pth", ".jit")
    served_as: ClassVar[str] = "pytorch"
    model_filename: ClassVar[str] = "model.pt"
    hint_options: ClassVar[tuple[str, ...]] = ("input_spec",)
    upload_hint: ClassVar[str] = (
        "the file torch.jit.script(model).save(path) or torch.jit.trace(model, example).save(path) writes; give its "
        "inputs' datatypes and shapes as input_spec (features=FP32:-1,5) or with sample inputs"
    )

    def matches_head(self, head: bytes) -> bool:
        return bool(_FIRST_MEMBER.match(first_zip_member(head))) and not _is_checkpoint(head)

    def explain_head(self, head: bytes) -> str:
        if not _is_checkpoint(head):
            return ""
        return (
            "This is a PyTorch checkpoint written by torch.save (a state_dict or a pickled Python module): weights "
            "without the model's code, which no server can run without the Python class that made it. Save the "
            "model as TorchScript (torch.jit.script(model).save('model.pt'), or torch.jit.trace(model, "
            "example_input).save('model.pt')) or as an exported program (torch.export.save(torch.export.export("
            "model, (example_input,)), 'model.pt2')), and upload that file."
        )

    def local_name(self, head: bytes) -> str:
        return self.model_filename

    def inspect_source(
        self, source: Path, specs: Mapping[str, tuple[str, Sequence[int]]], *, from_samples: bool
    ) -> tuple[dict[str, Any], Conversion]:
        """Sandbox child only: the served model's signature (`builds.inspection.ModelSignature.to_dict()`) and a
        report (the tool is the pytorch backend, nothing converted; its notes say what was read and assumed).

        `specs`: input name -> (Triton datatype, full shape; -1 = any size), from `input_spec` or, with
        `from_samples`, the user's sample inputs. Raises InvalidInput: field "file" for a file that is not
        TorchScript, a `forward` argument that is not a tensor, or a model that fails its trial runs; field
        "input_spec" for inputs missing from `specs` or names `forward` does not take.
        """
        import torch

        started = time.monotonic()
        module = _load(source)
        arguments = _tensor_arguments(module)
        where = "the sample inputs" if from_samples else "input_spec"
        # Triton's pytorch backend also names inputs by forward's argument index (INPUT__0, INPUT__1...): such names
        # are that argument's, and the served model keeps them.
        indexed = {int(m.group(1)): name for name in specs if (m := _INPUT_INDEX.match(name))}
        served_names = dict(zip(arguments, arguments, strict=True))
        if specs and len(indexed) == len(specs) and not set(specs) & set(arguments):
            beyond = [name for index, name in indexed.items() if index >= len(arguments)]
            if beyond:
                raise InvalidInput(
                    f"{where} names {beyond[0]!r}, but the model's forward takes {len(arguments)} argument(s) "
                    f"({', '.join(arguments)}).",
                    field="input_spec",
                )
            served_names = {arguments[index]: name for index, name in indexed.items()}
            specs = {arguments[index]: specs[name] for index, name in indexed.items()}
        unknown = sorted(set(specs) - set(arguments))
        if unknown:
            raise InvalidInput(
                f"{where} names {unknown[0]!r}, which is no argument of the model's forward ({', '.join(arguments)}). "
                "Name the inputs as forward's arguments.",
                field="input_spec",
            )
        missing = [name for name in arguments if name not in specs]
        if missing:
            example = "; ".join(f"{name}=FP32:-1,5" for name in arguments)
            given = (
                f"{where} {'leave' if from_samples else 'leaves'} out"
                if specs
                else "neither input_spec nor sample inputs give one for"
            )
            raise InvalidInput(
                f"TorchScript does not record its inputs' datatypes and shapes, and {given} forward's argument"
                f"{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}. Give every input as "
                f"input_spec (for example {example}: datatype, then the full shape with -1 for an axis of any size), "
                "or upload sample inputs (an .npz with one array per argument) and rebuild.",
                field="input_spec",
            )
        runs = [_trial(module, arguments, specs, sizes) for sizes in _TRIAL_SIZES]
        batch = all(specs[name][1][:1] == (-1,) for name in arguments)
        outputs = []
        for index, (first, second) in enumerate(zip(runs[0], runs[1], strict=True)):
            if first.ndim != second.ndim:
                raise InvalidInput(
                    f"forward's output {index} came back with rank {first.ndim}, then rank {second.ndim}, on inputs of "
                    "other sizes; a served output keeps its rank. Export a forward whose outputs keep their rank.",
                    field="file",
                )
            dims = tuple(-1 if a != b else int(a) for a, b in zip(first.shape, second.shape, strict=True))
            follows = (
                batch
                and first.ndim > 0
                and first.shape[0] == _TRIAL_SIZES[0][0]
                and second.shape[0] == _TRIAL_SIZES[1][0]
            )
            names = [BATCH_AXIS_NAME if (axis == 0 and follows) else None for axis in range(len(dims))]
            outputs.append(
                {"name": output_name(index), "datatype": _triton(first.dtype), "dims": list(dims), "dim_names": names}
            )
        inputs = []
        for name in arguments:
            datatype, dims = specs[name]
            names = [BATCH_AXIS_NAME if (axis == 0 and batch) else None for axis in range(len(dims))]
            inputs.append(
                {"name": served_names.get(name, name), "datatype": datatype, "dims": list(dims), "dim_names": names}
            )
        signature = {
            "inputs": inputs,
            "outputs": outputs,
            "ir_version": 0,
            "opset": None,
            "opset_imports": [],
            "producer_name": "pytorch",
            "producer_version": torch.__version__,
        }
        notes = [
            f"inputs named as forward's arguments: {', '.join(arguments)}; datatypes and shapes from {where}",
            f"outputs named {', '.join(o['name'] for o in outputs)} in the order forward returns them; their "
            "datatypes and shapes observed on two trial runs with other sizes on every dynamic axis",
        ]
        report = Conversion(
            tool="none: served as uploaded by Triton's pytorch backend",
            source=f"torch {torch.__version__} (TorchScript)",
            notes=tuple(notes),
            seconds=time.monotonic() - started,
        )
        return signature, report

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        import torch

        module = _load(source)
        arguments = _tensor_arguments(module)
        # Inputs named by forward's argument index (INPUT__0...), as a repository's config.pbtxt may name them.
        indexed = {int(m.group(1)): name for name in inputs if (m := _INPUT_INDEX.match(name))}
        names = [indexed.get(index, name) for index, name in enumerate(arguments)]
        with torch.inference_mode():
            results = module(*(torch.from_numpy(np.ascontiguousarray(inputs[name])) for name in names))
        return {output_name(index): value.numpy() for index, value in enumerate(_flatten(results))}


def _load(source: Path) -> Any:
    import torch

    with zipfile.ZipFile(source) as archive:
        names = archive.namelist()
    if not any("/code/" in name for name in names):
        raise InvalidInput(
            "This PyTorch file holds no TorchScript code (no code/ folder): it is a torch.save checkpoint. Save the "
            "model with torch.jit.script(model).save('model.pt') (or torch.jit.trace), or export it with "
            "torch.export.save, and upload that file.",
            field="file",
        )
    try:
        return torch.jit.load(str(source), map_location="cpu").eval()
    except Exception as error:  # torch raises RuntimeError for an archive it cannot read
        raise InvalidInput(
            f"torch.jit.load cannot load this TorchScript model: {tool_reason(error)}. Upload the file "
            "torch.jit.save wrote, unchanged, saved by a torch no newer than the one Triton's pytorch backend runs.",
            field="file",
        ) from None


def _tensor_arguments(module: Any) -> list[str]:
    """forward's argument names (self left out). Raises InvalidInput (field "file") naming an argument that is not
    a tensor, with how to export the model instead."""
    arguments = list(module.forward.schema.arguments)[1:]
    names = []
    for argument in arguments:
        kind = str(argument.type)
        if kind != "Tensor":
            raise InvalidInput(
                f"forward's argument {argument.name!r} is {_a(kind)}, not a tensor, and a served model takes only "
                "tensors (Triton sends every input as a tensor). Export the model with that argument fixed: wrap it "
                f"in a module whose forward takes only tensors and passes {argument.name} as a constant, then save "
                "that with torch.jit.script(...).save, or export it with torch.export (the constant is then part "
                "of the program) and upload the .pt2.",
                field="file",
            )
        names.append(argument.name)
    if not names:
        raise InvalidInput(
            "The model's forward takes no tensor, so a request has nothing to send it. Export a forward that takes "
            "its inputs as tensors.",
            field="file",
        )
    return names


def _a(kind: str) -> str:
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _trial(
    module: Any, arguments: list[str], specs: Mapping[str, tuple[str, Sequence[int]]], sizes: tuple[int, int]
) -> list[np.ndarray]:
    """The outputs of one run on generated inputs whose dynamic axes are `sizes` (axis 0, other axes)."""
    import torch

    generator = np.random.default_rng(0)
    tensors = []
    shown = []
    for name in arguments:
        datatype, dims = specs[name]
        shape = [(sizes[0] if axis == 0 else sizes[1]) if d == -1 else d for axis, d in enumerate(dims)]
        dtype = numpy_of_datatype(datatype)
        if np.issubdtype(dtype, np.floating):
            array = generator.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            array = generator.integers(0, 2, shape).astype(np.bool_)
        else:
            array = generator.integers(0, 2, shape).astype(dtype)
        tensors.append(torch.from_numpy(array))
        shown.append(f"{name} {datatype} {shape}")
    try:
        with torch.inference_mode():
            results = module(*tensors)
    except Exception as error:  # the TorchScript interpreter raises RuntimeError with the model's own message
        raise InvalidInput(
            f"The model failed on inputs {', '.join(shown)}: {tool_reason(error)}. Check the datatypes and shapes "
            "input_spec (or the sample inputs) gives: they must be what forward expects.",
            field="input_spec",
        ) from None
    return [value.numpy() for value in _flatten(results)]


def _flatten(results: Any) -> list[Any]:
    """forward's result as a list of tensors: a tensor, or a tuple or list of tensors. Raises InvalidInput
    (field "file") for anything else (a dict, a number, nested containers)."""
    import torch

    values = list(results) if isinstance(results, tuple | list) else [results]
    for index, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise InvalidInput(
                f"forward returns {type(results).__name__}, whose item {index} is {type(value).__name__}, not a "
                "tensor. Triton's pytorch backend serves a forward that returns a tensor or a tuple of tensors: "
                "return those and save the model again.",
                field="file",
            )
        if str(value.dtype) not in _TRITON_OF_TORCH:
            raise InvalidInput(
                f"forward's output {index} is a {value.dtype} tensor, which Triton has no datatype for. Return "
                "it as float32 (or another of bool, uint8, int8-int64, float16, float64) and save the model again.",
                field="file",
            )
    return [value.detach().cpu().contiguous() for value in values]


def _triton(dtype: np.dtype) -> str:
    try:
        return datatype_of_numpy(dtype)
    except ValueError:
        raise InvalidInput(
            f"An output has the numpy dtype {dtype}, which Triton has no datatype for.", field="file"
        ) from None
