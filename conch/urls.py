"""URL map: the REST API under /api/v1/, its schema and docs, the console pages, admin."""

from django.contrib import admin
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from deployments.api import gateway as gateway_views

api_v1 = [
    path("", include("tenancy.api.urls")),
    path("", include("models_registry.api.urls")),
    path("", include("builds.api.urls")),
    path("", include("deployments.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness/readiness for load balancers and the demo: the web process answers and the database works."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", include(api_v1)),
    # The inference gateway: each deployment speaks the KServe v2 REST API at its own base path.
    re_path(r"^serve/(?P<team>[-a-z0-9]+)/(?P<deployment>[-a-z0-9]+)/(?P<path>.*)$", gateway_views.serve, name="serve"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("deployments/", include("deployments.urls")),
    path("", RedirectView.as_view(url="/deployments/", permanent=False)),
]
