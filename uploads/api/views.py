"""REST views of resumable uploads (docs/uploads.md): check a file, start, list, sign parts, receive a part (folder
storage only), complete, abort. They translate HTTP to service calls; `uploads.services` holds the rules.
"""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from builds.formats import format_by_key
from conch.api import BoundedLimitOffsetPagination, DuplicateVersionErrorSerializer, ErrorSerializer
from conch.authentication import HeaderCsrfSessionAuthentication
from conch.limits import BodyLimit, accepts_body
from models_registry import services as registry
from tenancy.authentication import BearerTokenAuthentication
from tenancy.services import get_team_for_user
from uploads import services
from uploads.api.serializers import (
    CheckedUploadFileSerializer,
    CheckUploadFileSerializer,
    CompleteUploadSerializer,
    SignedPartsSerializer,
    SignPartsSerializer,
    StartUploadSerializer,
    StoredPartSerializer,
    UploadListFilterSerializer,
    UploadSerializer,
    UploadWaitSerializer,
)

_ERRORS = {400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer}
#: A part's body: no part is larger than a whole file may be (413 before a byte is read); the exact part size is
#: checked by the view (400 naming the part).
PART_BODY = BodyLimit(setting="CONCH_MAX_UPLOAD_BYTES", variable="CONCH_MAX_UPLOAD_BYTES", field="size_bytes")
_STORE_DOWN = {503: ErrorSerializer}
#: A start or completion may be refused as a duplicate: the body then names the version the file already is.
_DUPLICATE = {409: DuplicateVersionErrorSerializer}


def _render(uploads: list, *, many: bool = False) -> dict | list:
    """Serialize uploads with the parts the store holds now."""
    parts = {upload.pk: services.stored_parts(upload=upload) for upload in uploads}
    data = UploadSerializer(uploads, many=True, context={"parts": parts}).data
    return data if many else data[0]


class CheckUploadFileView(APIView):
    """POST: can Conch build this file? Asked with its name and first bytes, before it is hashed or sent."""

    parser_classes = [JSONParser]

    @extend_schema(
        request=CheckUploadFileSerializer,
        responses={200: CheckedUploadFileSerializer, **_ERRORS},
        description="The rules of an upload's start on a file's name (`filename`) and first bytes (`head`), without "
        "a model or an upload: 200 with the format Conch builds the file as, or 400 naming `filename` or `head` with "
        "what the file looks like and what to do. With `model` (an id) or `team` (a slug), the team's rules apply "
        "too: a pickle is refused (400 naming `head`) unless a platform admin allowed pickled models for the team; "
        "a model or team the caller cannot see is 404. Nothing is stored. `conch upload` asks this before it hashes a "
        "file or registers a model, so the rules exist once, on the server.",
    )
    def post(self, request: Request) -> Response:
        form = CheckUploadFileSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        team = None
        if data.get("model") is not None:
            team = registry.get_model(user=request.user, model_id=data["model"], token=request.auth).team
        elif data.get("team"):
            team = get_team_for_user(user=request.user, slug=data["team"], token=request.auth)
        found = services.check_upload_file(
            filename=data["filename"], head=data["head"], size_bytes=data.get("size_bytes"), team=team
        )
        described = format_by_key(found).describe()
        return Response(
            {
                "format": found,
                "title": described["title"],
                "served_as": described["served_as"],
                "conversion": described["conversion"],
            }
        )


