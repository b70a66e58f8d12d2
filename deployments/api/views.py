"""REST views of deployments: create, inspect, stop, infer, metrics."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse, QueryDict
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from conch.api import MAX_OFFSET, MAX_PAGE_SIZE, ErrorSerializer, RefusalsSerializer
from conch.errors import InvalidInput
from conch.limits import INFERENCE_BODY, accepts_body
from conch.throttling import InferenceRateThrottle
from deployments import observe, services
from deployments.api.serializers import (
    CreateDeploymentSerializer,
    CreateTensorRTPlanSerializer,
    DeploymentSerializer,
    GatewayUsageQuerySerializer,
    GatewayUsageSerializer,
    TensorRTPlanSerializer,
    UpdateDeploymentSerializer,
)
from deployments.services import DeploymentRequest, PlacementRequest
from tritonserving.client import BINARY_ONLY_DATATYPES, HEADER_LENGTH, JSON_DATATYPES

# KServe v2 "Inference Request JSON Object", for the OpenAPI schema (Swagger's form, clients, fuzzers); the view
# itself passes the body on, and the Triton adapter checks it.
_TENSOR_PARAMETERS = {
    "type": "object",
    "additionalProperties": True,
    "description": "E.g. binary_data_size (input bytes after the JSON header), binary_data (output as bytes).",
}
INFER_REQUEST_SCHEMA = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string", "description": "Returned in the response."},
        "parameters": {"type": "object", "additionalProperties": True},
        "inputs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "shape", "datatype"],
                "properties": {
                    "name": {"type": "string"},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "datatype": {"type": "string", "enum": [*JSON_DATATYPES, *BINARY_ONLY_DATATYPES]},
                    "parameters": _TENSOR_PARAMETERS,
                    "data": {"type": "array", "items": {}, "description": "Row-major values, flat or nested."},
                },
            },
        },
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": _TENSOR_PARAMETERS},
            },
        },
    },
    "example": {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]},
}

INFER_DESCRIPTION = f"""KServe v2 / Open Inference Protocol request, sent to the deployment's Triton as is; Triton's \
response comes back as Triton wrote it.

JSON: `{{"inputs": [{{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}}]}}`. \
Non-finite outputs are written as Triton writes them: `NaN`, `Infinity`, `-Infinity`.

Binary tensor data (Triton's "Binary Tensor Data Extension"): the JSON header, then the raw little-endian bytes of \
each input that declares `"parameters": {{"binary_data_size": <bytes>}}`, with the header \
`{HEADER_LENGTH}: <length of the JSON header in bytes>`. Ask for binary outputs with \
`"parameters": {{"binary_data": true}}` on an output (or `"binary_data_output": true` on the request); the \
response then carries the same header. `tritonclient.http.InferenceServerClient.generate_request_body` builds such \
bodies and `parse_response_body` reads the answers.

Errors are `{{"detail", "field"}}`: a malformed request names the field (`inputs[0].shape`); a request Triton \
rejects (wrong datatype or shape, unknown or missing input) comes back 400 with Triton's message and the tensor \
in `field`."""


class InferenceBodyParser(BaseParser):
    """Reads the request body for the view, whatever its Content-Type: Triton, not DRF, interprets it.

    The view takes the bytes from Django's `request.body`; DRF gets an empty form. DRF parses a body only when
    something asks for `request.data` or `request.POST`, and here that is the CSRF check of session
    authentication, which reads `request.POST` as a form (bytes there were a 500). Reading through Django's
    `HttpRequest.body` keeps Django's size limit (DATA_UPLOAD_MAX_MEMORY_SIZE, 413) and caches the bytes.
    """

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> QueryDict:
        parser_context["request"]._request.body  # noqa: B018 - reads and caches the body, under Django's limit
        return QueryDict()


def _header_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()):  # isdigit alone takes "²", which int() refuses
        raise InvalidInput(
            f"{HEADER_LENGTH} must be the length in bytes of the JSON header at the start of the body, got {raw!r}.",
            field=HEADER_LENGTH,
        )
    return int(raw)


