"""Run a task over its items: skip finished ones, record each result as soon as it exists."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from pipelines.runstore import RunStore


class HasId(Protocol):
    id: str


async def run_items(
    items: Sequence[HasId],
    solve: Callable[[Any], Awaitable[dict[str, Any]]],
    store: RunStore,
    *,
    concurrency: int = 16,
    show_progress: bool = True,
) -> int:
    """Solve the items not yet in ``store``; return how many were solved now.

    ``solve`` returns a record with at least ``status``; the id is added here. An exception
    (e.g. the endpoint is gone for good) stops the run: finished items stay recorded and a rerun
    resumes with the rest, so nothing is lost and nothing is recorded twice.
    """
    done = store.completed_ids()
    todo = [item for item in items if str(item.id) not in done]
    gate = asyncio.Semaphore(concurrency)

    async def one(item: HasId) -> None:
        async with gate:
            record = await solve(item)
        store.append({"id": str(item.id), **record})
        progress.advance(bar)

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not show_progress,
        transient=True,
    ) as progress:
        bar = progress.add_task("items", total=len(items), completed=len(items) - len(todo))
        tasks = [asyncio.create_task(one(item)) for item in todo]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            store.close()
    return len(todo)
