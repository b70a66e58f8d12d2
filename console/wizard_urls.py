"""URLs of the upload-and-deploy wizard, served under /wizard/: one page per step, and the small partials htmx
polls or posts to."""

from django.urls import path

from console import wizard_views as views

app_name = "wizard"
urlpatterns = [
    path("", views.start, name="start"),
    path("models/<int:model_id>/upload/", views.upload, name="upload"),
    path("versions/<int:version_id>/build/", views.build, name="build"),
    path("versions/<int:version_id>/build/status", views.build_status, name="build-status"),
    path("versions/<int:version_id>/build/check", views.check_options, name="check-options"),
    path("versions/<int:version_id>/deploy/", views.deploy, name="deploy"),
    path("versions/<int:version_id>/deploy/check", views.deploy_check, name="deploy-check"),
    path("deployments/<int:deployment_id>/status/", views.status, name="status"),
    path("deployments/<int:deployment_id>/status/live", views.status_partial, name="status-live"),
    path("deployments/<int:deployment_id>/test/", views.test_inference, name="test"),
]
