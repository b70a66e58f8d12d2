from rest_framework.routers import SimpleRouter

from tenancy.api.views import TeamViewSet

router = SimpleRouter(trailing_slash="/?")
router.register("teams", TeamViewSet, basename="team")
urlpatterns = router.urls
