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
