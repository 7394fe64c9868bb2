"""Graph workflows of the LangGraph contrib's tests (in-process and on real workers).

Node bodies append one line per execution to ``$CRASH_TEST_DIR/lg_nodes.jsonl`` (or to
``NODE_LOG`` in-process) so "ran exactly once" is counted across processes. A node
named in ``$LG_CRASH_AT`` (``node``, or several, comma-separated) SIGKILLs its own
worker the first time it runs (a marker file keeps a second worker from doing it again).

LangGraph's documentation examples are kept as the docs write them: :class:`NodeHook`, a
LangChain callback handler given to the compiled graph (a Durable line), counts their
node runs in ``lg_hook.jsonl`` (``HOOK_LOG`` in-process) and kills the worker at an armed
``<example>.<node>:end`` -- the node has returned, its writes are not saved yet.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.callbacks import BaseCallbackHandler
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import durable
from durable.contrib.langgraph import call_tool, graph_workflow

NODE_LOG: list[dict[str, Any]] = []
#: nodes that raise a TransientError the first time they run (in-process tests)
FAIL_ONCE: set[str] = set()
REFUNDS: list[dict[str, Any]] = []


def _note(run: str, node: str, **extra: Any) -> None:
    line = {"node": node, "pid": os.getpid(), **extra}
    NODE_LOG.append(line)
    folder = os.environ.get("CRASH_TEST_DIR")
    if folder:
        with open(Path(folder) / "lg_nodes.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _maybe_crash(node: str, before: Callable[[], Any] | None = None) -> None:
    """SIGKILL this worker if ``node`` is armed in ``$LG_CRASH_AT``, once per test folder
    (an O_EXCL marker: two workers never both fire it); ``before`` runs just before."""
    folder = os.environ.get("CRASH_TEST_DIR")
    if not folder or node not in os.environ.get("LG_CRASH_AT", "").split(","):
        return
    if before is not None:
        before()
    marker = Path(folder) / f"lg-crashed-{node}"
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


HOOK_LOG: list[dict[str, Any]] = []


def hook_lines() -> list[dict[str, Any]]:
    """The node runs :class:`NodeHook` saw: in this process, or in every worker."""
    folder = os.environ.get("CRASH_TEST_DIR")
    if not folder:
        return list(HOOK_LOG)
    path = Path(folder) / "lg_hook.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class NodeHook(BaseCallbackHandler):
    """Counts the node runs of documentation example ``example`` and crashes at an armed
    ``<example>.<label>:end``, where ``label`` is the node's name (or ``label(node,
    input)``, to tell ``Send`` branches apart); ``before_crash(label, thread_id)`` runs
    before the kill (to let siblings' writes be saved first)."""

    def __init__(
        self,
        example: str,
        label: Callable[[str, Any], str] | None = None,
        before_crash: Callable[[str, str], None] | None = None,
    ) -> None:
        self.example = example
        self.label = label
        self.before_crash = before_crash
        self.open: dict[Any, tuple[str, str]] = {}

    def on_chain_start(self, serialized, inputs, *, run_id, metadata=None, **kwargs):
        node = (metadata or {}).get("langgraph_node")
        if not node or kwargs.get("name") != node or node.startswith("__"):
            return  # the graph itself, or a runnable inside a node
        label = self.label(node, inputs) if self.label else node
        self.open[run_id] = (label, str((metadata or {}).get("thread_id", "")))
        line = {"example": self.example, "node": label, "pid": os.getpid()}
        HOOK_LOG.append(line)
        folder = os.environ.get("CRASH_TEST_DIR")
        if folder:
            with open(Path(folder) / "lg_hook.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")

    def on_chain_end(self, outputs, *, run_id, **kwargs):
        label, thread = self.open.pop(run_id, (None, ""))
        if label is not None:
            before = self.before_crash
            _maybe_crash(
                f"{self.example}.{label}:end",
                (lambda: before(label, thread)) if before else None,
            )

    def on_chain_error(self, error, *, run_id, **kwargs):
        self.open.pop(run_id, None)  # an interrupt, or a failure: the node did not end


def hooked(example: str, build: Callable[[], StateGraph], **hook: Any) -> Callable[[], Any]:
    """``build``'s graph compiled with a :class:`NodeHook` (Durable adds its saver)."""

    def compiled() -> Any:
        return build().compile().with_config(callbacks=[NodeHook(example, **hook)])

    compiled.__qualname__ = build.__qualname__
    return compiled


class Steps(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answers: Annotated[list[Any], operator.add]
    refund: Any


def _node(name: str, pause: float = 0.0):
    def body(state: Steps) -> dict[str, Any]:
        _note("", name)
        if pause:
            time.sleep(pause)
        _maybe_crash(name)
        if name in FAIL_ONCE:
            FAIL_ONCE.discard(name)
            raise durable.TransientError(f"{name} failed once")
        return {"log": [name]}

    body.__name__ = name
    return body


def chain_graph() -> StateGraph:
    """a -> b -> c -> d, one node per super-step."""
    g = StateGraph(Steps)
    for name in "abcd":
        g.add_node(name, _node(name, pause=0.2 if name == "c" else 0.0))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", "d")
    g.add_edge("d", END)
    return g


graph_workflow("lg.chain", "1", chain_graph)


def _ask(key: str):
    def body(state: Steps) -> dict[str, Any]:
        _note("", f"ask-{key}")
        answer = interrupt({"question": f"question {key}?", "key": key})
        return {"answers": [{key: answer}]}

    body.__name__ = f"ask_{key}"
    return body


def two_questions_graph() -> StateGraph:
    """start -> (ask_x | ask_y) in one super-step -> end: two interrupts at once."""
    g = StateGraph(Steps)
    g.add_node("start", _node("start"))
    g.add_node("ask_x", _ask("x"))
    g.add_node("ask_y", _ask("y"))
    g.add_node("end", _node("end"))
    g.add_edge(START, "start")
    g.add_edge("start", "ask_x")
    g.add_edge("start", "ask_y")
    g.add_edge(["ask_x", "ask_y"], "end")
    g.add_edge("end", END)
    return g


graph_workflow("lg.two_questions", "1", two_questions_graph)


def plain_question_graph() -> StateGraph:
    g = StateGraph(Steps)

    def ask(state: Steps) -> dict[str, Any]:
        return {"answers": [interrupt("Ship it?")]}

    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


graph_workflow("lg.plain_question", "1", plain_question_graph)


def two_in_a_row_graph() -> StateGraph:
    """One node asks twice: the second question must get its own answer."""
    g = StateGraph(Steps)

    def ask(state: Steps) -> dict[str, Any]:
        first = interrupt({"question": "first?"})
        second = interrupt({"question": "second?"})
        return {"answers": [first, second]}

    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


graph_workflow("lg.two_in_a_row", "1", two_in_a_row_graph)


def refunds_made() -> list[dict[str, Any]]:
    """The refunds made so far: in this process, or in every worker (CRASH_TEST_DIR)."""
    folder = os.environ.get("CRASH_TEST_DIR")
    path = Path(folder) / "lg_refunds.jsonl" if folder else None
    if path is None:
        return list(REFUNDS)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _find_refund(params: dict[str, Any], *, idempotency_key: str) -> Any:
    for r in refunds_made():
        if r["key"] == idempotency_key:
            return r
    return durable.NOT_FOUND


@durable.tool(name="lg_refund", safety="unsafe_write", reconcile=_find_refund)
def lg_refund(charge: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    refund = {"charge": charge, "amount": amount, "key": idempotency_key}
    REFUNDS.append(refund)
    folder = os.environ.get("CRASH_TEST_DIR")
    if folder:
        with open(Path(folder) / "lg_refunds.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(refund) + "\n")
    return refund


def refund_graph() -> StateGraph:
    """plan -> pay (a ledger write through call_tool) -> after."""
    g = StateGraph(Steps)
    g.add_node("plan", _node("plan"))

    def pay(state: Steps) -> dict[str, Any]:
        _note("", "pay")
        result = call_tool("lg_refund", {"charge": "ch_1", "amount": 5})
        _note("", "pay-after-tool")
        _maybe_crash("pay")
        return {"refund": result, "log": ["pay"]}

    g.add_node("pay", pay)
    g.add_node("after", _node("after"))
    g.add_edge(START, "plan")
    g.add_edge("plan", "pay")
    g.add_edge("pay", "after")
    g.add_edge("after", END)
    return g


graph_workflow("lg.refund", "1", refund_graph)


# --- LangGraph's documentation examples (docs.langchain.com/oss/python/langgraph/interrupts)
# Each is the doc's code; only the Durable lines (graph_workflow, no checkpointer, no
# thread config) differ.


class ApprovalState(TypedDict, total=False):
    action_details: str
    status: str


def approval_graph() -> StateGraph:
    """The "Approve or reject" example of the interrupts page."""
    from typing import Literal

    from langgraph.types import Command

    def approval_node(state: ApprovalState) -> Command[Literal["proceed", "cancel"]]:
        # Pause execution; payload shows up under result["__interrupt__"]
        is_approved = interrupt(
            {
                "question": "Do you want to proceed with this action?",
                "details": state["action_details"],
            }
        )
        # Route based on the response
        if is_approved:
            return Command(goto="proceed")  # Runs after the resume payload is provided
        else:
            return Command(goto="cancel")

    def proceed_node(state: ApprovalState):
        return {"status": "approved"}

    def cancel_node(state: ApprovalState):
        return {"status": "rejected"}

    builder = StateGraph(ApprovalState)
    builder.add_node("approval", approval_node)
    builder.add_node("proceed", proceed_node)
    builder.add_node("cancel", cancel_node)
    builder.add_edge(START, "approval")
    builder.add_edge("proceed", END)
    builder.add_edge("cancel", END)
    return builder


#: version 1 was registered before resume= existed: interrupt() returns the decision dict
graph_workflow("lg.approval", "1", approval_graph)
#: version 2 says what the graph expects: True or False
graph_workflow("lg.approval", "2", approval_graph, resume={"approval": "approve"})
#: an interrupt no declaration covers, under a workflow that declares resume=
graph_workflow("lg.approval_unmapped", "1", approval_graph, resume={"other": "approve"})


class ReviewState(TypedDict):
    generated_text: str


def review_graph() -> StateGraph:
    """The "Review and edit state" example of the interrupts page."""

    def review_node(state: ReviewState):
        # Pause and show the current content for review (surfaces in result["__interrupt__"])
        edited_content = interrupt(
            {
                "instruction": "Review and edit this content",
                "content": state["generated_text"],
            }
        )
        # Update the state with the edited version
        return {"generated_text": edited_content}

    builder = StateGraph(ReviewState)
    builder.add_node("review", review_node)
    builder.add_edge(START, "review")
    builder.add_edge("review", END)
    return builder


graph_workflow("lg.review", "1", hooked("review", review_graph), resume="edit:content")


class FormState(TypedDict):
    age: int | None


def age_graph() -> StateGraph:
    """The "Validating human input" example of the interrupts page."""

    def get_age_node(state: FormState):
        prompt = "What is your age?"

        while True:
            answer = interrupt(prompt)  # payload surfaces in result["__interrupt__"]

            # Validate the input
            if isinstance(answer, int) and answer > 0:
                # Valid input - continue
                break
            else:
                # Invalid input - ask again with a more specific prompt
                prompt = f"'{answer} is not a valid age. Please enter a positive number."

        return {"age": answer}

    builder = StateGraph(FormState)
    builder.add_node("collect_age", get_age_node)
    builder.add_edge(START, "collect_age")
    builder.add_edge("collect_age", END)
    return builder


graph_workflow("lg.age", "1", hooked("age", age_graph), resume="answer")


def asked_graph() -> StateGraph:
    """ask() declares the mapping at the interrupt itself."""
    from durable.contrib.langgraph import ask

    def confirm(state: ApprovalState):
        ok = ask(f"Run {state['action_details']}?", "approve")
        return {"status": "approved" if ok is True else f"not approved: {ok!r}"}

    builder = StateGraph(ApprovalState)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "confirm")
    builder.add_edge("confirm", END)
    return builder


graph_workflow("lg.asked", "1", hooked("asked", asked_graph))
#: the interrupt says "approve", the workflow says "answer": refused, not guessed
graph_workflow("lg.asked_conflict", "1", asked_graph, resume="answer")

#: the chain with LangGraph's durability="async": super-steps group-committed (batched)
graph_workflow("lg.chain_async", "1", chain_graph, durability="async")


# --- run-time context (docs.langchain.com/oss/python/langgraph/graph-api, "Runtime context")


@dataclass
class ContextSchema:
    llm_provider: str = "openai"


class ContextState(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def context_graph() -> StateGraph:
    """Two super-steps that read ``runtime.context``: the context reaches each."""
    from langgraph.runtime import Runtime

    def first(state: ContextState, runtime: Runtime[ContextSchema]):
        return {"log": [f"first:{runtime.context.llm_provider}"]}

    def second(state: ContextState, runtime: Runtime[ContextSchema]):
        assert isinstance(runtime.context, ContextSchema)
        return {"log": [f"second:{runtime.context.llm_provider}"]}

    builder = StateGraph(ContextState, context_schema=ContextSchema)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder


graph_workflow("lg.context", "1", hooked("context", context_graph))


# --- Send fan-out (docs.langchain.com/oss/python/langgraph/graph-api, "Send")

#: subjects whose joke fails once with a TransientError (in-process tests)
FAIL_SUBJECTS: set[str] = set()
#: called by a failing ``generate_joke`` branch just before it raises (a test's wait)
BEFORE_FAIL: list[Callable[[], Any]] = []


class OverallState(TypedDict):
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]


def jokes_graph() -> StateGraph:
    from langgraph.types import Send

    def continue_to_jokes(state: OverallState):
        return [Send("generate_joke", {"subject": s}) for s in state["subjects"]]

    def generate_joke(state: dict[str, Any]):
        subject = state["subject"]
        _note("", "generate_joke", subject=subject)
        if subject in FAIL_SUBJECTS:
            FAIL_SUBJECTS.discard(subject)
            for hook in BEFORE_FAIL:
                hook()
            raise durable.TransientError(f"the joke about {subject} failed once")
        return {"jokes": [f"Joke about {subject}"]}

    builder = StateGraph(OverallState)
    builder.add_node("generate_joke", generate_joke)
    builder.add_conditional_edges(START, continue_to_jokes)
    builder.add_edge("generate_joke", END)
    return builder


def _joke_label(node: str, input: Any) -> str:
    return f"{node}[{input['subject']}]" if isinstance(input, dict) else node


def _after_the_other_jokes(label: str, thread_id: str) -> None:
    """Before killing one joke's branch: the other branches' writes are saved (so the
    crash is mid-super-step, and only the killed branch may run again)."""
    from durable.contrib.langgraph.models import LangGraphWrite
    from durable.models import Run

    subjects = Run.objects.get(pk=thread_id).input_value()["subjects"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        saved = LangGraphWrite.objects.filter(thread_id=thread_id, channel="jokes")
        if saved.values("task_id").distinct().count() >= len(subjects) - 1:
            return
        time.sleep(0.05)


graph_workflow(
    "lg.jokes",
    "1",
    hooked("jokes", jokes_graph, label=_joke_label, before_crash=_after_the_other_jokes),
)


# --- model calls inside nodes (call_model): recorded LLM steps


class ChatState(TypedDict, total=False):
    topic: str
    draft: str
    review: str
    log: Annotated[list[str], operator.add]


def writer_graph() -> StateGraph:
    """write (two model calls in one node) -> check (fails once when asked) -> end."""
    from durable.contrib.langgraph import call_model

    def write(state: ChatState):
        _note("", "write")
        outline = call_model([{"role": "user", "content": f"outline {state['topic']}"}])
        draft = call_model([{"role": "user", "content": f"draft from {outline['content']}"}])
        _note("", "write-done")
        _maybe_crash("write")
        return {"draft": draft["content"], "log": ["write"]}

    builder = StateGraph(ChatState)
    builder.add_node("write", write)
    builder.add_node("check", _node("check"))
    builder.add_edge(START, "write")
    builder.add_edge("write", "check")
    builder.add_edge("check", END)
    return builder


graph_workflow("lg.writer", "1", writer_graph)


# --- long-term memory (docs.langchain.com/oss/python/langgraph/persistence, "Memory store")


@dataclass
class UserContext:
    user_id: str


class MemoryState(TypedDict, total=False):
    message: str
    seen: list[str]


def memory_graph() -> StateGraph:
    """Reads the user's memories, then remembers this message (under a key the node
    computes again when it re-runs)."""
    from langgraph.runtime import Runtime

    def call_model(state: MemoryState, runtime: Runtime[UserContext]):
        namespace = ("memories", runtime.context.user_id)
        memories = runtime.store.search(namespace)
        seen = sorted(m.value["data"] for m in memories)
        runtime.store.put(namespace, state["message"], {"data": state["message"]})
        return {"seen": seen}

    builder = StateGraph(MemoryState, context_schema=UserContext)
    builder.add_node("call_model", call_model)
    builder.add_edge(START, "call_model")
    builder.add_edge("call_model", END)
    return builder


def _memory_store():
    from durable.contrib.langgraph.store import DurableStore

    return DurableStore(ttl={"default_ttl": 60 * 24 * 30, "refresh_on_read": True})


graph_workflow("lg.memory", "1", hooked("memory", memory_graph), store=_memory_store())


# --- static breakpoints (compile(interrupt_before=/interrupt_after=)): refused


def _with_breakpoint(option: str) -> Callable[[], Any]:
    def build() -> Any:
        return chain_graph().compile(**{option: ["b"]})

    return build


graph_workflow("lg.breakpoint_before", "1", _with_breakpoint("interrupt_before"))
graph_workflow("lg.breakpoint_after", "1", _with_breakpoint("interrupt_after"))


# --- a LangChain chat model inside a node (durable_chat_model): recorded LLM steps

#: the chat model's calls in this process (``chat_calls()``: in every worker)
CHAT_CALLS: list[str] = []


def chat_calls() -> list[str]:
    folder = os.environ.get("CRASH_TEST_DIR")
    if not folder:
        return list(CHAT_CALLS)
    path = Path(folder) / "lg_chat.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def _counting_chat() -> Any:
    """A tiny LangChain ``BaseChatModel`` that answers from the last message and counts
    its calls (7 tokens each)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class CountingChat(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "counting"

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            asked = str(messages[-1].content)
            CHAT_CALLS.append(asked)
            folder = os.environ.get("CRASH_TEST_DIR")
            if folder:
                with open(Path(folder) / "lg_chat.jsonl", "a", encoding="utf-8") as fh:
                    fh.write(asked + "\n")
            usage = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
            reply = AIMessage(content=f"re: {asked}", usage_metadata=usage)  # type: ignore[arg-type]
            return ChatResult(generations=[ChatGeneration(message=reply)])

    return CountingChat()


def chat_writer_graph() -> StateGraph:
    """write (two chat model calls in one node; fails once when asked) -> check."""
    from durable.contrib.langgraph import durable_chat_model

    llm = durable_chat_model(_counting_chat(), name="counting-chat")

    def write(state: ChatState):
        _note("", "chat-write")
        outline = llm.invoke(f"outline {state['topic']}")
        draft = llm.invoke([("system", "be brief"), ("user", f"draft from {outline.content}")])
        _note("", "chat-write-done")
        _maybe_crash("chat-write")
        if "chat-write" in FAIL_ONCE:
            FAIL_ONCE.discard("chat-write")
            raise durable.TransientError("write failed once")
        return {"draft": draft.content, "log": ["write"]}

    builder = StateGraph(ChatState)
    builder.add_node("write", write)
    builder.add_node("check", _node("check"))
    builder.add_edge(START, "write")
    builder.add_edge("write", "check")
    builder.add_edge("check", END)
    return builder


graph_workflow("lg.chat_writer", "1", chat_writer_graph)
