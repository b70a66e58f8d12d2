"""Triton model repositories uploaded as archives (issue 20): found in the unpacked folder, every config.pbtxt parsed
with Triton's protobuf and checked against its folder and its model file, with errors naming model, tensor and
field. Pure: files in tmp_path, no Triton."""

from __future__ import annotations

from pathlib import Path

import pytest

from builds.formats import find_model_in_folder
from builds.formats.triton_repository import (
    check_served,
    configure_imported,
    pick_model,
    read_repository,
)
from builds.inspection import inspect_onnx
from conch.errors import InvalidInput
from tests.tiny_models import doubler
from tritonserving.config import config_to_pbtxt

BATCHED = """
name: "doubler"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
version_policy { latest { num_versions: 1 } }
"""


def _model(root: Path, name: str, config: str | None, versions: tuple[int, ...] = (1,), **doubler_args) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    for version in versions:
        doubler(folder / str(version) / "model.onnx", **doubler_args)
    return folder


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _refused(call) -> str:
    with pytest.raises(InvalidInput) as raised:
        call()
    assert raised.value.field == "file"
    return raised.value.detail


def _configure(root: Path, name: str = "doubler", *, config: str, **doubler_args):
    folder = _model(root, name, config, **doubler_args)
    [model] = read_repository(root, lone_name=name)
    signature = inspect_onnx(folder / "1" / "model.onnx")
    return configure_imported(model, name=name, signature=signature, model_filename="model.onnx")


@pytest.mark.parametrize("top", ["", "model_repository/"])
def test_a_repository_is_found_at_the_archives_top_or_in_its_one_folder(tmp_path, top):
    _model(tmp_path / top, "doubler", BATCHED)
    _model(tmp_path / top, "other", None)
    model_format, root = find_model_in_folder(tmp_path, _files(tmp_path))
    assert (model_format.key, root) == ("triton_repository", tmp_path / top.rstrip("/") if top else tmp_path)
    models = read_repository(root, lone_name="ignored")
    assert [m.name for m in models] == ["doubler", "other"]
    assert models[0].describe() == "model 'doubler': backend onnxruntime, version(s) 1, config.pbtxt"
    assert models[1].describe() == (
        "model 'other': backend onnxruntime, version(s) 1, no config.pbtxt (auto-completed from the model file)"
    )


def test_an_archive_of_one_models_folder_is_that_model_under_the_conch_models_name(tmp_path):
    (tmp_path / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    doubler(tmp_path / "3" / "model.onnx")
    model_format, root = find_model_in_folder(tmp_path, _files(tmp_path))
    assert (model_format.key, root) == ("triton_repository", tmp_path)
    [model] = read_repository(root, lone_name="scorer")
    assert (model.name, model.versions, model.model_file(3)) == ("scorer", (3,), tmp_path / "3" / "model.onnx")


def test_config_files_at_different_depths_are_refused_naming_them(tmp_path):
    _model(tmp_path, "a", BATCHED)
    _model(tmp_path / "deeper", "b", BATCHED)
    detail = _refused(lambda: find_model_in_folder(tmp_path, _files(tmp_path)))
    assert "config.pbtxt files at different places (a/config.pbtxt, deeper/b/config.pbtxt)" in detail


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ('name: "doubler"\nmax_batch_size: "eight"\n', "config.pbtxt is not a valid Triton model configuration: 2:"),
        ('name: "doubler"\nmax_batch_sizes: 8\n', 'has no field named "max_batch_sizes"'),
        ('name: "other"\n', "config.pbtxt sets name 'other', but the model's folder is 'doubler'"),
        ('platform: "caffe2_netdef"\n', "platform 'caffe2_netdef' is not one of Triton's"),
        ('platform: "onnxruntime_onnx"\nbackend: "pytorch"\n', "is served by backend 'onnxruntime', but backend is"),
        ('backend: "onnxruntime"\ndefault_model_filename: "net.onnx"\n', "version 1 has no net.onnx (doubler/1/ holds"),
        (
            'backend: "onnxruntime"\nversion_policy { specific { versions: [ 1, 4 ] } }\n',
            "version_policy specific names version(s) 4 but the folder has version(s) 1",
        ),
        ("max_batch_size: 8\n", "names no platform or backend and the version folders do not show one"),
    ],
)
def test_a_bad_configuration_is_refused_naming_the_model_and_field(tmp_path, config, says):
    folder = _model(tmp_path, "doubler", config)
    if "no platform" in says:
        (folder / "1" / "model.onnx").rename(folder / "1" / "weights.bin")
    detail = _refused(lambda: read_repository(tmp_path, lone_name="x"))
    assert detail.startswith("Triton model repository, model 'doubler': ") and says in detail, detail


