"""A stand-in for Triton's `tensorrt` backend, as a Python-based backend of the test kubelet's Tritons (see
devtools/cluster/standins): it serves a stand-in plan by handing the ONNX model inside it to Conch's Python-based
`onnxruntime` backend, the sibling folder of this one in the backend directory."""

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import triton_python_backend_utils as pb_utils

MAGIC = b"ftrt" + b"CONCH-STANDIN-PLAN\n"

_spec = importlib.util.spec_from_file_location(
    "conch_onnxruntime_backend", Path(__file__).parent.parent / "onnxruntime" / "model.py"
)
_onnxruntime = importlib.util.module_from_spec(_spec)
# Registered before it runs: its dataclasses look their module up in sys.modules.
sys.modules[_spec.name] = _onnxruntime
_spec.loader.exec_module(_onnxruntime)


class TritonPythonModel(_onnxruntime.TritonPythonModel):
    """Loads `model.plan` (a stand-in plan), then serves its ONNX model as the onnxruntime backend does."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        plan = (
            Path(args["model_repository"])
            / str(args["model_version"])
            / (config.get("default_model_filename") or "model.plan")
        )
        data = plan.read_bytes() if plan.is_file() else b""
        if not data.startswith(MAGIC):
            raise pb_utils.TritonModelException(f"{plan} is not a plan the trtexec stand-in made")
        _, _, model = data[len(MAGIC) :].partition(b"\n")
        self._folder = tempfile.TemporaryDirectory(prefix="conch-tensorrt-standin-")
        version = Path(self._folder.name) / str(args["model_version"])
        version.mkdir()
        (version / "model.onnx").write_bytes(model)
        config["default_model_filename"] = "model.onnx"
        super().initialize({**args, "model_config": json.dumps(config), "model_repository": self._folder.name})
