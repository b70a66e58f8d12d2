"""URLs of resumable uploads, under /api/v1/ (docs/uploads.md; the wizard's JavaScript and the CLI use them)."""

from django.urls import re_path

from uploads.api import views

urlpatterns = [
    re_path(r"^uploads/check/?$", views.CheckUploadFileView.as_view(), name="upload-check"),
    re_path(r"^models/(?P<model_id>[0-9]+)/uploads/?$", views.ModelUploadsView.as_view(), name="model-uploads"),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/?$",
        views.UploadDetailView.as_view(),
        name="model-upload",
    ),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/parts/?$",
        views.UploadPartsView.as_view(),
        name="model-upload-parts",
    ),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/parts/(?P<number>[0-9]{1,9})/?$",
        views.UploadPartView.as_view(),
        name="model-upload-part",
    ),
    re_path(
        r"^models/(?P<model_id>[0-9]+)/uploads/(?P<upload_id>[^/]+)/complete/?$",
        views.UploadCompleteView.as_view(),
        name="model-upload-complete",
    ),
]
