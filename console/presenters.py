"""What the console's pages show, computed from plain data: signature tables and client snippets (pure)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from builds.formats import describe_formats
from builds.inspection import short_dim_name
from builds.model_config import adds_served_axis
from conch.errors import InvalidInput
from tritonserving.config import config_from_pbtxt

#: Triton datatype -> the numpy dtype name a Python client builds its arrays with (Triton "Datatypes" table).
NUMPY_DTYPES = {
    "BOOL": "bool_",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object_",
}


@dataclass(frozen=True)
class TensorRow:
    """One row of a signature table: the tensor's name, Triton datatype, and its axes as text, each an int size
    or `?` (sized per request, with its symbolic name when the file has one); `batch_axis` says whether axis 0
    is the batch axis Triton adds (the model batches, max_batch_size > 0)."""

    name: str
    datatype: str
    axes: tuple[str, ...]
    batch_axis: bool
    #: Whether the last axis ("1") is Triton's, not the model's: see `signature_rows`.
    added_axis: bool = False

    @property
    def shown_axes(self) -> list[tuple[str, str]]:
        """(short, full) text of each axis: a long symbolic name is shortened (`short_dim_name`) and the page shows
        the full one on hover."""
        shown = []
        for axis in self.axes:
            name = axis[len("? (") : -1] if axis.startswith("? (") and axis.endswith(")") else ""
            shown.append((f"? ({short_dim_name(name)})" if name else axis, axis))
        return shown

    @property
    def example_shape(self) -> list[int]:
        """A shape a request may send: 1 for the batch axis and for every axis sized per request."""
        return [int(axis) if axis.isdigit() else 1 for axis in self.axes]


def max_batch_size_of(config_pbtxt: str) -> int:
    """`max_batch_size` of a model configuration in text form (0: the model does not batch, or no config yet)."""
    if not config_pbtxt.strip():
        return 0
    try:
        return config_from_pbtxt(config_pbtxt).max_batch_size
    except InvalidInput:
        return 0


def format_title(key: str) -> str:
    """The title of a model format by its key ("keras" -> "Keras model"); the key itself for one Conch no longer
    lists, "" for none."""
    if not key:
        return ""
    for item in describe_formats():
        if item["key"] == key:
            return str(item["title"])
    return key


def served_by_onnxruntime(config_pbtxt: str) -> bool:
    """Whether a model configuration in text form is served by ONNX Runtime (what a TensorRT plan is made from)."""
    if not config_pbtxt.strip():
        return False
    try:
        config = config_from_pbtxt(config_pbtxt)
    except InvalidInput:
        return False
    return config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"


def signature_rows(signature: dict[str, Any] | None, *, batching: bool) -> dict[str, list[TensorRow]]:
    """{"inputs": [TensorRow], "outputs": [TensorRow]} of a version's inspected signature
    (`ModelSignature.to_dict()`; None before inspection gives empty lists), with the shapes clients send and
    receive. With `batching`, axis 0 of every tensor is the batch axis, and a tensor whose only axis is the batch
    axis (a tree classifier's `label` [N]) is served as [N, 1] (`added_axis`): Triton needs one dimension besides
    the batch axis and Conch configures it as `dims: [1]` with an empty `reshape` (Triton "Model Configuration"
    -> "Reshape"). Without batching, a scalar input is sent as [1] the same way."""
    rows: dict[str, list[TensorRow]] = {"inputs": [], "outputs": []}
    for kind in rows:
        for tensor in (signature or {}).get(kind, []):
            dims = list(tensor.get("dims", []))
            names = list(tensor.get("dim_names") or [None] * len(dims))
            axes = tuple(
                str(size) if size >= 0 else (f"? ({name})" if name else "?")
                for size, name in zip(dims, names, strict=False)
            )
            # a non-batching scalar output may come back as a scalar: only inputs are sure to carry the axis
            added = adds_served_axis(len(dims), batching=batching) and (batching or kind == "inputs")
            rows[kind].append(
                TensorRow(
                    name=tensor["name"],
                    datatype=tensor["datatype"],
                    axes=(*axes, "1") if added else axes,
                    batch_axis=batching and bool(dims),
                    added_axis=added,
                )
            )
    return rows


def curl_snippet(*, gateway_url: str, model_name: str, inputs: list[TensorRow]) -> str:
    """A shell snippet that checks the deployment through the inference gateway and sends one inference read
    from request.json (its inputs' names, shapes and datatypes filled in, the data left to the user: a flat
    list of shape-product numbers). `$CONCH_TOKEN` stands for an API token with the `infer` scope."""
    body = {
        "inputs": [
            {"name": row.name, "shape": row.example_shape, "datatype": row.datatype, "data": []} for row in inputs
        ]
    }
    sizes = ", ".join(f"{row.name}: {math.prod(row.example_shape)}" for row in inputs)
    return (
        f'curl -H "Authorization: Bearer $CONCH_TOKEN" {gateway_url}/v2/models/{model_name}\n'
        f"# request.json: fill each data list with its shape's count of values ({sizes or 'no inputs'})\n"
        f"cat > request.json <<'JSON'\n{json.dumps(body)}\nJSON\n"
        f'curl -X POST -H "Authorization: Bearer $CONCH_TOKEN" -H "Content-Type: application/json" \\\n'
        f"  --data @request.json {gateway_url}/v2/models/{model_name}/infer"
    )


def tritonclient_snippet(
    *, gateway_url: str, model_name: str, inputs: list[TensorRow], outputs: list[TensorRow]
) -> str:
    """A Python snippet with NVIDIA's `tritonclient` sending one inference of zeros through the gateway (which
    takes the URL without its scheme); `CONCH_TOKEN` in the environment stands for the token."""
    address = gateway_url.split("://", 1)[-1]
    lines = [
        "import os",
        "",
        "import numpy as np",
        "import tritonclient.http as httpclient",
        "",
        f'client = httpclient.InferenceServerClient(url="{address}")',
        'headers = {"Authorization": f"Bearer {os.environ[\'CONCH_TOKEN\']}"}',
        "inputs = []",
    ]
    for row in inputs:
        dtype = NUMPY_DTYPES.get(row.datatype, "float32")
        lines += [
            f'tensor = httpclient.InferInput("{row.name}", {row.example_shape}, "{row.datatype}")',
            f"tensor.set_data_from_numpy(np.zeros({row.example_shape}, dtype=np.{dtype}))",
            "inputs.append(tensor)",
        ]
    lines += [
        "# a new dict of headers per call: tritonclient writes into it",
        f'result = client.infer("{model_name}", inputs, headers=dict(headers))',
    ]
    lines += [f'print(result.as_numpy("{row.name}"))' for row in outputs]
    return "\n".join(lines)


def in_use_message(what: str, users: list[dict[str, Any]]) -> str:
    """What the console says when `what` (e.g. "Version 3 of adder") cannot be deleted because deployments not
    stopped use it: `users` are the InUse error's [{"id", "name"}], named with what to do on their pages."""
    named = ", ".join(f"'{user['name']}'" for user in users)
    count = len(users)
    return (
        f"{what} is used by {count} deployment{'s' if count != 1 else ''} not stopped: {named}. On "
        f"{'each' if count != 1 else 'its'} deployment's page, press “Stop deployment…” or serve another version "
        "with “Switch version”, then delete again."
    )


