from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    """Sample workflows, discovered by ``durable`` from ``examples/workflows.py``."""

    name = "examples"
    verbose_name = "Examples"
    default_auto_field = "django.db.models.BigAutoField"
