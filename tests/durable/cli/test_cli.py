"""``manage.py durable <subcommand>``: every subcommand, its output and its exit codes."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

import durable
from durable import registry
from durable.models import (
    Operation,
    OperationStatus,
    Run,
    RunStatus,
    Step,
    StepAttempt,
    Wait,
    WaitKind,
    WaitStatus,
)
from durable.testing import drive
from tests.durable import cli_workflows as cw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset_fixtures():
    cw.reset()
    yield
    cw.reset()


def cli(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("durable", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def cli_error(*args: str) -> tuple[CommandError, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as info:
        call_command("durable", *args, stdout=out, stderr=err)
    return info.value, out.getvalue(), err.getvalue()


def unknown_outcome_run(amount: int = 5) -> tuple[Run, Operation]:
    """A cli.charge run WAITING on the unknown outcome of its unsafe write."""
    cw.FAILURES["cli_charge"] = 1
    run = drive(durable.start("cli.charge", {"amount": amount}).id)
    assert run.status == RunStatus.WAITING, run.error
    op = Operation.objects.get(run=run)
    assert op.status == OperationStatus.UNKNOWN
    return run, op


# --- workflows -----------------------------------------------------------------------


def test_workflows_lists_name_version_and_module():
    out, err = cli("workflows")
    line = next(ln for ln in out.splitlines() if ln.startswith("cli.echo "))
    assert line.split() == ["cli.echo", "1", "yes", "tests.durable.cli_workflows"]
    assert out.splitlines()[0].split() == ["workflow", "version", "latest", "module"]
    assert err == ""


def test_workflows_prints_load_errors_to_stderr_and_exits_zero(monkeypatch):
    monkeypatch.setitem(
        registry.load_errors,
        "shop.workflows",
        'Traceback (most recent call last):\n  File "x.py"\n'
        "ModuleNotFoundError: No module named 'stripe'\n",
    )
    out, err = cli("workflows")
    assert "cli.echo" in out
    assert "shop.workflows failed to import: ModuleNotFoundError: No module named 'stripe'" in err


def test_workflows_strict_exits_2_on_load_errors(monkeypatch):
    monkeypatch.setitem(registry.load_errors, "shop.workflows", "SyntaxError: bad\n")
    exc, _, err = cli_error("workflows", "--strict")
    assert exc.returncode == 2
    assert "shop.workflows failed to import: SyntaxError: bad" in err


def test_workflows_strict_exits_zero_without_load_errors(monkeypatch):
    monkeypatch.setattr(registry, "load_errors", {})
    out, err = cli("workflows", "--strict")
    assert "cli.echo" in out and err == ""


# --- start ---------------------------------------------------------------------------


def test_start_prints_the_run_id_of_a_pending_run():
    out, _ = cli("start", "cli.echo", "--input", '{"a": [1, 2]}')
    run = Run.objects.get()
    assert out.strip() == run.id
    assert run.status == RunStatus.PENDING
    assert run.input_value() == {"a": [1, 2]}
    assert drive(run.id).output_value() == {"echo": {"a": [1, 2]}}


def test_start_with_run_id_and_tags():
    out, _ = cli(
        "start", "cli.echo", "--input", "3", "--run-id", "order-42", "--tag", "vip", "--tag", "eu"
    )
    assert out.strip() == "order-42"
    run = Run.objects.get(pk="order-42")
    assert run.tags == ["vip", "eu"] and run.input_value() == 3


def test_start_without_input_starts_with_null():
    out, _ = cli("start", "cli.echo")
    assert Run.objects.get(pk=out.strip()).input_value() is None


def test_start_same_run_id_and_input_returns_the_existing_run():
    cli("start", "cli.echo", "--input", "1", "--run-id", "same")
    out, err = cli("start", "cli.echo", "--input", "1", "--run-id", "same")
    assert out.strip() == "same"
    assert "already exists" in err
    assert Run.objects.count() == 1


def test_start_same_run_id_with_other_input_exits_2():
    cli("start", "cli.echo", "--input", "1", "--run-id", "same")
    exc, out, _ = cli_error("start", "cli.echo", "--input", "2", "--run-id", "same")
    assert exc.returncode == 2
    assert "already exists with a different input" in str(exc)
    assert out == "" and Run.objects.count() == 1


@pytest.mark.parametrize(
    "text, where",
    [
        ("{'a': 1}", "line 1, column 2 (character 2)"),
        ('{"a": 1,}', "line 1, column 9 (character 9)"),
        ('{"a":\n tru}', "line 2, column 2"),
        ("", "line 1, column 1"),
    ],
)
def test_start_rejects_invalid_json_naming_the_problem_and_position(text, where):
    exc, out, _ = cli_error("start", "cli.echo", "--input", text)
    assert exc.returncode == 2
    assert str(exc).startswith("--input is not valid JSON: ")
    assert where in str(exc)
    assert out == "" and Run.objects.count() == 0


def test_start_rejects_nan_which_is_not_json():
    exc, _, _ = cli_error("start", "cli.echo", "--input", '{"x": NaN}')
    assert exc.returncode == 2 and "NaN is not valid JSON" in str(exc)
    assert Run.objects.count() == 0


def test_start_unknown_workflow_exits_2_and_writes_nothing():
    exc, out, _ = cli_error("start", "no.such.workflow", "--input", "{}")
    assert exc.returncode == 2
    assert "workflow 'no.such.workflow' is not registered" in str(exc)
    assert "manage.py durable workflows" in str(exc)
    assert out == "" and Run.objects.count() == 0


def test_start_oversized_input_exits_2_and_writes_nothing(settings):
    settings.DURABLE = {**settings.DURABLE, "MAX_PAYLOAD_BYTES": 64}
    exc, out, _ = cli_error("start", "cli.echo", "--input", json.dumps({"text": "x" * 100}))
    assert exc.returncode == 2
    assert "over the payload limit of 64 bytes" in str(exc)
    assert out == "" and Run.objects.count() == 0


def test_start_invalid_run_id_exits_2():
    exc, _, _ = cli_error("start", "cli.echo", "--run-id", "has space")
    assert exc.returncode == 2 and "is not valid" in str(exc)
    assert Run.objects.count() == 0


def test_start_wait_prints_the_output_as_json():
    run = drive(durable.start("cli.echo", {"n": 1}, "done-run").id)
    assert run.status == RunStatus.SUCCEEDED
    out, _ = cli("start", "cli.echo", "--input", '{"n": 1}', "--run-id", "done-run", "--wait", "5")
    run_id, result = out.strip().splitlines()
    assert run_id == "done-run"
    assert json.loads(result) == {"echo": {"n": 1}}


def test_start_wait_prints_a_long_and_awkward_output_whole_as_json():
    """The outside trial: ``--wait`` printed the display form, cut after 2,000 characters
    (invalid JSON for a script) and with characters raw; now the whole value, as JSON."""
    value = {"text": "x" * 5000, "accents": "ünï \u202e rtl", "nested": [1, None, True]}
    drive(durable.start("cli.echo", value, "long-run").id)
    out, _ = cli(
        "start", "cli.echo", "--input", json.dumps(value), "--run-id", "long-run", "--wait", "5"
    )
    _, result = out.strip().splitlines()
    assert result.isascii() and result.isprintable()
    assert json.loads(result) == {"echo": value}


def test_start_wait_shows_secrets_redacted():
    drive(durable.start("cli.echo", {"api_key": "sk-test-XYZ123456"}, "secret-run").id)
    out, _ = cli(
        "start",
        "cli.echo",
        "--input",
        '{"api_key": "sk-test-XYZ123456"}',
        "--run-id",
        "secret-run",
        "--wait",
        "5",
    )
    assert "XYZ123456" not in out
    assert json.loads(out.splitlines()[1]) == {"echo": {"api_key": "[REDACTED]"}}


def test_start_wait_gives_up_with_exit_1():
    exc, out, _ = cli_error("start", "cli.echo", "--input", "1", "--wait", "0.1")
    assert exc.returncode == 1
    assert "is still pending after 0.1 s" in str(exc)
    assert out.strip() == Run.objects.get().id


def test_start_wait_on_a_failed_run_exits_1_with_its_error():
    drive(durable.start("cli.fail", {"why": "no stock"}, "failed-run").id)
    exc, _, _ = cli_error(
        "start",
        "cli.fail",
        "--input",
        '{"why": "no stock"}',
        "--run-id",
        "failed-run",
        "--wait",
        "1",
    )
    assert exc.returncode == 1
    assert "run failed-run ended failed: PermanentError: cannot do it: no stock" in str(exc)


# --- runs ----------------------------------------------------------------------------


def test_runs_lists_runs_with_filters_and_limit():
    ok = drive(durable.start("cli.echo", 1, "r-ok").id)
    bad = drive(durable.start("cli.fail", {"why": "x"}, "r-bad").id)
    durable.start("cli.echo", 2, "r-pending")
    assert (ok.status, bad.status) == (RunStatus.SUCCEEDED, RunStatus.FAILED)

    out, _ = cli("runs")
    lines = out.splitlines()
    assert lines[0].split() == ["id", "workflow", "status", "created", "steps", "error"]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert set(rows) == {"r-ok", "r-bad", "r-pending"}
    assert rows["r-ok"][1:3] == ["cli.echo@1", "succeeded"]
    assert rows["r-ok"][-2:] == ["1", "-"]
    assert rows["r-bad"][-1] == "PermanentError"

    out, _ = cli("runs", "--status", "failed")
    assert [ln.split()[0] for ln in out.splitlines()[2:]] == ["r-bad"]
    out, _ = cli("runs", "--workflow", "cli.echo")
    assert {ln.split()[0] for ln in out.splitlines()[2:]} == {"r-ok", "r-pending"}
    out, _ = cli("runs", "--limit", "1")
    assert out.splitlines()[2].split()[0] == "r-pending"  # newest first
    assert "more than 1 runs match" in out


def test_runs_with_nothing_matching():
    out, _ = cli("runs", "--status", "waiting")
    assert out.strip() == "No runs match."


@pytest.mark.parametrize("args", [("--status", "nope"), ("--limit", "0"), ("--limit", "x")])
def test_runs_rejects_bad_options(args):
    exc, _, _ = cli_error("runs", *args)
    assert "Error:" in str(exc)


# --- show ----------------------------------------------------------------------------


def test_show_prints_header_steps_and_failed_attempts():
    cw.FAILURES["cli_lookup"] = 1
    run = drive(durable.start("cli.lookup", {"query": "weather"}, "lookup-1", tags=["t1"]).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out, _ = cli("show", "lookup-1")
    header = dict(ln.split(":", 1) for ln in out.split("\n\n")[0].splitlines())
    header = {k: v.strip() for k, v in header.items()}
    assert header["run"] == "lookup-1"
    assert header["workflow"] == "cli.lookup" and header["version"] == "1"
    assert header["status"] == "succeeded"
    assert header["input"] == '{"query": "weather"}'
    assert header["output"] == '"found weather"'
    assert header["tags"] == "t1"
    assert header["lease"] == "-"
    assert header["steps"].startswith("1 executed, 0 replayed")

    steps = out.split("\nSteps\n")[1].split("\n\n")[0].splitlines()
    assert steps[0].split() == [
        "pos",
        "step_id",
        "kind",
        "tool",
        "status",
        "attempts",
        "duration",
        "replayed",
        "durability",
    ]
    cells = steps[2].split()
    assert cells[:6] == ["0", "cli_lookup", "tool", "cli_lookup", "succeeded", "2"]
    assert cells[6].endswith("s") and cells[7] == "0" and cells[8] == "sync"

    attempts = out.split("\nFailed attempts\n")[1].split("\n\n")[0].splitlines()
    assert "TransientError" in attempts[2] and "503 from upstream" in attempts[2]
    assert attempts[2].split()[:4] == ["cli_lookup", "1", "failed", "transient"]
    assert "10ms" in attempts[2]

    events = out.split("\nEvents\n")[1]
    assert "created" in events and "completed" in events and "attempt_failed" in events


def test_show_says_which_steps_were_batched():
    run = drive(durable.start("cli.echo_batched", {"x": 1}).id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out, _ = cli("show", run.id)
    steps = out.split("\nSteps\n")[1].split("\n\n")[0].splitlines()
    assert steps[0].split()[-1] == "durability"
    assert [(row.split()[1], row.split()[-1]) for row in steps[2:]] == [
        ("echo", "batched"),
        ("again", "sync"),
    ]


def test_show_lists_operations_and_waits_of_an_unknown_outcome():
    run, op = unknown_outcome_run()
    out, _ = cli("show", run.id)
    assert "status:" in out and "waiting" in out
    ops = out.split("\nOperations\n")[1].split("\n\n")[0]
    row = ops.splitlines()[2].split()
    assert row[:6] == [
        str(op.pk),
        f"{run.id}:cli_charge",
        "cli_charge",
        "unsafe_write",
        "unknown",
        "-",
    ]
    assert "manage.py durable reconcile <id>" in ops
    waits = out.split("\nWaits\n")[1].split("\n\n")[0].splitlines()
    assert waits[2].split()[:3] == ["reconcile:cli_charge", "reconcile", "pending"]
    assert "AmbiguousOutcomeError" in out.split("\nFailed attempts\n")[1]


def test_show_failed_run_prints_its_error():
    drive(durable.start("cli.fail", {"why": "out of stock"}, "f-1").id)
    out, _ = cli("show", "f-1")
    assert "error:          PermanentError: cannot do it: out of stock" in out
    assert "error step:     boom" in out


def test_show_never_decrypts_secrets():
    run = drive(durable.start("cli.echo", {"api_key": "sk-test-XYZ123456", "n": 1}).id)
    out, _ = cli("show", run.id)
    assert "XYZ123456" not in out
    assert '{"api_key": "[REDACTED]", "n": 1}' in out


def test_show_escapes_terminal_control_characters():
    run = drive(durable.start("cli.echo", {"x": "\x1b[31mred\x9b"}).id)
    out, _ = cli("show", run.id)
    assert "\x1b" not in out and "\x9b" not in out


def test_show_unknown_run_exits_2():
    exc, out, _ = cli_error("show", "nope")
    assert exc.returncode == 2
    assert str(exc).startswith("run nope does not exist")
    assert out == ""


def test_show_cuts_long_payloads():
    run = drive(durable.start("cli.echo", {"text": "y" * 5000}).id)
    out, _ = cli("show", run.id)
    input_line = next(ln for ln in out.splitlines() if ln.startswith("input:"))
    assert len(input_line) < 2200 and "characters; the admin shows all of it" in input_line


# --- sweep ---------------------------------------------------------------------------


def test_sweep_prints_counts():
    out, _ = cli("sweep")
    assert "undispatched pending runs: 0" in out and "dispatched 0 run(s)" in out

    long_ago = timezone.now() - timedelta(hours=1)
    durable.start("cli.echo", 1, "p-1")  # its dispatch was lost
    durable.start("cli.echo", 2, "p-2")  # its retry is due
    durable.start("cli.echo", 3, "p-3")  # just dispatched: left alone
    Run.objects.filter(pk="p-1").update(dispatched_at=long_ago)
    Run.objects.filter(pk="p-2").update(
        status=RunStatus.RETRYING, dispatched_at=long_ago, wake_at=long_ago + timedelta(minutes=1)
    )
    out, _ = cli("sweep", "-v", "2")
    counts = dict(ln.split(":") for ln in out.splitlines() if ":" in ln)
    assert int(counts["due retries"]) == 1
    assert int(counts["undispatched pending runs"]) == 1
    assert int(counts["expired leases"]) == 0
    assert "dispatched 2 run(s)" in out
    assert "  p-1" in out and "  p-2" in out and "p-3" not in out


# --- reconcile -----------------------------------------------------------------------


def test_reconcile_happened_end_to_end_uses_the_given_result_without_calling_again():
    run, op = unknown_outcome_run(amount=7)
    assert [c[0] for c in cw.CALLS] == ["cli_charge"]
    result = {"charge_id": "ch_manual", "amount": 7}
    out, _ = cli(
        "reconcile",
        op.idempotency_key,
        "--happened",
        "--result",
        json.dumps(result),
        "--external-id",
        "ch_manual",
        "--reason",
        "seen in Stripe",
        "--by",
        "alice",
    )
    assert f"operation {op.pk} ({op.idempotency_key}): happened" in out
    assert f"run {run.id} is pending" in out

    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED and op.external_id == "ch_manual"
    assert op.resolved_by == "alice" and "seen in Stripe" in op.resolution
    wait = Wait.objects.get(run=run, kind=WaitKind.RECONCILE)
    assert wait.status == WaitStatus.RESOLVED and wait.resolved_by == "alice"

    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, step_id="cli_charge")
    assert step.output_value() == result
    assert run.output_value() == {"receipt": result}
    assert [c[0] for c in cw.CALLS] == ["cli_charge"]  # not called again
    assert drive(run.id).status == RunStatus.SUCCEEDED
    assert len(cw.CALLS) == 1


def test_reconcile_not_happened_by_pk_calls_the_tool_again_with_the_same_key():
    run, op = unknown_outcome_run(amount=3)
    out, _ = cli("reconcile", str(op.pk), "--not-happened")
    assert "calls the tool again with the same idempotency key" in out
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_value() == {"receipt": {"charge_id": "ch_3", "amount": 3}}
    assert cw.CALLS == [("cli_charge", op.idempotency_key)] * 2
    op.refresh_from_db()
    # the default actor of a CLI command is the OS login, recorded as "os:<login>"
    assert op.status == OperationStatus.SUCCEEDED and op.resolved_by.startswith("os:")


def test_reconcile_abort_fails_the_run():
    run, op = unknown_outcome_run()
    out, _ = cli("reconcile", str(op.pk), "--abort", "--reason", "customer cancelled")
    assert f"run {run.id} is failed" in out
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error_type == "AbortedByOperator"
    assert drive(run.id).status == RunStatus.FAILED
    assert len(cw.CALLS) == 1


def test_reconcile_unknown_operation_exits_2():
    for ref in ("999999", "no-run:no-step"):
        exc, out, _ = cli_error("reconcile", ref, "--not-happened")
        assert exc.returncode == 2
        assert f"operation {ref} does not exist" in str(exc)
        assert out == ""


def test_reconcile_twice_exits_2_and_changes_nothing():
    run, op = unknown_outcome_run()
    cli("reconcile", str(op.pk), "--abort")
    exc, _, _ = cli_error("reconcile", str(op.pk), "--happened")
    assert exc.returncode == 2
    assert "already decided" in str(exc)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED


def test_reconcile_of_a_settled_operation_exits_2():
    run = drive(durable.start("cli.charge", {"amount": 1}).id)
    assert run.status == RunStatus.SUCCEEDED
    op = Operation.objects.get(run=run)
    exc, _, _ = cli_error("reconcile", str(op.pk), "--not-happened")
    assert exc.returncode == 2 and "only an unknown outcome can be reconciled" in str(exc)


def test_reconcile_bad_result_json_exits_2_and_changes_nothing():
    _, op = unknown_outcome_run()
    exc, _, _ = cli_error("reconcile", str(op.pk), "--happened", "--result", "{oops")
    assert exc.returncode == 2 and str(exc).startswith("--result is not valid JSON")
    op.refresh_from_db()
    assert op.status == OperationStatus.UNKNOWN and op.resolution == ""


def test_reconcile_oversized_result_exits_2(settings):
    _, op = unknown_outcome_run()
    settings.DURABLE = {**settings.DURABLE, "MAX_PAYLOAD_BYTES": 32}
    exc, _, _ = cli_error("reconcile", str(op.pk), "--happened", "--result", json.dumps("z" * 100))
    assert exc.returncode == 2 and "payload limit" in str(exc)
    op.refresh_from_db()
    assert op.status == OperationStatus.UNKNOWN


def test_reconcile_result_goes_with_happened_only():
    run, op = unknown_outcome_run()
    exc, _, _ = cli_error("reconcile", str(op.pk), "--not-happened", "--result", "1")
    assert exc.returncode == 2 and "--happened only" in str(exc)
    assert StepAttempt.objects.filter(run=run).count() == 1


def test_reconcile_needs_exactly_one_outcome():
    exc, _, _ = cli_error("reconcile", "1")
    assert "one of the arguments --happened --not-happened --abort --lookup is required" in str(exc)
    exc, _, _ = cli_error("reconcile", "1", "--happened", "--abort")
    assert "not allowed with argument" in str(exc)


def test_no_subcommand_is_an_error():
    exc, _, _ = cli_error()
    assert "subcommand" in str(exc)


# --- transitions from the command line (the same services as the dashboard) ----------


def test_signal_cancel_and_compensate_from_the_command_line():
    from tests import waits_workflows as ww

    waiting = drive(durable.start("tests.signal", {}).id)
    assert waiting.status == RunStatus.WAITING
    out, _ = cli("signal", waiting.id, "go", "--payload", '{"n": 1}')
    assert "delivered to its wait" in out
    assert drive(waiting.id).output_value() == {"got": {"n": 1}}

    other = drive(durable.start("tests.signal", {}).id)
    out, _ = cli("cancel", other.id, "--reason", "not needed", "--by", "ops")
    assert f"run {other.id} is cancelled" in out
    assert Run.objects.get(pk=other.id).status == RunStatus.CANCELLED
    # the reason is a note, not an error: no "Cancelled" in the list's error column
    out, _ = cli("runs", "--status", "cancelled")
    (row,) = [line for line in out.splitlines() if other.id in line]
    assert "Cancelled" not in row and row.rstrip().endswith("-")
    out, _ = cli("show", other.id)
    assert re.search(r"^cancelled: +cancelled by ops: not needed$", out, re.M)
    assert "error:" not in out and "classification:" not in out
    with pytest.raises(CommandError) as exc:
        cli("cancel", other.id)
    assert exc.value.returncode == 2 and "only pending, running" in str(exc.value)

    ww.EFFECTS.clear()
    failed = drive(durable.start("tests.charge_then_fail", {}).id)
    assert failed.status == RunStatus.FAILED
    out, _ = cli("compensate", failed.id)
    assert "is compensating" in out
    assert drive(failed.id).status == RunStatus.COMPENSATED
    assert [e[0] for e in ww.EFFECTS].count("refund") == 2

    # its charges were refunded: a fork may not reuse them, only make them again
    with pytest.raises(CommandError) as exc:
        cli("fork", failed.id, "--from-step", "boom")
    assert exc.value.returncode == 2 and "can start from: waits.charge" in str(exc.value)
    out, _ = cli("fork", failed.id, "--from-step", "waits.charge")
    fork = Run.objects.get(forked_from_id=failed.id)
    assert fork.id in out and Step.objects.filter(run=fork).count() == 0

    with pytest.raises(CommandError) as exc:
        cli("resume", "no-such-run")
    assert exc.value.returncode == 2 and "does not exist" in str(exc.value)


def test_workflows_lists_tools_with_their_safety_class():
    from tests import waits_workflows  # noqa: F401  (registers waits.send)

    out, _ = cli("workflows")
    assert "waits.send" in out and "unsafe_write" in out


def test_show_prints_a_runs_parent_and_children():
    from tests.durable.runtime import child_workflows as cwf

    cwf.reset()
    run = durable.start("tests.children.parent", {"items": [{"n": 1, "id": "kid"}]}, "family-1")
    drive(run.id)
    child = drive("family-1.kid")
    assert child.status == RunStatus.SUCCEEDED
    drive(run.id)
    out, _ = cli("show", "family-1")
    rows = out.split("\nChild runs\n")[1].split("\n\n")[0].splitlines()
    assert rows[0].split() == ["run", "workflow", "status", "created"]
    assert rows[2].split()[:3] == ["family-1.kid", "tests.children.leaf", "succeeded"]
    steps = out.split("\nSteps\n")[1].split("\n\n")[0]
    assert "child:kid" in steps and "child" in steps
    out, _ = cli("show", "family-1.kid")
    header = dict(ln.split(":", 1) for ln in out.split("\n\n")[0].splitlines())
    assert header["parent run"].strip() == "family-1 (on its end: cancel)"
    assert "Child runs" not in out


def test_reconcile_lookup_prints_what_the_hook_finds_and_changes_nothing():
    from tests.dashboard import dash_workflows as dw

    dw.reset()
    dw.KNOBS["unknown"] = 1  # the write times out while the provider's lookup is down
    run = drive(durable.start("dash.payout", {"amount": 6}).id)
    op = Operation.objects.get(run=run)
    try:
        exc, _, _ = cli_error("reconcile", str(op.pk), "--lookup")
        assert exc.returncode == 2 and "could not tell" in str(exc) and "is down" in str(exc)
        dw.provider_records(op.idempotency_key, {"payment": "pay_6", "amount": 6})
        out, _ = cli("reconcile", op.idempotency_key, "--lookup")
        assert "found, it happened" in out and "external id: pay_6" in out
        assert 'result: {"payment": "pay_6", "amount": 6}' in out
        dw.provider_records(op.idempotency_key, None)
        out, _ = cli("reconcile", str(op.pk), "--lookup")
        assert "not found, it did not happen" in out and "--not-happened" in out
        exc, _, _ = cli_error("reconcile", str(op.pk), "--lookup", "--reason", "x")
        assert exc.returncode == 2 and "changes nothing" in str(exc)
        op.refresh_from_db()
        assert op.status == OperationStatus.UNKNOWN and op.resolution == ""
    finally:
        dw.reset()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0.000216, "0.216ms"),  # a no-op step: was "0.000s"
        (0.0123, "12.3ms"),
        (0.85, "850ms"),
        (0.9996, "1.000s"),
        (4.2, "4.200s"),
        (75, "75s"),
    ],
)
def test_the_cli_shows_a_step_shorter_than_a_millisecond(seconds, shown):
    from durable.cli.text import _seconds

    assert _seconds(seconds) == shown
