"""Serializers of resumable uploads (docs/uploads.md): the start, the file check, the part URLs, the completion."""

from __future__ import annotations

import base64
import binascii

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from builds.api.serializers import ALLOW_DUPLICATE_HELP, OUTPUT_DIMS_HELP, TOLERANCE_HELP
from builds.formats import HEAD_BYTES
from builds.model_config import MAX_INSTANCE_COUNT, MAX_MAX_BATCH_SIZE, MAX_QUEUE_DELAY_MICROSECONDS
from uploads.choices import PartChecksumAlgorithm
from uploads.models import Upload


class UploadBuildOptionsSerializer(serializers.Serializer):
    """Build options of a resumable upload: the version upload's fields as a JSON object.

    The fields document the options; their values, and any key that is not an option, are checked by the build's
    own rules when the upload starts (`uploads.services.sessions.start_resumable_upload`), which answer 400 naming
    `build_options.<name>` in the words the version upload uses.
    """

    max_batch_size = serializers.JSONField(
        required=False, help_text=f"0..{MAX_MAX_BATCH_SIZE}; 0 turns batching off. Left out: the model's default."
    )
    max_queue_delay_microseconds = serializers.JSONField(
        required=False, help_text=f"0..{MAX_QUEUE_DELAY_MICROSECONDS}, needs batching."
    )
    preferred_batch_size = serializers.JSONField(
        required=False, help_text="A list of batch sizes, each at most max_batch_size, or text such as '4, 8'."
    )
    instance_count = serializers.JSONField(required=False, help_text=f"1..{MAX_INSTANCE_COUNT} model instances.")
    output_dims = serializers.JSONField(required=False, allow_null=True, help_text=OUTPUT_DIMS_HELP)
    tolerance = serializers.JSONField(required=False, allow_null=True, help_text=TOLERANCE_HELP)

    def to_internal_value(self, data: object) -> dict:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                'build_options is a JSON object of build options, such as {"max_batch_size": 8}.'
            )
        return dict(data)  # every key, unknown ones too: the start refuses them by name


