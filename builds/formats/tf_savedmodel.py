"""TensorFlow SavedModels (a folder: `saved_model.pb` and `variables/`, uploaded as a zip or tar of it), converted to
ONNX with tf2onnx from their serving signature.

The signature is `serving_default` (what `tf.saved_model.save` and Keras' `model.export` write), or the only one
when there is a single other; its input and output keys become the converted model's tensor names, so a request
names the tensors as the signature does. Sandbox child only for `convert` and `run_source`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import ClassVar

import numpy as np

from builds.formats._tf import (
    OPSET,
    conversion_report,
    import_tensorflow,
    name_batch_axis,
    run_tf2onnx,
)
from builds.formats._trees import tool_reason
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from conch.errors import InvalidInput

__all__ = ["SavedModelFormat"]

#: The signature Conch serves when a SavedModel has it (TensorFlow's default serving signature key).
DEFAULT_SIGNATURE = "serving_default"
_TAG = "serve"


class SavedModelFormat(ModelFormat):
    """A TensorFlow SavedModel folder, converted with tf2onnx and served by the `onnxruntime` backend."""

    key: ClassVar[str] = "tf_savedmodel"
    title: ClassVar[str] = "TensorFlow SavedModel"
    suffixes: ClassVar[tuple[str, ...]] = ()
    converter: ClassVar[str] = "tf2onnx"
    upload_hint: ClassVar[str] = (
        "a zip or tar of the SavedModel folder (saved_model.pb and variables/) that tf.saved_model.save or Keras' "
        "model.export writes; `conch upload MODEL <folder>` zips it"
    )

    def matches_head(self, head: bytes) -> bool:
        return False  # a folder, never one file

    def find_in_folder(self, folder: Path, files: Sequence[str]) -> Path | None:
        roots = sorted(
            {str(PurePosixPath(name).parent) for name in files if PurePosixPath(name).name == "saved_model.pb"}
        )
        if len(roots) > 1:
            raise InvalidInput(
                f"The archive holds {len(roots)} SavedModels ({', '.join(roots[:5])}); Conch builds one model per "
                "upload. Upload each SavedModel folder in an archive of its own.",
                field="file",
            )
        return (folder / roots[0]) if roots else None

    def convert(self, source: Path, target: Path, hints: ConversionHints = NO_HINTS) -> Conversion:
        import tf2onnx

        signature, inputs, outputs = _signature(source)
        started = time.monotonic()
        graph_def, input_tensors, output_tensors, renames = run_tf2onnx(
            self.title,
            lambda: tf2onnx.tf_loader.from_saved_model(
                str(source), None, None, tag=_TAG, signatures=[signature], return_tensors_to_rename=True
            ),
        )
        model, _ = run_tf2onnx(
            self.title,
            lambda: tf2onnx.convert.from_graph_def(
                graph_def,
                input_names=input_tensors,
                output_names=output_tensors,
                tensors_to_rename=renames,
                opset=OPSET,
            ),
        )
        # tensors_to_rename names each input and output by its signature key
        notes = [f"signature {signature!r} (tag {_TAG!r}): inputs {', '.join(inputs)}; outputs {', '.join(outputs)}"]
        if name_batch_axis(model):
            notes.append("axis 0 of every input and output is the batch axis N (the signature leaves it open)")
        target.write_bytes(model.SerializeToString())
        return conversion_report(model, started=started, notes=notes)

    def run_source(
        self, source: Path, inputs: Mapping[str, np.ndarray], hints: ConversionHints = NO_HINTS
    ) -> dict[str, np.ndarray]:
        tf = import_tensorflow()
        signature, _, _ = _signature(source)
        function = tf.saved_model.load(str(source)).signatures[signature]
        outputs = function(**{name: tf.constant(array) for name, array in inputs.items()})
        return {name: np.asarray(value) for name, value in outputs.items()}


def _signature(folder: Path) -> tuple[str, list[str], list[str]]:
    """The serving signature's key, input keys and output keys. Raises InvalidInput when TensorFlow cannot load
    the SavedModel, or when it has several signatures and none is `serving_default`."""
    tf = import_tensorflow()
    try:
        loaded = tf.saved_model.load(str(folder), tags=[_TAG])
    except Exception as error:  # TensorFlow raises OSError, ValueError, RuntimeError and its own errors
        raise InvalidInput(
            f"TensorFlow cannot load this SavedModel: {tool_reason(error)}. Upload the whole folder that "
            "tf.saved_model.save (or model.export) wrote, saved_model.pb with its variables/ folder, in one archive.",
            field="file",
        ) from None
    keys = sorted(loaded.signatures.keys())
    if DEFAULT_SIGNATURE in keys:
        signature = DEFAULT_SIGNATURE
    elif len(keys) == 1:
        signature = keys[0]
    else:
        raise InvalidInput(
            f"The SavedModel has {'no serving signature' if not keys else 'the signatures ' + ', '.join(keys)} "
            f"and none is {DEFAULT_SIGNATURE!r}, so Conch cannot tell which function to serve. Save it with "
            "tf.saved_model.save(model, folder, signatures={'serving_default': function}) and upload it again.",
            field="file",
        )
    function = loaded.signatures[signature]
    _, named_inputs = function.structured_input_signature
    outputs = function.structured_outputs
    if not isinstance(outputs, Mapping):
        raise InvalidInput(
            f"The signature {signature!r} returns no named outputs. Save the SavedModel with a signature that returns "
            "a dict of tensors and upload it again.",
            field="file",
        )
    return signature, sorted(named_inputs), sorted(outputs)
