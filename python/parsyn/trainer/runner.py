"""The trainer's side of the contract: the command line, events, result and update files, stops and exit codes.

    main(describe={...}, train=fn)   the whole program: `--describe`, `run TASK_FILE`, anything else exit 2
    run_task(task_file, fn)          one task in this process (tests, notebooks): returns the result or raises

`fn(task)` trains (or evaluates) one Task and returns its result dict (or calls done() itself and returns None);
inside it, report_progress() prints progress events, save_update() writes the update and task.should_stop() says
whether SIGTERM/SIGINT arrived.

How a run ends (main):
  done          the result checked and written atomically, then the `done` event; exit 0
  TaskError     the `error` event with its code; exit 1 (exit 4 for out_of_memory)
  NonFiniteLoss a NaN or infinite loss in report_progress or the result: error non_finite_loss, exit 1
  Stopped       SIGTERM or SIGINT: report_progress (and done) raise it; exit 3, no event. Should the script not get
                there within STOP_DEADLINE_S, a watchdog thread removes the outputs and ends the process with exit 3
  MemoryError, torch.cuda.OutOfMemoryError: error out_of_memory, exit 4
  any other exception: error internal with the exception's type and message (traceback on stderr), exit 1
Whatever the way, anything but `done` removes the update and result this run wrote (and their temporary files).

stdout belongs to the events: while a task runs, file descriptor 1 and sys.stdout point at stderr, so the script's
print() calls and native libraries' output go to the worker's log; the events go to a private duplicate of the real
stdout, one JSON object per line, flushed at once.

One task runs at a time per process: the functions here use the task of the run in progress. report_progress may be
called from any thread of that run; the others from the thread that called main/run_task.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Mapping, NoReturn

import numpy as np

from .. import safetensors
from . import state
from .errors import NonFiniteLoss, Stopped, TaskError
from .outputs import check_result
from .state import EventSink
from .task import CONTRACT_VERSION, MODEL_KINDS, TASK_KINDS, Task

STOP_DEADLINE_S = 8.0  # the contract allows 10 s between SIGTERM and SIGKILL
PROGRESS_INTERVAL_S = 0.2  # progress events closer than this are not printed (the first and the last always are)
THROUGHPUT_UNITS = ("samples/s", "tokens/s")

USAGE = """usage: {prog} --describe
       {prog} run TASK_FILE

