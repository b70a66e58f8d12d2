"""URLs of a Conch from before the resumable upload API: every URL of this one except `/api/v1/models/ID/uploads/…`
(what a `conch upload` against an older server meets)."""

from django.urls import URLPattern, URLResolver, include, path

from conch.urls import urlpatterns as conch_urlpatterns


def _without_uploads(patterns: list) -> list:
    kept = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = _without_uploads(list(pattern.url_patterns))
            kept.append(
                URLResolver(pattern.pattern, inner, pattern.default_kwargs, pattern.app_name, pattern.namespace)
            )
        elif isinstance(pattern, URLPattern) and "uploads" not in str(pattern.pattern):
            kept.append(pattern)
    return kept


urlpatterns = [path("", include(_without_uploads(conch_urlpatterns)))]
