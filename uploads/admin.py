from django.contrib import admin

from conch.admin_base import ReadOnlyModelAdmin
from uploads.models import Upload


@admin.register(Upload)
class UploadAdmin(ReadOnlyModelAdmin):
    """Resumable uploads, read-only: their clients and the sweeper move them along."""

    list_display = ["id", "model", "filename", "size_bytes", "status", "expires_at", "created_at"]
    list_filter = ["status", "transport"]
