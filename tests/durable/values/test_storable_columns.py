"""Every free-text column of Durable's models goes through the storable fields.

A column left as a plain ``CharField``/``TextField``/``JSONField`` passes on SQLite and
fails on PostgreSQL the first time a user types a NUL (this is how an approval edit's
comment slipped through). So the rule is checked over the models, not column by column:
a plain text column must be on the list below, of columns only the engine writes, each
with the reason it cannot carry a user's text.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import models

from durable.values.fields import StorableCharField, StorableJSONField, StorableTextField

#: (app_label, model, field) -> why the engine alone writes it
ENGINE_WRITTEN = {
    ("durable", "run", "id"): "generated run id or a validated idempotency-style id",
    ("durable", "run", "workflow_name"): "a registered workflow's name",
    ("durable", "run", "workflow_version"): "a registered workflow's version",
    ("durable", "run", "status"): "RunStatus choice",
    ("durable", "run", "input_hash"): "sha256 hex",
    ("durable", "run", "lease_owner"): "host:pid of a worker",
    ("durable", "run", "lease_token"): "uuid4",
    ("durable", "run", "parent_close_policy"): "ParentClosePolicy choice, checked by start_child",
    ("durable", "step", "kind"): "StepKind choice",
    ("durable", "step", "status"): "StepStatus choice",
    ("durable", "step", "durability"): "Durability choice",
    ("durable", "stepattempt", "outcome"): "AttemptOutcome choice",
    ("durable", "stepattempt", "classification"): "Classification choice",
    ("durable", "operation", "idempotency_key"): "derived: run id, step id digest, position",
    ("durable", "operation", "safety"): "Safety choice",
    ("durable", "operation", "params_hash"): "sha256 hex",
    ("durable", "operation", "lease_token"): "uuid4",
    ("durable", "operation", "owners"): "list of uuid4 lease tokens",
    ("durable", "wait", "kind"): "WaitKind choice",
    ("durable", "wait", "status"): "WaitStatus choice",
    ("durable", "operation", "status"): "OperationStatus choice",
    ("durable", "tool", "name"): "a registered tool's name (admin forms refuse NUL)",
    ("durable", "tool", "safety"): "Safety choice",
    ("durable", "traceevent", "kind"): "event kind constant",
    ("durable", "streamevent", "kind"): "StreamKind choice",
    ("durable", "limit", "admitted"): "a list of admission times (floats)",
    ("durable", "limitslot", "lease_token"): "uuid4",
    ("durable", "tool", "rate_limit"): "validated as a rate ('60/m') before it is stored",
    ("durable", "workerprocess", "id"): "host:pid",
    ("durable", "schedule", "name"): "validated: letters, digits, '.', '_', '-'",
    ("durable", "schedule", "workflow_name"): "a registered workflow's name",
    ("durable", "schedule", "cron"): "parsed by cronsim before it is stored (NUL refused)",
    ("durable", "schedule", "timezone"): "a zoneinfo zone name, loaded before it is stored",
    ("durable", "schedule", "catchup"): "Catchup choice",
    ("durable", "schedule", "last_run_id"): "a run id the tick made",
    ("durable", "workerprocess", "hostname"): "socket.gethostname()",
    ("approvals", "approvalrequest", "payload"): "codec JSON (escapes NUL)",
    ("approvals", "approvalrequest", "safety"): "Safety choice",
    ("approvals", "approvalrequest", "on_timeout"): "validated choice",
    ("approvals", "approvalrequest", "requesters"): "normalised by durable.requesters",
    ("approvals", "approvalrequest", "status"): "ApprovalStatus choice",
    ("approvals", "approvalarguments", "value"): "codec JSON (escapes NUL)",
    ("approvals", "approvalarguments", "digest"): "sha256 hex",
    ("approvals", "approvaldecision", "edited"): "codec JSON (escapes NUL)",
    ("approvals", "approvaldecision", "arguments_digest"): "sha256 hex",
}

STORABLE = (StorableCharField, StorableTextField, StorableJSONField)
TEXT = (models.CharField, models.TextField, models.JSONField)


def _text_columns():
    for label in ("durable", "approvals", "dashboard"):
        try:
            config = apps.get_app_config(label)
        except LookupError:
            continue
        for model in config.get_models():
            for field in model._meta.concrete_fields:
                if isinstance(field, TEXT):
                    yield (label, model._meta.model_name, field.name), field


def test_every_plain_text_column_is_engine_written():
    plain = sorted(key for key, field in _text_columns() if not isinstance(field, STORABLE))
    unexplained = [key for key in plain if key not in ENGINE_WRITTEN]
    assert not unexplained, (
        "plain text columns that may carry a user's text (use durable.values.fields' storable "
        f"fields, or list them in ENGINE_WRITTEN with the reason): {unexplained}"
    )


def test_the_list_names_only_existing_plain_columns():
    plain = {key for key, field in _text_columns() if not isinstance(field, STORABLE)}
    stale = sorted(set(ENGINE_WRITTEN) - plain)
    assert not stale, f"ENGINE_WRITTEN names columns that are gone or now storable: {stale}"


@pytest.mark.django_db
def test_nul_in_an_approval_edit_comment_is_stored():
    from approvals.models import ApprovalArguments

    field = ApprovalArguments._meta.get_field("comment")
    assert field.get_prep_value("a\x00b") == "a\\x00b"
