"""Where a signal went: delivered or kept, misaddressed names, and signals a run never
consumed (S21)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

import durable
from durable import SignalDelivery, SignalResult
from durable.models import RunStatus, Signal, TraceEvent, Wait, WaitStatus
from durable.testing import drive
from durable.worker.sweeper import sweep

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_for_goods():
    run = drive(durable.start("apf.goods", {"timeout": 2}).id)
    assert run.status == RunStatus.WAITING, run.error
    return run


def test_s21_misaddressed_signal_is_kept_and_names_what_the_run_waits_on():
    """The run waits on goods_received (2 s timeout); the operator sends
    goods-received. The answer says "kept; this run waits on goods_received", the
    signal stays undelivered, and the run's end records that it was never consumed."""
    run = waiting_for_goods()
    sent = durable.signal(run.id, "goods-received", {"note": "DN-1"}, by="ops")
    assert isinstance(sent, SignalResult) and sent  # truthy, as the Signal row was
    assert sent.delivery == SignalDelivery.KEPT and not sent.delivered
    assert sent.misaddressed
    assert sent.waiting_on == ("goods_received",) and sent.waited_on == ("goods_received",)
    assert "kept; this run waits on goods_received" in sent.message
    assert "check the name" in sent.message
    # backward compatible: reads like the stored Signal
    assert sent.wait is None and sent.wait_id is None and sent.name == "goods-received"
    assert Signal.objects.get(pk=sent.pk).wait_id is None
    event = TraceEvent.objects.get(run=run, kind="signal_received")
    assert event.message == sent.message and event.data["misaddressed"] is True
    assert event.data["delivery"] == "kept"

    # the wait is not resolved by the wrong name; its 2 s timeout expires it
    wait = Wait.objects.get(run=run, key="goods_received")
    assert wait.status == WaitStatus.PENDING
    assert sweep(now=wait.wake_at)["timers"] == 1
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == {"goods": None}
    (end,) = TraceEvent.objects.filter(run=run, kind="signals_unconsumed")
    assert "'goods-received'" in end.message and "waited on goods_received" in end.message
    assert end.data["count"] == 1 and end.data["signals"][0]["name"] == "goods-received"
    assert end.data["signals"][0]["sent_by"] == "ops"


def test_a_genuinely_early_signal_gets_other_words_and_is_delivered_later():
    run = durable.start("apf.goods", {"timeout": 60})
    early = durable.signal(run.id, "goods_received", {"note": "early"})
    assert early.delivery == SignalDelivery.KEPT and not early.misaddressed
    assert early.waited_on == () and "this run waits on" not in early.message
    assert "has not waited on any signal yet" in early.message
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.output_value() == {"goods": {"note": "early"}}
    assert not TraceEvent.objects.filter(run=run, kind="signals_unconsumed").exists()


def test_a_signal_to_the_waiting_name_is_delivered():
    run = waiting_for_goods()
    sent = durable.signal(run.id, "goods_received", {"note": "DN-2"})
    assert sent.delivery == SignalDelivery.DELIVERED and sent.delivered
    assert sent.wait is not None and sent.wait.key == "goods_received"
    assert "delivered" in sent.message and not sent.misaddressed
    assert drive(run.id).output_value() == {"goods": {"note": "DN-2"}}


def test_a_repeated_dedupe_key_says_so():
    run = waiting_for_goods()
    first = durable.signal(run.id, "goods_received", 1, dedupe_key="k")
    again = durable.signal(run.id, "goods_received", 1, dedupe_key="k")
    assert again.duplicate and not first.duplicate and again.pk == first.pk
    assert again.delivered and again.message.startswith("already received")


def test_kept_for_the_next_wait_on_a_name_the_run_waited_on_before():
    run = drive(durable.start("apf.signal_loop", {"n": 2}).id)
    assert durable.signal(run.id, "go", 1).delivered
    # the first wait is resolved, the second not reached yet: kept, and not a typo
    second = durable.signal(run.id, "go", 2)
    assert second.delivery == SignalDelivery.KEPT and not second.misaddressed
    assert second.waiting_on == () and second.waited_on == ("go",)
    assert "kept in the mailbox for the run's next wait on 'go'" in second.message
    run = drive(run.id)
    assert run.status == RunStatus.SUCCEEDED and run.output_value() == [1, 2]


def test_cancelling_a_run_with_an_unread_signal_records_it():
    run = waiting_for_goods()
    durable.signal(run.id, "goods-recieved", "typo")
    durable.cancel(run.id, by="ops")
    (end,) = TraceEvent.objects.filter(run=run, kind="signals_unconsumed")
    assert "run cancelled" in end.message and "'goods-recieved'" in end.message
    assert end.actor == "ops"


def test_cli_signal_says_kept_and_names_the_waits():
    run = waiting_for_goods()
    out = StringIO()
    call_command(
        "durable",
        "signal",
        run.id,
        "goods-received",
        "--payload",
        '{"n": 1}',
        stdout=out,
        stderr=StringIO(),
    )
    assert "kept; this run waits on goods_received" in out.getvalue()
    out = StringIO()
    call_command("durable", "signal", run.id, "goods_received", stdout=out, stderr=StringIO())
    assert "delivered to its wait" in out.getvalue()
