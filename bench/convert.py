"""Benchmark: per model format, the time from upload to the first good inference, and the conversion's share of it.

Conch comes up as bench/time_to_serve.py brings it up (web and a Celery worker with two pool processes, embedded
defaults, a scratch CONCH_VAR_DIR, warm verify Tritons waited for). Then, for each format, --runs times, with a new
model name each, the clock runs over:
  upload  POST /api/v1/models/{id}/versions/ with the format's file -> 201
  build   until `built` (inspect with the conversion, configure, write, verify with the comparison)
  deploy  POST /api/v1/deployments/ (local runtime, one instance) -> until `ready`
  infer   POST /api/v1/deployments/{id}/infer with 8 rows; good = HTTP 200 and every output equal to the source
          framework's (or onnxruntime's, for ONNX) on the same rows, within the FP32 tolerance (atol = rtol = 1e-4)
The deployment is stopped after each run (not timed).

The formats (each model made here with a fixed seed: devtools/tree_models.py, devtools/tf_models.py,
devtools/torch_models.py):
  onnx        the LightGBM binary classifier converted once beforehand with onnxmltools: the baseline, served as
              uploaded, with the same trees as `lightgbm`
  lightgbm    a LightGBM binary classifier in LightGBM's text format
  xgboost     an XGBoost binary:logistic model, JSON
  xgboost-ubj the same as UBJSON
  sklearn     a scikit-learn pipeline (StandardScaler + LogisticRegression, 3 classes) pickled with joblib (the
              bench's team is allowed pickled models)
  keras       a Keras classifier (devtools/tf_models.py: 5 features -> 3 softmax probabilities), `.keras`
  keras-h5    the same as a legacy `.h5`
  savedmodel  the same exported as a SavedModel folder, zipped
  graphdef    a frozen GraphDef of it, with a PlaceholderWithDefault
  tflite      the same converted with TFLiteConverter
  torchscript a PyTorch classifier (devtools/torch_models.py: 5 features -> probabilities and logits), scripted,
              `.pt`, its input given as input_spec; served by the pytorch backend (Python-based here), not converted
  pt2         the same exported with torch.export (`.pt2`), converted with torch.onnx
  onnx-zip    the Keras classifier as ONNX with its weights as external data (weights.bin), zipped with them
  triton-repo the `onnx` model as one model's folder of a Triton model repository, zipped: its config.pbtxt
              batches (max_batch_size 8, dynamic batcher) and leaves the tensors to auto-complete

The conversion's share: (the conversion in the sandbox, its start included + the source framework's run for the
comparison, sandbox included; both from the build's record) / total. Each format's total is printed beside the
ONNX baseline's as a ratio.

Ends with one machine-readable line:
  convert: formats=<keys> slowest_seconds=<median total of the slowest format> slowest=<its key> \
      <key>_seconds=<median total> <key>_conversion_share=<median share> ... <key>/onnx=<ratio of medians>
Run: .venv/bin/python bench/convert.py [--runs 3] [--poll 0.05]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from time_to_serve import TEAM, Conch  # noqa: E402  (bench/ on sys.path)

from devtools import tf_models, torch_models  # noqa: E402
from devtools.tree_models import lightgbm_model, sklearn_model, training_rows, xgboost_model  # noqa: E402

ROWS = 8


@dataclass
class Run:
    key: str
    build: float = 0.0
    ready: float = 0.0
    infer: float = 0.0
    total: float = 0.0
    conversion: float = 0.0
    comparison: float = 0.0

    @property
    def share(self) -> float:
        return (self.conversion + self.comparison) / self.total if self.total else 0.0


def make_models(folder: Path) -> dict[str, tuple[Path, dict[str, np.ndarray], str]]:
    """Each format's file, the outputs its source framework gives for the bench's rows, and its input's name."""
    import lightgbm
    import onnxmltools
    import xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    rows = training_rows(rows=ROWS, seed=11)[0]
    lgb_path = lightgbm_model(folder / "churn.txt", "binary")
    positive = lightgbm.Booster(model_file=str(lgb_path)).predict(rows)
    lgb_expected = {"probabilities": np.stack([1 - positive, positive], axis=1), "label": (positive > 0.5) * 1}
    onnx_model = onnxmltools.convert_lightgbm(
        lightgbm.Booster(model_file=str(lgb_path)),
        initial_types=[("input", FloatTensorType([None, rows.shape[1]]))],
        zipmap=False,
    )
    for value in (*onnx_model.graph.input, *onnx_model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx_path = folder / "churn.onnx"
    onnx_path.write_bytes(onnx_model.SerializeToString())
    models = {"onnx": (onnx_path, lgb_expected, "input"), "lightgbm": (lgb_path, lgb_expected, "input")}
    for key, ending in (("xgboost", ".json"), ("xgboost-ubj", ".ubj")):
        path = xgboost_model(folder / f"booster{ending}", "binary:logistic")
        booster = xgboost.Booster()
        booster.load_model(str(path))
        p = booster.predict(xgboost.DMatrix(rows))
        models[key] = (path, {"probabilities": np.stack([1 - p, p], axis=1), "label": (p > 0.5) * 1}, "input")
    import joblib

    path = sklearn_model(folder / "pipeline.joblib", "pipeline")
    fitted = joblib.load(path)
    models["sklearn"] = (path, {"probabilities": fitted.predict_proba(rows), "label": fitted.predict(rows)}, "input")
    models.update(_tensorflow_models(folder, rows))
    models.update(_torch_models(folder, rows))
    # the Keras classifier as ONNX (converted as Conch converts it), its weights moved into weights.bin
    from builds.formats.keras import KerasFormat

    converted = folder / "classifier.onnx"
    KerasFormat().convert(models["keras"][0], converted)
    (folder / "external").mkdir()
    onnx.save(
        onnx.load(str(converted)),
        str(folder / "external" / "model.onnx"),
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    models["onnx-zip"] = (_zip(folder / "external", folder / "external.zip"), models["keras"][1], "features")
    repository = folder / "churn-model"
    (repository / "1").mkdir(parents=True)
    (repository / "1" / "model.onnx").write_bytes(onnx_path.read_bytes())
    (repository / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 100 }\n'
    )
    models["triton-repo"] = (_zip_contents(repository, folder / "churn-model.zip"), lgb_expected, "input")
    return models


def _tensorflow_models(folder: Path, rows: np.ndarray) -> dict[str, tuple[Path, dict[str, np.ndarray], str]]:
    """The Keras classifier of devtools/tf_models.py in each TensorFlow format, and its outputs for `rows`."""
    probs = {"probs": tf_models.keras_classifier()(rows).numpy()}
    output_0 = {"output_0": probs["probs"]}
    return {
        "keras": (tf_models.keras_model(folder / "classifier.keras"), probs, "features"),
        "keras-h5": (tf_models.keras_model(folder / "classifier.h5"), probs, "features"),
        "savedmodel": (_zip(tf_models.saved_model(folder / "export"), folder / "export.zip"), output_0, "features"),
        "graphdef": (tf_models.frozen_graph(folder / "frozen.pb"), {"Identity": probs["probs"]}, "x"),
        "tflite": (tf_models.tflite_model(folder / "classifier.tflite"), output_0, "features"),
    }


#: Form fields an upload of a format sends beside its file.
UPLOAD_FIELDS = {"torchscript": {"input_spec": "features=FP32:-1,5"}}


def _torch_models(folder: Path, rows: np.ndarray) -> dict[str, tuple[Path, dict[str, np.ndarray], str]]:
    """The classifier of devtools/torch_models.py as TorchScript and as an exported program, and its outputs."""
    import torch

    with torch.inference_mode():
        probs, logits = (
            value.numpy() for value in torch_models.classifier()(torch.from_numpy(np.asarray(rows, dtype=np.float32)))
        )
    return {
        "torchscript": (
            torch_models.torchscript(folder / "classifier.pt"),
            {"OUTPUT__0": probs, "OUTPUT__1": logits},
            "features",
        ),
        "pt2": (
            torch_models.exported_program(folder / "classifier.pt2"),
            {"output_0": probs, "output_1": logits},
            "features",
        ),
    }


def _zip(source: Path, target: Path) -> Path:
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(source.rglob("*")):
            bundle.write(path, f"{source.name}/{path.relative_to(source).as_posix()}")
    return target


def _zip_contents(source: Path, target: Path) -> Path:
    """A zip of the files under `source`, named relative to it (an archive of one model's folder)."""
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(source.rglob("*")):
            bundle.write(path, path.relative_to(source).as_posix())
    return target


def measure(conch: Conch, key: str, path: Path, expected: dict[str, np.ndarray], body: bytes, poll: float) -> Run:
    """One run of one format: upload -> built -> deployed -> a good first inference (the module docstring)."""
    run = Run(key=key)
    name = f"conv-{key}-{secrets.token_hex(3)}"
    model = conch.call("POST", "/api/v1/models/", 201, json={"name": name, "team": TEAM})
    started = time.time()
    with path.open("rb") as handle:
        version = conch.call(
            "POST",
            f"/api/v1/models/{model['id']}/versions/",
            201,
            files={"file": (path.name, handle)},
            data=UPLOAD_FIELDS.get(key, {}),
        )
    version = conch.wait_status(f"/api/v1/versions/{version['id']}/", "built", poll, 300)
    built = time.time()
    deployment = conch.call(
        "POST",
        "/api/v1/deployments/",
        201,
        json={"name": name, "team": TEAM, "model_version": version["id"], "runtime": "local", "instance_count": 1},
    )
    conch.wait_status(f"/api/v1/deployments/{deployment['id']}/", "ready", poll, 300)
    ready = time.time()
    response = conch.api.post(
        f"{conch.url}/api/v1/deployments/{deployment['id']}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    done = time.time()
    if response.status_code != 200:
        raise SystemExit(f"{key}: infer -> {response.status_code}: {response.text[:2000]}")
    for output in response.json()["outputs"]:
        got = np.asarray(output["data"]).reshape(output["shape"])
        want = np.asarray(expected[output["name"]]).reshape(got.shape)
        if not np.allclose(got, want, atol=1e-4, rtol=1e-4):
            raise SystemExit(f"{key}: output {output['name']} is {got.tolist()}, the framework says {want.tolist()}")
    run.build, run.ready, run.infer, run.total = built - started, ready - built, done - ready, done - started
    builds = conch.call("GET", f"/api/v1/versions/{version['id']}/builds/", 200)["results"]
    conversion = builds[0].get("conversion") or {}
    run.conversion = float(conversion.get("wall_seconds") or 0.0)
    run.comparison = float(conversion.get("comparison_seconds") or 0.0)
    conch.call("DELETE", f"/api/v1/deployments/{deployment['id']}/", 202)
    conch.wait_status(f"/api/v1/deployments/{deployment['id']}/", "stopped", poll, 300)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll", type=float, default=0.05, help="Seconds between the client's status checks.")
    args = parser.parse_args()

    rows = training_rows(rows=ROWS, seed=11)[0]

    def body(name: str) -> bytes:
        tensor = {"name": name, "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}
        return json.dumps({"inputs": [tensor]}).encode()

    runs: dict[str, list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="conch-bench-convert-") as tmp:
        models = make_models(Path(tmp))
        conch = Conch(Path(tmp) / "var", warm_verify=True, broker_poll=None, concurrency=2)
        try:
            conch.start()
            conch.manage(
                "shell",
                "-c",
                "from tenancy.models import Team, TeamQuota; "
                f"Team.objects.filter(slug={TEAM!r}).update(allow_pickled_models=True); "
                # every run registers a model of its own: 14 formats x --runs models, past the default quota of 20
                f"TeamQuota.objects.update_or_create(team=Team.objects.get(slug={TEAM!r}), "
                "defaults={'registered_models': 10000, 'deployments': 10000, 'storage_bytes': 1 << 40})",
            )
            conch.wait_for_warm_verify_servers()
            for number in range(1, args.runs + 1):
                for key, (path, expected, input_name) in models.items():  # formats alternate within each round
                    run = measure(conch, key, path, expected, body(input_name), args.poll)
                    runs.setdefault(key, []).append(run)
                    print(f"round {number} {key}: {run.total:.2f} s (conversion share {run.share:.0%})")
        finally:
            stopped = conch.stop()
            print(f"stopped web, worker and {stopped} Triton process(es)")

    medians = {key: statistics.median(r.total for r in group) for key, group in runs.items()}
    baseline = medians["onnx"]
    print()
    print(
        f"{'format':<12} {'build':>6} {'ready':>6} {'infer':>6} {'total':>6} {'convert':>7} {'compare':>7} "
        f"{'share':>6} {'/onnx':>6}"
    )
    for key, group in runs.items():
        print(
            f"{key:<12} {statistics.median(r.build for r in group):6.2f} "
            f"{statistics.median(r.ready for r in group):6.2f} {statistics.median(r.infer for r in group):6.2f} "
            f"{medians[key]:6.2f} {statistics.median(r.conversion for r in group):7.2f} "
            f"{statistics.median(r.comparison for r in group):7.2f} "
            f"{statistics.median(r.share for r in group):6.1%} {medians[key] / baseline:6.2f}"
        )
    print(
        "columns (seconds, medians): build = upload started -> built; ready = deploy -> ready; infer = first "
        "inference; total = upload started -> first good inference; convert = the conversion in the sandbox; "
        "compare = the source framework's run for verify's comparison; share = (convert + compare) / total; "
        "/onnx = total / the ONNX baseline's total."
    )
    slowest = max(medians, key=medians.__getitem__)
    figures = " ".join(
        f"{key}_seconds={medians[key]:.2f} {key}_conversion_share="
        f"{statistics.median(r.share for r in runs[key]):.3f} {key}/onnx={medians[key] / baseline:.2f}"
        for key in runs
    )
    print(f"convert: formats={','.join(runs)} slowest_seconds={medians[slowest]:.2f} slowest={slowest} {figures}")


if __name__ == "__main__":
    main()
