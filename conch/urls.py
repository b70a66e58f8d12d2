"""URL map: the REST API under /api/v1/, its schema and docs, the console pages, admin."""

from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

api_v1 = [
    path("", include("tenancy.api.urls")),
    path("", include("models_registry.api.urls")),
    path("", include("builds.api.urls")),
    path("", include("uploads.api.urls")),
    path("", include("deployments.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness/readiness for load balancers and the demo: the web process answers and the database works."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def gateway_elsewhere(request: HttpRequest, rest: str) -> JsonResponse:
    """404 naming the inference gateway's own address, for a client that called the console's address."""
    return JsonResponse(
        {"error": f"The inference gateway is served at {settings.CONCH_GATEWAY_URL}/serve/{rest}, not here."},
        status=404,
    )


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", include(api_v1)),
    # The inference gateway runs in its own process (conch.gateway); a client sent here is told where it is.
    re_path(r"^serve/(?P<rest>.*)$", gateway_elsewhere, name="serve"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    # The console's pages: overview at /, models, deployments, teams, the wizard.
    path("", include("console.urls")),
]
