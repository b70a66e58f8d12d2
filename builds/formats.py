"""Which files Conch can build, told cheaply from a file's name and first bytes: ONNX models, a binary protobuf
`ModelProto` (Triton's onnxruntime backend serves them; no other format is built).

Pure (no onnx import), so the edges refuse another format before its bytes are stored: the resumable upload's start
checks the promised filename, the single-request upload its filename and then its first bytes as they stream in, and
the build's inspect step checks the first bytes again on the stored copy (`builds.inspection`). The `conch` CLI
asks the server (POST /api/v1/uploads/check/, `builds.services.check_upload_file`) before it sends a file: the rules
exist here only.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from conch.errors import InvalidInput

__all__ = ["HEAD_BYTES", "MODEL_SUFFIX", "check_model_filename", "check_model_head", "starts_like_onnx"]

#: The file name ending of the one format Conch builds.
MODEL_SUFFIX = ".onnx"
#: How many first bytes `check_model_head` wants to name a foreign format (2 are enough to accept ONNX).
HEAD_BYTES = 512
# Highest IR version we accept in the first field when sniffing; onnx 1.23 writes 11, leave headroom.
_MAX_SNIFF_IR_VERSION = 30
_LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
#: File name endings of formats people upload by mistake, and what to do about each.
_FOREIGN_SUFFIXES = {
    (".pt", ".pth", ".ckpt"): "a PyTorch checkpoint; export it with torch.onnx.export and upload the .onnx file",
    (".bin", ".safetensors"): "a weights file (no graph); export the whole model to ONNX, for example with "
    "`optimum-cli export onnx`, and upload the .onnx file",
    (".pkl", ".pickle", ".joblib"): "a Python pickle; export the model with skl2onnx or torch.onnx.export",
    (".h5", ".hdf5", ".keras", ".pb", ".tflite"): "a Keras or TensorFlow model; convert it with tf2onnx",
    (".zip", ".gz", ".tgz", ".tar", ".xz", ".bz2", ".7z"): "an archive; extract the .onnx file and upload that",
}


def check_model_filename(filename: str, *, field: str) -> None:
    """Raise InvalidInput naming `field` when the file's name says it is not an ONNX model.

    A name ending in `.onnx` (any case) passes, and so does a name without any ending (its first bytes decide).
    Any other ending is refused, with what the format is when it is a common one (`.pt`, `.bin`, `.h5`, `.zip`…)
    and how to rename a real ONNX file.
    """
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    if not suffix or suffix == MODEL_SUFFIX:
        return
    what = next((advice for endings, advice in _FOREIGN_SUFFIXES.items() if suffix in endings), "")
    detail = f"{filename!r} is not an ONNX model file: Conch builds ONNX models, files whose name ends in .onnx"
    detail += f"; a {suffix} file is usually {what}." if what else "."
    detail += " If it is an ONNX model, rename it to end in .onnx."
    raise InvalidInput(detail, field=field)


def starts_like_onnx(head: bytes) -> bool:
    """True when the file opens with ModelProto field 1 (ir_version, varint) holding a plausible version.

    Protobuf serializers write fields in field-number order, and every exporter sets ir_version, so a real
    ONNX file starts with tag byte 0x08 followed by a small varint. Two bytes are enough.
    """
    return len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= _MAX_SNIFF_IR_VERSION


def check_model_head(head: bytes, *, size_bytes: int | None = None, field: str = "file") -> None:
    """Raise InvalidInput naming `field` when the first bytes of a file show it is not an ONNX protobuf.

    `head` is the file's first HEAD_BYTES bytes (all of it when shorter); `size_bytes` the whole file's size when
    known (a Git LFS pointer's message names it). The message names a well-known other format when the bytes
    show one (a PNG, a ZIP such as a PyTorch .pt, a pickle, HTML, text, a Git LFS pointer…) and what to do.
    """
    if head.startswith(_LFS_POINTER_PREFIX):
        real_size = re.search(rb"^size (\d+)", head, re.MULTILINE)
        about = f" (the real file is {int(real_size.group(1)):,} bytes)" if real_size else ""
        size = size_bytes if size_bytes is not None else len(head)
        raise InvalidInput(
            f"This is a Git LFS pointer file, a {size}-byte text stub that stands in for the model{about}, "
            "not the model itself. The repository you cloned stores the model with Git LFS: run `git lfs pull` "
            "in it (install Git LFS first with `git lfs install`), then upload the real .onnx file.",
            field=field,
        )
    if starts_like_onnx(head):
        return
    kind, advice = _foreign_format(head)
    if kind:
        raise InvalidInput(f"This is not an ONNX model: it looks like {kind}. {advice}", field=field)
    shown = " ".join(f"{byte:02x}" for byte in head[:8])
    raise InvalidInput(
        "This is not an ONNX model: an ONNX file is a binary protobuf `ModelProto` that begins with its IR "
        f"version field, but this file begins with the bytes {shown}. Export the model to ONNX (for "
        "example with torch.onnx.export, tf2onnx or skl2onnx) and upload the resulting .onnx file.",
        field=field,
    )


def _foreign_format(head: bytes) -> tuple[str, str]:
    """Name a well-known non-ONNX format from its magic bytes; ("", "") when none matches."""
    export = "Export the model to ONNX and upload the .onnx file."
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "a PNG image", "Upload the model file, not a picture. " + export
    if head.startswith(b"\xff\xd8\xff"):
        return "a JPEG image", "Upload the model file, not a picture. " + export
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "a GIF image", "Upload the model file, not a picture. " + export
    if head.startswith(b"%PDF-"):
        return "a PDF document", export
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return (
            "a ZIP archive (a zipped folder, a PyTorch .pt/.pth checkpoint or a Keras .keras file)",
            (
                "If it contains a .onnx file, unzip it and upload that file; a PyTorch checkpoint must first "
                "be exported with torch.onnx.export."
            ),
        )
    if head.startswith(b"\x1f\x8b"):
        return "a gzip-compressed file (such as .tar.gz)", "Extract the .onnx file from it and upload that."
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "an HDF5 file (such as a Keras .h5 model)", "Convert it with tf2onnx and upload the .onnx file."
    if head[4:8] == b"TFL3":
        return "a TensorFlow Lite model", "Convert it with `python -m tf2onnx.convert --tflite` first."
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return (
            "a Python pickle (such as a PyTorch or scikit-learn checkpoint)",
            "Export the model to ONNX (torch.onnx.export, skl2onnx) and upload the .onnx file.",
        )
    if len(head) > 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 0 and b'"' in head[8:40]:
        return (
            "a safetensors weights file (weights only, no graph)",
            "Export the whole model to ONNX (for example `optimum-cli export onnx`) and upload the .onnx file.",
        )
    text = _as_text(head)
    if text is not None:
        stripped = text.lstrip().lower()
        if stripped.startswith(("<!doctype html", "<html")):
            return (
                "an HTML web page (often an error or login page saved instead of the download)",
                (
                    "Download the raw model file (on Hugging Face use the 'download' link, which contains "
                    "/resolve/) and upload it."
                ),
            )
        first_line = text.strip().splitlines()[0][:60] if text.strip() else ""
        return f"a text file (it starts with {first_line!r})", export
    return "", ""


def _as_text(head: bytes) -> str | None:
    """Return `head` decoded when it is printable UTF-8 text, else None."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # A multi-byte character may be cut at the end of the head; retry without the last few bytes.
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return None
    printable = sum(ch.isprintable() or ch in "\r\n\t" for ch in text)
    return text if text and printable / len(text) > 0.95 else None
