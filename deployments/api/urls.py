from conch.api import OptionalSlashRouter
from deployments.api.views import ClusterViewSet, DeploymentViewSet, GatewayUsageViewSet

router = OptionalSlashRouter()
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("clusters", ClusterViewSet, basename="cluster")
# GET /api/v1/gateway-usage/<team slug>/
router.register("gateway-usage", GatewayUsageViewSet, basename="gateway-usage")
urlpatterns = router.urls
