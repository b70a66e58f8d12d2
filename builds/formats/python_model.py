"""Python models: an archive of `model.py` (Triton's `TritonPythonModel`), an optional `requirements.txt`, an optional
`config.pbtxt` and the files the code reads, served by Triton's Python backend in an execution environment Conch
builds from the requirements (`builds.environments`).

The layout (Triton Python backend README, "Usage" and "Creating Custom Execution Environments"): `model.py` at the
archive's top, or in its one top-level folder, beside everything it opens (`os.path.dirname(__file__)` is the
version folder Triton loads it from). Its inputs and outputs come from `config.pbtxt` when the archive holds one
(its `input`, `output` and `max_batch_size`; Triton's text format, parsed with `model_config.proto`), else from
the build options `input_spec` and `output_spec` (name=DATATYPE:dims, the batch axis included as -1). Never both:
one source, no silent precedence.

The code is never run outside Triton: `model.py` is read with `ast` (a parse, no import) to check that it defines
the class Triton instantiates, `TritonPythonModel`, with an `execute` method; everything else is for the verify
Triton, which runs it locked down, and the deployments.

Pure: no Django; protobuf, ast and paths only.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from builds.formats.base import ModelFormat
from conch.errors import InvalidInput
from tritonserving.config import ModelConfig, config_from_pbtxt, datatype_name

__all__ = [
    "CLASS_NAME",
    "ENTRY_FILENAME",
    "check_model_py",
    "EXECUTION_ENV_PARAMETER",
    "REQUIREMENTS_FILENAME",
    "PythonModel",
    "PythonModelFormat",
    "environment_filename",
    "read_python_model",
    "read_python_model_requirements",
    "read_repository_python_model",
    "signature_from_config",
]

#: The file Triton's Python backend loads from `<model>/<version>/` (its `default_model_filename`).
ENTRY_FILENAME = "model.py"
#: The class the Python backend instantiates from it (README "Usage": `class TritonPythonModel`).
CLASS_NAME = "TritonPythonModel"
#: The optional requirements file of a Python model upload: pip's requirement lines, one per line.
REQUIREMENTS_FILENAME = "requirements.txt"
#: The model configuration parameter naming the execution environment's archive (Python backend README,
#: "Creating Custom Execution Environments").
EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"
_CONFIG_FILENAME = "config.pbtxt"
#: Largest model.py and requirements.txt read, in bytes.
_MAX_SOURCE_BYTES = 4 * 1024 * 1024
#: Files of the upload that are Conch's inputs, not the model's: they do not go into the version folder.
_NOT_SHIPPED = (_CONFIG_FILENAME,)


def environment_filename(key: str) -> str:
    """The name of an execution environment's archive beside config.pbtxt ("python_env-<16 hex digits>.tar.gz"),
    from its key (`builds.environments.environment_key`)."""
    return f"python_env-{key[:16]}.tar.gz"


def _error(detail: str, field: str = "file") -> InvalidInput:
    return InvalidInput(f"Python model: {detail}", field=field)


@dataclass(frozen=True)
class PythonModel:
    """A Python model upload as `read_python_model` found and checked it.

    Attributes:
        folder: the folder holding model.py in the unpacked archive.
        files: every regular file the version folder gets ("/"-separated, relative to `folder`; model.py and what
            it reads, requirements.txt included; config.pbtxt left out: Conch writes the model's own).
        requirements: the text of requirements.txt ("" without one).
        config: the archive's config.pbtxt parsed, or None without one.
        methods: the methods `TritonPythonModel` defines ("initialize", "execute", "finalize", ...).
    """

    folder: Path
    files: tuple[str, ...]
    requirements: str
    config: ModelConfig | None
    methods: tuple[str, ...]

    def signature(
        self, *, input_spec: Mapping[str, Any] | None, output_spec: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The model's signature (`builds.inspection.ModelSignature.to_dict()`): from config.pbtxt's `input` and
        `output` (the batch axis added as -1 when max_batch_size > 0), else from `input_spec` and `output_spec`
        (`BuildOptions`: name -> (DATATYPE, full dims)).

        Raises InvalidInput naming input_spec/output_spec when they are given beside a config.pbtxt, when neither
        source gives the tensors, or when a name is both an input and an output; naming config.pbtxt's field for an
        input or output without a name, datatype or dims.
        """
        if self.config is not None:
            given = [field for field, spec in (("input_spec", input_spec), ("output_spec", output_spec)) if spec]
            if given:
                raise _error(
                    f"{given[0]} is given and the archive holds a config.pbtxt that configures the inputs and "
                    "outputs too. Keep one: leave the build options empty, or remove config.pbtxt from the archive.",
                    field=given[0],
                )
            return signature_from_config(self.config)
        missing = [field for field, spec in (("input_spec", input_spec), ("output_spec", output_spec)) if not spec]
        if missing:
            raise _error(
                "its inputs and outputs cannot be read from model.py (the code runs only inside Triton), so the upload "
                f"must declare them; {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing. Put a "
                "config.pbtxt with its input and output beside model.py, or give input_spec and output_spec (each "
                "tensor as name=DATATYPE:dims with the batch axis as -1, for example input_spec=image=UINT8:-1,-1,3 "
                "output_spec=label=INT64:-1,1): on this version with POST /api/v1/versions/{id}/rebuild or the build "
                "page, without uploading again.",
                field=missing[0],
            )
        assert input_spec is not None and output_spec is not None
        clash = sorted(set(input_spec) & set(output_spec))
        if clash:
            raise _error(
                f"input_spec and output_spec both name {clash[0]!r}; a tensor is an input or an output.",
                field="output_spec",
            )
        return _signature(
            [(name, datatype, tuple(dims)) for name, (datatype, dims) in input_spec.items()],
            [(name, datatype, tuple(dims)) for name, (datatype, dims) in output_spec.items()],
        )

    @property
    def configured_max_batch_size(self) -> int | None:
        """config.pbtxt's max_batch_size, or None without a config.pbtxt."""
        return None if self.config is None else int(self.config.max_batch_size)


def signature_from_config(config: ModelConfig, *, what: str = "Python model") -> dict[str, Any]:
    """The signature (`builds.inspection.ModelSignature.to_dict()`) a model configuration gives: its `input` and
    `output` tensors, the batch axis added as -1 when max_batch_size > 0. For models whose files Conch cannot read
    (a Python model, a model of a custom backend). Raises InvalidInput (field "file") naming config.pbtxt's field
    for a tensor without a name, datatype or dims, with a reshape, or no input or output at all; the message starts
    with `what`."""

    def _error(detail: str) -> InvalidInput:
        return InvalidInput(f"{what}: {detail}", field="file")

    batch = (-1,) if config.max_batch_size > 0 else ()
    tensors: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {"input": [], "output": []}
    for kind, entries in (("input", config.input), ("output", config.output)):
        if not entries:
            raise _error(f"config.pbtxt has no {kind}; list every {kind} tensor with its name, data_type and dims.")
        for position, tensor in enumerate(entries):
            where = f"config.pbtxt {kind}[{position}]"
            if not tensor.name:
                raise _error(f"{where} has no name.")
            if not tensor.data_type:
                raise _error(f"{where} ({tensor.name!r}) has no data_type; give one such as TYPE_FP32.")
            if tensor.HasField("reshape"):
                raise _error(
                    f"{where} ({tensor.name!r}) sets reshape, which Conch cannot check without reading the model; "
                    "remove it."
                )
            dims = tuple(int(d) for d in tensor.dims)
            if not dims and not batch:
                raise _error(
                    f"{where} ({tensor.name!r}) has no dims; give its shape (dims: [1] for a scalar), the batch "
                    "axis left out when max_batch_size > 0."
                )
            if any(d < -1 or d == 0 for d in dims):
                raise _error(f"{where} ({tensor.name!r}) has dims {list(dims)}: each is a size > 0, or -1 for any.")
            tensors[kind].append((tensor.name, datatype_name(tensor.data_type), batch + dims))
    return _signature(tensors["input"], tensors["output"])


def _signature(
    inputs: Sequence[tuple[str, str, tuple[int, ...]]], outputs: Sequence[tuple[str, str, tuple[int, ...]]]
) -> dict[str, Any]:
    def tensors(entries: Sequence[tuple[str, str, tuple[int, ...]]]) -> list[dict[str, Any]]:
        return [
            {"name": name, "datatype": datatype, "dims": list(dims), "dim_names": [None] * len(dims)}
            for name, datatype, dims in entries
        ]

    names = [name for name, _, _ in (*inputs, *outputs)]
    for name in names:
        if names.count(name) > 1:
            raise _error(f"the tensor name {name!r} is used twice; each input and output needs its own name.")
    return {
        "inputs": tensors(inputs),
        "outputs": tensors(outputs),
        "ir_version": 0,
        "opset": None,
        "opset_imports": [],
        "producer_name": "python",
        "producer_version": "",
    }


def _entry_folder(files: Sequence[str]) -> str | None:
    """The folder ("" = the top) holding model.py at the archive's top or in its one top-level folder, else None."""
    paths = [PurePosixPath(name) for name in files]
    if PurePosixPath(ENTRY_FILENAME) in paths:
        return ""
    tops = {path.parts[0] for path in paths if len(path.parts) > 1}
    loose = [path for path in paths if len(path.parts) == 1]
    if len(tops) == 1 and not loose:
        top = next(iter(tops))
        if PurePosixPath(top, ENTRY_FILENAME) in paths:
            return top
    return None


def check_model_py(source: bytes) -> tuple[str, ...]:
    """The methods `TritonPythonModel` defines in model.py's `source`, read with `ast` (nothing is run).
    Raises InvalidInput (field "file") for a syntax error, a missing class or a missing execute()."""
    try:
        tree = ast.parse(source, filename=ENTRY_FILENAME)
    except SyntaxError as error:
        raise _error(
            f"model.py line {error.lineno}: {error.msg}. Fix the syntax (it must run on the Python of the Triton "
            "it is served by) and upload again."
        ) from None
    except ValueError as error:  # null bytes
        raise _error(f"model.py cannot be parsed as Python source ({error}).") from None
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == CLASS_NAME]
    if not classes:
        raise _error(
            f"model.py defines no class {CLASS_NAME} at its top level. Triton's Python backend instantiates that "
            'class and calls its execute(requests) method; define it (see the Python backend README, "Usage").'
        )
    methods = tuple(node.name for node in classes[-1].body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
    if "execute" not in methods:
        raise _error(
            f"class {CLASS_NAME} in model.py has no execute method. Triton calls execute(self, requests) with a "
            "list of requests and expects one response per request; define it."
        )
    return methods


def read_repository_python_model(version_folder: Path, config: ModelConfig, model_folder: Path) -> PythonModel:
    """A `python` model of an uploaded Triton model repository as a Python model: the files of its version folder
    (`version_folder`: model.py and what it reads), its repository `config`, and a requirements.txt from the version
    folder or, failing that, the model's folder (`model_folder`).

    Raises InvalidInput (field "file") as `read_python_model` does, and when `config` sets EXECUTION_ENV_PATH: an
    environment packed elsewhere (conda-pack) cannot be checked; Conch builds its own from requirements.txt.
    """
    if EXECUTION_ENV_PARAMETER in config.parameters:
        shipped = config.parameters[EXECUTION_ENV_PARAMETER].string_value
        raise _error(
            f"config.pbtxt sets {EXECUTION_ENV_PARAMETER} ({shipped!r}), an environment packed elsewhere. Conch "
            "builds the environment itself from a requirements.txt beside model.py (wheels only, pinned): remove "
            "the parameter and list the packages model.py imports there."
        )
    model = read_python_model(version_folder)
    requirements = model.requirements
    if not requirements and (model_folder / REQUIREMENTS_FILENAME).is_file():
        requirements = read_python_model_requirements(model_folder / REQUIREMENTS_FILENAME)
    return dataclasses.replace(model, config=config, requirements=requirements)


def read_python_model_requirements(path: Path) -> str:
    """The text of a requirements.txt. Raises InvalidInput (field "requirements") past 4 MiB or for non-UTF-8."""
    if path.stat().st_size > _MAX_SOURCE_BYTES:
        raise _error("requirements.txt is larger than 4 MiB.", field="requirements")
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError:
        raise _error("requirements.txt is not UTF-8 text.", field="requirements") from None


def read_python_model(folder: Path) -> PythonModel:
    """Read and check the Python model whose model.py lies in `folder` (`PythonModelFormat.find_in_folder`'s
    answer: an unpacked archive, already checked by `builds.archives`, regular files and folders only).

    Raises InvalidInput (field "file") naming model.py's problem (syntax, class, execute), an unreadable
    requirements.txt, or config.pbtxt's error (Triton's text format, `model_config.proto`) and a backend other
    than python in it.
    """
    entry = folder / ENTRY_FILENAME
    if entry.stat().st_size > _MAX_SOURCE_BYTES:
        raise _error(f"model.py is larger than {_MAX_SOURCE_BYTES // (1024 * 1024)} MiB; keep data in files beside it.")
    methods = check_model_py(entry.read_bytes())
    shipped = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if relative not in _NOT_SHIPPED:
            shipped.append(relative)
    requirements_file = folder / REQUIREMENTS_FILENAME
    requirements = read_python_model_requirements(requirements_file) if requirements_file.is_file() else ""
    config = None
    config_file = folder / _CONFIG_FILENAME
    if config_file.is_file():
        try:
            config = config_from_pbtxt(config_file.read_text("utf-8"))
        except UnicodeDecodeError:
            raise _error("config.pbtxt is not UTF-8 text.") from None
        except InvalidInput as error:
            raise _error(f"config.pbtxt: {error.detail}") from None
        if config.backend and config.backend != "python":
            raise _error(
                f"config.pbtxt names backend {config.backend!r}, but the archive is a Python model (model.py); "
                'set backend: "python" or leave it out.'
            )
        if config.platform:
            raise _error(f"config.pbtxt sets platform {config.platform!r}; a Python model has none, remove it.")
    return PythonModel(folder=folder, files=tuple(shipped), requirements=requirements, config=config, methods=methods)


class PythonModelFormat(ModelFormat):
    """A Python model (Triton's Python backend): model.py and its files, in a zip or tar."""

    key: ClassVar[str] = "python"
    title: ClassVar[str] = "Python model"
    # Only ever found in an unpacked archive (`find_in_folder`): no file of its own.
    suffixes: ClassVar[tuple[str, ...]] = ()
    served_as: ClassVar[str] = "python"
    model_filename: ClassVar[str] = ENTRY_FILENAME
    hint_options: ClassVar[tuple[str, ...]] = ("input_spec", "output_spec")
    upload_hint: ClassVar[str] = (
        "a zip or tar of model.py (class TritonPythonModel), the files it reads, an optional requirements.txt "
        "(installed from wheels into an environment Conch builds) and an optional config.pbtxt with its inputs and "
        "outputs (else give input_spec and output_spec)"
    )

    def matches_head(self, head: bytes) -> bool:
        return False

    def find_in_folder(self, folder: Path, files: Sequence[str]) -> Path | None:
        """The folder holding model.py at the archive's top (or in its one top-level folder), else None. A Triton
        model repository's `<model>/<version>/model.py` is deeper and is not claimed here."""
        top = _entry_folder(files)
        if top is None:
            return None
        return folder / top if top else folder