class StartUploadSerializer(serializers.Serializer):
    """Body of POST /models/{model_id}/uploads/: what the file is, promised before any byte is sent."""

    filename = serializers.CharField(max_length=255, help_text="The file's name, e.g. model.onnx.")
    size_bytes = serializers.IntegerField(min_value=1, max_value=2**63 - 1, help_text="The file's size in bytes.")
    sha256 = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=64,
        help_text="The file's SHA-256, 64 hex digits. May be left out and sent with POST .../complete instead, so a "
        "client hashes the file while its parts go; an open upload of the same file is then only found again by a "
        "start that sends it.",
    )
    part_size_bytes = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=2**63 - 1,
        help_text="Bytes per part, 5 MiB to 5 GiB, at most 10,000 parts; left out, Conch chooses (16 MiB or more).",
    )
    build_options = UploadBuildOptionsSerializer(required=False, allow_null=True)
    head = serializers.CharField(
        required=False,
        max_length=4 * ((HEAD_BYTES + 2) // 3),
        help_text=f"Optional: the file's first {HEAD_BYTES} bytes (all of it when shorter), base64. A file whose first "
        "bytes show it is not an ONNX model (text, an image, a ZIP such as a PyTorch .pt, a Git LFS pointer…) is then "
        "refused with 400 naming `head` before anything is reserved, so a client learns it before sending the file.",
    )
    allow_duplicate = serializers.BooleanField(required=False, default=False, help_text=ALLOW_DUPLICATE_HELP)

    part_checksum_algorithm = serializers.ChoiceField(
        choices=PartChecksumAlgorithm.choices,
        required=False,
        allow_null=True,
        help_text='Optional: "CRC32" to send every part with the CRC32 of its bytes, which the object store checks '
        "as the part arrives (a part damaged on the way is refused, not stored), as boto3's transfer manager does. "
        "Each part URL is then given only with the part's CRC32 (POST .../parts/ `checksums`), and its `headers` carry "
        "it. Null or left out: parts go without checksums.",
        error_messages={
            "invalid_choice": 'must be "CRC32" (each part sent with its CRC32) or null (parts without checksums); '
            'got "{input}".',
            "blank": 'must be "CRC32" (each part sent with its CRC32) or null (parts without checksums); got "".',
        },
    )

    def validate_head(self, value: str) -> bytes:
        """Decode the base64 `head`; 400 naming it when it is not base64 or longer than HEAD_BYTES bytes."""
        return _decode_head(value)


def _decode_head(value: str) -> bytes:
    """The bytes of a base64 `head`; a ValidationError when it is not base64 or holds 0 or over HEAD_BYTES bytes."""
    try:
        head = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise serializers.ValidationError("head must be base64 (RFC 4648) of the file's first bytes.") from None
    if not head or len(head) > HEAD_BYTES:
        raise serializers.ValidationError(f"head must hold 1 to {HEAD_BYTES} bytes; it holds {len(head)}.")
    return head


class CheckUploadFileSerializer(serializers.Serializer):
    """Body of POST /uploads/check/: a file's name and first bytes, asked about before it is hashed or sent."""

    filename = serializers.CharField(max_length=255, help_text="The file's name, e.g. model.onnx.")
    head = serializers.CharField(
        max_length=4 * ((HEAD_BYTES + 2) // 3),
        help_text=f"The file's first {HEAD_BYTES} bytes (all of it when shorter), base64.",
    )
    size_bytes = serializers.IntegerField(
        required=False, min_value=0, max_value=2**63 - 1, help_text="Optional: the file's size in bytes."
    )
    model = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**63 - 1,
        help_text="Optional: the id of the model the file is for; its team's rules apply (pickles).",
    )
    team = serializers.SlugField(
        required=False,
        max_length=63,
        help_text="Optional, when no model is given: the slug of the team the file is for; its rules apply.",
    )

    def validate_head(self, value: str) -> bytes:
        """Decode the base64 `head` (400 naming it when it is not base64 or too long)."""
        return _decode_head(value)

    def validate(self, attrs: dict) -> dict:
        """Refuse `model` and `team` together (400 naming `team`): the model already says its team."""
        if attrs.get("model") is not None and attrs.get("team"):
            raise serializers.ValidationError({"team": "Give model or team, not both: a model's team is its own."})
        return attrs


class CheckedUploadFileSerializer(serializers.Serializer):
    """Answer of POST /uploads/check/ for a file Conch can build."""

    format = serializers.CharField(help_text='The format the file will be built as: "onnx", "lightgbm", "xgboost".')
    title = serializers.CharField(help_text="The format's name.")
    served_as = serializers.CharField(help_text="The Triton backend that serves the built model.")
    conversion = serializers.CharField(allow_null=True, help_text="The tool that converts it; null when served as is.")


class UploadListFilterSerializer(serializers.Serializer):
    """Query of GET /models/{model_id}/uploads/: keep the open uploads of one file (each filter optional)."""

    filename = serializers.CharField(required=False, max_length=255, help_text="The file's name, e.g. model.onnx.")
    size_bytes = serializers.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, help_text="The file's size in bytes."
    )
    head_sha256 = serializers.RegexField(
        r"^[0-9a-fA-F]{64}$",
        required=False,
        help_text=f"SHA-256 (64 hex digits) of the file's first {HEAD_BYTES} bytes (all of it when shorter): the "
        "digest of the `head` its start carried, so a file of the same name and size but other first bytes is left "
        "out.",
        error_messages={"invalid": "head_sha256 must be 64 hex digits: the SHA-256 of the file's first bytes."},
    )


class UploadWaitSerializer(serializers.Serializer):
    """Query of GET /models/{model_id}/uploads/{upload_id}/: how long to wait for the worker's check."""

    wait = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=3600,
        help_text="Seconds (at most 10 are waited) to hold the answer while the upload is `completing`: it comes "
        "as soon as the check ends (`completed` or `failed`), or with the upload still `completing` when the time "
        "is up (ask again). Without it, or for an upload in any other status, the answer comes at once.",
    )


class StoredPartSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    size_bytes = serializers.IntegerField()
    etag = serializers.CharField()


class UploadSerializer(serializers.ModelSerializer):
    """A resumable upload; `parts` are those the object store holds now (context `parts`: {upload id: parts})."""

    model = serializers.PrimaryKeyRelatedField(read_only=True)
    sha256 = serializers.CharField(read_only=True)
    head_sha256 = serializers.CharField(
        read_only=True,
        help_text='SHA-256 (hex) of the first bytes the start carried as `head` ("" when it carried none): list '
        "the model's uploads with `head_sha256=` to find the open upload of a file without hashing all of it.",
    )
    parts = serializers.SerializerMethodField()
    version = serializers.PrimaryKeyRelatedField(read_only=True)
    part_checksum_algorithm = serializers.SerializerMethodField()

    class Meta:
        model = Upload
        fields = [
            "id",
            "model",
            "filename",
            "size_bytes",
            "sha256",
            "head_sha256",
            "part_size_bytes",
            "part_count",
            "part_checksum_algorithm",
            "status",
            "transport",
            "allow_duplicate",
            "parts",
            "created_at",
            "expires_at",
            "version",
            "error",
            "error_field",
        ]

    @extend_schema_field(
        serializers.ChoiceField(
            choices=PartChecksumAlgorithm.choices,
            allow_null=True,
            help_text='"CRC32": each part URL needs the part\'s CRC32 (POST .../parts/ `checksums`); null: none.',
        )
    )
    def get_part_checksum_algorithm(self, obj: Upload) -> str | None:
        return obj.part_checksum_algorithm or None

    @extend_schema_field(StoredPartSerializer(many=True))
    def get_parts(self, obj: Upload) -> list[dict]:
        parts = self.context.get("parts", {}).get(obj.pk, [])
        return [{"number": part.number, "size_bytes": part.size_bytes, "etag": part.etag} for part in parts]


class SignPartsSerializer(serializers.Serializer):
    numbers = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**31 - 1),
        min_length=1,
        max_length=100,
        help_text="Part numbers (1-based) to send now, at most 100.",
    )
    checksums = serializers.DictField(
        child=serializers.CharField(max_length=64, trim_whitespace=False),
        required=False,
        help_text="Per-part checksums, required for every number asked for when the upload's "
        '`part_checksum_algorithm` is "CRC32" (and refused otherwise): a JSON object from part number (as a string) '
        "to the base64 of the 4 big-endian bytes of the CRC32 of the part's bytes, e.g. "
        '{"3": "NSRBwg=="} (Python: base64.b64encode(zlib.crc32(part).to_bytes(4, "big"))). The part\'s `headers` '
        "then carry it (`x-amz-checksum-crc32`); a part whose bytes do not match is refused by the store.",
    )


class PartTargetSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    method = serializers.CharField()
    url = serializers.CharField(help_text="Presigned S3 URL, or Conch's own part URL with folder storage.")
    headers = serializers.DictField(
        child=serializers.CharField(),
        help_text="Headers to send with the bytes, exactly as given (a presigned URL signs the checksum headers).",
    )
    expires_at = serializers.DateTimeField()


class SignedPartsSerializer(serializers.Serializer):
    parts = PartTargetSerializer(many=True)


class CompletePartSerializer(serializers.Serializer):
    number = serializers.IntegerField(min_value=1, max_value=2**31 - 1)
    etag = serializers.CharField(max_length=200)


class CompleteUploadSerializer(serializers.Serializer):
    parts = CompletePartSerializer(many=True, required=False, help_text="Optional: the ETags the client kept.")
    sha256 = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=64,
        help_text="The file's SHA-256, when the start left it out (required then); else, if sent, it must be the same.",
    )
    allow_duplicate = serializers.BooleanField(
        required=False,
        default=False,
        help_text=ALLOW_DUPLICATE_HELP + " Refused here, the upload stays open with every part: complete again "
        "with allow_duplicate true, or abort it (DELETE the upload).",
    )
