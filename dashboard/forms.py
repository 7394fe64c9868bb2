"""Forms of the dashboard: the runs filter and the small forms behind each action."""

from __future__ import annotations

from typing import Any

from django import forms

from approvals.edits import EDIT_MAX_BYTES, InvalidEdit, parse_edit
from durable.models import RunStatus
from durable.queries.parsing import BadParameter, bounded_datetime, load_json

from . import selectors

STATUS_CHOICES = (
    [("", "Any status")]
    + [(value, label) for value, label in RunStatus.choices]
    + [
        (selectors.STATUS_APPROVAL, "Waiting for approval"),
        (selectors.STATUS_ATTENTION, "Needs attention"),
        (selectors.STATUS_LIMIT, "Waiting for a limit"),
    ]
)

SORT_CHOICES = [
    ("-created", "Newest first"),
    ("created", "Oldest first"),
    ("-duration", "Longest first"),
    ("duration", "Shortest first"),
]


class RunFilterForm(forms.Form):
    """The runs list's filters (a GET form; invalid fields are reported and ignored)."""

    q = forms.CharField(
        required=False,
        max_length=200,
        label="Search",
        widget=forms.TextInput(
            attrs={"type": "search", "placeholder": "Run id, tag or input text"}
        ),
    )
    status = forms.ChoiceField(required=False, choices=STATUS_CHOICES)
    workflow = forms.ChoiceField(required=False, choices=[("", "Any workflow")])
    version = forms.CharField(
        required=False, max_length=64, widget=forms.TextInput(attrs={"placeholder": "any"})
    )
    started_by = forms.CharField(
        required=False,
        max_length=150,
        label="Started by",
        widget=forms.TextInput(attrs={"placeholder": "username"}),
    )
    created_from = forms.DateField(
        required=False, label="Created from", widget=forms.DateInput(attrs={"type": "date"})
    )
    created_to = forms.DateField(
        required=False, label="Created to", widget=forms.DateInput(attrs={"type": "date"})
    )
    waiting_minutes = forms.IntegerField(
        required=False, min_value=1, max_value=10_000_000, label="Waiting longer than (min)"
    )
    retries = forms.IntegerField(
        required=False, min_value=1, max_value=1_000_000, label="Min. retries of a step"
    )
    sort = forms.ChoiceField(required=False, choices=SORT_CHOICES, label="Sort")

    def __init__(self, *args: Any, workflows: list[str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["workflow"].choices = [("", "Any workflow")] + [
            (name, name) for name in (workflows or [])
        ]

    def _bounded_day(self, name: str) -> Any:
        day = self.cleaned_data.get(name)
        if day is None:
            return None
        try:
            return bounded_datetime(day, "The date")
        except BadParameter as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_created_from(self) -> Any:
        return self._bounded_day("created_from")

    def clean_created_to(self) -> Any:
        return self._bounded_day("created_to")

    def filters(self) -> selectors.RunFilters:
        self.is_valid()  # populate cleaned_data with the valid fields
        return selectors.RunFilters.from_cleaned(getattr(self, "cleaned_data", {}) or {})


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
