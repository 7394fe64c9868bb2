"""The checkpoint part's scenarios: how many runs of how many steps of which workflow.

Full sizes are chosen so that the part takes about 10 minutes on a loaded 2-core machine
(3 interleaved repetitions of every system on two databases); ``--quick`` sizes only
prove that every row is produced.
"""

from __future__ import annotations

from typing import Any

from .common import Config


def scenarios(cfg: Config) -> list[dict[str, Any]]:
    """``[{"key", "label", "runs", "steps", "workflow", ...}, ...]``: what each
    repetition runs; ``only`` limits a scenario to some systems, ``reps`` to fewer
    repetitions, ``needs_batched`` to a durable with ``ctx.step(..., durability=)``."""
    if cfg.quick:
        seq, single, tool, chain = (1, 50), (10, 1), (1, 20), (1, 50)
    else:
        seq, single, tool, chain = (20, 200), (200, 1), (5, 200), (5, 200)
    scen = [
        {
            "key": "seq",
            "label": f"{seq[0]} runs x {seq[1]} steps",
            "runs": seq[0],
            "steps": seq[1],
            "workflow": "noop",
        },
        {
            "key": "single",
            "label": f"{single[0]} runs x 1 step",
            "runs": single[0],
            "steps": 1,
            "workflow": "noop",
        },
        {
            "key": "read_tool",
            "label": f"read-only tool, {tool[0]} x {tool[1]}",
            "runs": tool[0],
            "steps": tool[1],
            "workflow": "read_tool",
            "only": ["durable"],
        },
        {
            "key": "write_tool",
            "label": f"unsafe_write tool, {tool[0]} x {tool[1]}",
            "runs": tool[0],
            "steps": tool[1],
            "workflow": "write_tool",
            "only": ["durable"],
        },
    ]
    # issue 13: the same chain of no-op steps, sync and batched (needs durable's
    # ``durability=`` keyword; a server without it skips these and says why)
    for mode in ("sync", "batched"):
        scen.append(
            {
                "key": f"chain_{mode}",
                "label": f'`ctx.step(..., durability="{mode}")` no-op, {chain[0]} x {chain[1]}',
                "runs": chain[0],
                "steps": chain[1],
                "workflow": "chain",
                "durability": mode,
                "only": ["durable"],
                "needs_batched": True,
            }
        )
    if not cfg.quick:
        scen.append(
            {
                "key": "read_tool_paced",
                "label": "read-only tool, 0.12 s of workflow code between calls, 2 x 10",
                "runs": 2,
                "steps": 10,
                "workflow": "read_tool",
                "sleep": 0.12,
                "only": ["durable"],
                "reps": 1,
            }
        )
    return scen
