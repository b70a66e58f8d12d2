"""Statuses and options of a resumable upload."""

from django.db import models


class UploadStatus(models.TextChoices):
    # Parts are arriving; the promised size is reserved in the team's storage quota until expires_at.
    UPLOADING = "uploading", "Uploading"
    # Every part is in the store; a worker joins them and checks size and SHA-256, then makes the version.
    COMPLETING = "completing", "Completing"
    COMPLETED = "completed", "Completed"
    ABORTED = "aborted", "Aborted"
    FAILED = "failed", "Failed"


class UploadTransport(models.TextChoices):
    # Clients PUT parts to presigned URLs of the bucket; the bytes never pass through Conch.
    S3 = "s3", "Straight to the S3 bucket"
    # Clients PUT parts to Conch, which streams them to the store's folder.
    CONCH = "conch", "Through Conch (folder storage)"


class PartChecksumAlgorithm(models.TextChoices):
    # Each part carries the CRC32 of its bytes (base64 of the 4 big-endian bytes, `x-amz-checksum-crc32`): the store
    # refuses a part whose bytes do not match it (S3: BadDigest) and the joined object gets S3's COMPOSITE CRC32.
    CRC32 = "CRC32", "CRC32 per part"
