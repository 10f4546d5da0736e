# Loaded with Django so that @shared_task binds to this app in every process.
from toolgate.celery import app as celery_app

__all__ = ("celery_app",)
