"""Progress for long CLI operations: a bar on stderr when stderr is a terminal, nothing otherwise
(piped or redirected output stays clean)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

__all__ = ["progress_bar"]


@contextmanager
def progress_bar(
    description: str, total: int, stream: IO[str] | None = None, force: bool | None = None
) -> Iterator[Callable[[int], None]]:
    """``with progress_bar("diff", total) as advance: ... advance(n)``.

    Shown only when ``stream`` (default stderr) is a terminal, or when ``force`` is True.
    """
    stream = stream or sys.stderr
    show = force if force is not None else bool(getattr(stream, "isatty", lambda: False)())
    if not show or total <= 0:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    console = Console(file=stream, force_terminal=force or None)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
