"""The model formats Conch builds, and how a file's format is told from its name and first bytes.

Each format is one module holding one `ModelFormat` (`builds.formats.base`); `FORMATS` lists them. Telling the
format is pure and cheap (no framework import), so the edges refuse a file Conch cannot build before its bytes are
stored: the resumable upload's start checks the promised filename and first bytes, the single-request upload its
filename and then its first bytes as they stream in, and the build's inspect step tells the stored copy's format
again (`detect_format`). The `conch` CLI and the browser ask the server (POST /api/v1/uploads/check/) before they
send a file: the rules exist here only. `GET /api/v1/formats/` lists `FORMATS` (`describe_formats`).

A file's format is decided by its name and its content together, never by the name alone: the name's ending
narrows the formats (a name without an ending allows all), and the first bytes must then be one of those formats'.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from builds.formats.archive import ArchiveFormat, archive_kind
from builds.formats.base import NO_HINTS, Conversion, ConversionHints, ModelFormat
from builds.formats.keras import KerasFormat
from builds.formats.lightgbm_text import LightGBMFormat
from builds.formats.onnx import OnnxFormat, starts_like_onnx
from builds.formats.python_model import PythonModelFormat
from builds.formats.sklearn_pickle import SklearnPickleFormat
from builds.formats.tensorrt_plan import TensorRTPlanFormat
from builds.formats.tf_graphdef import GraphDefFormat
from builds.formats.tf_savedmodel import SavedModelFormat
from builds.formats.tflite import TFLiteFormat
from builds.formats.torch_export import TorchExportFormat
from builds.formats.torchscript import TorchScriptFormat
from builds.formats.triton_repository import TritonRepositoryFormat
from builds.formats.xgboost_model import XGBoostFormat
from conch.errors import InvalidInput

__all__ = [
    "FORMATS",
    "HEAD_BYTES",
    "NO_HINTS",
    "Conversion",
    "ConversionHints",
    "ModelFormat",
    "check_model_filename",
    "check_model_head",
    "archive_kind",
    "check_format_allowed",
    "describe_formats",
    "detect_format",
    "find_model_in_folder",
    "format_allowed",
    "format_by_key",
    "formats_allowed",
    "starts_like_onnx",
]

#: The formats Conch builds, in the order the formats list shows them.
FORMATS: tuple[ModelFormat, ...] = (
    OnnxFormat(),
    LightGBMFormat(),
    XGBoostFormat(),
    SklearnPickleFormat(),
    KerasFormat(),
    SavedModelFormat(),
    GraphDefFormat(),
    TFLiteFormat(),
    TorchScriptFormat(),
    TorchExportFormat(),
    TensorRTPlanFormat(),
    TritonRepositoryFormat(),
    PythonModelFormat(),
    ArchiveFormat(),
)
#: The formats that may claim an unpacked archive's folder, in the order they are asked: a Python model first (its
#: model.py sits at the top, beside a config.pbtxt and any model files it reads), then a Triton model repository,
#: since its config.pbtxt says how the model files beside it are served.
_FOLDER_FORMATS: tuple[ModelFormat, ...] = tuple(
    sorted(
        (f for f in FORMATS if not f.container),
        key=lambda f: (not isinstance(f, PythonModelFormat), not isinstance(f, TritonRepositoryFormat)),
    )
)
#: How many first bytes `check_model_head` wants to tell a format (and to name a foreign one).
HEAD_BYTES = 512

_LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
#: File name endings of formats people upload that Conch does not build (yet), and what to do about each.
_FOREIGN_SUFFIXES = {
    (".ckpt",): "a training checkpoint (PyTorch Lightning, TensorFlow): weights without a servable graph; save the "
    "model as TorchScript (torch.jit.script(model).save('model.pt')), as an exported program (torch.export.save, "
    ".pt2) or as ONNX, and upload that file",
    (".bin", ".safetensors"): "a weights file (no graph); export the whole model to ONNX, for example with "
    "`optimum-cli export onnx`, and upload the .onnx file",
    (".gz", ".xz", ".bz2"): "a compressed file; Conch unpacks .zip, .tar, .tar.gz, .tgz, .tar.bz2 and .tar.xz "
    "archives: pack the model's files with `tar czf model.tar.gz <files>`, or upload the model file uncompressed",
    (".7z", ".rar"): "an archive in a format Conch does not unpack; pack the model's files as a .zip or .tar.gz",
    (".py",): "Python source; a Python model (Triton's Python backend) is uploaded as a zip or tar of model.py with "
    "the files it reads, an optional requirements.txt and config.pbtxt (model.py at the archive's top)",
}


def format_by_key(key: str) -> ModelFormat:
    """The format whose `key` is `key`; KeyError when none is."""
    for candidate in FORMATS:
        if candidate.key == key:
            return candidate
    raise KeyError(key)


def describe_formats() -> list[dict[str, Any]]:
    """What `GET /api/v1/formats/` lists: each format's key, title, name endings, backend and conversion."""
    return [candidate.describe() for candidate in FORMATS]


