"""Workflows with typed inputs, for the start-a-run page (tests/dashboard/test_start_run.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

import durable


class Priority(str, Enum):
    LOW = "low"
    HIGH = "high"


class Ticket(BaseModel):
    title: str = Field(description="what the ticket is about")
    count: int
    urgent: bool = False
    priority: Priority = Priority.LOW
    labels: list[str] = []


class Refund(TypedDict):
    order_id: str
    amount: float


@dataclass
class Ping:
    host: str
    tries: int = 3


@durable.workflow(name="start.ticket")
def ticket(ctx, input: Ticket) -> dict:
    return {"title": input.title if isinstance(input, Ticket) else input["title"]}


@durable.workflow(name="start.refund")
def refund(ctx, input: Refund) -> dict:
    return dict(input)


@durable.workflow(name="start.ping")
def ping(ctx, input: Ping) -> dict:
    return {"ok": True}


#: how many times each step of start.order ran (a fork reuses, never reruns, the first)
ORDER_CALLS: dict[str, int] = {}


def _counted(name: str, value):
    ORDER_CALLS[name] = ORDER_CALLS.get(name, 0) + 1
    return value


class Order(BaseModel):
    customer: str
    quantity: int
    api_key: str = ""


@durable.workflow(name="start.order")
def order(ctx, input: Order) -> dict:
    """A quote made from the input, then a confirmation: a fork from "confirm" with an
    edited quantity reuses the quote and confirms the new quantity."""
    data = input if isinstance(input, dict) else input.model_dump()
    quote = ctx.step("quote", _counted, "quote", {"for": data["customer"], "qty": data["quantity"]})
    confirmed = ctx.step("confirm", _counted, "confirm", data["quantity"])
    if data["quantity"] > 100:
        raise durable.PermanentError("too many")
    return {"quote": quote, "confirmed": confirmed}
