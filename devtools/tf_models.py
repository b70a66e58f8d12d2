"""Tiny TensorFlow models for tests and benchmarks (development tooling), built with fixed seeds and saved in each
format Conch converts with tf2onnx: Keras (`.keras`, `.h5`), a SavedModel folder, a frozen GraphDef (`.pb`, with a
`PlaceholderWithDefault`) and TFLite.

Each model maps FEATURES FP32 columns to CLASSES softmax probabilities (two Dense layers), so the outputs are real
numbers to compare. Each function returns the path it wrote.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FEATURES = 5
CLASSES = 3


def _tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return tf


def keras_classifier(seed: int = 0) -> Any:
    """A Keras functional model: input `features` FP32 [N, 5] -> output layer `probs` FP32 [N, 3]."""
    tf = _tf()
    tf.keras.utils.set_random_seed(seed)
    features = tf.keras.Input((FEATURES,), name="features")
    hidden = tf.keras.layers.Dense(8, activation="relu", name="hidden")(features)
    probs = tf.keras.layers.Dense(CLASSES, activation="softmax", name="probs")(hidden)
    return tf.keras.Model(features, probs, name="classifier")


def keras_model(path: Path, seed: int = 0) -> Path:
    """`keras_classifier` saved to `path`: Keras 3's zip for a `.keras` path, legacy HDF5 for `.h5`."""
    keras_classifier(seed).save(path)
    return path


def saved_model(folder: Path, seed: int = 0) -> Path:
    """`keras_classifier` exported as a SavedModel (`model.export`): signature serving_default, input `features`,
    output `output_0`."""
    keras_classifier(seed).export(str(folder), verbose=False)
    return folder


def frozen_graph(path: Path, seed: int = 0) -> Path:
    """A frozen GraphDef: Placeholder `x` FP32 [N, 5] and PlaceholderWithDefault `temperature` (scalar, default
    1.0) -> sink `Identity` = softmax(logits / temperature), with the node `logits` FP32 [N, 3] inside."""
    tf = _tf()
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    model = keras_classifier(seed)
    dense = tf.keras.Model(model.input, model.get_layer("probs").output)

    @tf.function(input_signature=[tf.TensorSpec((None, FEATURES), tf.float32, name="x")])
    def compute(x: Any) -> Any:
        temperature = tf.raw_ops.PlaceholderWithDefault(input=tf.constant(1.0), shape=[], name="temperature")
        logits = tf.identity(tf.math.log(dense(x)), name="logits")
        return tf.nn.softmax(logits / temperature)

    frozen = convert_variables_to_constants_v2(compute.get_concrete_function())
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    return path


def tflite_model(path: Path, seed: int = 0) -> Path:
    """`keras_classifier` converted with tf.lite.TFLiteConverter (FP32, no quantization): signature inputs
    `features`, outputs `output_0`."""
    tf = _tf()
    converter = tf.lite.TFLiteConverter.from_keras_model(keras_classifier(seed))
    path.write_bytes(converter.convert())
    return path
