"""Five examples of PydanticAI's own documentation (ai.pydantic.dev, the ``docs/`` folder
of github.com/pydantic/pydantic-ai), as DurableAgents.

Each example's agent, tools, deps and output types are the documentation's, copied as
they are; only two things differ: the model is a scripted ``FunctionModel`` (no network;
the documentation's model name is kept in a comment), and the Durable wrapper lines (a
``DurableAgent(...)``; ``start``/``decode`` instead of ``run_sync``) live in the tests.
Every scripted model request appends a line to ``calls.jsonl`` through
``tests.contrib.pai_agents.record`` (``model:<example>:<n>``), so "each model call ran
once" is counted across worker processes, and ``CRASH_AT=model:<example>:<n>`` kills a
worker there, once.
"""

from __future__ import annotations

import json
import random
import re
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    Capability,
    DeferredToolRequests,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelRetry,
    RunContext,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typing_extensions import TypedDict

from durable.contrib.pydantic_ai import DurableAgent
from tests.contrib.pai_agents import record


def _turn(messages: list[ModelMessage]) -> int:
    return sum(isinstance(m, ModelResponse) for m in messages) + 1


def _prompt(messages: list[ModelMessage]) -> str:
    return next(str(p.content) for m in messages for p in m.parts if p.part_kind == "user-prompt")


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def _output(info: AgentInfo, args: dict[str, Any]) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, "out")])


def scripted(example: str, script: Any) -> FunctionModel:
    """A FunctionModel running ``script(messages, info)``, each request recorded."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        record("model", f"{example}:{_turn(messages)}")
        return script(messages, info)

    return FunctionModel(model, model_name=f"scripted-{example}")


# --------------------------------------------------------------------------------------
# 1. "roulette_wheel.py" (https://ai.pydantic.dev/agent/)

NUMBERS = {"eighteen": 18, "five": 5}


def _roulette(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = _returns(messages)
    if not returns:
        words = re.findall(r"[a-z]+", _prompt(messages).lower())
        square = next(NUMBERS[w] for w in words if w in NUMBERS)
        return ModelResponse(parts=[ToolCallPart("roulette_wheel", {"square": square}, "rw")])
    return _output(info, {"response": returns[-1].content == "winner"})


roulette_agent = Agent(  # (1)!
    scripted("roulette", _roulette),  # 'openai:gpt-5.2'
    deps_type=int,
    output_type=bool,
    system_prompt=(
        "Use the `roulette_wheel` function to see if the "
        "customer has won based on the number they provide."
    ),
)


@roulette_agent.tool
async def roulette_wheel(ctx: RunContext[int], square: int) -> str:  # (2)!
    """check if the square is a winner"""
    return "winner" if square == ctx.deps else "loser"


# --------------------------------------------------------------------------------------
# 2. "dice_game.py" (https://ai.pydantic.dev/tools/)


def _dice(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = {p.tool_name: p.content for p in _returns(messages)}
    if not returns:
        return ModelResponse(
            parts=[
                ToolCallPart("roll_dice", {}, "roll"),
                ToolCallPart("get_player_name", {}, "name"),
            ]
        )
    guess = re.search(r"\d", _prompt(messages))
    name = returns["get_player_name"]
    if guess and returns["roll_dice"] == guess.group():
        return ModelResponse(
            parts=[TextPart(f"Congratulations {name}, you guessed correctly! You're a winner!")]
        )
    return ModelResponse(
        parts=[
            TextPart(f"Sorry {name}, you rolled a {returns['roll_dice']}. Better luck next time!")
        ]
    )


dice_agent = Agent(
    scripted("dice", _dice),  # 'google:gemini-3-flash-preview'
    deps_type=str,  # (2)!
    instructions=(
        "You're a dice game, you should roll the die and see if the number "
        "you get back matches the user's guess. If so, tell them they're a winner. "
        "Use the player's name in the response."
    ),
)


@dice_agent.tool_plain  # (3)!
def roll_dice() -> str:
    """Roll a six-sided die and return the result."""
    record("tool", "dice:roll_dice")
    return str(random.randint(1, 6))


@dice_agent.tool  # (4)!
def get_player_name(ctx: RunContext[str]) -> str:
    """Get the player's name."""
    return ctx.deps


# --------------------------------------------------------------------------------------
# 3. "Usage Limits", restricting the number of requests
#    (https://ai.pydantic.dev/agent/#usage-limits)


class NeverOutputType(TypedDict):
    """
    Never ever coerce data to this type.
    """

    never_use_this: str


def _retry_loop(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("infinite_retry_tool", {}, f"t{_turn(messages)}")])


limits_agent = Agent(
    scripted("limits", _retry_loop),  # 'anthropic:claude-sonnet-4-6'
    retries={"tools": 3},
    output_type=NeverOutputType,
    system_prompt=(
        "Any time you get a response, call the `infinite_retry_tool` to produce another response."
    ),
)


@limits_agent.tool_plain(retries=5)  # (1)!
def infinite_retry_tool() -> int:
    raise ModelRetry("Please try again.")


# --------------------------------------------------------------------------------------
# 4. "tool_requires_approval.py"
#    (https://ai.pydantic.dev/deferred-tools/#human-in-the-loop-tool-approval)


