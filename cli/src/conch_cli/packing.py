"""Packing a model's folder (a TensorFlow SavedModel, an ONNX model beside its external data files) into a zip.

The server unpacks archives itself (with its own checks); this only packs. The zip is reproducible: members in
sorted order, every timestamp 1980-01-01 and the same permissions, so packing the same folder twice gives the same
bytes, and a second `conch upload` of it resumes the first one's upload or finds the version it made (same size,
same sha256).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from conch_cli.errors import USAGE, CliError

__all__ = ["pack_folder"]

#: zip's earliest timestamp, given to every member so the bytes do not depend on when files were touched.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_CHUNK_BYTES = 1024 * 1024


def pack_folder(folder: Path, target_dir: Path) -> Path:
    """Zip every regular file under `folder` into `<target_dir>/<folder name>.zip`; return that path.

    Names in the zip are relative to `folder`'s parent, so the zip holds one top-level folder. Links are followed
    when they point inside `folder`; a link pointing outside it, or a folder holding no file, is a CliError
    (exit USAGE) naming it.
    """
    root = folder.resolve()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            path = Path(dirpath) / name
            real = path.resolve()
            if root != real and root not in real.parents:
                raise CliError(
                    f"{path} links to {real}, outside {folder}: copy the file into the folder, then upload again",
                    USAGE,
                )
            if real.is_file():
                files.append(path)
    if not files:
        raise CliError(f"{folder} holds no files: upload the folder that holds the model", USAGE)
    target = target_dir / f"{root.name or 'model'}.zip"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for path in files:
            info = zipfile.ZipInfo(f"{root.name}/{path.relative_to(root).as_posix()}", date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            with bundle.open(info, "w", force_zip64=path.stat().st_size > 2**31) as out, path.open("rb") as handle:
                while chunk := handle.read(_CHUNK_BYTES):
                    out.write(chunk)
    return target
