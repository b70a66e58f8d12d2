from conch.api import OptionalSlashRouter
from tenancy.api.views import TeamViewSet

router = OptionalSlashRouter()
router.register("teams", TeamViewSet, basename="team")
urlpatterns = router.urls
