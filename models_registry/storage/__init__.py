"""Object-store adapter: where uploaded model files and built Triton model repositories live.

Talks to one of two systems, chosen by `settings.CONCH_STORAGE_URL`:

- `file:///abs/path` — a local folder (the embedded default; Triton reads it as a local path);
- `s3://bucket/optional/prefix` — an S3-compatible bucket (AWS S3, MinIO) through boto3; Triton reads
  the repository itself over S3.

The package: `base` (keys, values, the writer and the store's contract), `folder` and `s3` (the two stores), and
here the factory that reads the settings. Keys are `/`-separated paths relative to the store's root (the folder, or
the bucket plus prefix), e.g. `models/7/versions/1/source/model.onnx`. Only `s3` imports boto3, botocore and
s3transfer: callers get `StoredObject` values and the typed errors of `conch.errors` (`NotFound` for a missing key,
`Unavailable` when the store cannot be reached or refuses us, `InvalidInput` for a malformed key).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from models_registry.storage.base import (
    CHECKSUM_CRC32_HEADER,
    CRC32,
    MAX_PART_SIZE_BYTES,
    MAX_PARTS,
    MIB,
    MIN_PART_SIZE_BYTES,
    ObjectStore,
    ObjectStoreConfigError,
    ObjectWriter,
    PartTarget,
    StoredObject,
    StoredPart,
    check_key,
    check_prefix,
    crc32_base64,
    is_crc32_base64,
)
from models_registry.storage.folder import FileObjectStore
from models_registry.storage.s3 import FALLBACK_REGION, S3ObjectStore

__all__ = [
    "CHECKSUM_CRC32_HEADER",
    "CRC32",
    "FALLBACK_REGION",
    "MAX_PARTS",
    "MAX_PART_SIZE_BYTES",
    "MIB",
    "MIN_PART_SIZE_BYTES",
    "FileObjectStore",
    "ObjectStore",
    "ObjectStoreConfigError",
    "ObjectWriter",
    "PartTarget",
    "S3ObjectStore",
    "StoredObject",
    "StoredPart",
    "build_object_store",
    "check_key",
    "check_prefix",
    "crc32_base64",
    "get_object_store",
    "is_crc32_base64",
]

# Factories


def build_object_store(
    url: str,
    *,
    endpoint_url: str = "",
    region: str = "",
    access_key: str = "",
    secret_key: str = "",
    **s3_tuning: Any,
) -> ObjectStore:
    """Build the store named by `url`, without reading Django settings.

    `url` is `file:///abs/path` (FileObjectStore) or `s3://bucket/optional/prefix`
    (S3ObjectStore with the given endpoint, region and keys; `s3_tuning` passes
    part_size_bytes, max_concurrency, timeouts). Raises ObjectStoreConfigError for any
    other form, a relative file path, or a missing bucket.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ObjectStoreConfigError(
                f"CONCH_STORAGE_URL={url!r} must name an absolute folder: file:///absolute/path."
            )
        return FileObjectStore(Path(unquote(parts.path)))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ObjectStoreConfigError(f"CONCH_STORAGE_URL={url!r} has no bucket: use s3://bucket/prefix.")
        return S3ObjectStore(
            parts.netloc,
            unquote(parts.path).strip("/"),
            endpoint_url,
            region,
            access_key,
            secret_key,
            **s3_tuning,
        )
    raise ObjectStoreConfigError(
        f"CONCH_STORAGE_URL={url!r} is not supported: use file:///absolute/path or s3://bucket/prefix."
    )


_cache_lock = threading.Lock()
_cached: tuple[tuple[str, ...], ObjectStore] | None = None


def get_object_store() -> ObjectStore:
    """Return the store configured in Django settings (built once per distinct configuration).

    Reads CONCH_STORAGE_URL, CONCH_S3_ENDPOINT_URL, CONCH_S3_REGION, CONCH_S3_ACCESS_KEY_ID,
    CONCH_S3_SECRET_ACCESS_KEY and CONCH_S3_PUBLIC_ENDPOINT_URL at call time, so tests may override them. Raises
    ObjectStoreConfigError when CONCH_STORAGE_URL is missing or malformed.
    """
    from django.conf import settings

    global _cached
    configuration = (
        getattr(settings, "CONCH_STORAGE_URL", "") or "",
        getattr(settings, "CONCH_S3_ENDPOINT_URL", "") or "",
        getattr(settings, "CONCH_S3_REGION", "") or "",
        getattr(settings, "CONCH_S3_ACCESS_KEY_ID", "") or "",
        getattr(settings, "CONCH_S3_SECRET_ACCESS_KEY", "") or "",
        getattr(settings, "CONCH_S3_PUBLIC_ENDPOINT_URL", "") or "",
    )
    if not configuration[0]:
        raise ObjectStoreConfigError("CONCH_STORAGE_URL is not set; see .env.example.")
    with _cache_lock:
        if _cached is None or _cached[0] != configuration:
            url, endpoint_url, region, access_key, secret_key, public_endpoint_url = configuration
            tuning = {"public_endpoint_url": public_endpoint_url} if url.startswith("s3:") else {}
            store = build_object_store(
                url, endpoint_url=endpoint_url, region=region, access_key=access_key, secret_key=secret_key, **tuning
            )
            _cached = (configuration, store)
        return _cached[1]