def already_member_message(username: str, team_slug: str) -> str:
    """What the console says when the user to add is already a member of the team."""
    return (
        f"'{username}' is already a member of team '{team_slug}'; change their role in the “Members and roles” "
        "table (pick the role, then Save)."
    )


def pipeline_graph(spec: dict, graph: dict) -> dict:
    """The drawing of a pipeline version for its page: boxes for its inputs, steps and outputs laid out left to
    right by depth (a step one column after the steps it takes tensors from), and an arrow per tensor from its
    producer to each consumer, labelled with its name, datatype and shape.

    Returns {"width", "height", "box_w", "box_h", "nodes": [{"id", "label", "detail", "x", "y", "kind"}], "edges":
    [{"path", "label", "label_x", "label_y"}]} in SVG user units (`path`: an SVG path's `d`).
    """
    box_w, box_h, gap_x, gap_y = 170, 46, 110, 40
    tensors = graph.get("tensors", {})
    steps = {step["name"]: step for step in spec.get("steps", [])}
    depth: dict[str, int] = {f"in:{name}": 0 for name in spec.get("inputs", {})}
    for name in graph.get("order", []):
        sources = [tensors.get(t, {}).get("producer", "") for t in steps[name]["inputs"].values()]
        depth[name] = 1 + max((depth.get(s if s != "input" else "", 0) for s in sources), default=0)
    last = max(depth.values(), default=0) + 1
    for name in spec.get("outputs", []):
        depth[f"out:{name}"] = last
    columns: dict[int, list[str]] = {}
    for node, level in depth.items():
        columns.setdefault(level, []).append(node)
    position = {}
    for level, nodes in columns.items():
        for row, node in enumerate(nodes):
            position[node] = (20 + level * (box_w + gap_x), 40 + row * (box_h + gap_y))
    nodes = []
    for node, (x, y) in position.items():
        if node.startswith("in:"):
            name = node[3:]
            t = spec["inputs"][name]
            nodes.append(
                {
                    "id": node,
                    "label": name,
                    "detail": f"input {t['datatype']} {t['dims']}",
                    "x": x,
                    "y": y,
                    "kind": "input",
                }
            )
        elif node.startswith("out:"):
            name = node[4:]
            t = tensors.get(name, {})
            nodes.append(
                {
                    "id": node,
                    "label": name,
                    "detail": f"output {t.get('datatype', '')} {t.get('dims', '')}",
                    "x": x,
                    "y": y,
                    "kind": "output",
                }
            )
        else:
            step = steps[node]
            nodes.append(
                {
                    "id": node,
                    "label": node,
                    "detail": f"{step['model']}:{step['version']}",
                    "x": x,
                    "y": y,
                    "kind": "step",
                }
            )
    edges = []

    def anchor(node: str, side: str) -> tuple[int, int]:
        x, y = position[node]
        return (x + box_w if side == "out" else x, y + box_h // 2)

    def edge(x1: int, y1: int, x2: int, y2: int, label: str) -> dict:
        # An arrow that skips a column bends above the boxes between its ends, so it crosses none of them.
        lift = 0 if x2 - x1 <= gap_x else min(y1, y2) - box_h // 2 - 16
        middle_y = (y1 + y2) // 2 if not lift else lift
        start_y, end_y = (lift, lift) if lift else (y1, y2)
        path = f"M {x1} {y1} C {x1 + gap_x // 2} {start_y}, {x2 - gap_x // 2} {end_y}, {x2} {y2}"
        return {"path": path, "label": label, "label_x": (x1 + x2) // 2, "label_y": middle_y - 4}

    for name, step in steps.items():
        for tensor in step["inputs"].values():
            producer = tensors.get(tensor, {}).get("producer", "")
            source = f"in:{tensor}" if producer == "input" else producer
            if source in position and name in position:
                (x1, y1), (x2, y2) = anchor(source, "out"), anchor(name, "in")
                t = tensors.get(tensor, {})
                edges.append(edge(x1, y1, x2, y2, f"{tensor} {t.get('datatype', '')}"))
    for name in spec.get("outputs", []):
        producer = tensors.get(name, {}).get("producer", "")
        if producer in position:
            (x1, y1), (x2, y2) = anchor(producer, "out"), anchor(f"out:{name}", "in")
            edges.append(edge(x1, y1, x2, y2, name))
    width = 40 + (last + 1) * (box_w + gap_x) - gap_x
    height = 60 + max((len(c) for c in columns.values()), default=1) * (box_h + gap_y) - gap_y
    return {"width": width, "height": height, "box_w": box_w, "box_h": box_h, "nodes": nodes, "edges": edges}
