from django.apps import AppConfig


class UploadsConfig(AppConfig):
    name = "uploads"
    verbose_name = "Uploads"

    def ready(self) -> None:
        from models_registry.deletion import register_model_cleanup
        from tenancy.audit import audit_admin_deletions
        from tenancy.quotas import register_usage_counter
        from uploads.models import Upload
        from uploads.services import (
            abort_uploads_of_model,
            count_team_upload_reservations,
            count_teams_upload_reservations,
        )

        # Open resumable uploads hold their promised size in the storage quota.
        register_usage_counter(
            "storage_bytes", count_team_upload_reservations, for_teams=count_teams_upload_reservations
        )
        # A model's deletion aborts the multipart uploads its open uploads left in the store.
        register_model_cleanup(abort_uploads_of_model)
        audit_admin_deletions(Upload)
