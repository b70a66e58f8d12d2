"""The object store in a local folder (the embedded default; Triton reads the repository as a local path)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import uuid
import zlib
from pathlib import Path
from typing import BinaryIO

from conch.errors import InvalidInput, NotFound, Unavailable
from models_registry.storage.base import (
    _COPY_BUFFER_BYTES,
    _TEMP_MARKER,
    CHECKSUM_CRC32_HEADER,
    ObjectStore,
    ObjectWriter,
    PartTarget,
    StoredPart,
    _atomic_local_file,
    _temp_prefix,
    check_key,
    check_prefix,
    crc32_base64,
)

# Resumable uploads of a FileObjectStore: `<root>/.conch-tmp-uploads/<upload id>/<number>-<sha256 hex>`.
_STAGING_FOLDER = f"{_TEMP_MARKER}uploads"
_FOLDER_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
_PART_FILE_RE = re.compile(r"(?P<number>[0-9]{5})-(?P<etag>[0-9a-f]{64})")


class _FileObjectWriter(ObjectWriter):
    """Writes to a hidden temp file in the target folder; commit renames it into place atomically."""

    def __init__(self, key: str, path: Path) -> None:
        super().__init__(key)
        self._final_path = path
        fd, temp_name = self._make_temp(path)
        self._temp_path = Path(temp_name)
        self._file = os.fdopen(fd, "wb")

    @staticmethod
    def _make_temp(path: Path) -> tuple[int, str]:
        # A concurrent delete may prune the freshly made (still empty) folder; one retry covers it.
        for attempt in range(2):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                return tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".part")
            except FileNotFoundError:
                if attempt:
                    raise Unavailable(f"Cannot create a file in {path.parent}.") from None
            except OSError as exc:
                raise Unavailable(f"Cannot create a file in {path.parent}: {exc.strerror or exc}.") from exc
        raise AssertionError("unreachable")

    def _write(self, view: memoryview) -> None:
        try:
            self._file.write(view)
        except OSError as exc:
            raise Unavailable(f"Cannot write {self._final_path}: {exc.strerror or exc}.") from exc

    def _commit(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.chmod(self._temp_path, 0o644)
            os.replace(self._temp_path, self._final_path)
        except OSError as exc:
            raise Unavailable(f"Cannot write {self._final_path}: {exc.strerror or exc}.") from exc

    def _abort(self) -> None:
        self._file.close()
        self._temp_path.unlink(missing_ok=True)


class FileObjectStore(ObjectStore):
    """An object store in a local folder: key `a/b/c` is the file `<root>/a/b/c`.

    Writes are atomic (temp file in the same folder, fsync, rename). Emptied folders are removed
    on delete, so a Triton repository never keeps an empty model or version folder.
    """

    def __init__(self, root: Path | str) -> None:
        """Use folder `root` (made absolute; created on the first write)."""
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"FileObjectStore(root={str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _folder(self, prefix: str) -> Path:
        normalised = check_prefix(prefix)
        return self.root.joinpath(*normalised.rstrip("/").split("/")) if normalised else self.root

    def _prune_empty_parents(self, path: Path) -> None:
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                return
            parent = parent.parent

    def open_writer(self, key: str) -> ObjectWriter:
        """Return a writer to the local file of `key` (see ObjectWriter). Raises Unavailable."""
        return _FileObjectWriter(key, self._path(key))

    def open_reader(self, key: str) -> BinaryIO:
        """Open the local file of `key` for reading. Raises NotFound, Unavailable."""
        path = self._path(key)
        try:
            return open(path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"Object {key!r} does not exist in the object store.") from None
        except OSError as exc:
            raise Unavailable(f"Cannot read {path}: {exc.strerror or exc}.") from exc

    def copy(self, src_key: str, dst_key: str) -> None:
        """Copy the file of `src_key` to `dst_key` atomically. Raises NotFound, Unavailable."""
        source = self._path(src_key)
        target = self._path(dst_key)
        if not source.is_file():
            raise NotFound(f"Object {src_key!r} does not exist in the object store.")
        with _atomic_local_file(target) as out:
            try:
                with open(source, "rb") as reader:
                    shutil.copyfileobj(reader, out, _COPY_BUFFER_BYTES)
            except FileNotFoundError:
                raise NotFound(f"Object {src_key!r} does not exist in the object store.") from None

    def exists(self, key: str) -> bool:
        """Return whether the file of `key` exists."""
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        """Return the size of the file of `key` in bytes. Raises NotFound."""
        path = self._path(key)
        try:
            stat = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"Object {key!r} does not exist in the object store.") from None
        if not path.is_file():
            raise NotFound(f"Object {key!r} does not exist in the object store.")
        return stat.st_size

    def delete(self, key: str) -> None:
        """Delete the file of `key` (missing is fine) and any folders it leaves empty."""
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except IsADirectoryError:
            return
        except OSError as exc:
            raise Unavailable(f"Cannot delete {path}: {exc.strerror or exc}.") from exc
        self._prune_empty_parents(path)

    def delete_prefix(self, prefix: str) -> int:
        """Delete the folder of `prefix` with everything in it; return how many objects went."""
        if not check_prefix(prefix):
            raise InvalidInput("Refusing to delete the whole object store (empty prefix).", field="prefix")
        folder = self._folder(prefix)
        if not folder.is_dir():
            return 0
        count = len(self.list_keys(prefix))
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise Unavailable(f"Cannot delete {folder}: {exc.strerror or exc}.") from exc
        self._prune_empty_parents(folder)
        return count

    def list_keys(self, prefix: str = "") -> list[str]:
        """Return the keys of the files under folder `prefix`, sorted (in-progress writes excluded)."""
        folder = self._folder(prefix)
        keys = []
        for dirpath, dirnames, filenames in os.walk(folder):
            # The staging folder of resumable uploads (`.conch-tmp-uploads`) holds no objects.
            dirnames[:] = [name for name in dirnames if not name.startswith(_TEMP_MARKER)]
            base = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(_TEMP_MARKER):
                    continue
                keys.append(name if base == "." else f"{base}/{name}")
        return sorted(keys)

    def abort_multipart_uploads(self, key: str) -> int:
        """Delete the in-progress temp files of `key` (`.conch-tmp-<name>.<random>.part` next to it); return how many.

        mkstemp's random part has no `.`, which tells `model.onnx`'s temp files from `model.onnx.sig`'s. Names
        are cut to 100 characters in temp names, so a sibling sharing the first 100 characters matches too.
        """
        target = self._path(key)
        prefix = _temp_prefix(target)

        def is_temp_of_key(name: str) -> bool:
            rest = name[len(prefix) :]
            return name.startswith(prefix) and rest.endswith(".part") and "." not in rest[: -len(".part")]

        try:
            leftovers = [path for path in target.parent.iterdir() if is_temp_of_key(path.name)]
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError as exc:
            raise Unavailable(f"Cannot list {target.parent}: {exc.strerror or exc}.") from exc
        for path in leftovers:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise Unavailable(f"Cannot delete {path}: {exc.strerror or exc}.") from exc
        if leftovers:
            self._prune_empty_parents(target)
        return len(leftovers)

    # --- Resumable uploads: parts are files `<number>-<sha256>` in `<root>/.conch-tmp-uploads/<upload id>/`.
    transport = "conch"

    def _staging(self, upload_id: str) -> Path:
        if not _FOLDER_UPLOAD_ID_RE.fullmatch(upload_id or ""):
            raise InvalidInput(f"{upload_id!r} is not an upload id of this store.", field="upload_id")
        return self.root / _STAGING_FOLDER / upload_id

    def start_multipart(self, key: str, *, checksum_algorithm: str = "") -> str:
        """Make the upload's staging folder; return its id (32 hex digits). Raises Unavailable.

        The checksum algorithm needs nothing here: `write_part` checks the CRC32 it is given.
        """
        self._path(key)
        upload_id = uuid.uuid4().hex
        try:
            self._staging(upload_id).mkdir(parents=True)
        except OSError as exc:
            raise Unavailable(f"Cannot create the staging folder of an upload in {self.root}: {exc}.") from exc
        return upload_id

    def presign_part(
        self, key: str, upload_id: str, number: int, *, expires_in_s: int, checksum_crc32: str = ""
    ) -> PartTarget | None:
        """Return None: parts of a folder store come through Conch (`write_part`)."""
        return None

    def write_part(
        self, key: str, upload_id: str, number: int, stream: BinaryIO, size_bytes: int, *, checksum_crc32: str = ""
    ) -> StoredPart:
        """Stream exactly `size_bytes` bytes of `stream` into the part's file (a temp file renamed into place).

        Reads `_COPY_BUFFER_BYTES` at a time; the part's tag is the SHA-256 of its bytes. With `checksum_crc32`
        the CRC32 of the bytes is computed on the way and must equal it, as S3 checks `x-amz-checksum-crc32`
        (BadDigest): otherwise the temp file is dropped and an earlier copy of the part stays. Raises InvalidInput
        (field `size_bytes`) when the stream ends before `size_bytes`, InvalidInput (field `parts[<number>]`) on a
        CRC32 mismatch, NotFound when the upload is gone, Unavailable when the disk fails.
        """
        folder = self._staging(upload_id)
        if not folder.is_dir():
            raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id")
        digest = hashlib.sha256()
        crc = 0
        received = 0
        try:
            fd, temp_name = tempfile.mkstemp(dir=folder, prefix=f"{_TEMP_MARKER}{number:05d}.", suffix=".part")
        except OSError as exc:
            raise Unavailable(f"Cannot write a part in {folder}: {exc.strerror or exc}.") from exc
        temp_path = Path(temp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                while received < size_bytes:
                    chunk = stream.read(min(_COPY_BUFFER_BYTES, size_bytes - received))
                    if not chunk:
                        raise InvalidInput(
                            f"Part {number} ended after {received} of its {size_bytes} bytes; send the part again "
                            "whole.",
                            field="size_bytes",
                        )
                    digest.update(chunk)
                    if checksum_crc32:
                        crc = zlib.crc32(chunk, crc)
                    out.write(chunk)
                    received += len(chunk)
            if checksum_crc32 and crc32_base64(crc) != checksum_crc32:
                raise InvalidInput(
                    f"Part {number}'s {received} bytes have CRC32 {crc32_base64(crc)}, not the {checksum_crc32} its "
                    f"{CHECKSUM_CRC32_HEADER} header gives: they changed on the way. This copy was not kept (the parts "
                    f"already stored are); send part {number} again.",
                    field=f"parts[{number}]",
                )
            for old in folder.glob(f"{number:05d}-*"):
                old.unlink(missing_ok=True)
            etag = digest.hexdigest()
            os.replace(temp_path, folder / f"{number:05d}-{etag}")
        except OSError as exc:
            temp_path.unlink(missing_ok=True)
            raise Unavailable(f"Cannot write part {number} in {folder}: {exc.strerror or exc}.") from exc
        except BaseException:
            temp_path.unlink(missing_ok=True)
            raise
        return StoredPart(
            number=number, size_bytes=received, etag=etag, checksum_crc32=crc32_base64(crc) if checksum_crc32 else ""
        )

    def list_parts(self, key: str, upload_id: str) -> list[StoredPart]:
        """Return the finished part files of the upload, by number. Raises NotFound when the upload is gone."""
        folder = self._staging(upload_id)
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id") from None
        except OSError as exc:
            raise Unavailable(f"Cannot list {folder}: {exc.strerror or exc}.") from exc
        parts = []
        for entry in entries:
            match = _PART_FILE_RE.fullmatch(entry.name)
            if match:
                size = entry.stat().st_size
                parts.append(StoredPart(number=int(match["number"]), size_bytes=size, etag=match["etag"]))
        return sorted(parts, key=lambda part: part.number)

    def complete_multipart(self, key: str, upload_id: str, parts: list[StoredPart]) -> None:
        """Concatenate the part files into object `key` (a temp file renamed into place), then drop the staging
        folder. Reads and writes a megabyte at a time."""
        folder = self._staging(upload_id)
        target = self._path(key)
        if not folder.is_dir():
            if target.is_file():
                return
            raise NotFound(f"Upload {upload_id} is no longer in the object store.", field="upload_id")
        for expected, part in enumerate(parts, start=1):
            if part.number != expected:
                raise InvalidInput(f"Part {expected} is missing; send it, then complete again.", field="parts")
        with _atomic_local_file(target) as out:
            for part in parts:
                path = folder / f"{part.number:05d}-{part.etag}"
                try:
                    with open(path, "rb") as reader:
                        shutil.copyfileobj(reader, out, _COPY_BUFFER_BYTES)
                except FileNotFoundError:
                    raise InvalidInput(
                        f"Part {part.number} with tag {part.etag} is not in the store any more; list the parts "
                        "and send the missing ones again.",
                        field="parts",
                    ) from None
        shutil.rmtree(folder, ignore_errors=True)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Delete the upload's staging folder with its parts (missing is fine). Raises Unavailable."""
        folder = self._staging(upload_id)
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise Unavailable(f"Cannot delete {folder}: {exc.strerror or exc}.") from exc

    def triton_repository_location(self, prefix: str) -> str:
        """Return the absolute local path of folder `prefix`, without a trailing slash.

        Triton docs, model repository, "Local File System": the absolute path must be given.
        """
        return str(self._folder(prefix))

    def triton_environment(self) -> dict[str, str]:
        """Return `{}`: Triton needs no credentials for a local folder."""
        return {}
