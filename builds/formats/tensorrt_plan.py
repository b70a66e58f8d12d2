"""TensorRT plans (serialized engines: `.plan`, `.engine`), packaged as uploaded for Triton's `tensorrt` backend
(`model.plan`).

A plan runs only on the GPU product and the TensorRT version it was built for (TensorRT "Engine Portability": in
the standard runtime the version numbers must match; an engine is not portable across GPU architectures without
hardware compatibility mode). Its bindings cannot be read without TensorRT and a GPU, neither of which Conch's
build machines have, so the upload declares them: its inputs as `input_spec`, its outputs as `output_spec`, and
`gpu_product` (the `nvidia.com/gpu.product` label of the nodes it was built on) and `tensorrt_version`. The build
checks what it can (the file is a plan; every declaration is there and well formed) and cannot prove the plan
serves: that happens when a deployment on a matching GPU loads it. Deployments elsewhere are refused naming the
mismatch (`deployments.services.records`).

A plan begins with the bytes "ftrt" (what NVIDIA's Torch-TensorRT checks a serialized engine for). Ultralytics
writes its `.engine` files with a metadata header first (a 4-byte little-endian length, then that much JSON):
the header is removed, so the repository holds the plan Triton can load. Pure: no framework.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from builds.formats.base import ModelFormat
from conch.errors import InvalidInput

__all__ = ["PLAN_MAGIC", "TensorRTPlanFormat", "ultralytics_header_length"]

#: What a serialized TensorRT engine begins with.
PLAN_MAGIC = b"ftrt"
#: The declarations a plan is uploaded with (build options).
DECLARATIONS = ("input_spec", "output_spec", "gpu_product", "tensorrt_version")


def ultralytics_header_length(head: bytes) -> int:
    """The length of the Ultralytics metadata header `head` opens with (4 + the JSON's length), or 0 when it opens
    with none: a 4-byte little-endian length, that much JSON, then the plan."""
    if len(head) < 9 or head[4:5] != b"{":
        return 0
    start = 4 + int.from_bytes(head[:4], "little")
    return start if head[start : start + 4] == PLAN_MAGIC else 0


class TensorRTPlanFormat(ModelFormat):
    """A TensorRT plan, served as uploaded by the `tensorrt` backend on the GPU product it was built for."""

    key: ClassVar[str] = "tensorrt_plan"
    title: ClassVar[str] = "TensorRT plan"
    suffixes: ClassVar[tuple[str, ...]] = (".plan", ".engine", ".trt")
    served_as: ClassVar[str] = "tensorrt"
    model_filename: ClassVar[str] = "model.plan"
    hint_options: ClassVar[tuple[str, ...]] = DECLARATIONS
    declares_interface: ClassVar[bool] = True
    upload_hint: ClassVar[str] = (
        "the serialized engine trtexec --saveEngine (or IBuilder.build_serialized_network) writes, with its inputs "
        "(input_spec), outputs (output_spec), gpu_product and tensorrt_version; it deploys only there"
    )

    def matches_head(self, head: bytes) -> bool:
        return head.startswith(PLAN_MAGIC) or bool(ultralytics_header_length(head))

    def local_name(self, head: bytes) -> str:
        return self.model_filename

    @property
    def verifiable_here(self) -> bool:
        return False

    def declared_signature(self, options: Any) -> tuple[dict[str, Any], list[str]]:
        """The plan's signature (`ModelSignature.to_dict()`) from the build options `options` (`BuildOptions`:
        input_spec, output_spec), and notes for the build log.

        Raises InvalidInput naming the first declaration missing (input_spec, output_spec, gpu_product,
        tensorrt_version), with what to give.
        """
        missing = [field for field in DECLARATIONS if not getattr(options, field)]
        if missing:
            raise InvalidInput(
                f"A TensorRT plan's bindings, and the GPU and TensorRT it runs on, cannot be read from the file "
                f"without TensorRT and that GPU, so the upload must declare them; {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} missing. Give input_spec and output_spec (each tensor as "
                "name=DATATYPE:dims, for example input_spec=images=FP32:-1,3,640,640 output_spec=output0=FP32:-1,84,"
                "8400), gpu_product (the nvidia.com/gpu.product label of the nodes it was built on, for example "
                "NVIDIA-A10) and tensorrt_version (for example 10.7.0), then rebuild.",
                field=missing[0],
            )
        clash = sorted(set(options.input_spec) & set(options.output_spec))
        if clash:
            raise InvalidInput(
                f"input_spec and output_spec both name {clash[0]!r}; a binding is an input or an output.",
                field="output_spec",
            )

        def tensors(spec: Any) -> list[dict[str, Any]]:
            return [
                {"name": name, "datatype": datatype, "dims": list(dims), "dim_names": [None] * len(dims)}
                for name, (datatype, dims) in spec.items()
            ]

        signature = {
            "inputs": tensors(options.input_spec),
            "outputs": tensors(options.output_spec),
            "ir_version": 0,
            "opset": None,
            "opset_imports": [],
            "producer_name": "tensorrt",
            "producer_version": options.tensorrt_version,
        }
        notes = [
            f"bindings as declared: inputs {', '.join(options.input_spec)}; outputs {', '.join(options.output_spec)}",
            f"built for {options.gpu_product} with TensorRT {options.tensorrt_version}: deployable only on nodes "
            "with that gpu.product, on a cluster whose Triton carries that TensorRT",
        ]
        return signature, notes

    def prepare(self, source: Path) -> str:
        """Make `source` the plan Triton loads, in place: an Ultralytics metadata header is removed. Returns a note
        for the build log ("" when the file was a plan as it was). Raises InvalidInput (field "file") for a
        header that does not end in a plan."""
        with source.open("rb") as handle:
            head = handle.read(64 * 1024)
        if head.startswith(PLAN_MAGIC):
            return ""
        length = ultralytics_header_length(head)
        if not length:
            raise InvalidInput(
                "This file does not begin with a TensorRT plan. Upload the engine trtexec --saveEngine wrote.",
                field="file",
            )
        try:
            metadata = json.loads(head[4:length])
        except ValueError:
            metadata = {}
        data = source.read_bytes()[length:]
        source.write_bytes(data)
        shown = ", ".join(f"{k}={metadata[k]}" for k in ("description", "imgsz", "batch") if k in metadata)
        return f"the Ultralytics metadata header ({length} bytes{': ' + shown if shown else ''}) removed"
