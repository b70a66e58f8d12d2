"""Teams the caller belongs to."""

from rest_framework.mixins import ListModelMixin, RetrieveModelMixin
from rest_framework.viewsets import GenericViewSet

from tenancy.api.serializers import TeamSerializer
from tenancy.services import teams_for_user


class TeamViewSet(ListModelMixin, RetrieveModelMixin, GenericViewSet):
    serializer_class = TeamSerializer
    lookup_field = "slug"

    def get_queryset(self):
        return teams_for_user(user=self.request.user).order_by("slug")
