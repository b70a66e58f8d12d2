"""An upload's parts: how a file is cut (`plan_parts`), where each part goes (`sign_parts`: a presigned S3 URL, or
Conch's own URL with folder storage), receiving a part through Conch (`receive_part`), per-part CRC32 checksums, and
what the store holds (`stored_parts`). API contract: UPLOAD-API in docs/uploads.md, "Resumable uploads".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, BinaryIO

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from conch.errors import Conflict, InvalidInput, NotFound
from models_registry.storage import (
    CHECKSUM_CRC32_HEADER,
    MAX_PART_SIZE_BYTES,
    MAX_PARTS,
    MIB,
    MIN_PART_SIZE_BYTES,
    PartTarget,
    StoredPart,
    get_object_store,
    is_crc32_base64,
)
from tenancy.choices import Role, Scope
from tenancy.services import TokenGrant, require_role
from uploads.choices import UploadStatus, UploadTransport
from uploads.models import Upload

if TYPE_CHECKING:
    from tenancy.models import Team

#: Part size when the client names none: few enough requests (64 for 1 GiB), little to resend after a dropped
#: connection. bench/upload.py on moto: the worker's CompleteMultipartUpload was fastest with 16 MiB parts (3-5 s
#: for 1 GiB, against 6-9 s with 64 MiB and 8 MiB parts).
DEFAULT_PART_SIZE_BYTES = 16 * MIB
#: Most part numbers one `sign_parts` call takes.
MAX_PARTS_PER_CALL = 100


def plan_parts(*, size_bytes: int, part_size_bytes: int | None = None) -> tuple[int, int]:
    """Return (part size, part count) for a file of `size_bytes` (> 0) bytes.

    Without `part_size_bytes` the part size is DEFAULT_PART_SIZE_BYTES, or larger (whole MiB) when the file
    would need more than MAX_PARTS parts. A given part size must be 5 MiB to 5 GiB (S3's limits on every part
    but the last) and give at most 10,000 parts. Raises InvalidInput (field `part_size_bytes`).
    """
    if part_size_bytes is None:
        least = math.ceil(size_bytes / MAX_PARTS)
        part_size_bytes = max(DEFAULT_PART_SIZE_BYTES, math.ceil(least / MIB) * MIB)
    elif not MIN_PART_SIZE_BYTES <= part_size_bytes <= MAX_PART_SIZE_BYTES:
        raise InvalidInput(
            f"part_size_bytes must be from {MIN_PART_SIZE_BYTES} (5 MiB) to {MAX_PART_SIZE_BYTES} (5 GiB), got "
            f"{part_size_bytes}; leave it out to let Conch choose.",
            field="part_size_bytes",
        )
    count = math.ceil(size_bytes / part_size_bytes)
    if count > MAX_PARTS:
        raise InvalidInput(
            f"A file of {size_bytes} bytes in parts of {part_size_bytes} bytes needs {count} parts, more than the "
            f"{MAX_PARTS} allowed; use parts of at least {math.ceil(size_bytes / MAX_PARTS)} bytes.",
            field="part_size_bytes",
        )
    return part_size_bytes, count


def part_range(upload: Upload, number: int) -> tuple[int, int]:
    """(first byte, byte after the last) of part `number` (1-based) in the file; the last part may be shorter."""
    start = (number - 1) * upload.part_size_bytes
    return start, min(upload.size_bytes, start + upload.part_size_bytes)


def upload_expiry() -> datetime:
    """When an upload worked on now expires: CONCH_UPLOAD_EXPIRES_HOURS from now."""
    return timezone.now() + timedelta(hours=settings.CONCH_UPLOAD_EXPIRES_HOURS)


def require_upload_writer(*, user: User, token: TokenGrant | None, team: Team, action: str) -> None:
    """Raise Forbidden unless the caller may upload to `team` (role developer, token scope `models:write`)."""
    require_role(user=user, team=team, role=Role.DEVELOPER, action=action, token=token, scope=Scope.MODELS_WRITE)


def stored_parts(*, upload: Upload) -> list[StoredPart]:
    """The parts the store holds of an `uploading` upload, by number ([] in any other status).

    Raises Unavailable when the store cannot be reached.
    """
    if upload.status != UploadStatus.UPLOADING or not upload.store_upload_id:
        return []
    try:
        return get_object_store().list_parts(upload.object_key, upload.store_upload_id)
    except NotFound:
        return []


def require_uploading(upload: Upload) -> None:
    """Raise Conflict (field `status` or `expires_at`) unless the upload is `uploading` and not expired."""
    if upload.status != UploadStatus.UPLOADING:
        raise Conflict(
            f"This upload is '{upload.status}', it takes no more parts"
            + (f" ({upload.error})" if upload.error else "")
            + "; start a new upload with POST /api/v1/models/{id}/uploads/ if you still need one.",
            field="status",
        )
    if upload.expires_at <= timezone.now():
        raise Conflict(
            f"This upload expired at {upload.expires_at.isoformat()} (no part for CONCH_UPLOAD_EXPIRES_HOURS); its "
            "parts are being discarded. Start a new upload with POST /api/v1/models/{id}/uploads/.",
            field="expires_at",
        )


def _check_number(upload: Upload, number: Any) -> int:
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= upload.part_count:
        last = upload.size_bytes - (upload.part_count - 1) * upload.part_size_bytes
        raise InvalidInput(
            f"Part number {number!r} is out of range: this upload has parts 1 to {upload.part_count} "
            f"({upload.part_size_bytes} bytes each, the last {last}).",
            field="number",
        )
    return number


def extend_expiry(upload: Upload) -> None:
    """Push the expiry of an upload that is being worked on."""
    upload.expires_at = upload_expiry()
    Upload.objects.filter(pk=upload.pk, status=UploadStatus.UPLOADING).update(expires_at=upload.expires_at)


def part_checksums(upload: Upload, numbers: Sequence[int], checksums: Mapping[str, Any] | None) -> dict[int, str]:
    """Check the client's per-part checksums of parts `numbers` and return them as {number: CRC32 base64}.

    `checksums` maps a part number (as a string: a JSON object's key) to the base64 of the 4 big-endian bytes of
    the CRC32 of the part's bytes (`zlib.crc32`). An upload with `part_checksum_algorithm` CRC32 needs one for every
    number asked for; an upload without takes none ({} back). Raises InvalidInput naming `checksums.<n>` (missing,
    malformed, or for a part not asked for) or `checksums` (sent to an upload without the algorithm).
    """
    given = dict(checksums or {})
    if not upload.part_checksum_algorithm:
        if given:
            raise InvalidInput(
                "This upload was started without part_checksum_algorithm, so its parts go without checksums; leave "
                "checksums out (or start a new upload with part_checksum_algorithm CRC32).",
                field="checksums",
            )
        return {}
    asked = {str(number) for number in numbers}
    for key in given:
        if key not in asked:
            raise InvalidInput(
                f"checksums names part {key!r}, which numbers does not ask for; send a checksum for each part in "
                "numbers, and only those.",
                field=f"checksums.{key}",
            )
    result: dict[int, str] = {}
    for number in numbers:
        value = given.get(str(number))
        if not is_crc32_base64(value):
            start, end = part_range(upload, number)
            got = "none" if value is None else repr(value)
            raise InvalidInput(
                f"This upload checks each part's CRC32 (part_checksum_algorithm {upload.part_checksum_algorithm}): "
                f'send checksums {{"{number}": "<base64 of the 4 big-endian bytes of the CRC32 of bytes {start} to '
                f'{end - 1} of the file>"}}, 8 characters (Python: base64.b64encode(zlib.crc32(part).to_bytes(4, '
                f'"big"))); got {got}.',
                field=f"checksums.{number}",
            )
        result[number] = str(value)
    return result


def sign_parts(
    *,
    user: User,
    upload: Upload,
    numbers: Sequence[int],
    checksums: Mapping[str, Any] | None = None,
    token: TokenGrant | None = None,
) -> list[PartTarget | None]:
    """Return where the client sends each of parts `numbers`: a presigned URL (S3), or None for Conch's own.

    Up to MAX_PARTS_PER_CALL distinct numbers from 1 to `part_count`. For an upload with `part_checksum_algorithm`
    CRC32, `checksums` gives each part's CRC32 (`part_checksums`), and each S3 target signs it into its URL and
    `headers` (`x-amz-checksum-crc32`, `x-amz-sdk-checksum-algorithm`), which the client sends with the bytes.
    Makes no request to the store; pushes the upload's expiry. Raises Forbidden, InvalidInput (field `numbers`,
    `checksums` or `checksums.<n>`), Conflict when the upload is not `uploading` or has expired (field
    `expires_at`).
    """
    require_upload_writer(user=user, token=token, team=upload.model.team, action="Uploading a model version")
    require_uploading(upload)
    if not numbers or len(numbers) > MAX_PARTS_PER_CALL:
        raise InvalidInput(f"numbers must list 1 to {MAX_PARTS_PER_CALL} part numbers.", field="numbers")
    if len(set(numbers)) != len(numbers):
        raise InvalidInput("numbers lists a part number twice; list each part once.", field="numbers")
    for number in numbers:
        try:
            _check_number(upload, number)
        except InvalidInput as error:
            raise InvalidInput(error.detail, field="numbers") from None
    crcs = part_checksums(upload, numbers, checksums)
    if not upload.store_upload_id:
        raise Conflict("This upload is still starting in the object store; ask again in a moment.", field="status")
    store = get_object_store()
    expires_in_s = settings.CONCH_UPLOAD_PART_URL_SECONDS
    targets = [
        store.presign_part(
            upload.object_key,
            upload.store_upload_id,
            number,
            expires_in_s=expires_in_s,
            checksum_crc32=crcs.get(number, ""),
        )
        for number in numbers
    ]
    extend_expiry(upload)
    return targets


def conch_part_headers(upload: Upload, number: int, checksums: Mapping[str, Any] | None) -> dict[str, str]:
    """Headers a client sends with part `number` of a folder-storage upload (to Conch's own part URL): the
    content type, and the part's `x-amz-checksum-crc32` (from `checksums`, already checked by `sign_parts`) for
    an upload with `part_checksum_algorithm`."""
    headers = {"Content-Type": "application/octet-stream"}
    if upload.part_checksum_algorithm and checksums:
        headers[CHECKSUM_CRC32_HEADER] = checksums[str(number)]
    return headers


def receive_part(
    *,
    user: User,
    upload: Upload,
    number: int,
    stream: BinaryIO,
    content_length: int | None,
    checksum_crc32: str | None = None,
    token: TokenGrant | None = None,
) -> StoredPart:
    """Stream part `number` of a folder-storage upload from `stream` (the request body) into the store.

    The body must be exactly the part's bytes (`content_length`, the declared Content-Length): the part size, or
    what is left for the last part. `checksum_crc32` is the request's `x-amz-checksum-crc32` header (None when it
    has none): required for an upload with `part_checksum_algorithm` CRC32, checked whenever sent; bytes with
    another CRC32 are not kept (an earlier copy of the part, and the other parts, stay). Raises NotFound for an
    upload straight to the bucket (its parts go to S3), Forbidden, Conflict (not `uploading`, expired),
    InvalidInput naming `number` (out of range), `size_bytes` (a length that is not the part's, or a body that
    ends early), `checksums.<number>` (the header missing or malformed) or `parts[<number>]` (a CRC32 mismatch:
    send the part again), Unavailable when the disk fails.
    """
    require_upload_writer(user=user, token=token, team=upload.model.team, action="Uploading a model version")
    if upload.transport != UploadTransport.CONCH:
        raise NotFound(
            "This upload goes straight to the bucket: PUT its parts to the URLs POST .../parts/ gives.", field="number"
        )
    require_uploading(upload)
    _check_number(upload, number)
    start, end = part_range(upload, number)
    expected = end - start
    if content_length != expected:
        sent = "no Content-Length" if content_length is None else f"{content_length} bytes"
        raise InvalidInput(
            f"Part {number} must be exactly {expected} bytes (bytes {start} to {end - 1} of the file); this request "
            f"sends {sent}. Send that slice of the file as the body, with its Content-Length.",
            field="size_bytes",
        )
    if checksum_crc32 is not None or upload.part_checksum_algorithm:
        if not is_crc32_base64(checksum_crc32):
            got = "none" if checksum_crc32 is None else repr(checksum_crc32)
            raise InvalidInput(
                f"Part {number} needs the {CHECKSUM_CRC32_HEADER} header its part URL gave (POST .../parts/ with its "
                f"checksum): base64 of the 4 big-endian bytes of the CRC32 of the part's bytes; got {got}.",
                field=f"checksums.{number}",
            )
    part = get_object_store().write_part(
        upload.object_key, upload.store_upload_id, number, stream, expected, checksum_crc32=checksum_crc32 or ""
    )
    extend_expiry(upload)
    return part
