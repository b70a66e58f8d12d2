"""Teams the caller belongs to, their quota usage, and (staff) their limits."""

from dataclasses import asdict

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet

from conch.api import ErrorSerializer
from tenancy.api.serializers import QuotaUpdateSerializer, TeamSerializer, TeamUsageSerializer
from tenancy.quotas import get_team_for_staff, set_quota, team_usage
from tenancy.services import get_team_for_user, teams_for_user


class TeamViewSet(ListModelMixin, RetrieveModelMixin, GenericViewSet):
    serializer_class = TeamSerializer
    lookup_field = "slug"

    def get_queryset(self):
        return teams_for_user(user=self.request.user).order_by("slug")

    @extend_schema(
        responses={200: TeamUsageSerializer, 404: ErrorSerializer},
        description="What the team uses of each quota, counted now, beside its limits. For members.",
    )
    @action(detail=True, methods=["get"])
    def usage(self, request: Request, slug: str) -> Response:
        team = get_team_for_user(user=request.user, slug=slug, field="slug")
        return Response(_usage_body(team, team_usage(team=team)))

    @extend_schema(
        request=QuotaUpdateSerializer,
        responses={200: TeamUsageSerializer, 400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
        description="Set some of the team's limits (null: back to the default). Staff only.",
    )
    @action(detail=True, methods=["patch"], permission_classes=[IsAdminUser])
    def quota(self, request: Request, slug: str) -> Response:
        team = get_team_for_staff(slug=slug)
        serializer = QuotaUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response(_usage_body(team, set_quota(team=team, limits=serializer.validated_data)))


def _usage_body(team, lines) -> dict:
    return {"team": team.slug, "quotas": [asdict(line) for line in lines]}
