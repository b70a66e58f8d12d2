"""TensorFlow frozen graphs (a `GraphDef` protobuf with its variables folded into constants, `.pb`), converted to
ONNX with tf2onnx.

A frozen graph records no signature, so its interface is discovered: the inputs are its `Placeholder` nodes, the
outputs its sinks (nodes whose outputs no other node reads, leaving out constants, no-ops and checkpoint saving).
A `PlaceholderWithDefault` (a training flag, a dropout rate) takes its default: it is folded into the graph as its
default value (tf2onnx's `use_default`), and the conversion report says so. Tensors are named as their nodes
("logits", not "logits:0"). Sandbox child only for `convert` and `run_source`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from builds.formats._tf import (
    OPSET,
    conversion_report,
    import_tensorflow,
    name_batch_axis,
    rename_tensors,
    run_tf2onnx,
    strip_port,
)
from builds.formats._trees import tool_reason
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["GraphDefFormat", "graph_interface"]

#: Ops that are never a model's output even when nothing reads them.
_NOT_OUTPUTS = frozenset(
    {
        "Const",
        "NoOp",
        "Placeholder",
        "PlaceholderWithDefault",
        "Assert",
        "SaveV2",
        "RestoreV2",
        "VarHandleOp",
        "VariableV2",
        "AssignVariableOp",
        "Assign",
        "MergeV2Checkpoints",
        "ShardedFilename",
        "StringJoin",
    }
)
#: A SavedModel's saved_model.pb: a SavedModel proto (field 1 schema version 1, then field 2 a MetaGraphDef).
_SAVED_MODEL_HEAD = b"\x08\x01\x12"


def _varint_end(head: bytes, position: int) -> int:
    """The index just past the protobuf varint at `position` in `head`, or -1 when it runs off the end."""
    for index in range(position, min(len(head), position + 10)):
        if not head[index] & 0x80:
            return index + 1
    return -1


class GraphDefFormat(ModelFormat):
    """A frozen TensorFlow GraphDef, converted with tf2onnx and served by the `onnxruntime` backend."""

    key: ClassVar[str] = "tf_graphdef"
    title: ClassVar[str] = "TensorFlow frozen graph (GraphDef)"
    suffixes: ClassVar[tuple[str, ...]] = (".pb",)
    converter: ClassVar[str] = "tf2onnx"
    hint_options: ClassVar[tuple[str, ...]] = ("graph_inputs", "graph_outputs")
    upload_hint: ClassVar[str] = (
        "a frozen GraphDef (.pb: variables folded into constants, as convert_variables_to_constants_v2 writes)"
    )

    def matches_head(self, head: bytes) -> bool:
        # GraphDef field 1 (node: a NodeDef, length-delimited), whose own field 1 (name) comes first
        end = _varint_end(head, 1) if head[:1] == b"\n" else -1
        return end > 0 and head[end : end + 1] == b"\n"

    def explain_head(self, head: bytes) -> str:
        if head.startswith(_SAVED_MODEL_HEAD):
            return (
                "This is the saved_model.pb of a TensorFlow SavedModel, which holds no weights without its "
                "variables/ folder. Upload the whole SavedModel folder in one zip or tar (`conch upload MODEL "
                "<folder>` zips it)."
            )
        return ""

    def local_name(self, head: bytes) -> str:
        return "model.pb"

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        import tf2onnx

        graph_def = _read(source)
        inputs, outputs, defaults = graph_interface(graph_def, hints)
        _fold_defaults(graph_def, defaults, inputs)
        started = time.monotonic()
        model, _ = run_tf2onnx(
            self.title,
            lambda: tf2onnx.convert.from_graph_def(
                graph_def,
                input_names=[f"{name}:0" for name in inputs],
                output_names=[f"{name}:0" for name in outputs],
                opset=OPSET,
            ),
        )
        renamed = rename_tensors(
            model, {value.name: strip_port(value.name) for value in (*model.graph.input, *model.graph.output)}
        )
        told_inputs = "the nodes graph_inputs names" if hints.inputs else "the Placeholder nodes"
        told_outputs = (
            "the nodes graph_outputs names" if hints.outputs else "the graph's sinks (nodes nothing else reads)"
        )
        notes = [
            f"inputs: {told_inputs} {', '.join(inputs)}",
            f"outputs: {told_outputs} {', '.join(outputs)}",
            *(f"PlaceholderWithDefault {name!r}: its default value is used (it is not an input)" for name in defaults),
            *renamed,
        ]
        if name_batch_axis(model):
            notes.append("axis 0 of every input and output is the batch axis N (the graph leaves it open)")
        target.write_bytes(model.SerializeToString())
        return conversion_report(model, started=started, notes=notes)

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        tf = import_tensorflow()
        graph_def = _read(source)
        inputs_used, outputs, defaults = graph_interface(graph_def, hints)
        _fold_defaults(graph_def, defaults, inputs_used)
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            values = session.run(
                [f"{name}:0" for name in outputs], feed_dict={f"{name}:0": array for name, array in inputs.items()}
            )
        return {name: np.asarray(value) for name, value in zip(outputs, values, strict=True)}


def graph_interface(graph_def: Any, hints: ConversionHints = NO_HINTS) -> tuple[list[str], list[str], list[str]]:
    """A GraphDef's inputs, outputs and the PlaceholderWithDefault nodes that keep their default, each in graph order.

    Discovered: the inputs are the Placeholder nodes, the outputs the sinks (nodes whose outputs no node reads). The
    user's `hints` replace either: `hints.inputs` must name every Placeholder (a graph cannot run without a value
    for one) and may name PlaceholderWithDefault nodes, which then become inputs; `hints.outputs` may name any node.
    Raises InvalidInput (field "file") for a graph without a Placeholder or a sink, or that still holds variables;
    (field "graph_inputs"/"graph_outputs") for a hint naming no such node, naming what the graph has instead.
    """
    nodes = {node.name: node for node in graph_def.node}
    read = {strip_port(name.lstrip("^")).split(":", 1)[0] for node in graph_def.node for name in node.input}
    placeholders = [node.name for node in graph_def.node if node.op == "Placeholder"]
    with_default = [node.name for node in graph_def.node if node.op == "PlaceholderWithDefault"]
    sinks = [node.name for node in graph_def.node if node.name not in read and node.op not in _NOT_OUTPUTS]
    if any(node.op in ("VarHandleOp", "VariableV2") for node in graph_def.node):
        raise InvalidInput(
            "This graph still holds variables: it is not frozen, so its weights are not in the file. Freeze it "
            "(tf.python.framework.convert_to_constants.convert_variables_to_constants_v2) or upload the "
            "SavedModel folder as a zip instead.",
            field="file",
        )
    inputs = placeholders
    if hints.inputs:
        for name in hints.inputs:
            if name not in nodes or nodes[name].op not in ("Placeholder", "PlaceholderWithDefault"):
                what = f"a {nodes[name].op} node" if name in nodes else "no node of the graph"
                raise InvalidInput(
                    f"graph_inputs names {name!r}, which is {what}; an input must be a Placeholder or a "
                    f"PlaceholderWithDefault. The graph has {_listed('Placeholder', placeholders)} and "
                    f"{_listed('PlaceholderWithDefault', with_default)}.",
                    field="graph_inputs",
                )
        left_out = [name for name in placeholders if name not in hints.inputs]
        if left_out:
            raise InvalidInput(
                f"graph_inputs leaves out the Placeholder {left_out[0]!r}, which the graph cannot run without a "
                "value for: name it too.",
                field="graph_inputs",
            )
        inputs = [name for name in nodes if name in hints.inputs]
    outputs = sinks
    if hints.outputs:
        unknown = [name for name in hints.outputs if name not in nodes]
        if unknown:
            raise InvalidInput(
                f"graph_outputs names {unknown[0]!r}, which is no node of the graph. Its sinks (nodes nothing else "
                f"reads) are {', '.join(sinks) or 'none'}.",
                field="graph_outputs",
            )
        outputs = list(hints.outputs)
    if not inputs:
        raise InvalidInput(
            "This frozen graph has no Placeholder node, so it takes no input. Freeze the graph with its inputs as "
            "Placeholders (convert_variables_to_constants_v2 of a concrete function with an input signature) and "
            "upload it again.",
            field="file",
        )
    if not outputs:
        raise InvalidInput(
            "This frozen graph has no output: every node's result is read by another node. Name its outputs with "
            "the graph_outputs build option, or freeze the graph of the function that computes them.",
            field="file",
        )
    return inputs, outputs, [name for name in with_default if name not in inputs]


def _listed(op: str, names: list[str]) -> str:
    return f"the {op} nodes {', '.join(names)}" if names else f"no {op} node"


def _read(source: Path) -> Any:
    tf = import_tensorflow()
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(source.read_bytes())
    except Exception as error:  # google.protobuf.message.DecodeError
        raise InvalidInput(
            f"This file cannot be read as a TensorFlow GraphDef: {tool_reason(error)}. Upload the frozen graph as "
            "tf.io.write_graph(graph_def, folder, 'model.pb', as_text=False) writes it.",
            field="file",
        ) from None
    return graph_def


def _fold_defaults(graph_def: Any, defaults: list[str], inputs: list[str]) -> None:
    """Turn each PlaceholderWithDefault in `defaults` into an Identity of its default (tf2onnx's `use_default`), and
    each one in `inputs` into a Placeholder (tf2onnx's `ignore_default`)."""
    wanted, fed = set(defaults), set(inputs)
    for node in graph_def.node:
        if node.name in fed and node.op == "PlaceholderWithDefault":
            node.op = "Placeholder"
            del node.input[:]
        elif node.name in wanted:
            node.op = "Identity"
            node.attr["T"].CopyFrom(node.attr["dtype"])
            for attribute in ("dtype", "shape"):
                del node.attr[attribute]
