"""URLs for tests of API error pages: Conch's own URLs plus API views that fail the way a bug would."""

from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class BrokenApiView(APIView):
    """A DRF view with a bug: an exception no handler knows."""

    def get(self, request: Request) -> Response:
        raise RuntimeError("a bug in an API view")


def broken_plain_view(request: HttpRequest) -> HttpResponse:
    """A plain Django view under /api/ with the same bug."""
    raise RuntimeError("a bug in a plain view")


urlpatterns = [
    path("api/v1/test-broken/", BrokenApiView.as_view()),
    path("api/v1/test-broken-plain/", broken_plain_view),
    path("", include("conch.urls")),
]
