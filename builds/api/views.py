"""REST views of model versions and their builds: upload a version, read it, rebuild it.

They translate HTTP to service calls: the registry stores the upload, `builds.services` records it and queues
its build (the registry itself never queues work of a layer above it).
"""

from __future__ import annotations

import difflib
import functools
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import GenericViewSet

from builds import services as builds
from builds.api.serializers import (
    BuildOptionsSerializer,
    BuildSerializer,
    CreatePipelineSerializer,
    CustomBackendSerializer,
    ModelFormatSerializer,
    ModelVersionSerializer,
    OptionsCheckSerializer,
    PipelineSerializer,
    PipelineVersionSerializer,
    PipelineVersionSpecSerializer,
    RebuildSerializer,
    RegisterBackendSerializer,
    UploadVersionSerializer,
    VersionReviewSerializer,
)
from builds.formats import (
    HEAD_BYTES,
    check_format_allowed,
    check_model_filename,
    check_model_head,
    describe_formats,
)
from builds.model_config import (
    BUILD_OPTION_FIELDS,
    GRAPH_INPUTS_FIELD,
    GRAPH_OUTPUTS_FIELD,
    INPUT_SPEC_FIELD,
    OUTPUT_DIMS_FIELD,
    OUTPUT_SPEC_FIELD,
    TOLERANCE_FIELD,
)
from builds.services import backends as backend_services
from builds.services import pipelines as pipeline_services
from builds.services import state as build_state
from builds.services.review import (
    DYNAMIC_BATCHING_FIELD,
    OPTION_NAMES,
    batching_reason,
    check_build_options,
    config_diff,
    signature_rows,
)
from builds.verification import MAX_SAMPLE_INPUTS_BYTES, SAMPLE_INPUTS_FIELD, SAMPLE_VALUES_FIELD
from conch.api import BoundedLimitOffsetPagination, DuplicateVersionErrorSerializer, ErrorSerializer
from conch.authentication import HeaderCsrfSessionAuthentication
from conch.errors import InvalidInput, UnsupportedMediaType
from conch.limits import STREAMED, BodyLimit, accepts_body
from conch.upload_handlers import (
    MULTIPART_SLACK_BYTES,
    ObjectStoreUploadHandler,
    check_content_length,
    declared_file_bytes,
)
from models_registry import deletion, services
from models_registry.storage import get_object_store
from tenancy.authentication import BearerTokenAuthentication

#: The fields a version upload's form takes besides the build options (Django's form CSRF token included).
UPLOAD_FORM_FIELDS = ("file", SAMPLE_INPUTS_FIELD, SAMPLE_VALUES_FIELD, "allow_duplicate", "csrfmiddlewaretoken")
#: The fields a rebuild takes.
REBUILD_FIELDS = (
    *OPTION_NAMES,
    DYNAMIC_BATCHING_FIELD,
    OUTPUT_DIMS_FIELD,
    TOLERANCE_FIELD,
    GRAPH_INPUTS_FIELD,
    GRAPH_OUTPUTS_FIELD,
    INPUT_SPEC_FIELD,
    OUTPUT_SPEC_FIELD,
    SAMPLE_INPUTS_FIELD,
    SAMPLE_VALUES_FIELD,
    "csrfmiddlewaretoken",
)


