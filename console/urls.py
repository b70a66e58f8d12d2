"""URL map of the console pages (login required on every one)."""

from django.urls import include, path

from console import views

app_name = "console"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("switch-team/", views.switch_team, name="switch-team"),
    path("models/", views.model_list, name="models"),
    path("models/<int:model_id>/", views.model_detail, name="model"),
    path(
        "models/<int:model_id>/versions/<int:version_id>/download/",
        views.version_download,
        name="version-download",
    ),
    path("models/<int:model_id>/versions/<int:version_id>/delete/", views.version_delete, name="version-delete"),
    path("models/<int:model_id>/versions/<int:version_id>/optimize/", views.version_optimize, name="version-optimize"),
    path("deployments/", views.deployment_list, name="deployments"),
    path("deployments/<int:deployment_id>/", views.deployment_detail, name="deployment"),
    path("deployments/<int:deployment_id>/live/", views.deployment_live, name="deployment-live"),
    path("deployments/<int:deployment_id>/scale/", views.deployment_scale, name="deployment-scale"),
    path("deployments/<int:deployment_id>/version/", views.deployment_switch_version, name="deployment-version"),
    path("deployments/<int:deployment_id>/stop/", views.deployment_stop, name="deployment-stop"),
    path("pipelines/", views.pipeline_list, name="pipelines"),
    path("pipelines/<int:pipeline_id>/", views.pipeline_detail, name="pipeline"),
    path("backends/", views.backend_list, name="backends"),
    path("backends/<int:backend_id>/delete/", views.backend_delete, name="backend-delete"),
    path("teams/<slug:slug>/", views.team_detail, name="team"),
    path("teams/<slug:slug>/members/", views.member_add, name="member-add"),
    path("teams/<slug:slug>/members/<str:username>/role/", views.member_role, name="member-role"),
    path("teams/<slug:slug>/members/<str:username>/remove/", views.member_remove, name="member-remove"),
    path("teams/<slug:slug>/tokens/", views.token_create, name="token-create"),
    path("teams/<slug:slug>/tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("wizard/", include("console.wizard_urls")),
]
