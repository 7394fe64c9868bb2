"""The dashboard's own workflow: a bulk action over many runs, carried out as a run.

``dashboard.bulk_action`` takes ``{"action": "cancel" | "resume" | "compensate",
"run_ids": [...], "by": <username>, "reason": <text>}`` and applies the action to the
runs in batches of :data:`BATCH`, each batch a step: a worker that dies part-way leaves
the finished batches recorded, and the next one goes on from there (a run of the batch
in flight that was already acted on is then skipped as no longer eligible). Each run's
action is the single-run service (:mod:`durable.services.runs`), so it is checked,
locked and audited as when one run is acted on, in the name of ``by``. Its output:
``{"done": n, "skipped": [{"run": id, "why": text}, ...]}``.
"""

from __future__ import annotations

from typing import Any

import durable
from durable.exceptions import IllegalTransition, RunNotFound

#: runs acted on per step
BATCH = 50
ACTIONS = ("cancel", "resume", "compensate")


def _batch(action: str, run_ids: list[str], by: str, reason: str) -> dict[str, Any]:
    from durable.services import runs

    act = {"cancel": runs.run_cancel, "resume": runs.run_resume, "compensate": runs.run_compensate}
    done, skipped = 0, []
    for run_id in run_ids:
        try:
            act[action](run_id=run_id, by=by, reason=reason)
        except (IllegalTransition, RunNotFound) as exc:
            skipped.append({"run": run_id, "why": str(exc)})
        else:
            done += 1
    return {"done": done, "skipped": skipped}


@durable.workflow(name="dashboard.bulk_action", version="1")
def bulk_action(ctx: Any, data: dict[str, Any]) -> dict[str, Any]:
    action, run_ids = data["action"], list(data["run_ids"])
    if action not in ACTIONS:
        raise durable.PermanentError(f"bulk action {action!r}: one of {', '.join(ACTIONS)}")
    total: dict[str, Any] = {"done": 0, "skipped": []}
    for start in range(0, len(run_ids), BATCH):
        out = ctx.step(
            f"batch-{start // BATCH + 1}",
            _batch,
            action,
            run_ids[start : start + BATCH],
            data["by"],
            data.get("reason", ""),
        )
        total["done"] += out["done"]
        total["skipped"] += out["skipped"]
    return total
