"""The Celery app: `celery -A config worker` and `celery -A config beat`.

Celery is only the transport (docs/architecture.md#dispatch): a task carries a run id, the
engine does the rest. Configuration lives in Django settings under the CELERY_ prefix.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("durable")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["durable.worker", "api"])
