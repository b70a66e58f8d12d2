from conch.api import OptionalSlashRouter
from deployments.api.views import DeploymentViewSet

router = OptionalSlashRouter()
router.register("deployments", DeploymentViewSet, basename="deployment")
urlpatterns = router.urls
