from rest_framework.routers import SimpleRouter

from deployments.api.views import DeploymentViewSet

# "/?": both `/deployments/1/infer` (the documented form) and `/deployments/1/infer/` work.
router = SimpleRouter(trailing_slash="/?")
router.register("deployments", DeploymentViewSet, basename="deployment")
urlpatterns = router.urls
