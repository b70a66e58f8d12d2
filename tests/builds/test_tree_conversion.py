"""LightGBM and XGBoost models converted to ONNX in the sandbox (`builds.conversion`), and their source framework's
outputs arranged as the converted model's: the converted model, run by onnxruntime, computes what the framework
computes. No Triton here (tests/builds/test_tree_builds.py builds them through a real one)."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from builds.comparison import compare_outputs
from builds.conversion import convert_in_sandbox, run_source_in_sandbox
from builds.formats import format_by_key
from builds.inspection import inspect_onnx
from conch.errors import InvalidInput
from devtools.tree_models import FEATURES, lightgbm_model, sklearn_model, training_rows, xgboost_model


def _converted(tmp_path, key, source):
    target = tmp_path / "model.onnx"
    conversion = convert_in_sandbox(format_by_key(key), source, target)
    return conversion, target


def _compare(key, source, target, rows):
    session = onnxruntime.InferenceSession(str(target))
    names = [output.name for output in session.get_outputs()]
    served = dict(zip(names, session.run(None, {"input": rows}), strict=True))
    expected = run_source_in_sandbox(format_by_key(key), source, {"input": rows})
    signature = inspect_onnx(target)
    datatypes = {spec.name: spec.datatype for spec in signature.outputs}
    return {result.name: result for result in compare_outputs(expected, served, datatypes)}, signature


@pytest.mark.parametrize(
    ("objective", "outputs"),
    [("binary", {"label", "probabilities"}), ("multiclass", {"label", "probabilities"}), ("regression", {"variable"})],
)
def test_lightgbm_models_convert_and_compute_what_lightgbm_computes(tmp_path, objective, outputs):
    source = lightgbm_model(tmp_path / "model.txt", objective)
    conversion, target = _converted(tmp_path, "lightgbm", source)
    assert conversion.tool.startswith("onnxmltools ") and conversion.source.startswith("lightgbm ")
    assert conversion.opset.get("ai.onnx.ml", 0) >= 1
    assert conversion.notes[1].startswith(f"input: one FP32 tensor 'input' [-1, {FEATURES}]")
    rows = training_rows(rows=64, seed=7)[0]
    results, signature = _compare("lightgbm", source, target, rows)
    assert set(results) == outputs
    assert all(not r.problem for r in results.values()), [r.describe() for r in results.values()]
    assert signature.inputs[0].name == "input" and signature.inputs[0].datatype == "FP32"
    if "label" in results:
        assert results["label"].agreement == 1.0


@pytest.mark.parametrize(
    ("ending", "objective"),
    [
        (".json", "binary:logistic"),
        (".ubj", "binary:logistic"),
        (".json", "multi:softprob"),
        (".ubj", "multi:softmax"),
        (".json", "reg:squarederror"),
    ],
)
def test_xgboost_models_convert_and_compute_what_xgboost_computes(tmp_path, ending, objective):
    source = xgboost_model(tmp_path / f"booster{ending}", objective)
    # the build names its local copy by the content (XGBoost reads a file by its ending)
    head = source.read_bytes()[:512]
    local = source.rename(tmp_path / format_by_key("xgboost").local_name(head))
    assert local.suffix == ending
    conversion, target = _converted(tmp_path, "xgboost", local)
    assert conversion.source.startswith("xgboost")
    results, _ = _compare("xgboost", local, target, training_rows(rows=64, seed=3)[0])
    assert all(not r.problem for r in results.values()), [r.describe() for r in results.values()]
    assert set(results) == ({"variable"} if objective.startswith("reg:") else {"label", "probabilities"})


def test_a_file_the_framework_cannot_read_fails_with_its_reason_and_what_to_upload(tmp_path):
    broken = tmp_path / "model.txt"
    broken.write_text("tree\nversion=v4\nnum_class=1\nthis is not the rest of a model\n")
    with pytest.raises(InvalidInput) as raised:
        _converted(tmp_path, "lightgbm", broken)
    assert raised.value.field == "file"
    assert raised.value.detail.startswith("LightGBM cannot read this file as a model: ")
    assert "Upload the text file that Booster.save_model writes, unchanged." in raised.value.detail


def test_a_model_the_converter_does_not_support_fails_with_the_tools_reason_and_the_fix(tmp_path):
    import joblib
    from sklearn.neighbors import NearestCentroid

    # given a scikit-learn estimator skl2onnx has no converter for
    rows = np.random.default_rng(0).random((40, 3))
    joblib.dump(NearestCentroid().fit(rows, (rows[:, 0] > 0.5).astype(int)), tmp_path / "centroid.joblib")
    with pytest.raises(InvalidInput) as raised:
        _converted(tmp_path, "sklearn", tmp_path / "centroid.joblib")
    detail = raised.value.detail
    # then the build fails with the tool's reason in its words, and the fix
    assert detail.startswith(
        "skl2onnx could not convert this scikit-learn model (NearestCentroid): Unable to find a shape calculator for "
        "type '<class 'sklearn.neighbors._nearest_centroid.NearestCentroid'>'"
    )
    assert detail.endswith("and upload the .onnx file.") and raised.value.field == "file"


def test_an_xgboost_linear_booster_is_refused_naming_the_booster(tmp_path):
    # given an XGBoost linear booster (onnxmltools converts tree boosters only)
    source = xgboost_model(tmp_path / "linear.json", "reg:squarederror", booster_kind="gblinear")
    with pytest.raises(InvalidInput) as raised:
        _converted(tmp_path, "xgboost", source)
    assert raised.value.detail == (
        "This XGBoost model's booster is gblinear (a linear model, not trees), which onnxmltools cannot convert: "
        "Conch converts tree boosters (gbtree, dart). Train with booster='gbtree', or convert the model to ONNX "
        "yourself and upload the .onnx file."
    )


@pytest.mark.parametrize(
    ("kind", "outputs"),
    [
        ("pipeline", {"label", "probabilities"}),
        ("text-classes", {"label", "probabilities"}),
        ("regressor", {"variable"}),
    ],
)
def test_scikit_learn_pickles_convert_and_compute_what_scikit_learn_computes(tmp_path, kind, outputs):
    source = sklearn_model(tmp_path / "model.joblib", kind)
    conversion, target = _converted(tmp_path, "sklearn", source)
    assert conversion.tool.startswith("skl2onnx ") and conversion.source.startswith("scikit-learn ")
    results, signature = _compare("sklearn", source, target, training_rows(rows=64, seed=5)[0])
    assert set(results) == outputs
    assert all(not r.problem for r in results.values()), [r.describe() for r in results.values()]
    if kind == "text-classes":
        assert {spec.name: spec.datatype for spec in signature.outputs}["label"] == "BYTES"


class _Dial:
    """Unpickling it calls socket.create_connection(("127.0.0.1", port)): what a hostile pickle would do."""

    def __init__(self, port: int) -> None:
        self.port = port

    def __reduce__(self):
        import socket

        return (socket.create_connection, (("127.0.0.1", self.port), 2))


def test_a_hostile_pickle_reaches_no_network_from_the_sandbox(tmp_path):
    import pickle
    import socket

    # given a pickle that connects to a port of this host when it is loaded
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    hostile = tmp_path / "model.pkl"
    hostile.write_bytes(pickle.dumps(_Dial(listener.getsockname()[1])))
    # when the build converts it
    with pytest.raises(InvalidInput) as raised:
        _converted(tmp_path, "sklearn", hostile)
    # then its code ran without a network: the connection failed and nothing reached the port
    assert raised.value.detail.startswith("This pickle could not be loaded: ")
    assert "unreachable" in raised.value.detail.lower()
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()


def test_a_pickle_of_something_else_is_refused_saying_what_it_holds(tmp_path):
    import pickle

    other = tmp_path / "model.pkl"
    other.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    with pytest.raises(InvalidInput) as raised:
        _converted(tmp_path, "sklearn", other)
    assert raised.value.detail.startswith("This pickle holds a builtins.dict, not a scikit-learn estimator")
