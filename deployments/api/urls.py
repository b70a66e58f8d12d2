from conch.api import OptionalSlashRouter
from deployments.api.views import ClusterViewSet, DeploymentViewSet, GatewayUsageViewSet, TensorRTPlanViewSet

router = OptionalSlashRouter()
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("tensorrt-plans", TensorRTPlanViewSet, basename="tensorrt-plan")
# GET /api/v1/gateway-usage/<team slug>/
router.register("gateway-usage", GatewayUsageViewSet, basename="gateway-usage")
urlpatterns = router.urls
