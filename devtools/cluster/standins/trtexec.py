"""A stand-in for TensorRT's `trtexec`, for the test kubelet's TensorRT-image containers (see the package doc).

Takes the options Conch's plan Job uses, with trtexec's spelling: `--onnx=F --saveEngine=P [--fp16]
[--minShapes= --optShapes= --maxShapes=]` builds a "plan"; `--loadEngine=P --loadInputs='name':file,...
--shapes='name':AxB,... --exportOutput=F` runs it once and writes the outputs in trtexec's `--exportOutput` JSON
(`[{"name", "dimensions": "AxB", "values": [...]}]`). Like TensorRT's ONNX parser, it refuses operators outside the
default ONNX domain (`ai.onnx.ml` tree ensembles, custom ops) with "No importer registered for op". With `--fp16`
floating outputs are rounded through float16, as FP16 kernels would.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from devtools.cluster.standins import STANDIN_MAGIC

VERSION_LINE = "[I] TensorRT version: 0.0.0 (Conch's trtexec stand-in: no TensorRT runs here)"
_ENTRY = re.compile(r"'([^']*)':([^,]*)|([^,:]+):([^,]*)")


def _options(argv: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for arg in argv:
        if not arg.startswith("--"):
            sys.exit(f"[E] unknown argument {arg}")
        name, _, value = arg[2:].partition("=")
        options[name] = value
    return options


def _entries(text: str) -> dict[str, str]:
    return {
        (m.group(1) if m.group(1) is not None else m.group(3)): (m.group(2) or m.group(4) or "")
        for m in _ENTRY.finditer(text)
    }


def build(options: dict[str, str]) -> int:
    model = onnx.load(options["onnx"])
    for index, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx"):
            print(
                f"[E] [TRT] ModelImporter.cpp:949: While parsing node number {index} [{node.op_type} -> "
                f'"{node.output[0] if node.output else ""}"]:'
            )
            print(
                f'[E] [TRT] ModelImporter.cpp:953: --- Begin node ---\ninput: "{node.input[0] if node.input else ""}"'
            )
            print(
                f"[E] [TRT] ModelImporter.cpp:956: ERROR: onnxOpImporters.cpp: No importer registered for op: "
                f"{node.op_type}. Attempting to import as plugin."
            )
            print("[E] Failed to parse onnx file")
            return 1
    tag = b"fp16\n" if "fp16" in options else b"fp32\n"
    Path(options["saveEngine"]).write_bytes(STANDIN_MAGIC + tag + model.SerializeToString())
    print(f"[I] Engine built; saved to {options['saveEngine']}")
    return 0


def run(options: dict[str, str]) -> int:
    data = Path(options["loadEngine"]).read_bytes()
    if not data.startswith(STANDIN_MAGIC):
        print("[E] Error[1]: IRuntime::deserializeCudaEngine: not a plan this stand-in made")
        return 1
    tag, _, model = data[len(STANDIN_MAGIC) :].partition(b"\n")
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    files, shapes = _entries(options.get("loadInputs", "")), _entries(options.get("shapes", ""))
    feeds = {}
    for item in session.get_inputs():
        dtype = _ort_dtype(item.type)
        shape = [int(d) for d in shapes[item.name].split("x")] if item.name in shapes else [int(d) for d in item.shape]
        feeds[item.name] = np.fromfile(files[item.name], dtype=dtype).reshape(shape)
    names = [item.name for item in session.get_outputs()]
    outputs = session.run(names, feeds)
    entries = []
    for name, array in zip(names, outputs, strict=True):
        array = np.asarray(array)
        if tag == b"fp16" and array.dtype.kind == "f":
            array = array.astype(np.float16).astype(array.dtype)
        entries.append(
            {"name": name, "dimensions": "x".join(str(d) for d in array.shape), "values": array.reshape(-1).tolist()}
        )
    Path(options["exportOutput"]).write_text(json.dumps(entries, indent=1))
    return 0


def _ort_dtype(type_name: str) -> np.dtype:
    names = {"float": "float32", "double": "float64", "float16": "float16", "bool": "bool"}
    inner = type_name[len("tensor(") : -1]
    return np.dtype(names.get(inner, inner))


def main(argv: list[str] | None = None) -> int:
    options = _options(sys.argv[1:] if argv is None else argv)
    print(VERSION_LINE, flush=True)
    if "onnx" in options:
        return build(options)
    if "loadEngine" in options:
        return run(options)
    print("[E] give --onnx or --loadEngine")
    return 1


if __name__ == "__main__":
    sys.exit(main())
