from conch.api import OptionalSlashRouter
from tenancy.api.views import ApiTokenViewSet, TeamViewSet

router = OptionalSlashRouter()
router.register("teams", TeamViewSet, basename="team")
router.register("tokens", ApiTokenViewSet, basename="token")
urlpatterns = router.urls
