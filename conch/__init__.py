"""Conch: upload a model, build a Triton model repository, deploy and observe it."""

from conch.celery import app as celery_app

__all__ = ["celery_app"]