def _deployment_request(request: Request) -> DeploymentRequest:
    """The `DeploymentRequest` of a create (or check) body (400 naming a field the serializer refuses)."""
    form = CreateDeploymentSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    v = form.validated_data
    placement = PlacementRequest(
        runtime=v["runtime"],
        cluster=v["cluster"],
        replicas=v["replicas"],
        autoscaling=v["autoscaling"],
        gpu=v["gpu"],
        cpu=v["cpu"],
        memory=v["memory"],
    )
    return DeploymentRequest(
        team_slug=v["team"],
        name=v["name"],
        model_version_id=v["model_version"],
        placement=placement,
        instance_count=v["instance_count"],
        instance_kind=v["instance_kind"],
        max_batch_size=v["max_batch_size"],
        max_queue_delay_microseconds=v["max_queue_delay_microseconds"],
    )


class DeploymentViewSet(ListModelMixin, RetrieveModelMixin, GenericViewSet):
    """Deployments of your teams. PATCH changes one while it serves; DELETE stops one (its Triton ends, its ports
    are freed)."""

    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    serializer_class = DeploymentSerializer

    def get_queryset(self):
        return services.visible_deployments(user=self.request.user, token=self.request.auth).order_by("id")

    @extend_schema(
        request=CreateDeploymentSerializer,
        responses={
            201: DeploymentSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
        description="Deploy a built version. The deployment's Triton reads its own copy of the version's files "
        "(and its configuration) in the object store: those bytes count in the team's storage quota from now until "
        "the deployment is stopped (409 with `quota`, field `storage_bytes`, when they do not fit), as do "
        "`deployments`, `instances` (local) and `gpu` (Kubernetes).",
    )
    def create(self, request: Request) -> Response:
        deployment = services.create_deployment(
            user=request.user, token=request.auth, request=_deployment_request(request)
        )
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=CreateDeploymentSerializer,
        responses={
            200: OpenApiTypes.OBJECT,
            400: RefusalsSerializer,
            403: RefusalsSerializer,
            404: RefusalsSerializer,
            409: RefusalsSerializer,
            503: RefusalsSerializer,
        },
        description="Would this deployment be accepted now? The same body as POST /deployments/, checked by the "
        'create\'s own rules and quota reservation, writing nothing: 200 `{"fits": true, "requested": …}`, '
        "or the very error the create would answer (409 with `quota` when the team's quota has no room), its "
        "`detail`, `field` and `quota` as before, plus `errors`: every refusal at once, that one first, each "
        '`{"detail", "field"}` (and `quota`): the name, the runtime, each placement field, the version, the '
        "options, the instance kind, each quota field (`deployments`, `instances`, `gpu` per resource, "
        "`storage_bytes`: the deployment's own copy of the version's files and configuration) and a "
        "name already taken. The status is the first refusal's. A refusal of the team or of the caller's role "
        "stops the check there.",
    )
    @action(detail=False, methods=["post"], url_path="check")
    def check(self, request: Request) -> Response:
        fit = services.check_deployment_fits(
            user=request.user, token=request.auth, request=_deployment_request(request)
        )
        return Response({"fits": True, **fit})

    @extend_schema(
        parameters=[OpenApiParameter("team", str, required=True, description="Slug of one of your teams.")],
        responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer, 404: ErrorSerializer},
        description="What the team can deploy on: runtimes (available or why not), registered clusters with the "
        "GPUs their Nodes offer (product, resource, MIG profile, most on one node, total), the team's quota "
        "use (limit, used, free per field and unit), and the instance kinds each runtime can take (KIND_GPU only "
        "with a GPU on the local worker host, or on a cluster that offers GPUs; unavailable ones say why).",
    )
    @action(detail=False, methods=["get"], url_path="offers")
    def offers(self, request: Request) -> Response:
        team = request.query_params.get("team", "")
        if not team:
            raise InvalidInput("Name the team: ?team=<slug>.", field="team")
        return Response(services.deployment_offers(user=request.user, team_slug=team, token=request.auth))

    @extend_schema(
        request=UpdateDeploymentSerializer,
        responses={
            202: DeploymentSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
        description="Change a running deployment. `model_version`: move to another built version of the same model "
        "without restarting a server (update_status goes queued -> updating -> succeeded or failed). `replicas` or "
        "`autoscaling` (kubernetes): a new pod count or autoscaling bounds, applied to the cluster. Fields that "
        "cannot be changed are refused with 400 naming them.",
    )
    def partial_update(self, request: Request, pk: str) -> Response:
        deployment = self.get_object()
        if not hasattr(request.data, "keys"):
            raise InvalidInput("The body must be a JSON object of the fields to change.", field="request")
        form = UpdateDeploymentSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        changes = {name: request.data[name] for name in request.data.keys()}
        deployment = services.update_deployment(
            user=request.user, deployment=deployment, changes=changes, token=request.auth
        )
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: DeploymentSerializer, 403: ErrorSerializer})
    def destroy(self, request: Request, pk: str) -> Response:
        deployment = services.request_stop(user=request.user, deployment=self.get_object(), token=request.auth)
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request={"application/json": INFER_REQUEST_SCHEMA, "application/octet-stream": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter(
                HEADER_LENGTH,
                int,
                OpenApiParameter.HEADER,
                description="Only with binary tensor data: the length in bytes of the JSON header.",
            )
        ],
        responses={
            (200, "application/json"): OpenApiResponse(OpenApiTypes.OBJECT, description="Triton's response."),
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description=f"Triton's response with binary outputs, and {HEADER_LENGTH}."
            ),
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
            413: ErrorSerializer,
            503: ErrorSerializer,
        },
        description=INFER_DESCRIPTION,
    )
    @action(
        detail=True,
        methods=["post"],
        url_path="infer",
        parser_classes=[InferenceBodyParser],
        throttle_classes=[InferenceRateThrottle],
    )
    @accepts_body(INFERENCE_BODY)
    def infer(self, request: Request, pk: str) -> HttpResponse:
        deployment = self.get_object()
        answer = services.infer(
            user=request.user,
            deployment=deployment,
            body=request._request.body,
            header_length=_header_length(request),
            token=request.auth,
        )
        response = HttpResponse(answer.body, content_type=answer.content_type)
        if answer.header_length is not None:
            response[HEADER_LENGTH] = str(answer.header_length)
        return response

    @extend_schema(
        parameters=[OpenApiParameter("window", int, description="Seconds to look back (10..86400).")],
        responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer, 404: ErrorSerializer},
        description="Per model over the window: inference, request and execution counts, failures, throughput "
        "(inferences/s), requests/s, average request latency, queue and compute time (µs), average batch size "
        "(inferences per execution). Read from the samples the periodic scrape stores (every "
        "CONCH_METRICS_SCRAPE_INTERVAL_SECONDS); this request does not scrape. Figures are sums of the increases "
        "of Triton's cumulative counters between consecutive samples (an interval in which Triton restarted counts "
        "from zero). Rates (`throughput_inferences_per_second`, `requests_per_second`) are over the window, not "
        "over the stretch the samples cover: from the window's start, or from the deployment's creation when that is "
        "later (stretched back to the first counted interval's begin, whose increase is counted), to now; a model's "
        "`window_seconds` is that span. A burst followed by idle time, a stop or a Triton restart is a low rate over "
        "the window. A model with no interval in the window (a single sample, its model loaded before the window) "
        "has null rates and `window_seconds`. `series` holds, per model, one point per `step_seconds` (window/60 "
        "rounded up to whole scrape intervals) with the counts closed in that step, their rates, average latency, "
        "queue and compute time, batch size, and request latency p50/p99 (Triton's latency summaries; the highest "
        "in the step); the counts add up "
        "to `models`.",
    )
    @action(detail=True, methods=["get"], url_path="metrics")
    def metrics(self, request: Request, pk: str) -> Response:
        raw = request.query_params.get("window", "300")
        try:
            window = int(raw)
        except ValueError:
            raise InvalidInput("window must be a whole number of seconds.", field="window") from None
        return Response(observe.summarize(deployment=self.get_object(), window_seconds=window))


