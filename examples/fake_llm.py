"""A local OpenAI-compatible chat-completions server that answers from scripted conversations.

Run it as its own process and point the agents at it::

    python -m examples.fake_llm --port 8010
    export OPENAI_BASE_URL=http://127.0.0.1:8010/v1 OPENAI_API_KEY=anything

``POST /v1/chat/completions`` speaks the OpenAI protocol with tool calling, so the
official ``openai`` client (and so ``ctx.llm``) cannot tell it from a real provider,
except that it answers with ``system_fingerprint="durable-scripted"`` (the dashboard
labels runs that used it). ``"stream": true`` is answered as the OpenAI API does:
server-sent events, one ``data: {chat.completion.chunk}`` line a word of the content or
a fragment of a tool call's arguments, the finish reason, a usage chunk when
``stream_options.include_usage`` asks for it, then ``data: [DONE]``; the assembled reply
is the one the same request without streaming gets. Answers are computed from the
messages:

- the script is named by a marker ``durable-script: NAME`` in the system prompt (the
  reference agents put one there); without one, the "echo" script answers in prose;
- the ``support`` script plans from the customer message (``kb_search``,
  ``tickets_create``, ``payments_refund`` when a charge and an amount are named,
  ``email_send``), corrects a call the tools refused, and summarises once every tool
  has answered; ``chaos-frameworks`` (the chaos audit's framework agents) makes one tool
  call a turn, a ticket and then a refund, asking again once after an error answer.

**Faults on demand**, by a marker in a user message (so a run carries its own faults
and replays them deterministically):

- ``[fault:429]``, ``[fault:429x3]``, ``[fault:503x2]``, ``[fault:500]``: the first N
  requests of the conversation (same system prompt and first user message) get that
  status (429/503 with ``Retry-After``, 1 s unless ``[fault:retry_after=2.5]``); later
  ones are answered;
- ``[fault:401]``: every request is refused as unauthenticated;
- ``[fault:slow=3]``: every answer takes 3 more seconds;
- ``[fault:malformed_json]`` (or ``malformed_jsonx2``, ``malformed_json_always``): the
  plan's tool-call arguments are not valid JSON until the agent fed the error back N
  times;
- ``[fault:unknown_tool]``, ``[fault:wrong_args]``: the plan names a tool that does not
  exist / passes a wrong argument name, and is corrected once the tool result says so;
- ``[fault:eager_email]``: the plan is three calls -- search, the refund, and an email
  that already says "Your refund of $X has been issued" (a model that takes the
  refund's approval for granted);
- ``[fault:stream_hold=N]`` (``stream_holdxK=N``: the first K requests of the
  conversation): a streamed answer stops after N pieces until ``POST /_admin/release``
  (or ``FakeLLM.release.set()``; 120 s at most), a point a test controls to kill a
  worker mid-stream; ``[fault:stream_delay=0.05]``: seconds between two chunks.

Also by a header ``X-Fault: 429`` (``503``, ``500``, ``401``, ``slow=2``) or queued
with ``POST /_admin/faults {"fault": ..., "times": n, "match": text}``.
``GET /_admin/requests`` lists what was asked (the run named by ``run: ID`` in the
system prompt, the turn, the answer's status), so tests count LLM calls per run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from typing import Any

from examples._http import Request, Response, Router, arg_parser, error, run_forever, start

SCRIPTED_FINGERPRINT = "durable-scripted"  # == durable.runtime.llm.SCRIPTED_FINGERPRINT
FAULT_RE = re.compile(r"\[fault:([a-z_]*[a-z]|\d{3})(?:x(\d+))?(?:=([0-9.]+))?\]", re.IGNORECASE)
SCRIPT_RE = re.compile(r"durable-script:\s*([\w.\-]+)")
RUN_RE = re.compile(r"\brun:\s*([\w.\-]+)")
#: what the workflow says when it feeds an unusable reply back (counted by the script)
FEEDBACK_PREFIX = "Your previous reply could not be used"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _tokens(text: str) -> int:
    """A rough token count (about four characters a token), at least 1."""
    return max(1, (len(text) + 3) // 4)


class Conversation:
    """The parts of a chat-completions request the scripts read."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.messages: list[dict[str, Any]] = [
            m for m in body.get("messages") or [] if isinstance(m, dict)
        ]
        self.system = "\n".join(
            _text(m.get("content"))
            for m in self.messages
            if m.get("role") in ("system", "developer")
        )
        users = [_text(m.get("content")) for m in self.messages if m.get("role") == "user"]
        self.first_user = users[0] if users else ""
        self.feedbacks = sum(1 for u in users if u.startswith(FEEDBACK_PREFIX))
        script = SCRIPT_RE.search(self.system)
        self.script = script.group(1) if script else "echo"
        run = RUN_RE.search(self.system)
        self.run_id = run.group(1) if run else ""
        self.faults: dict[str, tuple[int | None, float | None]] = {}
        for m in FAULT_RE.finditer(" ".join(users)):
            self.faults[m.group(1).lower()] = (
                int(m.group(2)) if m.group(2) else None,
                float(m.group(3)) if m.group(3) else None,
            )
        self.turn = sum(1 for m in self.messages if m.get("role") == "assistant")

    def fault(self, name: str) -> tuple[int | None, float | None] | None:
        return self.faults.get(name)

    def tool_results(self, only_last_turn: bool = False) -> list[tuple[dict[str, Any], Any]]:
        """``(call, parsed result)`` for every answered tool call, in order (or only those
        of the last assistant turn)."""
        calls: dict[str, dict[str, Any]] = {}
        last_ids: set[str] = set()
        out = []
        for m in self.messages:
            if m.get("role") == "assistant":
                last_ids = set()
                for c in m.get("tool_calls") or []:
                    fn = c.get("function") or {}
                    try:
                        args = json.loads(fn.get("arguments") or "{}")
                    except json.JSONDecodeError:
                        args = {}
                    calls[c.get("id", "")] = {"name": fn.get("name", ""), "arguments": args}
                    last_ids.add(c.get("id", ""))
            elif m.get("role") == "tool":
                try:
                    result = json.loads(_text(m.get("content")))
                except json.JSONDecodeError:
                    result = {"result": _text(m.get("content"))}
                call_id = m.get("tool_call_id", "")
                out.append((call_id, calls.get(call_id, {"name": "", "arguments": {}}), result))
        if only_last_turn:
            out = [item for item in out if item[0] in last_ids]
        return [(call, result) for _, call, result in out]


