"""Manifests of a TensorRT plan Job, and the reading of what it wrote: pure functions of plain data.

A plan Job builds a TensorRT plan from a version's ONNX model on a node with the GPU product the plan is for, in
NVIDIA's TensorRT image of the cluster's Triton release, runs it once on Conch's inputs and hands the plan and the
outputs back through presigned object-store URLs (`plan_job_program`). It consists of:
- a batch/v1 Job: one pod, `restartPolicy: Never`, `backoffLimit: 0` (a failed build is not retried: Conch reports
  it), `activeDeadlineSeconds` (Kubernetes "Jobs": "Job termination and cleanup"), one whole `nvidia.com/gpu`,
  the GPU product by its `nvidia.com/gpu.product` node label and the `nvidia.com/gpu` taint tolerated, run as
  non-root without privilege escalation or capabilities (Kubernetes "Pod Security Standards", restricted), the
  termination message taken from the log when the program fails (`FallbackToLogsOnError`);
- a Secret with the request (the URLs), owned by the Job so the garbage collector deletes it with the Job.

Shapes follow trtexec's options (TensorRT "trtexec": `--minShapes`, `--optShapes`, `--maxShapes`, `--shapes`,
`--loadInputs`, `--exportOutput`): `name:AxBxC`, names quoted with single quotes, entries separated by commas.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conch.errors import InvalidInput
from deployments.runtimes.kubernetes.manifests import GPU_PRODUCT_LABEL, GPU_RESOURCE, dns_label

__all__ = [
    "PLAN_PROGRAM",
    "REQUEST_ENV",
    "PlanJobSpec",
    "TensorShape",
    "plan_job_manifest",
    "plan_request_secret_manifest",
    "read_trtexec_outputs",
    "shape_arguments",
]

#: The program the Job's container runs with `python3 -c` (standard library only).
PLAN_PROGRAM = (Path(__file__).with_name("plan_job_program.py")).read_text(encoding="utf-8")
#: Container variable holding the request JSON, from the Job's Secret.
REQUEST_ENV = "CONCH_PLAN_REQUEST"
_REQUEST_KEY = "request.json"
_DIMENSIONS = re.compile(r"^\d+(x\d+)*$|^$")


@dataclass(frozen=True)
class TensorShape:
    """One input's shapes for TensorRT: `minimum`, `optimum` and `maximum` (each a tuple of ints, the batch axis
    first when the model batches) for the optimization profile, and `run`, the shape of Conch's input."""

    name: str
    minimum: tuple[int, ...]
    optimum: tuple[int, ...]
    maximum: tuple[int, ...]
    run: tuple[int, ...]


@dataclass(frozen=True)
class PlanJobSpec:
    """Plain data of one plan Job.

    `plan_id`: Conch's record of the plan (names and labels); `image`: the TensorRT image; `gpu_product`: the
    `nvidia.com/gpu.product` label value of the nodes to build on; `shapes`: every input (`shape_arguments`);
    `fp16`: let TensorRT choose FP16 kernels; `deadline_s`: seconds the Job may run (activeDeadlineSeconds);
    `cpu`, `memory`: Kubernetes quantities requested per pod; `installation`: the Conch installation (labels and
    names).
    """

    plan_id: int
    team: str
    namespace: str
    image: str
    gpu_product: str
    shapes: tuple[TensorShape, ...]
    fp16: bool = False
    deadline_s: int = 3600
    cpu: str = "2"
    memory: str = "8Gi"
    image_pull_secrets: tuple[str, ...] = ()
    #: The Conch installation (`conch.io/installation` label, part of the names).
    installation: str = ""
    extra_labels: Mapping[str, str] = field(default_factory=dict)


def job_name(plan_id: int, installation: str = "") -> str:
    """The Job's (and its Secret's) name: `conch-plan-<installation>-<id>` (`conch-plan-<id>` without one), so two
    Conch installations sharing a namespace never share a Job."""
    return dns_label(f"conch-plan-{installation}-{plan_id}" if installation else f"conch-plan-{plan_id}")


def plan_labels(spec: PlanJobSpec) -> dict[str, str]:
    """Labels of the Job, its pod and its Secret (Kubernetes "Recommended Labels" plus Conch's own)."""
    return {
        "app.kubernetes.io/name": "tensorrt-plan",
        "app.kubernetes.io/instance": job_name(spec.plan_id, spec.installation),
        "app.kubernetes.io/managed-by": "conch",
        "conch.io/team": dns_label(spec.team),
        "conch.io/plan": str(spec.plan_id),
        **({"conch.io/installation": spec.installation} if spec.installation else {}),
        **spec.extra_labels,
    }


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


def shape_arguments(shapes: Sequence[TensorShape]) -> tuple[list[str], list[str]]:
    """trtexec arguments for the shapes: (build: `--minShapes`, `--optShapes`, `--maxShapes`; run: `--shapes`).
    Inputs without a dynamic axis need none: both lists are then empty."""
    dynamic = [shape for shape in shapes if shape.minimum != shape.maximum]
    build: list[str] = []
    if dynamic:
        for flag, pick in (("--minShapes", "minimum"), ("--optShapes", "optimum"), ("--maxShapes", "maximum")):
            build.append(f"{flag}=" + ",".join(f"'{s.name}':{_dims(getattr(s, pick))}" for s in shapes))
    run = ["--shapes=" + ",".join(f"'{s.name}':{_dims(s.run)}" for s in shapes)] if dynamic else []
    return build, run


