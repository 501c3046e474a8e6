"""The task in progress in this process: what it wrote, its stop flag. One task runs at a time per process."""

from __future__ import annotations

import glob
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .task import Task

EventSink = Callable[[dict], None]


@dataclass
class Run:
    """The task in progress and what it wrote."""

    task: Task
    emit: EventSink
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    written: list[Path] = field(default_factory=list)
    update_written: bool = False
    result: dict | None = None  # set once done() committed
    last_progress_s: float = -math.inf

    def remove_outputs(self) -> None:
        """Removes the update and result this run wrote and any temporary file of theirs left by an interrupted
        write."""
        targets = set(self.written)
        targets.update(p for p in (self.task.output.weights, self.task.output.result) if p is not None)
        for path in targets:
            if path in self.written:
                _unlink(path)
            for temp in glob.glob(glob.escape(str(path.parent / f".{path.name}.")) + "*.tmp"):
                _unlink(Path(temp))


_current: Run | None = None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def begin(run: Run) -> None:
    """Makes `run` the task in progress. RuntimeError when one already is (run_task does not nest)."""
    global _current
    if _current is not None:
        raise RuntimeError("a task is already running in this process; run_task() does not nest")
    _current = run


def end() -> None:
    global _current
    _current = None


def current_run() -> Run:
    """The task in progress; RuntimeError outside one."""
    if _current is None:
        raise RuntimeError("no task is running: call this from the function given to parsyn.trainer.main() or "
                           "parsyn.trainer.run_task()")
    return _current


def current_run_or_none() -> Run | None:
    return _current


def stop_requested() -> bool:
    """True once the running task was asked to stop (SIGTERM/SIGINT under main)."""
    return _current is not None and _current.stop.is_set()


def current_task() -> Task:
    """The task in progress (RuntimeError outside one)."""
    return current_run().task