# ------------------------------------------------------------------------ scripts

EMAIL_RE = re.compile(r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+")
CHARGE_RE = re.compile(r"\bch_\w+")
AMOUNT_RE = re.compile(
    r"(?:\$|USD\s?|EUR\s?|€)\s?(\d{1,6}(?:[.,]\d{1,2})?)|"
    r"(\d{1,6}(?:[.,]\d{1,2})?)\s?(?:USD|EUR|dollars|euros|€)",
    re.IGNORECASE,
)
NAME_RE = re.compile(r"^Customer:\s*([^<\n]+?)\s*(?:<|$)", re.MULTILINE)


def _support_facts(text: str) -> dict[str, Any]:
    email = EMAIL_RE.search(text)
    charge = CHARGE_RE.search(text)
    amount = AMOUNT_RE.search(text)
    name = NAME_RE.search(text)
    cents = None
    if amount:
        raw = (amount.group(1) or amount.group(2)).replace(",", ".")
        cents = round(float(raw) * 100)
    message = text.split("Message:", 1)[1].strip() if "Message:" in text else text.strip()
    message = FAULT_RE.sub("", message).strip()
    return {
        "email": email.group(0) if email else "",
        "charge": charge.group(0) if charge else "",
        "cents": cents,
        "name": name.group(1).strip() if name else "customer",
        "message": message,
    }


def _money(cents: int | None) -> str:
    return f"${(cents or 0) / 100:,.2f}"


def support_script(conv: Conversation) -> dict[str, Any]:
    """The support agent: plan, correct refused calls, summarise."""
    facts = _support_facts(conv.first_user)
    subject = (facts["message"].splitlines() or ["Customer request"])[0][:80] or "Customer request"
    if conv.turn == 0 and conv.fault("eager_email") and facts["charge"] and facts["cents"]:
        return {
            "content": None,
            "tool_calls": [
                ("kb_search", {"query": "refund policy duplicate charge"}),
                (
                    "payments_refund",
                    {
                        "charge_id": facts["charge"],
                        "amount_cents": facts["cents"],
                        "reason": "duplicate charge reported by the customer",
                    },
                ),
                (
                    "email_send",
                    {
                        "to": facts["email"],
                        "subject": f"Re: {subject}",
                        "body": f"Hello {facts['name']},\n\nYour refund of "
                        f"{_money(facts['cents'])} has been issued.\n\n"
                        "The support team",
                    },
                ),
            ],
        }
    if conv.turn == 0:  # nothing executed yet: plan
        calls = [
            (
                "kb_search",
                {"query": "refund policy duplicate charge" if facts["charge"] else subject},
            ),
            (
                "tickets_create",
                {
                    "customer": facts["name"],
                    "email": facts["email"],
                    "subject": subject,
                    "body": facts["message"][:2000],
                    "priority": "high" if facts["charge"] else "normal",
                },
            ),
        ]
        if facts["charge"] and facts["cents"]:
            refund = {
                "charge_id": facts["charge"],
                "amount_cents": facts["cents"],
                "reason": "duplicate charge reported by the customer",
            }
            if conv.fault("wrong_args"):
                refund = {"charge": facts["charge"], "amount": facts["cents"]}
            name = "payments_refund_all" if conv.fault("unknown_tool") else "payments_refund"
            calls.append((name, refund))
        if facts["email"]:
            body = (
                f"Hello {facts['name']},\n\nthank you for writing to us. We have opened a "
                "ticket for your request"
                + (
                    f" and asked for a refund of {_money(facts['cents'])} on charge "
                    f"{facts['charge']}"
                    if facts["charge"] and facts["cents"]
                    else ""
                )
                + ". You will hear from us shortly.\n\nThe support team"
            )
            calls.append(
                ("email_send", {"to": facts["email"], "subject": f"Re: {subject}", "body": body})
            )
        malformed = conv.fault("malformed_json") or conv.fault("malformed_json_always")
        limit = (
            10**9
            if conv.fault("malformed_json_always")
            else ((malformed[0] or 1) if malformed else 0)
        )
        return {"content": None, "tool_calls": calls, "malformed": conv.feedbacks < limit}
    # correct what the tools refused in the last turn
    retry = []
    correct = {
        "charge_id": facts["charge"],
        "amount_cents": facts["cents"],
        "reason": "duplicate charge reported by the customer",
    }
    for call, result in conv.tool_results(only_last_turn=True):
        err = result.get("error") if isinstance(result, dict) else None
        if not err or err.get("type") == "ApprovalRejected":
            continue  # a person said no: do not insist
        if (
            (call["name"], call["arguments"]) != ("payments_refund", correct)
            and call["name"].startswith("payments_")
            and facts["charge"]
            and facts["cents"]
        ):
            retry.append(("payments_refund", correct))
    if retry:
        return {"content": None, "tool_calls": retry}
    return {"content": _summary(conv, facts), "tool_calls": []}


def _summary(conv: Conversation, facts: dict[str, Any]) -> str:
    done, failed = [], []
    for call, result in conv.tool_results():
        value = result.get("result") if isinstance(result, dict) else None
        err = result.get("error") if isinstance(result, dict) else None
        if err:
            failed.append(f"{call['name']} ({err.get('message', 'failed')[:120]})")
        elif call["name"] == "tickets_create" and isinstance(value, dict):
            done.append(f"opened ticket {value.get('number') or value.get('id')}")
        elif call["name"] == "payments_refund" and isinstance(value, dict):
            done.append(
                f"refunded {_money(value.get('amount_cents'))} on "
                f"{value.get('charge_id')} ({value.get('id')})"
            )
        elif call["name"] == "email_send":
            done.append(f"emailed {call['arguments'].get('to')}")
        elif call["name"] == "kb_search":
            done.append("checked the knowledge base")
    text = f"Summary for {facts['name']}: " + ("; ".join(done) or "nothing was done")
    if failed:
        text += ". Not done: " + "; ".join(failed)
    return text + "."


def echo_script(conv: Conversation) -> dict[str, Any]:
    last = _text(conv.messages[-1].get("content")) if conv.messages else ""
    return {
        "content": f"(scripted model, no script for this conversation) You said: {last[:500]}",
        "tool_calls": [],
    }


def refund_graph_script(conv: Conversation) -> dict[str, Any]:
    """The LangGraph reference agent (examples/langgraph_agent.py): one refund, then a
    summary of what the tool answered."""
    facts = _support_facts(conv.first_user)
    results = conv.tool_results()
    if not results:
        if facts["charge"] and facts["cents"]:
            refund = {
                "charge_id": facts["charge"],
                "amount_cents": facts["cents"],
                "reason": "duplicate charge reported by the customer",
            }
            return {"content": None, "tool_calls": [("payments_refund", refund)]}
        return {"content": f"Nothing to refund for {facts['name']}.", "tool_calls": []}
    call, result = results[-1]
    err = result.get("error") if isinstance(result, dict) else None
    if err:
        text = f"The refund was not made: {str(err.get('message', err))[:200]}"
    else:
        value = result.get("result") if isinstance(result, dict) else None
        value = value if isinstance(value, dict) else {}
        text = (
            f"Refunded {_money(value.get('amount_cents'))} on {value.get('charge_id')} "
            f"({value.get('id')})"
        )
    return {"content": f"Summary for {facts['name']}: {text}.", "tool_calls": []}


def refund_desk_script(conv: Conversation) -> dict[str, Any]:
    """The OpenAI Agents SDK reference agents: a triage agent hands the customer over to
    the refunds agent (``transfer_to_*``), which looks the order up and refunds it (a
    call that needs approval), then says what happened, a rejection's reason included."""
    offered = {
        str((t.get("function") or {}).get("name", ""))
        for t in conv.body.get("tools") or []
        if isinstance(t, dict)
    }
    done = {call["name"]: result for call, result in conv.tool_results()}
    transfer = sorted(name for name in offered if name.startswith("transfer_to_"))
    if transfer and not any(name.startswith("transfer_to_") for name in done):
        return {"content": None, "tool_calls": [(transfer[0], {})]}
    order = (re.findall(r"\b[A-Z]-\d+\b", conv.first_user) or ["A-1"])[0]
    if "lookup_order" in offered and "lookup_order" not in done:
        return {"content": None, "tool_calls": [("lookup_order", {"order_id": order})]}
    found = done.get("lookup_order") or {}
    amount = int(found.get("amount", 0)) if isinstance(found, dict) else 0
    if "refund_order" in offered and "refund_order" not in done:
        args = {"order_id": order, "amount": amount}
        return {"content": None, "tool_calls": [("refund_order", args)]}
    refund = done.get("refund_order")
    if isinstance(refund, dict) and (refund.get("refunded") or refund.get("status") == "succeeded"):
        return {"content": f"Refunded {amount} for order {order}.", "tool_calls": []}
    reason = refund.get("result", "") if isinstance(refund, dict) else ""
    return {"content": f"No refund for order {order}. {reason}".strip(), "tool_calls": []}


def _is_error(result: Any) -> bool:
    """Whether a tool answered with an error (an ``error`` key, or the OpenAI Agents SDK's
    "An error occurred while running the tool" text)."""
    if not isinstance(result, dict):
        return False
    return "error" in result or "error occurred" in str(result.get("result", "")).lower()


def chaos_frameworks_script(conv: Conversation) -> dict[str, Any]:
    """The chaos audit's framework agents (examples/chaos_frameworks.py): one tool call a
    turn -- ``open_ticket`` with a subject naming the run, then ``refund_charge`` of the
    charge the customer names, each asked once more after an error answer (as a model
    told "Please try again" does) -- then a summary of what the tools answered."""
    facts = _support_facts(conv.first_user)
    offered = {str((t.get("function") or {}).get("name", "")) for t in conv.body.get("tools") or []}
    called = [call["name"] for call, _ in conv.tool_results()]
    failed = [call["name"] for call, result in conv.tool_results() if _is_error(result)]
    wanted = {
        "open_ticket": {"customer": facts["name"], "subject": f"{conv.run_id} framework ticket"},
        "refund_charge": {"charge_id": facts["charge"], "amount_cents": facts["cents"]},
    }
    for name, args in wanted.items():
        if name in offered and called.count(name) == failed.count(name) < 2:
            return {"content": None, "tool_calls": [(name, args)]}
    return {"content": f"Summary for {facts['name']}: {', '.join(called)}.", "tool_calls": []}


SCRIPTS = {
    "support": support_script,
    "echo": echo_script,
    "refund_graph": refund_graph_script,
    "refund-desk": refund_desk_script,
    "chaos-frameworks": chaos_frameworks_script,
}


# ------------------------------------------------------------------------- server


class FakeLLM:
    def __init__(self, api_key: str = "") -> None:
        self.api_key = api_key
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}
        self.queued: list[dict[str, Any]] = []
        self.log: list[dict[str, Any]] = []  #: answered requests, as each ended
        #: requests as they arrived (the same entries), answered or still in flight
        self.received: list[dict[str, Any]] = []
        self.router = Router()
        r = self.router
        r.route("GET", "/health")(lambda req: Response(200, {"ok": True}))
        r.route("GET", "/v1/models")(
            lambda req: Response(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": "scripted", "object": "model", "created": 0, "owned_by": "durable"}
                    ],
                },
            )
        )
        r.route("POST", "/v1/chat/completions")(self.completions)
        r.route("GET", "/_admin/requests")(self._requests)
        r.route("POST", "/_admin/faults")(self._add_fault)
        r.route("DELETE", "/_admin/faults")(self._clear_faults)
        r.route("POST", "/_admin/reset")(self._reset)
        r.route("POST", "/_admin/release")(self._release)
        #: set: held streams go on (``[fault:stream_hold=N]``)
        self.release = threading.Event()

    def completions(self, req: Request) -> Response:
        body = req.json()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return error(400, "'messages' is a required property")
        conv = Conversation(body)
        # the same request streamed or not gets the same answer (ids included)
        asked = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        fp = hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()
        # faults count per conversation (its system prompt and first user message)
        thread = hashlib.sha256(f"{conv.system}\0{conv.first_user}".encode()).hexdigest()
        with self.lock:
            self.seen[thread] = self.seen.get(thread, 0) + 1
            n = self.seen[thread]
        entry = {
            "at": time.time(),
            "run": conv.run_id,
            "script": conv.script,
            "turn": conv.turn,
            "feedbacks": conv.feedbacks,
            "status": 200,
            "fault": "",
        }
        with self.lock:
            self.received.append(entry)
        response = self._fault(req, conv, n, entry)
        if response is None:
            response = self._answer(conv, fp)
            if body.get("stream"):
                response = self._streamed(conv, response.body, n)
        entry["status"] = response.status
        with self.lock:
            self.log.append(entry)
        return response

    def _fault(
        self, req: Request, conv: Conversation, n: int, entry: dict[str, Any]
    ) -> Response | None:
        if self.api_key and req.header("authorization") != f"Bearer {self.api_key}":
            entry["fault"] = "401"
            return error(
                401, "Incorrect API key provided.", "invalid_request_error", code="invalid_api_key"
            )
        wanted: dict[str, Any] | None = None
        header = req.header("x-fault")
        if header:
            name, _, arg = header.partition("=")
            wanted = {"fault": name, "arg": float(arg) if arg else None}
        if wanted is None:
            with self.lock:
                for rule in self.queued:
                    if rule["times"] != 0 and (
                        not rule["match"] or rule["match"] in json.dumps(conv.body)
                    ):
                        rule["times"] -= 1
                        wanted = {"fault": rule["fault"], "arg": rule.get("arg")}
                        break
        if wanted is None:
            retry_after = (conv.fault("retry_after") or (None, None))[1]
            for name in ("401", "429", "500", "502", "503"):
                spec = conv.fault(name)
                if spec is None:
                    continue
                if name == "401" or n <= (spec[0] or 1):
                    wanted = {"fault": name, "arg": retry_after}
                    break
            slow = conv.fault("slow")
            if wanted is None and slow is not None:
                wanted = {"fault": "slow", "arg": slow[1] or 2.0}
        if wanted is None:
            return None
        fault, arg = wanted["fault"], wanted.get("arg")
        entry["fault"] = fault
        if fault == "slow":
            time.sleep(float(arg or 2.0))
            return None
        ra = {"Retry-After": f"{arg:g}" if arg else "1"}
        if fault == "401":
            return error(
                401,
                "Incorrect API key provided (injected).",
                "invalid_request_error",
                code="invalid_api_key",
            )
        if fault == "429":
            return error(
                429,
                "Rate limit reached for requests (injected).",
                "requests",
                code="rate_limit_exceeded",
                headers=ra,
            )
        if fault in ("500", "502", "503"):
            return error(
                int(fault),
                "The server had an error while processing your request (injected).",
                "server_error",
                headers=ra,
            )
        return None

    def _answer(self, conv: Conversation, fp: str) -> Response:
        script = SCRIPTS.get(conv.script, echo_script)
        out = script(conv)
        tool_calls = []
        for i, (name, args) in enumerate(out.get("tool_calls") or []):
            arguments = json.dumps(args)
            if out.get("malformed") and i == len(out["tool_calls"]) - 1:
                arguments = arguments[:-1].replace('"', "'", 2)  # cut and mangled
            tool_calls.append(
                {
                    "id": "call_" + hashlib.sha1(f"{fp}:{i}".encode()).hexdigest()[:24],
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        message: dict[str, Any] = {
            "role": "assistant",
            "content": out.get("content"),
            "refusal": None,
        }
        if tool_calls:
            message["tool_calls"] = tool_calls
        prompt_text = json.dumps(conv.body.get("messages")) + json.dumps(
            conv.body.get("tools") or []
        )
        completion_text = json.dumps(message)
        usage = {
            "prompt_tokens": _tokens(prompt_text),
            "completion_tokens": _tokens(completion_text),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return Response(
            200,
            {
                "id": "chatcmpl-" + fp[:24],
                "object": "chat.completion",
                "created": int(time.time()),
                "model": str(conv.body.get("model") or "scripted"),
                "system_fingerprint": SCRIPTED_FINGERPRINT,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": "tool_calls" if tool_calls else "stop",
                    }
                ],
                "usage": usage,
            },
        )

    def _streamed(self, conv: Conversation, reply: dict[str, Any], n: int) -> Response:
        """``reply`` (a chat.completion) as the chunks of a streamed one."""
        options = conv.body.get("stream_options") or {}
        hold = conv.fault("stream_hold")
        hold_after = int(hold[1] or 0) if hold and n <= (hold[0] or 1) else None
        delay = (conv.fault("stream_delay") or (None, None))[1]
        return Response(
            200, stream=self._events(reply, bool(options.get("include_usage")), hold_after, delay)
        )

    def _events(
        self,
        reply: dict[str, Any],
        include_usage: bool,
        hold_after: int | None,
        delay: float | None,
    ) -> Any:
        head = {k: reply[k] for k in ("id", "created", "model", "system_fingerprint")}
        choice = reply["choices"][0]
        message = choice["message"]

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                **head,
                "object": "chat.completion.chunk",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                data["usage"] = None
            return f"data: {json.dumps(data)}\n\n".encode()

        pieces: list[dict[str, Any]] = []
        for word in re.findall(r"\s*\S+|\s+", message.get("content") or ""):
            pieces.append({"content": word})
        for index, call in enumerate(message.get("tool_calls") or []):
            start = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            pieces.append({"tool_calls": [start]})
            arguments = call["function"]["arguments"]
            for at in range(0, len(arguments), 12):
                fragment = {"index": index, "function": {"arguments": arguments[at : at + 12]}}
                pieces.append({"tool_calls": [fragment]})
        first = {"role": "assistant", "content": "" if message.get("content") else None}
        yield chunk({**first, "refusal": None})
        for count, delta in enumerate(pieces):
            if count == hold_after:
                self.release.wait(120)
            if delay:
                time.sleep(delay)
            yield chunk(delta)
        yield chunk({}, choice["finish_reason"])
        if include_usage:
            usage = {
                **head,
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": reply["usage"],
            }
            yield f"data: {json.dumps(usage)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    # ----------------------------------------------------------------- admin

    def _requests(self, req: Request) -> Response:
        with self.lock:
            data = [e for e in self.log if not req.query.get("run") or e["run"] == req.query["run"]]
        return Response(200, {"data": data})

    def _add_fault(self, req: Request) -> Response:
        p = req.json()
        fault = str(p.get("fault") or "")
        if fault not in ("401", "429", "500", "502", "503", "slow"):
            return error(400, "fault must be 401, 429, 500, 502, 503 or slow")
        rule = {
            "fault": fault,
            "times": int(p.get("times", 1)),
            "match": str(p.get("match") or ""),
            "arg": float(p["retry_after"])
            if p.get("retry_after") is not None
            else (float(p["seconds"]) if p.get("seconds") is not None else None),
        }
        with self.lock:
            self.queued.append(rule)
        return Response(200, rule)

    def _clear_faults(self, req: Request) -> Response:
        with self.lock:
            self.queued.clear()
        return Response(200, {"rules": []})

    def _release(self, req: Request) -> Response:
        self.release.set()
        return Response(200, {"released": True})

    def _reset(self, req: Request) -> Response:
        self.release.clear()
        with self.lock:
            self.queued.clear()
            self.seen.clear()
            self.log.clear()
            self.received.clear()
        return Response(200, {"reset": True})


def main(argv: list[str] | None = None) -> None:
    parser = arg_parser("OpenAI-compatible scripted chat-completions server.", default_port=8010)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("FAKE_LLM_API_KEY", ""),
        help="require 'Authorization: Bearer KEY' (default: any key)",
    )
    args = parser.parse_args(argv)
    llm = FakeLLM(api_key=args.api_key)
    server = start(llm.router, "fake-llm", args.host, args.port)
    port = server.server_address[1]
    run_forever(
        [server],
        port,
        args.port_file,
        f"scripted LLM on http://{args.host}:{port}/v1 (OPENAI_BASE_URL)",
    )


if __name__ == "__main__":
    main()
