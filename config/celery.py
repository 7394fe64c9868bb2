"""The Celery app: `celery -A config worker` and `celery -A config beat`.

Celery is only the transport (docs/architecture.md#dispatch): a task carries a run id, the
engine does the rest. Configuration lives in Django settings under the CELERY_ prefix.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Celery's Django fix-up runs Django's system checks at every worker start and discards
# what they find; they load the URLconf (the API, every view) and the whole workflow
# registry, seconds of a worker's start for nothing. `manage.py check` (and migrate, which
# every deploy runs) reports them. CELERY_SKIP_CHECKS= (empty) runs them again.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("durable")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["durable.worker", "api"])