def _a(title: str) -> str:
    """`title` with its indefinite article ("an ONNX model", "a LightGBM model", "an XGBoost model")."""
    return f"{'an' if title[:1] in 'AEIOX' else 'a'} {title}"


def _known_formats_text(*, containers: bool = True) -> str:
    return "; ".join(
        f"{f.title} ({', '.join(f.suffixes) or 'a folder, zipped'})" for f in FORMATS if containers or not f.container
    )


def _suffix(filename: str) -> str:
    return PurePosixPath(filename.replace("\\", "/")).suffix.lower()


def _formats_named(filename: str) -> tuple[ModelFormat, ...]:
    """The formats one of whose endings ends `filename` (".tar.gz" counts as one ending); all for a name with none."""
    if not _suffix(filename):
        return FORMATS
    name = PurePosixPath(filename.replace("\\", "/")).name.lower()
    return tuple(f for f in FORMATS if any(name.endswith(suffix) for suffix in f.suffixes))


def check_model_filename(filename: str, *, field: str) -> None:
    """Raise InvalidInput naming `field` when the file's name ends in no ending of a format Conch builds.

    A name without an ending passes (its first bytes decide). The refusal says what a common foreign ending
    usually holds (`.pt`, `.bin`, `.h5`, `.zip`…) and what to do, and lists the formats Conch builds.
    """
    if _formats_named(filename):
        return
    suffix = _suffix(filename)
    what = next((advice for endings, advice in _FOREIGN_SUFFIXES.items() if suffix in endings), "")
    detail = f"{filename!r} is not a model file Conch builds: Conch builds {_known_formats_text()}"
    detail += f"; a {suffix} file is usually {what}." if what else "."
    detail += " If the file is one of these formats, rename it to the format's ending."
    raise InvalidInput(detail, field=field)


def detect_format(
    head: bytes, *, filename: str = "", size_bytes: int | None = None, field: str = "file"
) -> ModelFormat:
    """The format of a file from its name (`filename`, may be "") and first bytes (`head`: up to HEAD_BYTES).

    `size_bytes`, the whole file's size when known, is named in a Git LFS pointer's message. Raises InvalidInput
    naming `field` when the bytes are none of the formats the name allows: the message names a well-known other
    format when the bytes show one (a PNG, a ZIP, a pickle, HTML, a Git LFS pointer…), and what to do.
    """
    if head.startswith(_LFS_POINTER_PREFIX):
        real_size = re.search(rb"^size (\d+)", head, re.MULTILINE)
        about = f" (the real file is {int(real_size.group(1)):,} bytes)" if real_size else ""
        size = size_bytes if size_bytes is not None else len(head)
        raise InvalidInput(
            f"This is a Git LFS pointer file, a {size}-byte text stub that stands in for the model{about}, "
            "not the model itself. The repository you cloned stores the model with Git LFS: run `git lfs pull` "
            "in it (install Git LFS first with `git lfs install`), then upload the real model file.",
            field=field,
        )
    named = _formats_named(filename) if filename else FORMATS
    for candidate in named:
        if candidate.matches_head(head):
            return candidate
    explained = next((text for text in (f.explain_head(head) for f in named) if text), "")
    if explained:
        raise InvalidInput(explained, field=field)
    by_content = next((f for f in FORMATS if f.matches_head(head)), None)
    if by_content is not None and not by_content.container:
        wanted = " or ".join(by_content.suffixes)
        raise InvalidInput(
            f"{filename!r} is named like {' or '.join(_a(f.title) for f in named)} file, but its content is "
            f"{_a(by_content.title)}. Rename it to end in {wanted} and upload it again.",
            field=field,
        )
    kind, advice = _foreign_format(head)
    expected = " or ".join(_a(f.title) for f in named)
    if kind:
        raise InvalidInput(f"This is not {expected}: it looks like {kind}. {advice}", field=field)
    shown = " ".join(f"{byte:02x}" for byte in head[:8])
    if [f.key for f in named] == ["onnx"]:
        raise InvalidInput(
            "This is not an ONNX model: an ONNX file is a binary protobuf `ModelProto` that begins with its IR "
            f"version field, but this file begins with the bytes {shown}. Export the model to ONNX (for "
            "example with torch.onnx.export, tf2onnx or skl2onnx) and upload the resulting .onnx file.",
            field=field,
        )
    raise InvalidInput(
        f"This is not {expected}: its first bytes ({shown}) are none of the formats Conch builds "
        f"({_known_formats_text()}). Save the model in one of them (for example export it to ONNX with "
        "torch.onnx.export, tf2onnx or skl2onnx) and upload that file.",
        field=field,
    )


