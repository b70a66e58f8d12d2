"""WSGI entry point, for a WSGI server in front of Conch (Conch itself serves the console with `conch.web`,
ASGI, so that a slow client holds no thread: see conch.asgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")
application = get_wsgi_application()
