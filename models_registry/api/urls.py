from django.urls import re_path
from rest_framework.routers import SimpleRouter

from models_registry.api import views

# "/?": a trailing slash is optional everywhere, as in the documented paths.
router = SimpleRouter(trailing_slash="/?")
router.register("models", views.RegisteredModelViewSet, basename="model")
router.register("versions", views.ModelVersionViewSet, basename="version")

urlpatterns = [
    re_path(r"^models/(?P<model_id>[0-9]+)/versions/?$", views.ModelVersionListUploadView.as_view(),
            name="model-versions"),
    re_path(r"^versions/(?P<version_id>[0-9]+)/rebuild/?$", views.RebuildView.as_view(), name="version-rebuild"),
    *router.urls,
]