A Parsyn trainer (docs/trainer-contract.md): --describe prints what it trains as JSON; run trains the task in
TASK_FILE and prints JSON events on stdout. Exit codes: 0 done, 1 failed, 2 usage, 3 stopped, 4 out of memory."""

TrainFunction = Callable[[Task], "Mapping[str, Any] | None"]


def report_progress(step: int, total_steps: int, loss: float | None = None, throughput: float | None = None,
                    throughput_unit: str = "samples/s") -> None:
    """Reports training progress: `step` optimizer steps done of `total_steps`, the step's loss, and the throughput
    in `throughput_unit` ("samples/s" or "tokens/s").

    Raises Stopped once a stop was requested, NonFiniteLoss for a NaN or infinite loss, ValueError for arguments of
    the wrong type. Events closer together than PROGRESS_INTERVAL_S are not printed (the first and the last step's
    always are); every call is checked."""
    run = state.current_run()
    if run.stop.is_set():
        raise Stopped()
    step, total_steps = _count(step, "step"), _count(total_steps, "total_steps")
    event: dict[str, Any] = {"event": "progress", "step": step, "total_steps": total_steps}
    if loss is not None:
        loss = float(loss)
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the training loss is {loss} at step {step} of {total_steps}: the initial weights "
                                "may hold NaN or infinite values, or the learning rate is too high for the data")
        event["loss"] = loss
    if throughput is not None:
        throughput = float(throughput)
        if not math.isfinite(throughput) or throughput < 0:
            raise ValueError(f"throughput must be a finite number >= 0, got {throughput}")
        if throughput_unit not in THROUGHPUT_UNITS:
            raise ValueError(f"throughput_unit must be one of {THROUGHPUT_UNITS}, got {throughput_unit!r}")
        event["throughput"] = throughput
        event["throughput_unit"] = throughput_unit
    now = time.monotonic()
    with run.lock:
        if now - run.last_progress_s < PROGRESS_INTERVAL_S and step != total_steps:
            return
        run.last_progress_s = now
    run.emit(event)


def _count(value: Any, name: str) -> int:
    if isinstance(value, np.integer):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def done(result: Mapping[str, Any]) -> None:
    """Checks the result (check_result), writes it to output.result atomically and prints the `done` event. A train
    task must have written its update (save_update) first. Raises Stopped when a stop was requested, NonFiniteLoss
    for a non-finite loss, TaskError for any other broken rule; done twice is a RuntimeError."""
    run = state.current_run()
    checked = check_result(result)
    if run.task.kind == "train" and not run.update_written:
        raise TaskError("internal", "the train task finished without an update: call "
                                    "parsyn.trainer.save_update(task, tensors) before done()")
    with run.lock:
        if run.result is not None:
            raise RuntimeError("done() was called twice")
        if run.stop.is_set():
            raise Stopped()
        run.written.append(run.task.output.result)
        text = json.dumps(checked, allow_nan=False, separators=(",", ":")) + "\n"
        safetensors.atomic_write(run.task.output.result, [text.encode("utf-8")])
        run.result = checked
    run.emit({"event": "done", **checked})


def fail(code: str, message: str) -> NoReturn:
    """Ends the task with the `error` event {code, message} and exit 1 (4 for out_of_memory): raises TaskError."""
    raise TaskError(code, message)


def run_task(task_file: os.PathLike | str, train: TrainFunction, *, describe: Mapping[str, Any] | None = None,
             on_event: EventSink | None = None) -> dict[str, Any]:
    """Runs one task in this process and returns its result: reads the task file, calls `train(task)`, checks and
    writes the result (done) unless `train` did. Each event goes to `on_event` (default: dropped). With `describe`,
    a task of a kind or model kind it does not list is refused (TaskError invalid_argument).

    Raises what main() turns into exit codes (TaskError and its subclasses, Stopped, any exception of `train`),
    after removing what the task wrote."""
    task = Task.load(task_file)
    if describe is not None:
        _check_task_fits(task, describe)
    run = state.Run(task, on_event or (lambda event: None))
    state.begin(run)
    try:
        returned = train(task)
        if run.result is None:
            if returned is None:
                raise TaskError("internal", "the train function returned None without calling done(result): "
                                            "return the result dict")
            done(returned)
        return run.result
    except BaseException:
        with run.lock:
            run.result = None
            run.remove_outputs()
        raise
    finally:
        state.end()


def _check_task_fits(task: Task, describe: Mapping[str, Any]) -> None:
    if task.kind not in describe["task_kinds"]:
        raise TaskError("invalid_argument",
                        f"this trainer runs {' and '.join(describe['task_kinds'])} tasks, not {task.kind}")
    kinds = describe["model_kinds"]
    if task.model_kind is not None and "*" not in kinds and task.model_kind not in kinds:
        raise TaskError("invalid_argument",
                        f"this trainer trains model kinds {list(kinds)}, not {task.model_kind!r}: map the job's "
                        "trainer name to a trainer for this model kind (parsyn worker --trainer NAME=COMMAND)")


def checked_description(describe: Mapping[str, Any]) -> dict[str, Any]:
    """The --describe object: `describe` with contract_versions [1] added when absent. ValueError (the script's bug)
    when task_kinds or model_kinds are missing or unknown."""
    description = {"contract_versions": [CONTRACT_VERSION], **describe}
    if CONTRACT_VERSION not in description["contract_versions"]:
        raise ValueError(f"describe's contract_versions must include {CONTRACT_VERSION}")
    for key, known in (("task_kinds", TASK_KINDS), ("model_kinds", MODEL_KINDS + ("*",))):
        values = description.get(key)
        if not isinstance(values, (list, tuple)) or not values or any(v not in known for v in values):
            raise ValueError(f"describe[{key!r}] must be a non-empty list of {', '.join(known)}; got {values!r}")
        description[key] = list(values)
    for key in ("name", "version"):
        if key in description and not isinstance(description[key], str):
            raise ValueError(f"describe[{key!r}] must be a string")
    return description


def main(describe: Mapping[str, Any], train: TrainFunction, argv: list[str] | None = None) -> NoReturn:
    """The trainer's program: `--describe` prints `describe` (contract_versions [1] added) and exits 0; `run
    TASK_FILE` runs the task with `train` and exits as the module docstring says; anything else prints the usage on
    stderr and exits 2."""
    description = checked_description(describe)
    args = sys.argv[1:] if argv is None else list(argv)
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "trainer"
    if args == ["--describe"]:
        sys.stdout.write(json.dumps(description) + "\n")
        sys.stdout.flush()
        sys.exit(0)
    if args in (["--help"], ["-h"]):
        sys.stdout.write(USAGE.format(prog=prog) + "\n")
        sys.exit(0)
    if len(args) != 2 or args[0] != "run":
        sys.stderr.write(f"{prog}: expected --describe or run TASK_FILE, got {' '.join(args) or 'nothing'}\n"
                         + USAGE.format(prog=prog) + "\n")
        sys.exit(2)
    events = _claim_stdout()
    sys.exit(_run_cli(args[1], train, description, events))


def _claim_stdout():
    """Keeps a private duplicate of stdout for the events and points fd 1 and sys.stdout at stderr."""
    sys.stdout.flush()
    events = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return events


def _run_cli(task_file: str, train: TrainFunction, description: dict[str, Any], events) -> int:
    lock = threading.Lock()

    def emit(event: dict) -> None:
        line = json.dumps(event, allow_nan=False, separators=(",", ":"))
        with lock:
            events.write(line + "\n")
            events.flush()

    signalled = _install_stop_handlers()
    try:
        run_task(task_file, train, describe=description, on_event=emit)
        return 0
    except BaseException as e:  # the edge of the user's code: every way it ends becomes an exit code
        if signalled.is_set() or isinstance(e, (Stopped, KeyboardInterrupt)):
            # A stop was asked for: whatever the script raised on its way out, the task was stopped.
            sys.stderr.write("parsyn trainer: stopped by a signal; removed this task's outputs\n")
            return 3
        if isinstance(e, TaskError):
            return _report_error(emit, e.code, e.message)
        if isinstance(e, MemoryError) or _is_out_of_memory(e):
            traceback.print_exc(file=sys.stderr)
            return _report_error(emit, "out_of_memory", f"{type(e).__name__}: {_first_line(e)}: lower batch_size "
                                                        "or max_seq_len, or use a machine with more memory")
        if not isinstance(e, Exception):
            raise  # SystemExit and the like: the script chose its own exit
        traceback.print_exc(file=sys.stderr)
        return _report_error(emit, "internal", f"{type(e).__name__}: {_first_line(e)}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else "(no message)")[:2000]


def _is_out_of_memory(error: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch is not None else None
    if oom is not None and isinstance(error, oom):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _report_error(emit: EventSink, code: str, message: str) -> int:
    sys.stderr.write(f"parsyn trainer: {code}: {message}\n")
    emit({"event": "error", "code": code, "message": message})
    return 4 if code == "out_of_memory" else 1


def _install_stop_handlers() -> threading.Event:
    """SIGTERM and SIGINT set the running task's stop flag and start the watchdog that ends the process with exit 3
    after STOP_DEADLINE_S should the script not stop by itself. Returns an event set at the first signal."""
    signalled = threading.Event()

    def on_signal(signum, frame) -> None:
        if signalled.is_set():
            return
        signalled.set()
        # os.write: the handler may run while the script is inside a write to the buffered sys.stderr.
        os.write(2, f"parsyn trainer: {signal.Signals(signum).name}: stopping\n".encode())
        run = state.current_run_or_none()
        if run is not None:
            run.stop.set()
            threading.Thread(target=_watchdog, args=(run,), name="parsyn-stop-watchdog", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return signalled


def _watchdog(run: state.Run) -> None:
    time.sleep(STOP_DEADLINE_S)
    with run.lock:
        if run.result is not None:
            return  # done was printed before the stop: the process is exiting 0
        run.remove_outputs()
    sys.stderr.write(f"parsyn trainer: the script did not stop within {STOP_DEADLINE_S:g} s of the signal "
                     "(call report_progress or check task.should_stop() in long loops); exiting\n")
    sys.stderr.flush()
    os._exit(3)
