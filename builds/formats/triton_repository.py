"""Triton model repositories: a zip or tar of `<model>/config.pbtxt` and `<model>/<version>/<model file>`, served as
its configuration says, after every model in it was checked.

The layout is Triton's ("Model Repository" -> "Repository Layout"): one folder per model, named as the model,
holding an optional `config.pbtxt` and one numeric folder per version with the model file in it (named
`default_model_filename`, else the backend's default: `model.onnx`, `model.pt`, `model.plan`, `model.py`...).
Subfolders whose names are not numbers are not versions (Triton skips them). An archive of one model's folder
(`config.pbtxt` and `1/model.onnx` at its top) is a repository of that one model.

Every model's `config.pbtxt` is parsed with Triton's protobuf schema (`model_config.proto`) and checked against its
folder before any Triton sees it (`read_repository`): the name against the folder, platform and backend, the
version policy against the version folders, each served version's model file, ensemble steps against the models
in the repository. The model a build serves is then checked against its model file (`configure_imported`):
inputs and outputs, datatypes, dims, `max_batch_size` and the batching settings, with errors naming the model, the
tensor and the field. Conch builds `onnxruntime`, `pytorch` (TorchScript) and `python` models (with an execution
environment built from a requirements.txt beside model.py, `builds.formats.python_model`) from a repository today;
other backends are recognised and refused saying what to upload instead.

Pure: no Django; protobuf and paths only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar

from builds.formats.base import ModelFormat
from conch.errors import InvalidInput
from tritonserving.config import ModelConfig, datatype_name, datatype_value

if TYPE_CHECKING:
    from builds.inspection import ModelSignature, TensorSpec

__all__ = [
    "CONFIG_FILENAME",
    "CONFIGURATION_OPTIONS",
    "DEFAULT_MODEL_FILENAMES",
    "PLATFORM_BACKENDS",
    "SERVED_BACKENDS",
    "name_outputs_as_configured",
    "pytorch_input_specs",
    "RepositoryModel",
    "TritonRepositoryFormat",
    "check_served",
    "configure_imported",
    "pick_model",
    "read_repository",
    "refuse_configuration_options",
]

#: A model's configuration file in its folder (Triton "Model Configuration").
CONFIG_FILENAME = "config.pbtxt"
#: Largest config.pbtxt read, in bytes: real ones are a few kilobytes; the protobuf text parser holds it whole.
MAX_CONFIG_BYTES = 1024 * 1024
#: Triton's platforms -> the backend that serves each ("Model Configuration" -> "Platform and Backend"; an ensemble
#: is run by Triton's ensemble scheduler, no backend).
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "ensemble": "ensemble",
}
#: The model file a version folder holds when `default_model_filename` is unset, per backend (each backend's
#: README in the triton-inference-server organisation; TensorFlow's depends on the platform).
DEFAULT_MODEL_FILENAMES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "python": "model.py",
    "openvino": "model.xml",
    "dali": "model.dali",
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
}
#: The backend a version folder's file shows, for a model whose configuration names none (Triton's auto-complete
#: tells the backend from the file the same way).
_BACKEND_BY_FILE = {
    "model.onnx": "onnxruntime",
    "model.pt": "pytorch",
    "model.plan": "tensorrt",
    "model.py": "python",
    "model.savedmodel": "tensorflow",
    "model.graphdef": "tensorflow",
}
#: What to upload instead of a repository model of a backend Conch does not serve (yet).
_NOT_SERVED = {
    "tensorrt": "a TensorRT plan, which runs only on the GPU and TensorRT version it was built for. Upload the ONNX "
    "model it was built from",
    "tensorflow": "a TensorFlow model; Triton's TensorFlow backend is deprecated since 25.03 and gone after it. "
    "Upload the SavedModel folder as a zip (or the frozen .pb file): Conch converts it to ONNX",
    "ensemble": "an ensemble, which Conch does not serve yet. Upload each of its steps that is an ONNX model as a "
    "model of its own",
}
_VERSION_FOLDER = re.compile(r"\d{1,18}")
_Fail = Callable[[str], InvalidInput]


@dataclass(frozen=True)
class RepositoryModel:
    """One model of an uploaded Triton model repository, as `read_repository` found and checked it.

    Attributes:
        name: the model's name: its folder's (or, for an archive of one model's folder, the name it is built as).
        folder: the model's folder in the unpacked archive.
        config: its configuration as `config.pbtxt` gives it (an empty `ModelConfig` when it has none).
        has_config: whether the folder holds a config.pbtxt (Triton auto-completes one that is missing).
        backend: the backend that serves it ("onnxruntime", "pytorch", ...; "ensemble" for an ensemble).
        versions: the version numbers its version policy serves, ascending (Triton "Model Configuration" ->
            "Version Policy"; the default serves the highest one).
        skipped: what in the folder Triton does not load, one phrase each ("folder 'docs' (not a number)", "version 1
            (not served by the version policy)").
    """

    name: str
    folder: Path
    config: ModelConfig
    has_config: bool
    backend: str
    versions: tuple[int, ...]
    skipped: tuple[str, ...] = ()

    @property
    def model_filename(self) -> str:
        """The model file's name in each version folder ("model.onnx"); "" for an ensemble, which has none, and
        for a backend whose files Conch does not know (a team's own: its version folder is served as it is)."""
        if self.backend == "ensemble":
            return ""
        if self.config.default_model_filename:
            return str(self.config.default_model_filename)
        if self.backend == "tensorflow":
            return DEFAULT_MODEL_FILENAMES[str(self.config.platform) or "tensorflow_savedmodel"]
        return DEFAULT_MODEL_FILENAMES.get(self.backend, "")

    def model_file(self, version: int) -> Path:
        """The model file of `version` (a file, or a folder for a SavedModel)."""
        return self.folder / str(version) / self.model_filename

    def describe(self) -> str:
        """One build-log line: name, backend, served versions, and whether config.pbtxt is the folder's own."""
        versions = ", ".join(str(v) for v in self.versions)
        origin = "config.pbtxt" if self.has_config else "no config.pbtxt (auto-completed from the model file)"
        return f"model {self.name!r}: backend {self.backend}, version(s) {versions}, {origin}"


def _error(model: str, detail: str) -> InvalidInput:
    return InvalidInput(f"Triton model repository, model {model!r}: {detail}", field="file")


class TritonRepositoryFormat(ModelFormat):
    """A Triton model repository in a zip or tar; each model served as its config.pbtxt configures it."""

    key: ClassVar[str] = "triton_repository"
    title: ClassVar[str] = "Triton model repository"
    # Only ever found in an unpacked archive (`find_in_folder`): no file of its own.
    suffixes: ClassVar[tuple[str, ...]] = ()
    upload_hint: ClassVar[str] = (
        "a zip or tar of a Triton model repository (<model>/config.pbtxt, <model>/<version>/model.onnx) or of one "
        "model's folder; every config.pbtxt is checked against its model files, and onnxruntime models are served "
        "as configured"
    )

    def matches_head(self, head: bytes) -> bool:
        return False

    def find_in_folder(self, folder: Path, files: Sequence[str]) -> Path | None:
        """The repository's root: the folder holding the model folders (the archive's top, or its one top-level
        folder), or the model's folder for an archive of one model's folder. None without a config.pbtxt.

        Raises InvalidInput (field "file") when config.pbtxt files sit at different depths, naming two of them.
        """
        configs = [PurePosixPath(name) for name in files if PurePosixPath(name).name == CONFIG_FILENAME]
        if not configs:
            return None
        roots = sorted({str(path.parent.parent) if path.parent != PurePosixPath(".") else "" for path in configs})
        if "" in roots and len(configs) == 1:
            return folder
        roots = sorted({str(path.parent.parent) for path in configs})
        if len(roots) > 1 or any(len(path.parts) > 3 for path in configs):
            shown = ", ".join(str(path) for path in configs[:4])
            raise InvalidInput(
                f"The archive holds config.pbtxt files at different places ({shown}). A Triton model repository has "
                "one folder per model at its top, each with its config.pbtxt and numbered version folders "
                "(<model>/config.pbtxt, <model>/1/model.onnx); pack it that way.",
                field="file",
            )
        return folder if roots[0] == "." else folder / roots[0]


def read_repository(root: Path, *, lone_name: str) -> tuple[RepositoryModel, ...]:
    """Read and check every model of the Triton model repository at `root` (an unpacked archive, already checked by
    `builds.archives`: regular files and folders only); models sorted by name.

    `root` is `TritonRepositoryFormat.find_in_folder`'s answer. When it holds config.pbtxt itself it is one model's
    folder, named `lone_name`. Otherwise each folder at its top that holds a config.pbtxt or a numbered version
    folder is a model; files at the top are not models (Triton ignores them too).

    Checked per model (Triton "Model Repository", "Model Configuration"): config.pbtxt is at most MAX_CONFIG_BYTES
    and parses with `model_config.proto`; its `name`, when set, is the folder's; `platform` and `backend` name a
    known pair, or the version folders' files tell the backend; the version policy serves at least one version and
    every version a `specific` policy names has its folder; each served version holds the model file; an ensemble's
    steps name models of the repository.

    Raises:
        InvalidInput: field "file", naming the model and what to fix.
    """
    if (root / CONFIG_FILENAME).is_file():
        return (_read_model(root, lone_name, lone=True),)
    folders = sorted(path for path in root.iterdir() if path.is_dir())
    models = [
        _read_model(path, path.name)
        for path in folders
        if (path / CONFIG_FILENAME).is_file() or any(_VERSION_FOLDER.fullmatch(p.name) for p in path.iterdir())
    ]
    if not models:
        raise InvalidInput(
            "The archive holds no Triton model: no folder at its top has a config.pbtxt or a numbered version folder "
            "(<model>/config.pbtxt, <model>/1/model.onnx).",
            field="file",
        )
    names = {model.name for model in models}
    for model in models:
        if model.backend == "ensemble":
            for step in model.config.ensemble_scheduling.step:
                if step.model_name not in names:
                    raise _error(
                        model.name,
                        f"ensemble_scheduling step names the model {step.model_name!r}, which the repository does not "
                        f"hold (it holds {', '.join(sorted(names))}). Add that model's folder or fix the step.",
                    )
    return tuple(models)


def _read_model(folder: Path, name: str, *, lone: bool = False) -> RepositoryModel:
    config_path = folder / CONFIG_FILENAME
    has_config = config_path.is_file()
    config = ModelConfig()
    if has_config:
        config = _parse_config(config_path, name)
        if config.name and config.name != name and not lone:
            raise _error(
                name,
                f"config.pbtxt sets name {config.name!r}, but the model's folder is {name!r}; Triton requires them to "
                "agree. Rename the folder or the name.",
            )
    numbered: dict[int, str] = {}
    skipped: list[str] = []
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            continue
        if _VERSION_FOLDER.fullmatch(entry.name):
            numbered[int(entry.name)] = entry.name
        else:
            skipped.append(f"folder {entry.name!r} (not a version number)")
    backend = _backend(config, name, folder, sorted(numbered))
    versions = _served_versions(config, name, sorted(numbered))
    skipped += [f"version {v} (not served by the version policy)" for v in sorted(numbered) if v not in versions]
    model = RepositoryModel(
        name=name,
        folder=folder,
        config=config,
        has_config=has_config,
        backend=backend,
        versions=tuple(versions),
        skipped=tuple(skipped),
    )
    if model.model_filename:
        for version in versions:
            if not model.model_file(version).exists():
                raise _error(
                    name,
                    f"version {version} has no {model.model_filename} ({name}/{version}/ holds "
                    f"{_listing(folder / numbered[version])}). Put the model file there"
                    + (", or set default_model_filename to its name." if has_config else "."),
                )
    elif backend == "ensemble" and not config.ensemble_scheduling.step:
        raise _error(name, "the ensemble has no ensemble_scheduling steps. Give its steps in config.pbtxt.")
    return model


def _parse_config(path: Path, name: str) -> ModelConfig:
    from google.protobuf import text_format

    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise _error(name, f"config.pbtxt is {size} bytes; a model configuration is at most {MAX_CONFIG_BYTES} bytes.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _error(name, "config.pbtxt is not UTF-8 text. Save it as protobuf text (config.pbtxt).") from None
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise _error(
            name,
            f"config.pbtxt is not a valid Triton model configuration: {str(error).rstrip('.')}. Fix that line (the "
            "field names are those of Triton's model_config.proto).",
        ) from None
    return config


def _backend(config: ModelConfig, name: str, folder: Path, versions: Sequence[int]) -> str:
    platform, backend = str(config.platform), str(config.backend)
    if platform:
        expected = PLATFORM_BACKENDS.get(platform)
        if expected is None:
            raise _error(
                name,
                f"platform {platform!r} is not one of Triton's ({', '.join(PLATFORM_BACKENDS)}); for other backends "
                "set backend instead.",
            )
        if backend and backend != expected:
            raise _error(name, f"platform {platform!r} is served by backend {expected!r}, but backend is {backend!r}.")
        return expected
    if backend:
        return backend
    found = sorted(
        {
            _BACKEND_BY_FILE[entry.name]
            for v in versions
            for entry in (folder / str(v)).iterdir()
            if entry.name in _BACKEND_BY_FILE
        }
    )
    if len(found) == 1:
        return found[0]
    raise _error(
        name,
        "config.pbtxt names no platform or backend and the version folders do not show one"
        + (f" (they hold files of {', '.join(found)})" if found else "")
        + '. Set backend (for example backend: "onnxruntime").',
    )


def _served_versions(config: ModelConfig, name: str, present: Sequence[int]) -> list[int]:
    if not present:
        raise _error(
            name,
            f"no version folder: Triton loads a model from its numbered folders ({name}/1/model.onnx). Put the model "
            "file in one.",
        )
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if which == "all":
        return list(present)
    if which == "specific":
        wanted = sorted({int(v) for v in policy.specific.versions})
        missing = [v for v in wanted if v not in present]
        if not wanted or missing:
            raise _error(
                name,
                f"version_policy specific names version(s) {', '.join(str(v) for v in missing or wanted)} but the "
                f"folder has version(s) {', '.join(str(v) for v in present)}. Name versions that are there.",
            )
        return wanted
    count = int(policy.latest.num_versions) if which == "latest" else 1
    if count < 1:
        raise _error(name, "version_policy latest num_versions must be at least 1.")
    return list(present[-count:])


def _listing(folder: Path) -> str:
    names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "") if names else "nothing"


def pick_model(models: Sequence[RepositoryModel], name: str) -> RepositoryModel:
    """The model of a repository that a build of Conch model `name` serves: the one named `name`, else the only one.

    Raises InvalidInput (field "file") for a repository of several models none of which is named `name`, naming them.
    """
    for model in models:
        if model.name == name:
            return model
    if len(models) == 1:
        return models[0]
    raise InvalidInput(
        f"The Triton model repository holds {len(models)} models ({', '.join(m.name for m in models)}) and none is "
        f"named {name!r}, the model this version belongs to. Upload it as a version of a model named like one of "
        "them, or upload an archive of one model's folder.",
        field="file",
    )


#: The build options that set what a repository model's config.pbtxt sets: refused for a repository.
CONFIGURATION_OPTIONS = (
    "max_batch_size",
    "max_queue_delay_microseconds",
    "preferred_batch_size",
    "instance_count",
    "output_dims",
)


def refuse_configuration_options(options: Mapping[str, Any]) -> None:
    """Raise InvalidInput naming the first of CONFIGURATION_OPTIONS that `options` (option name -> value, None or
    "" for unset) sets: a Triton model repository's config.pbtxt configures the model instead."""
    for option in CONFIGURATION_OPTIONS:
        if options.get(option) not in (None, ""):
            raise InvalidInput(
                f"{option} configures the model, but this upload is a Triton model repository whose config.pbtxt "
                "configures it. Set it in config.pbtxt, leave the option empty, and upload again.",
                field=option,
            )


#: Backends Conch serves a repository model with.
SERVED_BACKENDS = ("onnxruntime", "pytorch", "python")
_INDEXED_NAME = re.compile(r"^(.+)__(\d+)$")


def check_served(model: RepositoryModel) -> None:
    """Raise InvalidInput (field "file") when Conch cannot serve `model`'s backend, saying what to upload instead."""
    if model.backend in SERVED_BACKENDS:
        return
    reason = _NOT_SERVED.get(model.backend) or (
        f"served by the backend {model.backend!r}, which the Triton Conch runs does not have and the team has not "
        "registered (register the backend first: POST /api/v1/backends/ with its libtriton_"
        f"{model.backend}.so or model.py, then upload the repository again)"
    )
    raise _error(model.name, f"it is {reason}.")


def pytorch_input_specs(model: RepositoryModel) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The inputs of a `pytorch` repository model as its config.pbtxt gives them, in the form TorchScript's inspection
    takes (`input_spec`: name -> (Triton datatype, full shape with -1 for the batch axis when it batches)).

    TorchScript records no datatypes or shapes, so config.pbtxt must give every input (Triton's pytorch backend
    cannot auto-complete them either). Raises InvalidInput (field "file") naming the model when it gives none.
    """
    if not model.config.input:
        raise _error(
            model.name,
            "a TorchScript model records no datatypes or shapes of its inputs, and config.pbtxt configures none. "
            "Configure each input (name, data_type, dims) in config.pbtxt, as Triton's pytorch backend needs too.",
        )
    batching = model.config.max_batch_size > 0
    return {
        tensor.name: (
            datatype_name(tensor.data_type),
            (
                *((-1,) if batching else ()),
                *(int(d) for d in (tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)),
            ),
        )
        for tensor in model.config.input
    }


def name_outputs_as_configured(model: RepositoryModel, signature: ModelSignature) -> ModelSignature:
    """`signature` (a TorchScript model's, outputs OUTPUT__<i> in forward's order) with its outputs named as
    config.pbtxt names them: an output named `<name>__<i>` is forward's output i (Triton's pytorch backend naming
    convention), others are taken in order. Outputs config.pbtxt does not configure keep their names."""
    outputs = list(signature.outputs)
    renamed = {}
    for position, tensor in enumerate(model.config.output):
        match = _INDEXED_NAME.match(tensor.name)
        index = int(match.group(2)) if match else position
        if index < len(outputs):
            renamed[index] = tensor.name
    data = signature.to_dict()
    for index, new_name in renamed.items():
        data["outputs"][index]["name"] = new_name
    return type(signature).from_dict(data)


def configure_imported(
    model: RepositoryModel,
    *,
    name: str,
    signature: ModelSignature,
    model_filename: str,
    backend: str = "onnxruntime",
) -> tuple[ModelConfig, list[str]]:
    """The configuration Conch serves a repository model of `backend` ("onnxruntime", or "pytorch" with `signature`
    from TorchScript's inspection: `pytorch_input_specs`, `name_outputs_as_configured`) with, checked against its
    model file, and what it changed or assumed (build-log sentences).

    The configuration is the model's own, with what Conch manages replaced: `name` (the Conch model's), `backend`
    in place of `platform`, `default_model_filename` (`model_filename`), no `version_policy` (a Conch
    version is one Triton version), KIND_GPU instance groups made KIND_AUTO (where to run is a deployment's
    choice) and their `gpus` dropped. Missing inputs and outputs are taken from the file, as Triton's auto-complete
    does.

    Checked (Triton "Model Configuration"; onnxruntime backend `ValidateInputs`/`ValidateOutputs`):
    - each configured input and output is one of the file's, with its datatype (`data_type`);
    - every input of the file is configured (the backend refuses one it is not given);
    - dims (or `reshape`) give the file's rank with the batch axis left out when `max_batch_size` > 0; an input's
      axis the file fixes has that size; every dim is -1 or at least 0;
    - `max_batch_size` > 0 only where axis 0 of every configured tensor is dynamic in the file;
    - `dynamic_batching` only with `max_batch_size` > 0, its `preferred_batch_size` each 1..max_batch_size;
    - no `sequence_batching` or decoupled transaction policy (stateful or streaming models: not served yet), no
      warmup that reads input data files (Conch does not package them).

    Raises:
        InvalidInput: field "file", naming the model, the tensor and the field.
    """
    config = ModelConfig()
    config.CopyFrom(model.config)
    notes: list[str] = []
    where = model.name

    def fail(detail: str) -> InvalidInput:
        return _error(where, detail)

    if config.HasField("sequence_batching"):
        raise fail("sequence_batching configures a stateful model, which Conch does not serve yet.")
    if config.model_transaction_policy.decoupled:
        raise fail(f"model_transaction_policy decoupled is for streaming backends; {backend} models answer once.")
    for warmup in config.model_warmup:
        for tensor_name, data in warmup.inputs.items():
            if data.WhichOneof("input_data_type") == "input_data_file":
                raise fail(
                    f"model_warmup {warmup.name!r} reads input {tensor_name!r} from a file, which Conch does not "
                    "package; use zero_data or random_data."
                )

    batching = config.max_batch_size > 0
    if config.max_batch_size < 0:
        raise fail("max_batch_size is negative; use 0 (no batching) or the largest batch.")
    if config.HasField("dynamic_batching"):
        if not batching:
            raise fail("dynamic_batching needs max_batch_size > 0 (Triton refuses it without). Set max_batch_size.")
        too_large = [
            int(s) for s in config.dynamic_batching.preferred_batch_size if not 1 <= s <= config.max_batch_size
        ]
        if too_large:
            raise fail(
                f"dynamic_batching preferred_batch_size {too_large[0]} is outside 1..max_batch_size "
                f"({config.max_batch_size})."
            )

    files = {
        "input": {spec.name: spec for spec in signature.inputs},
        "output": {spec.name: spec for spec in signature.outputs},
    }
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            spec = files[kind].get(tensor.name)
            if spec is None:
                raise fail(
                    f"{kind} {tensor.name!r} is not an {kind} of {model_filename}, whose {kind}s are "
                    f"{', '.join(repr(n) for n in files[kind])}. Use the file's names."
                )
            _check_tensor(fail, kind, tensor, spec, batching)
    if config.input:
        missing = [name_ for name_ in files["input"] if name_ not in {t.name for t in config.input}]
        if missing:
            raise fail(
                f"input(s) {', '.join(repr(n) for n in missing)} of {model_filename} are not in config.pbtxt; the "
                f"{backend} backend needs every input configured. Add them, or leave out input to have Conch "
                "take them all from the file."
            )
    for kind, tensors in (("input", config.input), ("output", config.output)):
        if not tensors:
            for spec in files[kind].values():
                added = tensors.add(name=spec.name, data_type=datatype_value(spec.datatype))
                _set_dims(fail, kind, added, spec, batching)
            notes.append(
                f"config.pbtxt configures no {kind}s: took {len(files[kind])} from the model file, as Triton's "
                "auto-complete does"
            )

    if (config.name or model.name) != name:
        notes.append(f"served as {name!r} (the Conch model's name) in place of {config.name or model.name!r}")
    config.name = name
    if config.platform:
        notes.append(f'platform {config.platform!r} written as backend "{backend}"')
        config.ClearField("platform")
    config.backend = backend
    config.default_model_filename = model_filename
    config.ClearField("cc_model_filenames")
    if config.HasField("version_policy"):
        notes.append("version_policy dropped: each Conch version is one Triton version")
        config.ClearField("version_policy")
    for group in config.instance_group:
        if group.kind == group.KIND_GPU or group.gpus:
            notes.append(
                f"instance_group {group.name or '#'}: KIND_GPU made KIND_AUTO (a deployment's instance kind chooses "
                "CPU or GPU)"
            )
            group.kind = group.KIND_AUTO
            group.ClearField("gpus")
        if group.count < 0:
            raise fail(f"instance_group count {group.count} is negative; give at least 1.")
    return config, notes


def _set_dims(fail: _Fail, kind: str, tensor: Any, spec: TensorSpec, batching: bool) -> None:
    if batching and (not spec.dims or spec.dims[0] != -1):
        raise fail(
            f"max_batch_size > 0 needs axis 0 of every tensor to be dynamic, but {kind} {spec.name!r} has shape "
            f"{list(spec.dims)} in the model file. Set max_batch_size 0, or export the model with a dynamic axis 0."
        )
    body = list(spec.dims[1:] if batching else spec.dims)
    tensor.dims.extend(body or [1])
    if not body and batching:
        tensor.reshape.SetInParent()


def _check_tensor(fail: _Fail, kind: str, tensor: Any, spec: TensorSpec, batching: bool) -> None:
    configured = datatype_name(tensor.data_type) if tensor.data_type else "TYPE_INVALID"
    if configured != spec.datatype:
        raise fail(
            f"{kind} {tensor.name!r}: data_type is TYPE_{configured} but the model file has "
            f"{spec.datatype}. Set data_type: TYPE_{'STRING' if spec.datatype == 'BYTES' else spec.datatype}."
        )
    dims = [int(d) for d in tensor.dims]
    if not dims:
        raise fail(f"{kind} {tensor.name!r} has no dims; Triton needs at least one (dims: [ 1 ] for a scalar).")
    if any(d < -1 for d in dims):
        raise fail(f"{kind} {tensor.name!r}: dims {dims} has a size below -1; use -1 for an axis of any size.")
    if batching and (not spec.dims or spec.dims[0] != -1):
        raise fail(
            f"max_batch_size > 0 needs axis 0 of {kind} {tensor.name!r} to be dynamic, "
            f"but the model file gives it shape {list(spec.dims)}. Set max_batch_size 0 with dims "
            f"{list(spec.dims) or [1]}, or export the model with a dynamic axis 0."
        )
    shape = [int(d) for d in tensor.reshape.shape] if tensor.HasField("reshape") else dims
    model_shape = list(spec.dims[1:] if batching else spec.dims)
    if not model_shape and shape in ([1], []):
        return
    field = "reshape" if tensor.HasField("reshape") else "dims"
    if len(shape) != len(model_shape):
        raise fail(
            f"{kind} {tensor.name!r}: {field} {shape} has {len(shape)} axes, but the model file's shape "
            f"{list(spec.dims)} gives {len(model_shape)}"
            + (
                " once the batch axis (axis 0, which max_batch_size > 0 leaves out of dims) is removed"
                if batching
                else ""
            )
            + f". Set {field} to {model_shape or [1]}."
        )
    if kind == "input":
        for axis, (given, declared) in enumerate(zip(shape, model_shape, strict=True)):
            if declared >= 0 and given != declared:
                raise fail(
                    f"input {tensor.name!r}: {field} {shape} gives axis {axis + int(batching)} the size {given}, but "
                    f"the model file fixes it at {declared}. Set it to {declared}."
                )