def plan_request(
    spec: PlanJobSpec,
    *,
    model_files: Sequence[tuple[str, str]],
    inputs: Sequence[tuple[str, str]],
    plan_url: str,
    outputs_url: str,
    report_url: str,
) -> dict[str, Any]:
    """The request the program reads: `model_files` [(path relative to the model folder, GET URL)], the main
    model first; `inputs` [(input name, GET URL of its raw C-order bytes)]; PUT URLs for what it writes."""
    build, run = shape_arguments(spec.shapes)
    if spec.fp16:
        build.append("--fp16")
    return {
        "trtexec": "trtexec",
        "model_files": [{"path": path, "url": url} for path, url in model_files],
        "inputs": [{"name": name, "file": f"input{index}.bin", "url": url} for index, (name, url) in enumerate(inputs)],
        "build_args": build,
        # One inference, no warm-up and no timed loop: the outputs are what Conch wants, not a benchmark.
        "run_args": [*run, "--iterations=1", "--warmUp=0", "--duration=0", "--avgRuns=1"],
        "plan_url": plan_url,
        "outputs_url": outputs_url,
        "report_url": report_url,
    }


def plan_request_secret_manifest(spec: PlanJobSpec, request: Mapping[str, Any], *, owner_uid: str) -> dict[str, Any]:
    """The Secret holding the request, owned by the Job `owner_uid` (deleted with it by the garbage collector)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": job_name(spec.plan_id, spec.installation),
            "namespace": spec.namespace,
            "labels": plan_labels(spec),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name(spec.plan_id, spec.installation),
                    "uid": owner_uid,
                }
            ],
        },
        "stringData": {_REQUEST_KEY: json.dumps(dict(request), sort_keys=True)},
    }


def plan_job_manifest(spec: PlanJobSpec) -> dict[str, Any]:
    """The batch/v1 Job building the plan (see the module docstring for its rules). Raises InvalidInput naming
    `gpu_product` when none is given (a plan is built for one GPU product)."""
    if not spec.gpu_product:
        raise InvalidInput("A TensorRT plan is built for one GPU product: give gpu_product.", field="gpu_product")
    name = job_name(spec.plan_id, spec.installation)
    labels = plan_labels(spec)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "nodeSelector": {GPU_PRODUCT_LABEL: spec.gpu_product},
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "trtexec",
                "image": spec.image,
                "command": ["python3", "-c", PLAN_PROGRAM],
                "env": [
                    {"name": REQUEST_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": _REQUEST_KEY}}},
                    {"name": "HOME", "value": "/tmp"},
                ],
                "resources": {
                    "requests": {"cpu": spec.cpu, "memory": spec.memory, GPU_RESOURCE: "1"},
                    "limits": {"memory": spec.memory, GPU_RESOURCE: "1"},
                },
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in spec.image_pull_secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(spec.deadline_s),
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


_NON_FINITE = re.compile(r"(?<![\w.])(-?)(nan|inf)(?![\w.])", re.IGNORECASE)


def read_trtexec_outputs(text: str, datatypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Output tensors from trtexec's `--exportOutput` JSON: `[{"name", "dimensions": "AxB", "values": [...]}]`,
    as arrays of the model's Triton `datatypes` (output name -> datatype). trtexec writes non-finite floats as
    `nan`/`inf`, which are read as such. Raises InvalidInput (field `outputs`) for text that is not that."""
    from tritonserving.config import numpy_of_datatype

    cleaned = _NON_FINITE.sub(lambda m: f'"{m.group(1)}{m.group(2).lower()}"', text)
    try:
        entries = json.loads(cleaned)
    except ValueError as exc:
        raise InvalidInput(f"trtexec's outputs are not JSON ({exc}).", field="outputs") from None
    if not isinstance(entries, list):
        raise InvalidInput("trtexec's outputs are not a list of tensors.", field="outputs")
    arrays: dict[str, np.ndarray] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidInput("trtexec's outputs hold an entry without a name.", field="outputs")
        name, dims = entry["name"], str(entry.get("dimensions", ""))
        if not _DIMENSIONS.match(dims):
            raise InvalidInput(f"trtexec's output {name!r} has dimensions {dims!r}.", field="outputs")
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        values = [float(v) if isinstance(v, str) else v for v in entry.get("values") or []]
        if len(values) != math.prod(shape):
            raise InvalidInput(
                f"trtexec's output {name!r} holds {len(values)} values for dimensions {dims}.", field="outputs"
            )
        dtype = numpy_of_datatype(datatypes.get(name, "FP32"))
        arrays[name] = np.asarray(values, dtype=np.float64).astype(dtype).reshape(shape)
    return arrays