class ModelUploadsView(APIView):
    """GET lists a model's open resumable uploads; POST starts one (or gives back the open one of the same file)."""

    parser_classes = [JSONParser]
    # Used by `get` (an APIView pages nothing by itself); drf-spectacular documents the page from it.
    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(
        parameters=[UploadListFilterSerializer],
        responses={200: UploadSerializer(many=True), **_ERRORS, **_STORE_DOWN},
        description="The model's uploads still `uploading` (not expired) or `completing`, oldest first, a page at a "
        "time (`limit`, `offset`), each with the parts the object store holds now. `filename`, `size_bytes` and "
        "`head_sha256` (the SHA-256 of the `head` its start carried) keep only the uploads of one file: how a client "
        "that lost its own record of an upload finds it again, then sends only the missing parts (the promised "
        "SHA-256 is still checked on the joined file). A bad filter is 400 naming it.",
    )
    def get(self, request: Request, model_id: int) -> Response:
        model = registry.get_model(user=request.user, model_id=model_id, token=request.auth)
        query = UploadListFilterSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        paginator = self.pagination_class()
        found = services.open_uploads(model=model, **query.validated_data)
        page = paginator.paginate_queryset(found, request, view=self)
        return paginator.get_paginated_response(_render(page, many=True))

    @extend_schema(
        request=StartUploadSerializer,
        responses={
            201: UploadSerializer,
            200: OpenApiResponse(UploadSerializer, description="The open upload of the same file, to resume."),
            **_ERRORS,
            413: ErrorSerializer,
            **_DUPLICATE,
            **_STORE_DOWN,
        },
        description="Start a resumable upload of a model file: its name, size and SHA-256 are promised now. A name "
        "that says the file is not an ONNX model (an ending other than .onnx, such as .pt or .bin) is refused with 400 "
        "naming `filename`; with `head` (optional: the file's first bytes, base64), first bytes that show another "
        "format are refused with 400 naming `head`. Both are checked before the SHA-256, which may be left out "
        "here and sent with .../complete, so a client can ask before hashing the file. The size "
        "is checked against CONCH_MAX_UPLOAD_BYTES (413 naming size_bytes) and reserved in the team's storage quota "
        "(409 with `quota`) before anything starts in the object store; the reservation lasts until the upload "
        "completes, is aborted or expires. The same file (model, filename, size, sha256) while an upload of it is "
        "open gives that upload back (200), so a client that stopped resumes. Then ask for part URLs "
        "(POST .../parts/), send the parts, and POST .../complete. With a `sha256` that already is a live version's of "
        "the model the start is refused with 409 naming `sha256`, `existing_version` ({id, number, status}) saying "
        "which; send `allow_duplicate: true` to make another version from the same file. With "
        '`part_checksum_algorithm` "CRC32" every part goes with the CRC32 of its bytes, checked by the store as it '
        "arrives (any other value: 400 naming the field); a start without it is not given back an open upload that "
        "has it.",
    )
    def post(self, request: Request, model_id: int) -> Response:
        model = registry.get_model(user=request.user, model_id=model_id, token=request.auth)
        form = StartUploadSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        upload, created = services.start_resumable_upload(
            user=request.user,
            model=model,
            filename=data["filename"],
            size_bytes=data["size_bytes"],
            sha256=data.get("sha256") or "",
            part_size_bytes=data.get("part_size_bytes"),
            build_options={k: v for k, v in (data.get("build_options") or {}).items() if v is not None},
            head=data.get("head"),
            part_checksum_algorithm=data.get("part_checksum_algorithm"),
            token=request.auth,
            allow_duplicate=data.get("allow_duplicate", False),
        )
        return Response(_render([upload]), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class UploadDetailView(APIView):
    """GET one upload with the parts the store holds; DELETE aborts it."""

    @extend_schema(
        parameters=[UploadWaitSerializer],
        responses={200: UploadSerializer, **_ERRORS, **_STORE_DOWN},
        description="The upload, with `parts` listed fresh from the object store: resume by sending the others. "
        "After POST .../complete, ask again until `completed` (`version` is then the new version, its build queued) "
        "or `failed` (`error` says why and what to do); with `wait` the answer comes as soon as the check ends "
        "(a long poll of at most 10 s). A bad `wait` is 400 naming it.",
    )
    def get(self, request: Request, model_id: int, upload_id: str) -> Response:
        query = UploadWaitSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        upload = services.get_upload(user=request.user, model_id=model_id, upload_id=upload_id, token=request.auth)
        if query.validated_data.get("wait"):
            upload = services.wait_for_check(upload=upload, wait_s=query.validated_data["wait"])
        return Response(_render([upload]))

    @extend_schema(
        request=None,
        responses={204: None, **_ERRORS, **_STORE_DOWN},
        description="Abort the upload: the object store drops its parts and the team's storage reservation ends. "
        "409 while it is `completing` or once `completed`; an aborted or failed upload stays as it is.",
    )
    def delete(self, request: Request, model_id: int, upload_id: str) -> Response:
        upload = services.get_upload(user=request.user, model_id=model_id, upload_id=upload_id, token=request.auth)
        services.abort_upload(user=request.user, upload=upload, token=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UploadPartsView(APIView):
    """POST gives where to send each of some parts."""

    parser_classes = [JSONParser]

    @extend_schema(
        request=SignPartsSerializer,
        responses={200: SignedPartsSerializer, **_ERRORS, **_STORE_DOWN},
        description="Where to PUT each part (up to 100 numbers a call). With S3 storage: presigned UploadPart URLs "
        "of the bucket: PUT exactly the part's bytes there and keep the ETag response header; the bytes never pass "
        "through Conch. With folder storage: Conch's own part URL (send your usual Authorization). Each part is "
        "`part_size_bytes` bytes (the last one what is left). Asking pushes the upload's `expires_at`. For an "
        'upload with `part_checksum_algorithm` "CRC32", send `checksums` with each part\'s CRC32 (400 naming '
        "`checksums.<n>` without it): the part's `headers` then carry `x-amz-checksum-crc32` (and, for S3, "
        "`x-amz-sdk-checksum-algorithm`), signed into the URL; send them exactly. The store refuses bytes with "
        "another CRC32 (S3: 400 BadDigest; folder storage: 400 naming `parts[n]`): send that part again.",
    )
    def post(self, request: Request, model_id: int, upload_id: str) -> Response:
        upload = services.get_upload(user=request.user, model_id=model_id, upload_id=upload_id, token=request.auth)
        form = SignPartsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        numbers = form.validated_data["numbers"]
        checksums = form.validated_data.get("checksums")
        targets = services.sign_parts(
            user=request.user, upload=upload, numbers=numbers, checksums=checksums, token=request.auth
        )
        now = timezone.now()
        parts = []
        for number, target in zip(numbers, targets, strict=True):
            if target is None:
                path = reverse(
                    "model-upload-part", kwargs={"model_id": model_id, "upload_id": upload.pk, "number": number}
                )
                parts.append(
                    {
                        "number": number,
                        "method": "PUT",
                        "url": request.build_absolute_uri(path),
                        "headers": services.conch_part_headers(upload, number, checksums),
                        "expires_at": upload.expires_at,
                    }
                )
            else:
                parts.append(
                    {
                        "number": target.number,
                        "method": target.method,
                        "url": target.url,
                        "headers": target.headers,
                        "expires_at": now + timedelta(seconds=target.expires_in_s),
                    }
                )
        return Response(SignedPartsSerializer({"parts": parts}).data)


class UploadPartView(APIView):
    """PUT receives one part of a folder-storage upload, streamed to disk."""

    # The body is the part's raw bytes, read as a stream: no parser, and a CSRF check that never reads it.
    parser_classes: list = []
    authentication_classes = [BearerTokenAuthentication, HeaderCsrfSessionAuthentication]

    @extend_schema(
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={200: StoredPartSerializer, **_ERRORS, 413: ErrorSerializer, **_STORE_DOWN},
        description="Folder storage only (404 for an upload straight to the bucket): the body is exactly part "
        "`number`'s bytes, Content-Length equal to its size (400 naming the part otherwise; 413 past "
        "CONCH_MAX_UPLOAD_BYTES). Streamed to the "
        "store's staging folder a megabyte at a time; sending a part again replaces it. With an "
        '`x-amz-checksum-crc32` header (required for an upload with `part_checksum_algorithm` "CRC32": 400 naming '
        "`checksums.<n>` without it) the bytes must have that CRC32: otherwise 400 naming `parts[n]`, the copy is not "
        "kept (the parts already stored are) and the part must be sent again.",
    )
    @accepts_body(PART_BODY)
    def put(self, request: Request, model_id: int, upload_id: str, number: str) -> Response:
        upload = services.get_upload(user=request.user, model_id=model_id, upload_id=upload_id, token=request.auth)
        try:
            length: int | None = int(request.META.get("CONTENT_LENGTH") or "")
        except ValueError:
            length = None
        part = services.receive_part(
            user=request.user,
            upload=upload,
            number=int(number),
            stream=request._request,
            content_length=length,
            checksum_crc32=request.META.get("HTTP_X_AMZ_CHECKSUM_CRC32"),
            token=request.auth,
        )
        return Response({"number": part.number, "size_bytes": part.size_bytes, "etag": part.etag})


class UploadCompleteView(APIView):
    """POST asks Conch to join the parts and check the file."""

    parser_classes = [JSONParser]

    @extend_schema(
        request=CompleteUploadSerializer,
        responses={202: UploadSerializer, **_ERRORS, **_DUPLICATE, **_STORE_DOWN},
        description="Every part must be in the object store at its size (409 naming the first missing or "
        "wrong-sized part). The upload becomes `completing`: a worker joins the parts, checks the size promised at "
        "the start (no read of the object), then makes the model's next version and queues its build (`completed`, "
        "`version` set); on a size mismatch the upload is `failed`, `error` naming size_bytes with expected and got "
        "values, the object deleted and the quota freed. Poll GET the upload. The promised SHA-256 is checked by the "
        "version's build on the file it downloads (`source.sha256_checked` false until then): a mismatch fails the "
        "version with `error_field` sha256. A start that left the SHA-256 out must send it here (`sha256`, 400 "
        "naming it otherwise). A file (its SHA-256) that already is a live version of the model is refused with 409 "
        "naming `sha256`, `existing_version` ({id, number, status}) saying which, unless `allow_duplicate` is true "
        "here or was at the start: the upload then stays `uploading` with every part, to complete again with "
        "`allow_duplicate: true` or to abort (DELETE); left alone, it expires. Should two identical uploads "
        "complete at once, the first makes its version and the second fails naming `sha256` and that version.",
    )
    def post(self, request: Request, model_id: int, upload_id: str) -> Response:
        upload = services.get_upload(user=request.user, model_id=model_id, upload_id=upload_id, token=request.auth)
        form = CompleteUploadSerializer(data=request.data or {})
        form.is_valid(raise_exception=True)
        upload = services.complete_resumable_upload(
            user=request.user,
            upload=upload,
            client_parts=form.validated_data.get("parts"),
            sha256=form.validated_data.get("sha256") or None,
            token=request.auth,
            allow_duplicate=form.validated_data.get("allow_duplicate", False),
        )
        return Response(_render([upload]), status=status.HTTP_202_ACCEPTED)
