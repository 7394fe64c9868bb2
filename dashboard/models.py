"""The dashboard has no tables of its own: it reads and changes Durable's through services.

This module exists so that Django sends ``post_migrate`` for the app (it skips apps
without a models module), which lets :mod:`approvals.roles` re-create the role groups
after ``flush``.
"""
