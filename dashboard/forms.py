"""Forms of the dashboard: the runs filter and the small forms behind each action."""

from __future__ import annotations

from typing import Any

from django import forms
from django.forms.utils import ErrorDict

from approvals.edits import EDIT_MAX_BYTES, InvalidEdit, parse_edit
from durable.queries.filters import (
    FIELDS,
    NUMBER_RANGE,
    SORT_CHOICES,
    STATUS_CHOICES,
    TEXT_MAX,
    RunFilters,
    parse_filters,
)
from durable.queries.parsing import load_json


def _number_attrs(name: str) -> dict[str, int]:
    least, most = NUMBER_RANGE[name]
    return {"min": least, "max": most}


class RunFilterForm(forms.Form):
    """The runs list's filters as an HTML GET form. It only renders: the rules are
    :func:`durable.queries.filters.parse_filters`, which the API applies too; an invalid
    filter is reported beside its field and left out."""

    q = forms.CharField(
        required=False,
        label="Search",
        widget=forms.TextInput(
            attrs={
                "type": "search",
                "placeholder": "Run id, tag, input or output text",
                "maxlength": TEXT_MAX["q"],
            }
        ),
    )
    status = forms.CharField(required=False, widget=forms.Select(choices=STATUS_CHOICES))
    workflow = forms.CharField(required=False)
    version = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "any", "maxlength": TEXT_MAX["version"]}),
    )
    started_by = forms.CharField(
        required=False,
        label="Started by",
        widget=forms.TextInput(
            attrs={"placeholder": "username", "maxlength": TEXT_MAX["started_by"]}
        ),
    )
    created_from = forms.CharField(
        required=False, label="Created from", widget=forms.DateInput(attrs={"type": "date"})
    )
    created_to = forms.CharField(
        required=False, label="Created to", widget=forms.DateInput(attrs={"type": "date"})
    )
    waiting_minutes = forms.CharField(
        required=False,
        label="Waiting longer than (min)",
        widget=forms.NumberInput(attrs=_number_attrs("waiting_minutes")),
    )
    retries = forms.CharField(
        required=False,
        label="Min. retries of a step",
        widget=forms.NumberInput(attrs=_number_attrs("retries")),
    )
    sort = forms.CharField(required=False, label="Sort", widget=forms.Select(choices=SORT_CHOICES))
    # rendered by the template as a checkbox; here for its error message
    system = forms.CharField(required=False, label="Show system runs")

    def __init__(self, *args: Any, workflows: list[str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["workflow"].widget = forms.Select(
            choices=[("", "Any workflow")] + [(name, name) for name in (workflows or [])]
        )
        self._filters = RunFilters()

    def full_clean(self) -> None:
        """Validation is :func:`parse_filters`'s: its messages go beside the fields."""
        self._errors = ErrorDict()
        self.cleaned_data = {}
        if not self.is_bound:
            return
        self._filters, errors = parse_filters(self.data)
        self.cleaned_data = {
            name: getattr(self._filters, name) for name in FIELDS if name not in errors
        }
        for name, message in errors.items():
            self._errors[name] = self.error_class([message])

    def filters(self) -> RunFilters:
        self.is_valid()  # parse the filters, noting the invalid ones
        return self._filters


class ReasonForm(forms.Form):
    reason = forms.CharField(required=False, max_length=500, label="Reason (optional)")
    return_to = forms.ChoiceField(
        required=False, choices=[("detail", "detail"), ("attention", "attention")]
    )


class ResumeForm(ReasonForm):
    extra_steps = forms.IntegerField(
        required=False, min_value=0, max_value=10_000_000, label="Extra steps for the budget"
    )
    deadline_minutes = forms.FloatField(
        required=False, min_value=0.1, max_value=10_000_000, label="New deadline, minutes from now"
    )


class ForkForm(ReasonForm):
    from_step = forms.ChoiceField(label="Re-run from step")

    def __init__(self, *args: Any, step_ids: list[str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["from_step"].choices = [(s, s) for s in (step_ids or [])]


def _json_object(text: str, what: str) -> Any:
    """A JSON form field, bounded in size and depth (:func:`durable.queries.parsing.load_json`)."""
    return load_json(text, what=what)


class DecisionForm(forms.Form):
    """Approve, approve with edited parameters, or reject one approval request.

    ``version``: the version of the arguments the page showed; a decision on a version
    that is no longer current is refused (someone edited meanwhile). ``edited`` is
    parsed with :func:`approvals.edits.parse_edit` (size and depth bounded before
    parsing); secret parameters are not in it: the server keeps their stored values.
    """

    decision = forms.ChoiceField(
        choices=[
            ("approve", "Approve"),
            ("edit", "Approve with edited parameters"),
            ("reject", "Reject"),
        ]
    )
    comment = forms.CharField(
        required=False, max_length=4000, widget=forms.Textarea(attrs={"rows": 2})
    )
    # a little over the edit limit, so that parse_edit names the limit in its message
    edited = forms.CharField(
        required=False,
        max_length=EDIT_MAX_BYTES + 1,
        label="Parameters (JSON)",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
    )
    version = forms.IntegerField(
        required=False, min_value=1, max_value=1_000_000, widget=forms.HiddenInput
    )
    #: the page the decision was made on: the inbox, or the run's page ("detail")
    return_to = forms.ChoiceField(
        required=False, choices=[("approvals", "approvals"), ("detail", "detail")]
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        decision = data.get("decision")
        if decision == "reject" and not (data.get("comment") or "").strip():
            self.add_error("comment", "Say why you reject it: the agent receives this comment.")
        data["parameters"] = None
        if decision == "edit":
            text = (data.get("edited") or "").strip()
            if not text:
                self.add_error("edited", "Enter the parameters to approve, as a JSON object.")
            else:
                try:
                    data["parameters"] = parse_edit(text)
                except InvalidEdit as exc:
                    self.add_error("edited", [m for msgs in exc.errors.values() for m in msgs])
        return data


class ReconcileForm(forms.Form):
    """An operator's answer to a write whose outcome is unknown."""

    outcome = forms.ChoiceField(
        choices=[
            ("happened", "It happened"),
            ("not_happened", "It did not happen — retry"),
            ("abort", "Abort the run"),
        ]
    )
    external_id = forms.CharField(required=False, max_length=400, label="External id")
    result = forms.CharField(
        required=False,
        max_length=200_000,
        label="Result (JSON)",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
    )
    reason = forms.CharField(required=False, max_length=500, label="Reason (optional)")
    return_to = forms.ChoiceField(
        required=False, choices=[("detail", "detail"), ("attention", "attention")]
    )

    def clean_result(self) -> Any:
        text = (self.cleaned_data.get("result") or "").strip()
        if not text:
            return None
        return _json_object(text, "The result")


class SignalForm(forms.Form):
    """Send a signal to a run: its name and an optional JSON payload."""

    name = forms.CharField(max_length=200, label="Signal name", strip=True)
    payload = forms.CharField(
        required=False,
        max_length=200_000,
        label="Payload (JSON)",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
    )

    def clean_payload(self) -> Any:
        text = (self.cleaned_data.get("payload") or "").strip()
        if not text:
            return None
        return load_json(text, what="The payload")
