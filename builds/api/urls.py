from django.urls import re_path

from builds.api import views
from conch.api import OptionalSlashRouter

router = OptionalSlashRouter()
router.register("versions", views.ModelVersionViewSet, basename="version")

urlpatterns = [
    re_path(
        r"^models/(?P<model_id>[0-9]+)/versions/?$", views.ModelVersionListUploadView.as_view(), name="model-versions"
    ),
    re_path(r"^versions/(?P<version_id>[0-9]+)/rebuild/?$", views.RebuildView.as_view(), name="version-rebuild"),
    re_path(
        r"^versions/(?P<version_id>[0-9]+)/check-options/?$", views.CheckOptionsView.as_view(), name="version-check"
    ),
    re_path(r"^versions/(?P<version_id>[0-9]+)/builds/?$", views.VersionBuildListView.as_view(), name="version-builds"),
    re_path(r"^versions/(?P<version_id>[0-9]+)/review/?$", views.VersionReviewView.as_view(), name="version-review"),
    re_path(r"^formats/?$", views.FormatListView.as_view(), name="formats"),
    re_path(r"^backends/?$", views.BackendListRegisterView.as_view(), name="backends"),
    re_path(r"^pipelines/?$", views.PipelineListCreateView.as_view(), name="pipelines"),
    re_path(r"^pipelines/(?P<pipeline_id>[0-9]+)/?$", views.PipelineDetailView.as_view(), name="pipeline-detail"),
    re_path(
        r"^pipelines/(?P<pipeline_id>[0-9]+)/versions/?$",
        views.PipelineVersionCreateView.as_view(),
        name="pipeline-versions",
    ),
    re_path(r"^backends/(?P<backend_id>[0-9]+)/?$", views.BackendDetailView.as_view(), name="backend-detail"),
    *router.urls,
]
