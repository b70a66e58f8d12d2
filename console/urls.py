"""URL map of the console pages (login required on every one)."""

from django.urls import include, path

from console import views

app_name = "console"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("switch-team/", views.switch_team, name="switch-team"),
    path("models/", views.model_list, name="models"),
    path("models/<int:model_id>/", views.model_detail, name="model"),
    path("deployments/", views.deployment_list, name="deployments"),
    path("deployments/<int:deployment_id>/", views.deployment_detail, name="deployment"),
    path("teams/<slug:slug>/", views.team_detail, name="team"),
    path("wizard/", include("console.wizard_urls")),
]
