from conch.api import OptionalSlashRouter
from models_registry.api import views

router = OptionalSlashRouter()
router.register("models", views.RegisteredModelViewSet, basename="model")

urlpatterns = [
    *router.urls,
]
