"""A cheap local check that a file is a model Conch can build, before `conch upload` hashes or sends a byte.

Conch builds ONNX models only: a binary protobuf `ModelProto`. The rules are the server's (`builds.formats`, copied
here because the CLI imports no server code): a name ending in `.onnx` or without any ending, and first bytes that
are ModelProto's field 1 (`ir_version`, tag byte 0x08) holding a small varint. The server applies the same rules
(the resumable upload's start refuses the name; the build's inspection reads the bytes), so this only saves the
upload of a file that would be refused anyway.
"""

from __future__ import annotations

from pathlib import Path

from conch_cli.errors import USAGE, CliError

#: What Conch builds, in the words of the error messages.
ACCEPTS = "Conch builds ONNX models: a .onnx file (a binary protobuf ModelProto, as torch.onnx.export writes)"
MODEL_SUFFIX = ".onnx"
#: Highest ONNX IR version the first field may hold (onnx 1.23 writes 11; the server allows up to 30 as well).
MAX_IR_VERSION = 30

_SUFFIX_HINTS = {
    (".pt", ".pth", ".ckpt"): "a PyTorch checkpoint: export it with torch.onnx.export",
    (".bin", ".safetensors"): "a weights file without the graph: export the whole model to ONNX "
    "(for example with `optimum-cli export onnx`)",
    (".pkl", ".pickle", ".joblib"): "a Python pickle: export the model with skl2onnx or torch.onnx.export",
    (".h5", ".hdf5", ".keras", ".pb", ".tflite"): "a Keras or TensorFlow model: convert it with tf2onnx",
    (".zip", ".gz", ".tgz", ".tar", ".xz", ".bz2", ".7z"): "an archive: extract the .onnx file and upload that",
}


def _head_kind(head: bytes) -> str:
    """What the first bytes look like when they are not ONNX, in a few words ("" when unknown)."""
    if head.startswith(b"version https://git-lfs.github.com/spec/v1"):
        return "a Git LFS pointer (run `git lfs pull` to fetch the real file)"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "a ZIP archive (such as a PyTorch .pt checkpoint)"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "a Python pickle (such as a PyTorch or scikit-learn checkpoint)"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "an HDF5 file (such as a Keras .h5 model)"
    if head.startswith(b"\x1f\x8b"):
        return "a gzip-compressed file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    if text and sum(ch.isprintable() or ch in "\r\n\t" for ch in text) / len(text) > 0.95:
        return "a text file"
    return ""


def check_model_file(path: Path) -> None:
    """Raise CliError (USAGE, field `file`) naming `path` and what Conch accepts when the file cannot be a model
    Conch builds: a name ending other than `.onnx`, or first bytes that are not an ONNX protobuf's. Reads 2 bytes
    (16 when they are not ONNX, to say what the file looks like); an empty file is refused too."""
    suffix = path.suffix.lower()
    if suffix and suffix != MODEL_SUFFIX:
        hint = next((text for endings, text in _SUFFIX_HINTS.items() if suffix in endings), "")
        raise CliError(
            f"{path} is not an ONNX model file: {ACCEPTS}; its name ends in {suffix}"
            + (f", usually {hint}" if hint else "")
            + ". If it is an ONNX model, rename it to end in .onnx.",
            USAGE,
            field="file",
        )
    with path.open("rb") as handle:
        head = handle.read(16)
    if not head:
        raise CliError(f"{path} is empty (0 bytes): {ACCEPTS}.", USAGE, field="file")
    if len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= MAX_IR_VERSION:
        return
    kind = _head_kind(head)
    shown = " ".join(f"{byte:02x}" for byte in head[:8])
    raise CliError(
        f"{path} is not an ONNX model: {ACCEPTS}, which begins with its IR version field (bytes 08 01 to 08 1e), "
        f"but this file begins with {shown}" + (f" and looks like {kind}" if kind else "") + ".",
        USAGE,
        field="file",
    )
