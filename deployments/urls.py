from django.urls import path

from deployments import views

app_name = "deployments"
urlpatterns = [
    path("", views.deployment_list, name="list"),
    path("<int:deployment_id>/", views.deployment_detail, name="detail"),
]