class TensorRTPlanViewSet(ListModelMixin, RetrieveModelMixin, GenericViewSet):
    """TensorRT plans of your teams' ONNX versions, each built by a Kubernetes Job on the GPU product it runs on and
    compared with the ONNX model. Deployments of the version on that cluster with that GPU product serve the plan."""

    http_method_names = ["get", "post", "delete", "head", "options"]
    serializer_class = TensorRTPlanSerializer

    def get_queryset(self):
        plans = services.visible_plans(user=self.request.user, token=self.request.auth).order_by("id")
        version = self.request.query_params.get("model_version")
        if version is not None:
            if not version.isdigit():
                raise InvalidInput("model_version must be the id of a model version.", field="model_version")
            plans = plans.filter(model_version_id=int(version))
        return plans

    @extend_schema(
        parameters=[OpenApiParameter("model_version", int, description="Only the plans of this version.")],
        responses={200: TensorRTPlanSerializer(many=True), 400: ErrorSerializer},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(
        request=CreateTensorRTPlanSerializer,
        responses={
            202: TensorRTPlanSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
            503: ErrorSerializer,
        },
        description="Optimize a built ONNX version for a GPU product of a cluster: a Kubernetes Job builds a "
        "TensorRT plan with trtexec on a node with that GPU, in the TensorRT image of the cluster's Triton release, "
        "runs it once, and Conch compares its outputs with the ONNX model's. 202: the plan, `pending`; follow "
        "`status` and `message`. 400 names the field (`model_version` not ONNX or with a dynamic axis besides the "
        "batch axis, `cluster`, `gpu_product` no node offers); 409 for a plan that exists or a full storage quota.",
    )
    def create(self, request: Request) -> Response:
        body = CreateTensorRTPlanSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        plan = services.request_tensorrt_plan(
            user=request.user,
            token=request.auth,
            model_version_id=body.validated_data["model_version"],
            cluster_name=body.validated_data["cluster"],
            gpu_product=body.validated_data["gpu_product"],
            fp16=body.validated_data["fp16"],
        )
        return Response(TensorRTPlanSerializer(plan).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={204: None, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        plan = self.get_object()
        services.delete_tensorrt_plan(user=request.user, token=request.auth, plan=plan)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ClusterViewSet(GenericViewSet):
    """Kubernetes clusters deployments can run on (registered by an admin), with the GPUs their Nodes offer and
    whether their Triton image matches the release builds are verified with. Credentials are never shown."""

    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer},
        parameters=[
            OpenApiParameter(
                "limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE}, description="Clusters per page."
            ),
            OpenApiParameter(
                "offset", {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}, description="Clusters to skip."
            ),
        ],
        description="A page (`limit`, `offset`) of clusters: `count`, `next`, `previous`, `results`.",
    )
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(services.list_clusters())
        return self.get_paginated_response([services.describe_cluster(cluster) for cluster in page])

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: ErrorSerializer})
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(services.describe_cluster(services.get_cluster(name=name)))


class GatewayUsageViewSet(GenericViewSet):
    """Use of the inference gateway by the team's tokens, per day (UTC), token and deployment: requests,
    inferences (batch items), errors (answers >= 400) and body bytes in and out. For the team's admins."""

    serializer_class = GatewayUsageSerializer
    lookup_field = "slug"
    lookup_value_regex = "[-a-z0-9]+"

    @extend_schema(
        parameters=[GatewayUsageQuerySerializer],
        responses={200: GatewayUsageSerializer(many=True), 400: ErrorSerializer, 403: ErrorSerializer},
    )
    def retrieve(self, request: Request, slug: str) -> Response:
        query = GatewayUsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = services.gateway_usage(
            user=request.user,
            team_slug=slug,
            token=request.auth,
            since=query.validated_data.get("since"),
            until=query.validated_data.get("until"),
        )
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)