def _files(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = _returns(messages)
    if not returns:
        return ModelResponse(
            parts=[
                ToolCallPart("delete_file", {"path": "__init__.py"}, "delete_file"),
                ToolCallPart(
                    "update_file",
                    {"path": "README.md", "content": "Hello, world!"},
                    "update_file_readme",
                ),
                ToolCallPart("update_file", {"path": ".env", "content": ""}, "update_file_dotenv"),
            ]
        )
    done = {p.tool_call_id: (p.outcome, p.content) for p in returns}
    return ModelResponse(parts=[TextPart("Here's what I've done: " + json.dumps(done))])


files_agent = Agent(
    scripted("files", _files),  # 'openai:gpt-5.2'
    output_type=[str, DeferredToolRequests],
)

PROTECTED_FILES = {".env"}


@files_agent.tool
def update_file(ctx: RunContext, path: str, content: str) -> str:
    if path in PROTECTED_FILES and not ctx.tool_call_approved:
        raise ApprovalRequired(metadata={"reason": "protected"})  # (1)!
    return f"File {path!r} updated: {content!r}"


@files_agent.tool_plain(requires_approval=True)
def delete_file(path: str) -> str:
    return f"File {path!r} deleted"


# --------------------------------------------------------------------------------------
# 5. "bank_support.py" (https://ai.pydantic.dev/), with the documentation
#    tests' ``bank_database.DatabaseConn`` (tests/example_modules/bank_database.py)


@dataclass
class DatabaseConn:
    @classmethod
    @asynccontextmanager
    async def connect(cls):
        yield cls()

    async def customer_name(self, *, id: int) -> str | None:
        if id == 123:
            return "John"

    async def customer_balance(self, *, id: int, include_pending: bool) -> float:
        if id == 123:
            return 123.45
        else:
            raise ValueError("Customer not found")

    async def refund_status(self, *, id: int) -> str:
        if id == 123:
            return "refunded on 2026-05-01"
        else:
            raise ValueError("Customer not found")


@dataclass
class SupportDependencies:  # (1)!
    customer_id: int
    db: DatabaseConn  # (2)!


class SupportOutput(BaseModel):  # (3)!
    support_advice: str = Field(description="Advice returned to the customer")
    block_card: bool = Field(description="Whether to block the customer's card")
    risk: int = Field(description="Risk level of query", ge=0, le=10)


customer_context = Capability[SupportDependencies](  # (4)!
    id="customer-context",
    description="Who the customer is and what's on their account.",
)


@customer_context.instructions  # (5)!
async def add_customer_name(ctx: RunContext[SupportDependencies]) -> str:
    customer_name = await ctx.deps.db.customer_name(id=ctx.deps.customer_id)
    return f"The customer's name is {customer_name!r}"


@customer_context.tool  # (6)!
async def customer_balance(ctx: RunContext[SupportDependencies], include_pending: bool) -> float:
    """Returns the customer's current account balance."""  # (7)!
    return await ctx.deps.db.customer_balance(
        id=ctx.deps.customer_id,
        include_pending=include_pending,
    )


refunds = Capability[SupportDependencies](  # (8)!
    id="refunds",
    description="Refund eligibility and refund status.",
    defer_loading=True,
)


@refunds.tool
async def refund_status(ctx: RunContext[SupportDependencies]) -> str:
    """Look up the refund status for the customer's most recent charge."""
    return await ctx.deps.db.refund_status(id=ctx.deps.customer_id)


def _support(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    name = re.search(r"The customer's name is '(\w+)'", info.instructions or "")
    customer = name.group(1) if name else "customer"
    prompt = _prompt(messages)
    if "card" in prompt:
        return _output(
            info,
            {
                "support_advice": f"I'm sorry to hear that, {customer}. We are temporarily "
                "blocking your card to prevent unauthorized transactions.",
                "block_card": True,
                "risk": 8,
            },
        )
    returns = _returns(messages)
    if not returns:
        return ModelResponse(
            parts=[ToolCallPart("customer_balance", {"include_pending": True}, "balance")]
        )
    return _output(
        info,
        {
            "support_advice": f"Hello {customer}, your current account balance, including "
            f"pending transactions, is ${returns[-1].content}.",
            "block_card": False,
            "risk": 1,
        },
    )


support_agent = Agent(  # (9)!
    scripted("support", _support),  # 'openai:gpt-5.6-sol'
    deps_type=SupportDependencies,
    output_type=SupportOutput,  # (11)!
    instructions=(
        "You are a support agent in our bank, give the "
        "customer support and judge the risk level of their query."
    ),
    capabilities=[customer_context, refunds],  # (12)!
)


# --------------------------------------------------------------------------------------
# The Durable wrapper lines (what the tests change besides run_sync -> start/decode)

durable_roulette = DurableAgent(roulette_agent, name="pai.docs.roulette")
durable_dice = DurableAgent(dice_agent, name="pai.docs.dice")
durable_limits = DurableAgent(limits_agent, name="pai.docs.limits")
durable_files = DurableAgent(files_agent, name="pai.docs.files")
#: the database connection cannot be stored: the run stores the customer id and each
#: execution opens its own connection (``deps_factory``)
durable_support = DurableAgent(
    support_agent,
    name="pai.docs.support",
    deps_factory=lambda stored: SupportDependencies(stored["customer_id"], DatabaseConn()),
)