def test_version_folders_follow_the_version_policy_and_other_folders_are_skipped(tmp_path):
    folder = _model(
        tmp_path,
        "doubler",
        'backend: "onnxruntime"\nversion_policy { latest { num_versions: 2 } }\n',
        versions=(1, 2, 10),
    )
    (folder / "docs").mkdir()
    (folder / "docs" / "README.md").write_text("notes")
    [model] = read_repository(tmp_path, lone_name="x")
    assert model.versions == (2, 10)
    assert model.skipped == ("folder 'docs' (not a version number)", "version 1 (not served by the version policy)")


def test_a_model_without_a_version_folder_or_model_file_is_refused_saying_where_to_put_it(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    assert "no version folder: Triton loads a model from its numbered folders (empty/1/model.onnx)" in _refused(
        lambda: read_repository(tmp_path, lone_name="x")
    )
    (tmp_path / "empty" / "1").mkdir()
    (tmp_path / "empty" / "1" / "README").write_text("x")
    assert "version 1 has no model.onnx (empty/1/ holds README). Put the model file there" in _refused(
        lambda: read_repository(tmp_path, lone_name="x")
    )


def test_an_ensemble_naming_a_model_the_repository_lacks_is_refused(tmp_path):
    _model(tmp_path, "doubler", BATCHED)
    (tmp_path / "pipeline" / "1").mkdir(parents=True)
    (tmp_path / "pipeline" / "config.pbtxt").write_text(
        'platform: "ensemble"\nensemble_scheduling { step [ { model_name: "doubler" model_version: -1 }, '
        '{ model_name: "decoder" model_version: -1 } ] }\n'
    )
    detail = _refused(lambda: read_repository(tmp_path, lone_name="x"))
    assert (
        "model 'pipeline': ensemble_scheduling step names the model 'decoder', which the repository does not hold"
        in (detail)
    )


@pytest.mark.parametrize(
    ("backend", "file", "says"),
    [
        ('platform: "tensorrt_plan"', "model.plan", "Upload the ONNX model it was built from"),
        ('platform: "tensorflow_savedmodel"', "model.savedmodel/saved_model.pb", "Conch converts it to ONNX"),
        ('backend: "tnn"', "model.tnnmodel", "served by the backend 'tnn', which the Triton Conch runs does not have"),
        ('backend: "tnn"', "model.tnnmodel", "register the backend first: POST /api/v1/backends/"),
    ],
)
def test_models_of_backends_conch_does_not_serve_are_refused_saying_what_to_upload(tmp_path, backend, file, says):
    config = backend + ('\ndefault_model_filename: "model.tnnmodel"' if "tnn" in backend else "")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(config + "\n")
    (tmp_path / "m" / "1" / file).parent.mkdir(parents=True)
    (tmp_path / "m" / "1" / file).write_bytes(b"model")
    [model] = read_repository(tmp_path, lone_name="x")
    detail = _refused(lambda: check_served(model))
    assert detail.startswith("Triton model repository, model 'm': it is ") and says in detail


def test_several_models_none_named_like_the_conch_model_are_refused_naming_them(tmp_path):
    _model(tmp_path, "a", None)
    _model(tmp_path, "b", None)
    models = read_repository(tmp_path, lone_name="x")
    assert pick_model(models, "b").name == "b"
    assert "holds 2 models (a, b) and none is named 'c'" in _refused(lambda: pick_model(models, "c"))


def test_the_configuration_is_kept_with_what_conch_manages_replaced(tmp_path):
    config, notes = _configure(tmp_path, "doubler", config=BATCHED)
    assert config.name == "doubler" and config.backend == "onnxruntime" and not config.platform
    assert (config.max_batch_size, list(config.dynamic_batching.preferred_batch_size)) == (16, [4, 8])
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert [(g.count, g.kind, list(g.gpus)) for g in config.instance_group] == [(2, 0, [])]  # 0: KIND_AUTO
    assert not config.HasField("version_policy") and config.default_model_filename == "model.onnx"
    assert notes == [
        "platform 'onnxruntime_onnx' written as backend \"onnxruntime\"",
        "version_policy dropped: each Conch version is one Triton version",
        "instance_group #: KIND_GPU made KIND_AUTO (a deployment's instance kind chooses CPU or GPU)",
    ]


def test_missing_inputs_and_outputs_are_taken_from_the_file_as_triton_auto_completes(tmp_path):
    config, notes = _configure(tmp_path, "m", config='backend: "onnxruntime"\nmax_batch_size: 4\n')
    text = config_to_pbtxt(config)
    assert 'name: "x"' in text and 'name: "y"' in text and "dims: 4" in text
    assert [list(t.dims) for t in (*config.input, *config.output)] == [[4], [4]]
    assert notes[:2] == [
        "config.pbtxt configures no inputs: took 1 from the model file, as Triton's auto-complete does",
        "config.pbtxt configures no outputs: took 1 from the model file, as Triton's auto-complete does",
    ]


def _with(replace: str, by: str) -> str:
    assert replace in BATCHED
    return BATCHED.replace(replace, by)


@pytest.mark.parametrize(
    ("config", "doubler_args", "says"),
    [
        (_with('name: "x"', 'name: "input"'), {}, "input 'input' is not an input of model.onnx, whose inputs are 'x'"),
        (
            _with('name: "x" data_type: TYPE_FP32', 'name: "x" data_type: TYPE_INT64'),
            {},
            "input 'x': data_type is TYPE_INT64 but the model file has FP32. Set data_type: TYPE_FP32.",
        ),
        (
            _with('name: "x" data_type: TYPE_FP32 dims: [ 4 ]', 'name: "x" data_type: TYPE_FP32 dims: [ 1, 4 ]'),
            {},
            "input 'x': dims [1, 4] has 2 axes, but the model file's shape [-1, 4] gives 1 once the batch axis",
        ),
        (
            _with('name: "x" data_type: TYPE_FP32 dims: [ 4 ]', 'name: "x" data_type: TYPE_FP32 dims: [ 3 ]'),
            {},
            "input 'x': dims [3] gives axis 1 the size 3, but the model file fixes it at 4. Set it to 4.",
        ),
        (BATCHED, {"shape": (1, 4)}, "max_batch_size > 0 needs axis 0 of input 'x' to be dynamic"),
        (
            _with("max_batch_size: 16", "max_batch_size: 0"),
            {},
            "dynamic_batching needs max_batch_size > 0 (Triton refuses it without)",
        ),
        (
            _with("max_batch_size: 16", "max_batch_size: 6"),
            {},
            "dynamic_batching preferred_batch_size 8 is outside 1..max_batch_size (6)",
        ),
        (
            _with(
                "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }",
                "sequence_batching { }",
            ),
            {},
            "sequence_batching configures a stateful model",
        ),
        (
            BATCHED + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 '
            'dims: [ 4 ] input_data_file: "x.bin" } } } ]\n',
            {},
            "model_warmup 'w' reads input 'x' from a file, which Conch does not package",
        ),
        (
            _with(
                'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                'input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            ),
            {"input_name": "a"},
            "",
        ),
    ],
)
def test_a_configuration_that_disagrees_with_the_model_file_is_refused_naming_tensor_and_field(
    tmp_path, config, doubler_args, says
):
    if not says:  # the last case agrees: a control that the refusals above come from what each changed
        _configure(tmp_path, config=config, **doubler_args)
        return
    detail = _refused(lambda: _configure(tmp_path, config=config, **doubler_args))
    assert detail.startswith("Triton model repository, model 'doubler': ") and says in detail, detail


def test_an_input_left_out_of_the_configuration_is_refused(tmp_path):
    config = 'backend: "onnxruntime"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
    folder = _model(tmp_path, "doubler", config)
    [model] = read_repository(tmp_path, lone_name="x")
    signature = inspect_onnx(folder / "1" / "model.onnx")
    extra = signature.__class__(
        inputs=(*signature.inputs, signature.inputs[0].__class__("mask", "BOOL", (-1, 4), (None, None))),
        outputs=signature.outputs,
        ir_version=signature.ir_version,
        opset=signature.opset,
        opset_imports=signature.opset_imports,
    )
    detail = _refused(lambda: configure_imported(model, name="doubler", signature=extra, model_filename="model.onnx"))
    assert "input(s) 'mask' of model.onnx are not in config.pbtxt; the onnxruntime backend needs every input" in detail


def test_a_model_folder_packs_to_the_same_bytes_with_a_config_naming_its_backend(tmp_path):
    import zipfile

    from builds.services.repositories import pack_model_folder

    _model(tmp_path / "repo", "scorer", None, versions=(1, 2))
    [model] = read_repository(tmp_path / "repo", lone_name="x")
    first = pack_model_folder(model, tmp_path / "a.zip").read_bytes()
    (model.folder / "1" / "model.onnx").touch()  # a new modification time changes nothing
    assert pack_model_folder(model, tmp_path / "b.zip").read_bytes() == first
    with zipfile.ZipFile(tmp_path / "a.zip") as bundle:
        assert bundle.namelist() == ["scorer/config.pbtxt", "scorer/1/model.onnx", "scorer/2/model.onnx"]
        assert 'backend: "onnxruntime"' in bundle.read("scorer/config.pbtxt").decode()
    # and the zip is told as a repository of that one model again
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(tmp_path / "a.zip") as bundle:
        bundle.extractall(unpacked)
    model_format, root = find_model_in_folder(unpacked, _files(unpacked))
    assert model_format.key == "triton_repository"
    [again] = read_repository(root, lone_name="x")
    assert (again.name, again.versions, again.has_config) == ("scorer", (2,), True)
