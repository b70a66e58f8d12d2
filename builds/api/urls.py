from django.urls import re_path

from builds.api import uploads, views
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
    re_path(r"^versions/(?P<version_id>[0-9]+)/review/?$", views.VersionReviewView.as_view(), name="version-review"),
    # Resumable uploads (docs/uploads.md).
    re_path(r"^uploads/check/?$", uploads.CheckUploadFileView.as_view(), name="upload-check"),
    re_path(r"^models/(?P<model_id>[0-9]+)/uploads/?$", uploads.ModelUploadsView.as_view(), name="model-uploads"),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/?$",
        uploads.UploadDetailView.as_view(),
        name="model-upload",
    ),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/parts/?$",
        uploads.UploadPartsView.as_view(),
        name="model-upload-parts",
    ),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/parts/(?P<number>[0-9]{1,9})/?$",
        uploads.UploadPartView.as_view(),
        name="model-upload-part",
    ),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/complete/?$",
        uploads.UploadCompleteView.as_view(),
        name="model-upload-complete",
    ),
    *router.urls,
]
