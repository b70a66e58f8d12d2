"""REST views of deployments: create, inspect, stop, infer, metrics."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from conch.api import ErrorSerializer
from conch.errors import InvalidInput
from deployments import observe, services
from deployments.api.serializers import CreateDeploymentSerializer, DeploymentSerializer


class DeploymentViewSet(ListModelMixin, RetrieveModelMixin, GenericViewSet):
    """Deployments of your teams. DELETE stops one (its Triton ends, its ports are freed)."""

    serializer_class = DeploymentSerializer

    def get_queryset(self):
        return services.visible_deployments(user=self.request.user).order_by("id")

    @extend_schema(
        request=CreateDeploymentSerializer,
        responses={201: DeploymentSerializer, 400: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
    )
    def create(self, request: Request) -> Response:
        form = CreateDeploymentSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        v = form.validated_data
        deployment = services.create_deployment(
            user=request.user,
            team_slug=v["team"],
            name=v["name"],
            model_version_id=v["model_version"],
            runtime=v["runtime"],
            instance_count=v["instance_count"],
            max_batch_size=v["max_batch_size"],
            max_queue_delay_microseconds=v["max_queue_delay_microseconds"],
        )
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    def destroy(self, request: Request, pk: str) -> Response:
        deployment = services.request_stop(deployment=self.get_object())
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer, 409: ErrorSerializer, 503: ErrorSerializer},
        description="KServe v2 / Open Inference Protocol JSON request, forwarded to Triton; Triton's response. "
        'Example: {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]}. '
        "A request Triton rejects comes back 400 with Triton's message.",
    )
    @action(detail=True, methods=["post"], url_path="infer", parser_classes=[JSONParser])
    def infer(self, request: Request, pk: str) -> Response:
        return Response(services.infer(deployment=self.get_object(), request=request.data))

    @extend_schema(
        parameters=[OpenApiParameter("window", int, description="Seconds to look back (10..86400).")],
        responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer, 404: ErrorSerializer},
        description="Per model over the window: inference, request and execution counts, failures, throughput "
        "(inferences/s), requests/s, average request latency, queue and compute time (µs), average batch size "
        "(inferences per execution). Read from the samples the periodic scrape stores (every "
        "CONCH_METRICS_SCRAPE_INTERVAL_SECONDS); this request does not scrape. Figures are sums of the increases "
        "of Triton's cumulative counters between consecutive samples (an interval in which Triton restarted counts "
        "from zero). `series` holds, per model, one point per `step_seconds` (window/60 rounded up to whole scrape "
        "intervals) with the counts closed in that step, their rates and latency; the counts add up to `models`.",
    )
    @action(detail=True, methods=["get"], url_path="metrics")
    def metrics(self, request: Request, pk: str) -> Response:
        raw = request.query_params.get("window", "300")
        try:
            window = int(raw)
        except ValueError:
            raise InvalidInput("window must be a whole number of seconds.", field="window") from None
        return Response(observe.summarize(deployment=self.get_object(), window_seconds=window))
