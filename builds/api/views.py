"""REST views of model versions and their builds: upload a version, read it, rebuild it.

They translate HTTP to service calls: the registry stores the upload, `builds.services` records it and queues
its build (the registry itself never queues work of a layer above it).
"""

from __future__ import annotations

import functools

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import GenericViewSet

from builds import services as builds
from builds.api.serializers import ModelVersionSerializer, UploadVersionSerializer
from conch.api import ErrorSerializer
from conch.errors import InvalidInput, UnsupportedMediaType
from models_registry import services
from models_registry.storage import get_object_store
from models_registry.uploads import (
    HeaderCsrfSessionAuthentication,
    ObjectStoreUploadHandler,
    check_content_length,
)
from tenancy.authentication import BearerTokenAuthentication

BUILD_OPTION_FIELDS = ("max_batch_size", "max_queue_delay_microseconds", "preferred_batch_size", "instance_count")


class ModelVersionListUploadView(APIView):
    """GET lists a model's versions; POST uploads a new version (multipart field `file`)."""

    parser_classes = [MultiPartParser]
    # Session auth's CSRF check would parse the body before the streaming handler is installed.
    authentication_classes = [BearerTokenAuthentication, HeaderCsrfSessionAuthentication]

    @extend_schema(responses={200: ModelVersionSerializer(many=True)})
    def get(self, request: Request, model_id: int) -> Response:
        model = services.get_model(user=request.user, model_id=model_id)
        versions = services.visible_versions(user=request.user).filter(model=model).prefetch_related("build_steps")
        return Response(ModelVersionSerializer(versions, many=True).data)

    @extend_schema(
        request={"multipart/form-data": UploadVersionSerializer},
        responses={
            201: ModelVersionSerializer,
            400: ErrorSerializer,
            404: ErrorSerializer,
            413: ErrorSerializer,
            415: ErrorSerializer,
        },
        description="Upload a model file (multipart field `file`) as the model's next version, with optional "
        "build options. The bytes stream to the object store; the build is queued. Poll GET /versions/{id}/.",
    )
    def post(self, request: Request, model_id: int) -> Response:
        model = services.get_model(user=request.user, model_id=model_id)
        max_bytes = settings.CONCH_MAX_UPLOAD_BYTES
        check_content_length(request._request, max_bytes)
        version = services.reserve_version(model=model, user=request.user)
        handler = ObjectStoreUploadHandler(
            get_object_store(),
            version.source_key,
            max_bytes=max_bytes,
            heartbeat=functools.partial(services.touch_upload, version_id=version.pk),
            heartbeat_interval_s=settings.CONCH_UPLOAD_HEARTBEAT_SECONDS,
        )
        # The bytes stream straight into the object store as the body is parsed.
        request._request.upload_handlers = [handler]
        try:
            try:
                data, files = request.data, request.FILES
            except exceptions.UnsupportedMediaType:
                raise UnsupportedMediaType(
                    "Send the model as multipart/form-data with the file in the field 'file' "
                    "(curl -F file=@model.onnx …).",
                    field="file",
                ) from None
            upload = files.get("file")
            if upload is None:
                raise InvalidInput("Send the model file in the multipart field 'file'.", field="file")
            options = {k: data.get(k) for k in BUILD_OPTION_FIELDS if data.get(k) not in (None, "")}
            version = builds.submit_upload(
                version=version, stored=upload.stored, filename=upload.name or "", options=options
            )
        except BaseException:
            handler.abort()  # a multipart upload still open in the store is aborted, not left pending
            services.discard_upload(version=version)
            raise
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ModelVersionViewSet(RetrieveModelMixin, ListModelMixin, GenericViewSet):
    """Model versions of your teams, with build steps, signature and generated config.pbtxt."""

    serializer_class = ModelVersionSerializer

    def get_queryset(self):
        return services.visible_versions(user=self.request.user).prefetch_related("build_steps").order_by("id")


class RebuildView(APIView):
    """POST starts the build of a version again from its stored file."""

    @extend_schema(request=None, responses={202: ModelVersionSerializer, 404: ErrorSerializer, 409: ErrorSerializer})
    def post(self, request: Request, version_id: int) -> Response:
        version = services.get_version(user=request.user, version_id=version_id)
        version = builds.request_rebuild(version=version)
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_202_ACCEPTED)
