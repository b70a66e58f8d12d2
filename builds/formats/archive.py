"""Archives of a model: a zip or a tar (plain, or compressed with gzip, bzip2 or xz) holding the model's files.

An archive is a container, not a model: the build unpacks it in the sandbox (`builds.archives`, with its caps) and
then tells the format of what it holds (`builds.formats.find_model_in_folder`): an ONNX model with its external
data files, or one model file of another format. Its first bytes show only the archive kind (a compressed tar's
members are known once decompressed), so the upload edges accept it by name and kind, and the build checks the rest.
"""

from __future__ import annotations

from typing import ClassVar

from builds.formats.base import ModelFormat

__all__ = ["ArchiveFormat", "archive_kind"]


def archive_kind(head: bytes) -> str:
    """The archive kind a file's first bytes show: "zip", "tar", "tar.gz", "tar.bz2", "tar.xz", or "" for none.

    A zip by its local file header (or an empty archive's end record), a compressed tar by its compressor's magic
    bytes, a plain tar by POSIX ustar magic at byte 257 (so `head` needs at least 262 bytes for it).
    """
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head.startswith(b"BZh"):
        return "tar.bz2"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "tar.xz"
    if head[257:262] == b"ustar":
        return "tar"
    return ""


class ArchiveFormat(ModelFormat):
    """A zip or tar of a model's files, unpacked in the build's sandbox; served as the format of what it holds."""

    key: ClassVar[str] = "archive"
    title: ClassVar[str] = "model archive (zip or tar)"
    suffixes: ClassVar[tuple[str, ...]] = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
    served_as: ClassVar[str] = ""
    container: ClassVar[bool] = True
    upload_hint: ClassVar[str] = (
        "a zip or tar of the model's files: an ONNX model with its external data files (model.onnx beside "
        "weights.bin), or one model file of another format listed here"
    )

    def matches_head(self, head: bytes) -> bool:
        return bool(archive_kind(head))

    def local_name(self, head: bytes) -> str:
        return "source." + (archive_kind(head) or "zip")