def find_model_in_folder(folder: Path, files: Sequence[str]) -> tuple[ModelFormat, Path]:
    """The model an unpacked archive holds: its format and its entry (a file or a folder under `folder`).

    `files` are the regular files' names in `folder` (relative, "/"-separated; `builds.archives.UnpackedArchive`).
    A format that arrives as several files claims the folder first (`ModelFormat.find_in_folder`: a Triton model
    repository before all, then an ONNX model with its external data, a SavedModel); otherwise an archive of one
    file holds that file, told by its name and first bytes.
    Raises InvalidInput (field "file") for an archive inside the archive, for several models, and for a folder
    that holds no model Conch builds, naming what it found (a SavedModel saved as text, a TorchScript zip…) and
    what to upload instead.
    """
    for candidate in _FOLDER_FORMATS:
        entry = candidate.find_in_folder(folder, files)
        if entry is not None:
            return candidate, entry
    if len(files) == 1:
        path = folder / files[0]
        with path.open("rb") as handle:
            head = handle.read(HEAD_BYTES)
        found = detect_format(head, filename=files[0], size_bytes=path.stat().st_size)
        if found.container:
            raise InvalidInput(
                f"The archive holds only another archive ({files[0]!r}). Upload that archive itself, or pack the "
                "model's files directly.",
                field="file",
            )
        return found, path
    shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
    raise InvalidInput(
        f"The archive holds no model Conch builds{_what_the_folder_is(files)}. It holds {len(files)} files: "
        f"{shown}. Conch builds from an archive an ONNX model with its external data files, or one model file "
        f"of these formats: {_known_formats_text(containers=False)}.",
        field="file",
    )


def _what_the_folder_is(files: Sequence[str]) -> str:
    """ ", which looks like X; do Y" for a folder layout of a well-known format Conch does not build, else ""."""
    names = {PurePosixPath(name).name for name in files}
    if "saved_model.pbtxt" in names:
        return (
            ": it looks like a TensorFlow SavedModel saved as text (saved_model.pbtxt). Save it again with "
            "tf.saved_model.save, which writes the binary saved_model.pb, and upload that folder"
        )
    if "data.pkl" in names or "constants.pkl" in names or "archive_format" in names:
        return (
            ": it looks like an unpacked PyTorch file (torch.save, torch.jit.save or torch.export.save write a zip of "
            "such a folder). Upload the file torch wrote itself: a TorchScript model as .pt, an exported program as "
            ".pt2"
        )
    return ""


def check_model_head(
    head: bytes, *, size_bytes: int | None = None, field: str = "file", filename: str = ""
) -> ModelFormat:
    """`detect_format` under the name the upload edges use: the format, or InvalidInput naming `field`."""
    return detect_format(head, filename=filename, size_bytes=size_bytes, field=field)


def format_allowed(model_format: ModelFormat, *, team: Any) -> bool:
    """Whether `team` (a `tenancy.models.Team`) may build `model_format`: a format whose loading runs code from the
    file (a pickle) only when a platform admin allowed that for the team (`Team.allow_pickled_models`)."""
    return not model_format.runs_code or bool(getattr(team, "allow_pickled_models", False))


def formats_allowed(team: Any) -> tuple[ModelFormat, ...]:
    """The formats of `FORMATS` that `team` may build (`format_allowed`), in `FORMATS`' order."""
    return tuple(candidate for candidate in FORMATS if format_allowed(candidate, team=team))


def check_format_allowed(model_format: ModelFormat, *, team: Any, field: str = "file") -> ModelFormat:
    """Return `model_format` when `team` (a `tenancy.models.Team`) may build it; raise InvalidInput naming `field`
    for a format whose loading runs code from the file (a pickle) when no platform admin allowed that for the team
    (`Team.allow_pickled_models`)."""
    if not format_allowed(model_format, team=team):
        raise InvalidInput(
            f"This file is {_a(model_format.title)}. Loading a pickle runs code from the file, so Conch loads "
            f"pickles only for teams a platform admin allowed, and team {getattr(team, 'slug', team)!r} is not "
            "allowed. Ask a platform admin to tick 'Allow pickled models' on the team's admin page "
            f"({_admin_page(team)}), or convert the model to ONNX yourself (skl2onnx.to_onnx) and upload the "
            ".onnx file.",
            field=field,
        )
    return model_format


def _admin_page(team: Any) -> str:
    """The path of `team`'s change page in Django's admin site, where a platform admin allows pickles."""
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse("admin:tenancy_team_change", args=[team.pk])
    except (NoReverseMatch, AttributeError):
        return "/admin/tenancy/team/"


def _foreign_format(head: bytes) -> tuple[str, str]:
    """Name a well-known format Conch does not build from its magic bytes; ("", "") when none matches."""
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
            "a ZIP archive (a zipped folder, a PyTorch file or a Keras .keras file)",
            (
                "If it is an archive of the model's files, name it .zip: Conch unpacks archives. A TorchScript "
                "model is named .pt, an exported program .pt2, a Keras model .keras."
            ),
        )
    if archive_kind(head):
        return (
            f"a {archive_kind(head)} archive",
            "If it is an archive of the model's files, name it so (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz): Conch "
            "unpacks archives. Otherwise extract the model file from it and upload that.",
        )
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