def refuse_unknown_fields(sent: Iterable[str], known: tuple[str, ...], what: str) -> None:
    """Refuse a body field Conch does not take, so a misspelt build option is not quietly left out (the build would
    then use the model's default). Raises InvalidInput naming the first unknown field, the closest known name, and
    every field `what` takes."""
    unknown = [name for name in sent if name not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    takes = ", ".join(name for name in known if name != "csrfmiddlewaretoken")
    raise InvalidInput(f"{what} has no field {unknown[0]!r}.{hint} It takes {takes}.", field=unknown[0])


#: A rebuild's body: an .npz of sample inputs (streamed, checked by its upload handler) or a small JSON object.
REBUILD_BODY = BodyLimit(
    setting=None, variable=None, field=SAMPLE_INPUTS_FIELD, extra_bytes=MAX_SAMPLE_INPUTS_BYTES + MULTIPART_SLACK_BYTES
)


def parse_allow_duplicate(value: object) -> bool:
    """The form field `allow_duplicate` as a boolean: left out or empty is false; true/false, 1/0, yes/no, on/off
    (any case) as written. Raises InvalidInput naming it for anything else."""
    if value in (None, ""):
        return False
    try:
        return serializers.BooleanField().to_internal_value(value)
    except exceptions.ValidationError:
        raise InvalidInput(
            f"allow_duplicate must be true or false, got {str(value)[:40]!r}.", field="allow_duplicate"
        ) from None


class ModelVersionListUploadView(APIView):
    """GET lists a model's versions; POST uploads a new version (multipart field `file`)."""

    parser_classes = [MultiPartParser]
    # Session auth's CSRF check would parse the body before the streaming handler is installed.
    authentication_classes = [BearerTokenAuthentication, HeaderCsrfSessionAuthentication]
    # Used by `get` (an APIView pages nothing by itself); drf-spectacular documents the page from it.
    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(
        responses={200: ModelVersionSerializer(many=True), 400: ErrorSerializer, 404: ErrorSerializer},
        description="The model's versions, oldest first, a page at a time (`limit`, `offset`).",
    )
    def get(self, request: Request, model_id: int) -> Response:
        model = services.get_model(user=request.user, model_id=model_id, token=request.auth)
        versions = services.visible_versions(user=request.user, token=request.auth).filter(model=model)
        versions = build_state.with_builds(versions.order_by("number"))
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(versions, request, view=self)
        return paginator.get_paginated_response(ModelVersionSerializer(page, many=True).data)

    @extend_schema(
        request={"multipart/form-data": UploadVersionSerializer},
        responses={
            201: ModelVersionSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: DuplicateVersionErrorSerializer,
            413: ErrorSerializer,
            415: ErrorSerializer,
        },
        description="Upload a model file (multipart field `file`) as the model's next version, with optional "
        "build options and sample inputs for the verify step (`sample_inputs`: an .npz of named arrays in the "
        "shapes the model takes; `sample_values`: per-input values such as `sr=16000`; `output_dims`: outputs' "
        "shapes in place of those the model file declares, e.g. `387=-1,1,8210`). The bytes stream to the "
        "object store; the build is queued. Poll GET /versions/{id}/. 409 when the file does not fit in the team's "
        "storage quota (the body then has `quota`: limit, used, requested): at once when the declared body "
        "(Content-Length) cannot fit, else as soon as more bytes than are free have arrived, and again once stored. "
        "The build's repository (a copy of the file and its configuration) counts in storage too. 400 naming `file` "
        "for a file that is not an ONNX model: by its name (an ending other than .onnx) before a byte is read, or "
        "by its first bytes, before they are stored. 409 naming `sha256`, with `existing_version` ({id, number, "
        "status}), when the file (its SHA-256, known once it is stored) already is a live version of the model: what "
        "was stored is deleted; send the form field `allow_duplicate=true` to make another version from the same file.",
    )
    @accepts_body(STREAMED)
    def post(self, request: Request, model_id: int) -> Response:
        model = services.get_model(user=request.user, model_id=model_id, token=request.auth)
        max_bytes = settings.CONCH_MAX_UPLOAD_BYTES
        # The body may carry the model, an .npz of sample inputs and the small form fields.
        slack = MULTIPART_SLACK_BYTES + MAX_SAMPLE_INPUTS_BYTES
        check_content_length(request._request, max_bytes, slack_bytes=slack)
        declared = declared_file_bytes(request._request, slack_bytes=slack)
        version = services.reserve_version(model=model, user=request.user, token=request.auth)
        try:  # after the role check of reserve_version: a viewer learns nothing of the team's storage
            room = services.check_upload_room(model=model, declared_bytes=declared)
        except BaseException:
            services.discard_upload(version=version)
            raise
        store = get_object_store()
        handler = ObjectStoreUploadHandler(
            store,
            version.source_key,
            max_bytes=max_bytes,
            other_fields=(SAMPLE_INPUTS_FIELD,),
            slack_bytes=slack,
            heartbeat=functools.partial(services.touch_upload, version_id=version.pk),
            heartbeat_interval_s=settings.CONCH_UPLOAD_HEARTBEAT_SECONDS,
            room=room,
            # Another format is refused by its name, or by its first bytes, before they are stored.
            check_name=functools.partial(check_model_filename, field="file"),
            check_head=lambda head, size, name: check_format_allowed(
                check_model_head(head, size_bytes=size, field="file", filename=name), team=model.team
            ),
            head_bytes=HEAD_BYTES,
        )
        samples_handler = ObjectStoreUploadHandler(
            store,
            services.sample_inputs_key(model_id=model.pk, number=version.number, incoming=True),
            max_bytes=MAX_SAMPLE_INPUTS_BYTES,
            field_name=SAMPLE_INPUTS_FIELD,
            slack_bytes=max_bytes + MULTIPART_SLACK_BYTES,
            heartbeat=functools.partial(services.touch_upload, version_id=version.pk),
            heartbeat_interval_s=settings.CONCH_UPLOAD_HEARTBEAT_SECONDS,
        )
        # The bytes stream straight into the object store as the body is parsed.
        request._request.upload_handlers = [handler, samples_handler]
        try:
            try:
                data, files = request.data, request.FILES
            except exceptions.UnsupportedMediaType:
                raise UnsupportedMediaType(
                    "Send the model as multipart/form-data with the file in the field 'file' "
                    "(curl -F file=@model.onnx …).",
                    field="file",
                ) from None
            refuse_unknown_fields(
                [*data.keys(), *files.keys()], (*UPLOAD_FORM_FIELDS, *BUILD_OPTION_FIELDS), "An upload"
            )
            upload = files.get("file")
            if upload is None:
                raise InvalidInput("Send the model file in the multipart field 'file'.", field="file")
            options = {k: data.get(k) for k in BUILD_OPTION_FIELDS if data.get(k) not in (None, "")}
            allow_duplicate = parse_allow_duplicate(data.get("allow_duplicate"))
            samples = files.get(SAMPLE_INPUTS_FIELD)
            version = builds.submit_upload(
                version=version,
                stored=upload.stored,
                filename=upload.name or "",
                options=options,
                sample_inputs=samples.stored if samples is not None else None,
                sample_values=data.get(SAMPLE_VALUES_FIELD) or None,
                allow_duplicate=allow_duplicate,
            )
        except BaseException:
            # Multipart uploads still open in the store are aborted, not left pending.
            handler.abort()
            samples_handler.abort()
            services.discard_upload(version=version)
            raise
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ModelVersionViewSet(RetrieveModelMixin, ListModelMixin, GenericViewSet):
    """Model versions of your teams, with build steps, signature and generated config.pbtxt; DELETE removes one."""

    serializer_class = ModelVersionSerializer

    def get_queryset(self):
        versions = services.visible_versions(user=self.request.user, token=self.request.auth)
        return build_state.with_builds(versions.order_by("id"))

    @extend_schema(
        request=None,
        responses={204: None, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer, 503: ErrorSerializer},
        description="Delete the version: its uploaded file, sample inputs and every build's repository leave the "
        "object store, then its row goes (freeing the team's storage). Stopped deployments of it go with it. 409 "
        "while a deployment that is not stopped serves it or is being updated to it (the body's `deployments` lists "
        "their ids and names), or while it uploads or builds (wait for the build to finish). 503 when the object "
        "store fails: the version stays 'deleting'; send the DELETE again (or the sweeper finishes it).",
    )
    def destroy(self, request: Request, pk: str) -> Response:
        deletion.delete_model_version(user=request.user, version=self.get_object(), token=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RebuildView(APIView):
    """POST starts the build of a version again from its stored file, optionally with new sample inputs."""

    parser_classes = [MultiPartParser, JSONParser, FormParser]
    # As for uploads: the CSRF check must not parse the body before the samples handler is installed.
    authentication_classes = [BearerTokenAuthentication, HeaderCsrfSessionAuthentication]

    @extend_schema(
        request={"multipart/form-data": RebuildSerializer, "application/json": RebuildSerializer},
        responses={
            202: ModelVersionSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
            413: ErrorSerializer,
        },
        description="Build the version again. `sample_inputs` (an .npz file) and `sample_values` (text such as "
        "`sr=16000`, or a JSON object) replace the version's sample inputs for the verify step; leave them out to "
        "keep what the version has. Build options (`max_batch_size`, `max_queue_delay_microseconds`, "
        "`preferred_batch_size`, `instance_count`, `dynamic_batching` false for max_batch_size 0, and `output_dims`: "
        'outputs\' full shapes such as {"387": [-1, 1, 8210]} in place of those the model file declares): when any '
        "is sent they replace the version's options (one left out goes back to the model's default), checked first "
        "by the build's rules (400 naming the option and, for output_dims, the tensor; `POST "
        "/versions/{id}/check-options` lists every field at fault). 413 when `sample_inputs` unpack past "
        "CONCH_MAX_SAMPLE_UNPACKED_BYTES or hold more than CONCH_MAX_SAMPLE_ARRAYS arrays (found before anything "
        "is unpacked).",
    )
    @accepts_body(REBUILD_BODY)
    def post(self, request: Request, version_id: int) -> Response:
        version = services.get_version(user=request.user, version_id=version_id, token=request.auth)
        handler = ObjectStoreUploadHandler(
            get_object_store(),
            services.sample_inputs_key(model_id=version.model_id, number=version.number, incoming=True),
            max_bytes=MAX_SAMPLE_INPUTS_BYTES,
            field_name=SAMPLE_INPUTS_FIELD,
        )
        request._request.upload_handlers = [handler]
        try:
            try:
                data, files = request.data, request.FILES
            except exceptions.UnsupportedMediaType:
                raise UnsupportedMediaType(
                    "Send the rebuild as multipart/form-data (sample_inputs file, sample_values field) or as JSON "
                    '({"sample_values": {"sr": 16000}}), or with no body.',
                    field=SAMPLE_INPUTS_FIELD,
                ) from None
            if not isinstance(data, Mapping):
                raise InvalidInput(
                    'Send the rebuild body as a JSON object such as {"sample_values": {"sr": 16000}}.',
                    field=SAMPLE_VALUES_FIELD,
                )
            refuse_unknown_fields([*data.keys(), *files.keys()], REBUILD_FIELDS, "A rebuild")
            samples = files.get(SAMPLE_INPUTS_FIELD)
            option_keys = [
                key
                for key in (
                    *OPTION_NAMES,
                    DYNAMIC_BATCHING_FIELD,
                    OUTPUT_DIMS_FIELD,
                    TOLERANCE_FIELD,
                    GRAPH_INPUTS_FIELD,
                    GRAPH_OUTPUTS_FIELD,
                    INPUT_SPEC_FIELD,
                    OUTPUT_SPEC_FIELD,
                )
                if key in data
            ]
            version = builds.request_rebuild(
                user=request.user,
                token=request.auth,
                version=version,
                sample_inputs=samples.stored if samples is not None else None,
                sample_values=data.get(SAMPLE_VALUES_FIELD) if SAMPLE_VALUES_FIELD in data else None,
                options={key: data.get(key) for key in option_keys} if option_keys else None,
            )
        except BaseException:
            handler.discard()  # the incoming samples are never left behind
            raise
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_202_ACCEPTED)


class CheckOptionsView(APIView):
    """POST checks build options for a version by the build's own rules, without building (inline validation)."""

    parser_classes = [JSONParser, FormParser]

    @extend_schema(
        request=BuildOptionsSerializer,
        responses={200: OptionsCheckSerializer, 404: ErrorSerializer},
        description="Check build options as a rebuild would (the same rules as the configure step, against the "
        "version's inspected signature). 200 with `errors`: every option at fault as {field, detail} (empty when "
        "all is well), and `config_pbtxt`: the configuration these options would give. Nothing is changed.",
    )
    def post(self, request: Request, version_id: int) -> Response:
        version = services.get_version(user=request.user, version_id=version_id, token=request.auth)
        if not isinstance(request.data, Mapping):
            raise InvalidInput("Send the build options as a JSON object.", field="max_batch_size")
        check = check_build_options(version=version, fields=request.data)
        return Response({"errors": check.errors, "config_pbtxt": check.config_pbtxt})


class VersionReviewView(APIView):
    """GET what a build found and wrote: signature rows with the batch axis, why batching is on or off, the diff."""

    @extend_schema(
        responses={200: VersionReviewSerializer, 404: ErrorSerializer},
        description="The inspected signature as rows (role, name, datatype, dims, shape text with the batch axis "
        "marked `batch*`), the build's reason for batching or not (from its log), the generated config.pbtxt and "
        "its unified diff against the previous built version of the same model.",
    )
    def get(self, request: Request, version_id: int) -> Response:
        version = services.get_version(user=request.user, version_id=version_id, token=request.auth)
        diff = config_diff(version, services.visible_versions(user=request.user, token=request.auth))
        return Response(
            {
                "version": version.pk,
                "status": version.status,
                "signature": [row.__dict__ for row in signature_rows(version)],
                "batching_reason": batching_reason(version),
                "config_pbtxt": build_state.latest_config_pbtxt(version),
                "previous_version_number": diff.previous_number,
                "config_diff": diff.diff,
            }
        )


class FormatListView(APIView):
    """GET the model formats Conch builds, with the conversion each gets."""

    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(
        responses={200: ModelFormatSerializer(many=True), 400: ErrorSerializer},
        description="Every format an upload may be in: its key, title, file name endings, the Triton backend that "
        "serves it and the tool that converts it (null when Triton serves the file as uploaded). A file is told by "
        "its name and its first bytes together (POST /api/v1/uploads/check/ tells one file's).",
    )
    def get(self, request: Request) -> Response:
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(describe_formats(), request, view=self)
        return paginator.get_paginated_response(ModelFormatSerializer(page, many=True).data)


class VersionBuildListView(APIView):
    """GET every build attempt of a version, newest first, with its steps and logs."""

    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(
        responses={200: BuildSerializer(many=True), 400: ErrorSerializer, 404: ErrorSerializer},
        description="The version's build history: every attempt, newest first, a page at a time (`limit`, `offset`), "
        "each with its status (queued, building, succeeded, failed; `lost` when its worker stopped mid-build and the "
        "next attempt took over; `superseded` when a rebuild replaced it), the options it used, the worker that ran "
        "it, its times, the repository it wrote, the configuration it generated, its error and its steps with their "
        "logs. 404 for a version outside your teams.",
    )
    def get(self, request: Request, version_id: int) -> Response:
        version = services.get_version(user=request.user, version_id=version_id, token=request.auth)
        attempts = build_state.builds_of(version_id=version.pk).prefetch_related("steps")
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(attempts, request, view=self)
        return paginator.get_paginated_response(BuildSerializer(page, many=True).data)


class BackendListRegisterView(APIView):
    """GET the custom backends of the caller's teams; POST registers one (multipart: team, name, version, file)."""

    parser_classes = [MultiPartParser]
    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(
        responses={200: CustomBackendSerializer(many=True), 400: ErrorSerializer},
        description="The custom backends of the teams the caller sees, a page at a time (`limit`, `offset`).",
    )
    def get(self, request: Request) -> Response:
        backends = backend_services.list_backends(user=request.user, token=request.auth).order_by("name", "-pk")
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(backends, request, view=self)
        return paginator.get_paginated_response(CustomBackendSerializer(page, many=True).data)

    @extend_schema(
        request={"multipart/form-data": RegisterBackendSerializer},
        responses={201: CustomBackendSerializer, 400: ErrorSerializer, 403: ErrorSerializer, 409: ErrorSerializer},
        description='Register a backend of the team\'s own (Triton "Backends"): a zip or tar of its folder, '
        "libtriton_NAME.so with the libraries it needs (checked before it is accepted: an ELF shared library for the "
        "nodes' architecture, exporting TRITONBACKEND_ModelInstanceExecute, calling only functions the Triton release "
        "Conch runs exports, its needed libraries shipped or standard) or model.py (a Python-based backend). Models "
        'whose config.pbtxt says backend: "NAME" are then served with it. 400 names what is wrong; 409 for a name '
        "and version the team has already.",
    )
    @accepts_body(backend_services.BACKEND_BODY)
    def post(self, request: Request) -> Response:
        refuse_unknown_fields(
            [*request.data.keys()],
            ("team", "name", "version", "file", "api_version", "csrfmiddlewaretoken"),
            "A backend",
        )
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidInput("Send the backend's archive as the multipart field 'file'.", field="file")
        with tempfile.TemporaryDirectory(prefix="conch-backend-upload-") as work:
            archive = Path(work) / "backend.archive"
            with archive.open("wb") as out:
                for chunk in upload.chunks():
                    out.write(chunk)
            backend = backend_services.register_backend(
                user=request.user,
                team_slug=str(request.data.get("team") or ""),
                name=str(request.data.get("name") or ""),
                version=str(request.data.get("version") or ""),
                archive=archive,
                api_version=str(request.data.get("api_version") or "") or None,
                token=request.auth,
            )
        return Response(CustomBackendSerializer(backend).data, status=201)


class BackendDetailView(APIView):
    """GET one custom backend; DELETE removes it while no model version uses it."""

    @extend_schema(responses={200: CustomBackendSerializer, 404: ErrorSerializer})
    def get(self, request: Request, backend_id: int) -> Response:
        backend = backend_services.get_backend(user=request.user, backend_id=backend_id, token=request.auth)
        return Response(CustomBackendSerializer(backend).data)

    @extend_schema(
        responses={204: None, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
        description="Delete the backend and its files; 409 while a model version built with it exists.",
    )
    def delete(self, request: Request, backend_id: int) -> Response:
        backend_services.delete_backend(user=request.user, backend_id=backend_id, token=request.auth)
        return Response(status=204)


class PipelineListCreateView(APIView):
    """GET the pipelines of the caller's teams; POST registers one ({"team", "name"})."""

    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(responses={200: PipelineSerializer(many=True), 400: ErrorSerializer})
    def get(self, request: Request) -> Response:
        found = pipeline_services.list_pipelines(user=request.user, token=request.auth).order_by("name", "pk")
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(found.prefetch_related("versions"), request, view=self)
        return paginator.get_paginated_response(PipelineSerializer(page, many=True).data)

    @extend_schema(
        request=CreatePipelineSerializer,
        responses={201: PipelineSerializer, 400: ErrorSerializer, 403: ErrorSerializer, 409: ErrorSerializer},
        description="Register a pipeline name in a team: the name of the Triton ensemble its versions generate.",
    )
    def post(self, request: Request) -> Response:
        data = request.data if isinstance(request.data, Mapping) else {}
        refuse_unknown_fields(list(data), ("team", "name"), "A pipeline")
        pipeline = pipeline_services.create_pipeline(
            user=request.user,
            team_slug=str(data.get("team") or ""),
            name=str(data.get("name") or ""),
            token=request.auth,
        )
        return Response(PipelineSerializer(pipeline).data, status=201)


class PipelineDetailView(APIView):
    """GET one pipeline with its versions."""

    @extend_schema(responses={200: PipelineSerializer, 404: ErrorSerializer})
    def get(self, request: Request, pipeline_id: int) -> Response:
        pipeline = pipeline_services.get_pipeline(user=request.user, pipeline_id=pipeline_id, token=request.auth)
        return Response(PipelineSerializer(pipeline).data)


class PipelineVersionCreateView(APIView):
    """POST a pipeline version: its steps are checked as a graph before it is made."""

    @extend_schema(
        request=PipelineVersionSpecSerializer,
        responses={201: PipelineVersionSerializer, 400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
        description="Check a pipeline's steps (built model versions of the team, wired by tensor names) against "
        "the configurations those versions serve, by Triton's ensemble rules: datatypes and shapes through the "
        "graph, unconnected inputs, tensors nothing uses, cycles, batch sizes. 400 lists every problem under "
        "`errors`, each naming the step, the tensor and both sides; 201 gives the version with its graph and the "
        "ensemble's generated model configuration.",
    )
    def post(self, request: Request, pipeline_id: int) -> Response:
        pipeline = pipeline_services.get_pipeline(user=request.user, pipeline_id=pipeline_id, token=request.auth)
        data = request.data if isinstance(request.data, Mapping) else {}
        refuse_unknown_fields(list(data), ("inputs", "outputs", "max_batch_size", "steps"), "A pipeline version")
        version = pipeline_services.create_pipeline_version(
            user=request.user, pipeline=pipeline, spec=data, token=request.auth
        )
        return Response(PipelineVersionSerializer(version).data, status=201)
