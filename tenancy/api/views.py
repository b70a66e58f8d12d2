"""Teams the caller belongs to, their members (for admins), quota usage and (staff) limits, the caller's API
tokens, and the audit log of the teams they administer."""

from dataclasses import asdict

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from conch.api import ErrorSerializer
from tenancy import members
from tenancy.api.serializers import (
    AddMemberSerializer,
    ApiTokenSerializer,
    AuditEntrySerializer,
    AuditFilterSerializer,
    ChangeMemberSerializer,
    CreateApiTokenSerializer,
    CreatedApiTokenSerializer,
    MemberSerializer,
    QuotaUpdateSerializer,
    TeamSerializer,
    TeamUsageSerializer,
)
from tenancy.quotas import team_usage
from tenancy.services import (
    change_team_quota,
    create_api_token,
    get_team_for_user,
    revoke_api_token,
    teams_for_user,
    visible_audit_entries,
    visible_tokens,
)


class TeamViewSet(ListModelMixin, RetrieveModelMixin, GenericViewSet):
    serializer_class = TeamSerializer
    lookup_field = "slug"

    def get_queryset(self):
        return teams_for_user(user=self.request.user, token=self.request.auth).order_by("slug")

    @extend_schema(
        responses={200: TeamUsageSerializer, 404: ErrorSerializer},
        description="What the team uses of each quota, counted now, beside its limits. For members.",
    )
    @action(detail=True, methods=["get"])
    def usage(self, request: Request, slug: str) -> Response:
        team = get_team_for_user(user=request.user, slug=slug, field="slug", token=request.auth)
        return Response(_usage_body(team, team_usage(team=team)))

    @extend_schema(
        request=QuotaUpdateSerializer,
        responses={200: TeamUsageSerializer, 400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
        description="Set some of the team's limits (null: back to the default). Staff only.",
    )
    @action(detail=True, methods=["patch"])
    def quota(self, request: Request, slug: str) -> Response:
        serializer = QuotaUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        lines = change_team_quota(user=request.user, slug=slug, limits=serializer.validated_data, token=request.auth)
        return Response({"team": slug, "quotas": [asdict(line) for line in lines]})

    @extend_schema(
        methods=["GET"],
        responses={200: MemberSerializer(many=True), 403: ErrorSerializer, 404: ErrorSerializer},
        description="The team's members and their roles. For the team's admins (and staff).",
    )
    @extend_schema(
        methods=["POST"],
        request=AddMemberSerializer,
        responses={
            201: MemberSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
        description="Add an existing user to the team with a role (default developer). For the team's admins.",
    )
    @action(detail=True, methods=["get", "post"], serializer_class=MemberSerializer)
    def members(self, request: Request, slug: str) -> Response:
        if request.method == "GET":
            rows = members.list_members(user=request.user, slug=slug, token=request.auth)
            page = self.paginate_queryset(rows)
            return self.get_paginated_response(MemberSerializer(page, many=True).data)
        # The service checks the caller's role before the body (another team's caller learns nothing from a 400).
        membership = members.add_member(
            user=request.user,
            slug=slug,
            token=request.auth,
            username=_body_field(request, "username"),
            role=_body_field(request, "role", "developer"),
        )
        return Response(MemberSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        methods=["PATCH"],
        request=ChangeMemberSerializer,
        responses={
            200: MemberSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
        description="Change a member's role. 409 when it would leave the team without an admin.",
    )
    @extend_schema(
        methods=["DELETE"],
        request=None,
        responses={204: None, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
        description="Take a member out of the team (their tokens of it are revoked). 409 for the last admin.",
    )
    @action(
        detail=True,
        methods=["patch", "delete"],
        url_path=r"members/(?P<username>[\w.@+-]+)",
        serializer_class=MemberSerializer,
    )
    def member(self, request: Request, slug: str, username: str) -> Response:
        if request.method == "DELETE":
            members.remove_member(user=request.user, slug=slug, username=username, token=request.auth)
            return Response(status=status.HTTP_204_NO_CONTENT)
        membership = members.change_member_role(
            user=request.user, slug=slug, username=username, role=_body_field(request, "role"), token=request.auth
        )
        return Response(MemberSerializer(membership).data)


def _body_field(request: Request, name: str, default: object = None) -> object:
    """Field `name` of a JSON object or form body (None when the body is something else, e.g. a JSON list)."""
    data = request.data
    return data.get(name, default) if hasattr(data, "get") else default


def _usage_body(team, lines) -> dict:
    return {"team": team.slug, "quotas": [asdict(line) for line in lines]}


class ApiTokenViewSet(ListModelMixin, GenericViewSet):
    """Your API tokens, and all tokens of the teams you administer (a developer or viewer sees only their own).
    POST creates one (its secret is in that answer only); DELETE revokes one."""

    serializer_class = ApiTokenSerializer
    lookup_value_regex = "[0-9]+"

    def get_queryset(self):
        return visible_tokens(user=self.request.user, token=self.request.auth).order_by("-created_at", "-id")

    @extend_schema(
        request=CreateApiTokenSerializer,
        responses={201: CreatedApiTokenSerializer, 400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
    )
    def create(self, request: Request) -> Response:
        form = CreateApiTokenSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        v = form.validated_data
        issued = create_api_token(
            user=request.user,
            team=get_team_for_user(user=request.user, slug=v["team"], token=request.auth),
            name=v["name"],
            scopes=v.get("scopes"),
            deployments=v.get("deployments"),
            expires_in_days=v.get("expires_in_days"),
            token=request.auth,
        )
        body = {**ApiTokenSerializer(issued.token).data, "token": issued.secret}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None, 404: ErrorSerializer})
    def destroy(self, request: Request, pk: str) -> Response:
        revoke_api_token(user=request.user, token_id=int(pk), token=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditEntryViewSet(ListModelMixin, GenericViewSet):
    """Who changed what, newest first: the entries of the teams you administer (staff: every team's).

    Append-only: entries are never changed or deleted. A token needs the `read` scope; a member who is not a
    team admin gets 403 naming the admin role.
    """

    serializer_class = AuditEntrySerializer

    def get_queryset(self):
        form = AuditFilterSerializer(data=self.request.query_params)
        form.is_valid(raise_exception=True)
        wanted = form.validated_data
        entries = visible_audit_entries(
            user=self.request.user, token=self.request.auth, team_slug=wanted.get("team", "")
        )
        for name, lookup in (
            ("action", "action"),
            ("object_type", "object_type"),
            ("object_id", "object_id"),
            ("user", "actor"),
            ("source", "source"),
            ("since", "created_at__gte"),
            ("until", "created_at__lt"),
        ):
            if name in wanted:
                entries = entries.filter(**{lookup: wanted[name]})
        return entries.order_by("-created_at", "-id")

    @extend_schema(
        parameters=[AuditFilterSerializer],
        responses={
            200: AuditEntrySerializer(many=True),
            400: OpenApiResponse(ErrorSerializer, description="A filter's value is not valid; `field` names it."),
            403: OpenApiResponse(ErrorSerializer, description="Not a team admin, or a token without `read`."),
            404: OpenApiResponse(ErrorSerializer, description="`team` is not one of your teams."),
        },
    )
    def list(self, request: Request, *args, **kwargs) -> Response:
        return super().list(request, *args, **kwargs)
