from conch.api import OptionalSlashRouter
from deployments.api.views import ClusterViewSet, DeploymentViewSet

router = OptionalSlashRouter()
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("clusters", ClusterViewSet, basename="cluster")
urlpatterns = router.urls
