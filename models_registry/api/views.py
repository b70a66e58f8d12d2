"""REST views of the model registry: translate HTTP to service calls, nothing more."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from conch.api import ErrorSerializer
from models_registry import deletion, services
from models_registry.api.serializers import CreateModelSerializer, RegisteredModelSerializer


class RegisteredModelViewSet(ListModelMixin, RetrieveModelMixin, GenericViewSet):
    """Models of your teams. POST registers a name in a team; DELETE removes a model with its versions."""

    serializer_class = RegisteredModelSerializer

    def get_queryset(self):
        return services.visible_models(user=self.request.user, token=self.request.auth).order_by("id")

    @extend_schema(
        request=CreateModelSerializer,
        responses={
            201: RegisteredModelSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
    )
    def create(self, request: Request) -> Response:
        form = CreateModelSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        model = services.create_model(
            user=request.user,
            team_slug=form.validated_data["team"],
            name=form.validated_data["name"],
            token=request.auth,
        )
        return Response(RegisteredModelSerializer(model).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None,
        responses={204: None, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer, 503: ErrorSerializer},
        description="Delete the model with every version: their uploaded files, sample inputs and build outputs "
        "leave the object store, then the rows go (freeing the team's storage and a place in its models quota). "
        "Stopped deployments of its versions go with it. 409 while a deployment that is not stopped uses a version "
        "(the body's `deployments` lists their ids and names) or a version uploads or builds. 503 when the object "
        "store fails: the model stays marked for deletion; send the DELETE again (or the sweeper finishes it).",
    )
    def destroy(self, request: Request, pk: str) -> Response:
        deletion.delete_model(user=request.user, model=self.get_object(), token=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)
