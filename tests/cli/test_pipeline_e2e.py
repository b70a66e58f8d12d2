"""A CI pipeline through the installed `conch` command with a real model: upload with --wait (a real build, verify
on a real Triton), deploy with --wait (a local Triton), infer from a .npy file (outputs equal onnxruntime's),
status, metrics and stop, every step's --json parsed."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from tests import real_models

pytestmark = pytest.mark.e2e


def test_upload_build_deploy_infer_status_stop_with_the_cli(cli_process, eager_tasks, tmp_path):
    # register and upload the demo classifier, waiting for its build
    assert cli_process("models", "create", "orientation", "--json").code == 0
    uploaded = cli_process(
        "upload", "orientation", real_models.classifier(), "--wait", "-o", "max_batch_size=8", "--json", timeout=600
    )
    assert uploaded.code == 0, uploaded.err
    version = uploaded.json()["version"]
    assert version["status"] == "built" and version["build_options"]["max_batch_size"] == 8
    # deploy it and wait until it serves
    deployed = cli_process("deploy", "orientation", "--name", "orientation", "--wait", "--json", timeout=600)
    assert deployed.code == 0, deployed.err
    deployment = deployed.json()
    assert deployment["status"] == "ready" and deployment["model_version"] == version["id"]
    # a second deployment of that name is a conflict
    assert cli_process("deploy", "orientation:1", "--name", "orientation").code == 4
    # infer from a .npy file: the outputs equal onnxruntime's on the same input
    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    inferred = cli_process("infer", "orientation", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path)
    assert inferred.code == 0, inferred.err
    assert inferred.out.startswith("fetch_name_0 FP32 [2, 4]: ")
    session = onnxruntime.InferenceSession(str(real_models.classifier()), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "fetch_name_0.npy"), expected, rtol=1e-4, atol=1e-5)
    as_json = cli_process("infer", str(deployment["id"]), "-i", f"x={tmp_path / 'x.npy'}", "--json").json()
    assert as_json["outputs"][0]["shape"] == [2, 4]
    # a wrong input is refused by Triton: exit 1 naming the tensor
    np.save(tmp_path / "wrong.npy", np.zeros((1, 4), dtype=np.float32))
    wrong = cli_process("infer", "orientation", "--input", f"y={tmp_path / 'wrong.npy'}")
    assert wrong.code == 1 and "(field: y)" in wrong.err
    # status, listed and alone
    listed = cli_process("status", "--json").json()
    assert [(d["name"], d["status"]) for d in listed] == [("orientation", "ready")]
    one = cli_process("status", "orientation")
    assert one.code == 0 and one.out.split("\n")[1].split() == [
        str(deployment["id"]),
        "orientation",
        "acme",
        "orientation:1",
        "local",
        "ready",
    ]
    assert cli_process("metrics", "orientation", "--json").code == 0
    # stop it; then the name is not found any more
    stopped = cli_process("stop", "orientation", "--wait", "--json", timeout=300)
    assert stopped.code == 0 and stopped.json()["status"] == "stopped"
    assert cli_process("status", "orientation").code == 3
