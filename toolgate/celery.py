import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate.settings.local")

app = Celery("toolgate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
