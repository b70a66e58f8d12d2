from conch.api import OptionalSlashRouter
from tenancy.api.views import ApiTokenViewSet, AuditEntryViewSet, TeamViewSet

router = OptionalSlashRouter()
router.register("teams", TeamViewSet, basename="team")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("audit", AuditEntryViewSet, basename="audit")
urlpatterns = router.urls
