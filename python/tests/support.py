"""Shared test helpers: task files, model folders and data, and running a trainer's command line."""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parsyn import safetensors

PYTHON_DIR = Path(__file__).resolve().parents[1]
REPO = PYTHON_DIR.parent
EXAMPLES = REPO / "examples" / "trainers"


def env_with_package() -> dict[str, str]:
    """The environment with python/ on PYTHONPATH, for trainer subprocesses."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYTHON_DIR), env.get("PYTHONPATH")) if p)
    return env


def write_task(path: Path, **fields: Any) -> Path:
    """A task file with contract_version 1, kind train, seed 7 and outputs under out/, overridden by `fields`."""
    task = {"contract_version": 1, "kind": "train", "seed": 7, "split_seed": 0, "device": "cpu",
            "output": {"weights": "out/update.safetensors", "result": "out/result.json"}}
    task.update(fields)
    path.write_text(json.dumps(task))
    return path


@dataclass
class TrainerRun:
    returncode: int
    stdout: str
    stderr: str
    events: list[dict]
    wall_s: float

    def events_named(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]


def parse_events(stdout: str) -> list[dict]:
    """Every non-empty stdout line as an event; AssertionError naming a line that is not a JSON object with an
    "event" string (the worker's `stdout` rule)."""
    events = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"stdout line is not JSON: {line!r}") from None
        if not isinstance(event, dict) or not isinstance(event.get("event"), str):
            raise AssertionError(f"stdout line is not an object with an 'event' string: {line!r}")
        events.append(event)
    return events


def run_trainer(command: list[str], *args: str, timeout_s: float = 120, env: dict | None = None,
                cwd: Path | None = None) -> TrainerRun:
    started = time.monotonic()
    """Runs `command ARGS...`; for `run` its stdout must be events only (parse_events)."""
    proc = subprocess.run(command + list(args), capture_output=True, text=True, timeout=timeout_s,
                          env=env or env_with_package(), cwd=cwd, stdin=subprocess.DEVNULL)
    events = parse_events(proc.stdout) if args and args[0] == "run" else []
    return TrainerRun(proc.returncode, proc.stdout, proc.stderr, events, time.monotonic() - started)


def run_and_sigterm(command: list[str], task_file: Path, first_event_timeout_s: float = 120,
                    env: dict | None = None) -> tuple[TrainerRun, float]:
    """Starts `command run TASK_FILE`, waits for its first progress event, sends SIGTERM and waits for the exit.
    Returns the run and the seconds from SIGTERM to the exit."""
    proc = subprocess.Popen(command + ["run", str(task_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env or env_with_package())
    started = time.monotonic()
    lines = []
    try:
        while True:
            remaining = first_event_timeout_s - (time.monotonic() - started)
            if remaining <= 0 or not select.select([proc.stdout], [], [], remaining)[0]:
                raise AssertionError(f"no progress event within {first_event_timeout_s} s")
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"the trainer exited ({proc.wait()}) before a progress event: "
                                     f"{proc.stderr.read()[-2000:]}")
            lines.append(line)
            if parse_events(line) and parse_events(line)[0]["event"] == "progress":
                break
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
        exited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + stdout
    return TrainerRun(proc.returncode, out, stderr, parse_events(out), time.monotonic() - started), exited


def tensor_bytes(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Each tensor's (dtype, shape, stored bytes), for bit-for-bit comparisons."""
    header = safetensors.read_header(path)
    data = path.read_bytes()[header.data_start:]
    return {n: (i.dtype, i.shape, data[i.begin:i.end]) for n, i in header.tensors.items()}


# ----------------------------------------------------------------------------------------------------------------
# Data and model folders


def write_tabular_csv(path: Path, rows: int = 240, features: int = 4, classes: int = 3, seed: int = 0,
                      label_column: str = "label") -> Path:
    """Rows around one centre per class (separable), labels "c0", "c1", ... written as strings."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, size=(classes, features))
    labels = rng.integers(0, classes, size=rows)
    x = centres[labels] + rng.normal(0, 1, size=(rows, features))
    lines = [",".join([f"x{i}" for i in range(features)] + [label_column])]
    lines += [",".join([f"{v:.5f}" for v in row] + [f"c{label}"]) for row, label in zip(x, labels)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_tabular_model(folder: Path, data: Path, hidden_sizes: list[int] = (8,), seed: int = 0,
                        label_column: str = "label") -> Path:
    """A tabular model folder for `data` (tabular_model.json with its standardizer and classes, model.safetensors
    with random F32 weights)."""
    import csv

    with open(data, newline="") as f:
        records = list(csv.reader(f))
    header, body = records[0], records[1:]
    label_at = header.index(label_column)
    features = [h for i, h in enumerate(header) if i != label_at]
    x = np.array([[float(v) for i, v in enumerate(r) if i != label_at] for r in body])
    classes = sorted({r[label_at] for r in body})
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"format": "parsyn-tabular", "model_type": "mlp" if hidden_sizes else "logreg",
            "hidden_sizes": list(hidden_sizes), "label_column": label_column, "feature_names": features,
            "class_names": classes, "standardizer": {"mean": x.mean(0).tolist(), "std": x.std(0).tolist()}}
    (folder / "tabular_model.json").write_text(json.dumps(spec))
    rng = np.random.default_rng(seed)
    sizes = [len(features), *hidden_sizes, len(classes)]
    weights = {}
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        bound = 1 / math.sqrt(n_in)
        weights[f"layers.{i}.weight"] = rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32)
        weights[f"layers.{i}.bias"] = rng.uniform(-bound, bound, n_out).astype(np.float32)
    safetensors.save(folder / "model.safetensors", weights)
    return folder


def write_digits_csv(path: Path, rows: np.ndarray | None = None) -> Path:
    """scikit-learn's digits (all 1,797 rows, or those listed) as p0..p63,label."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    indices = np.arange(len(digits.target)) if rows is None else rows
    lines = [",".join([f"p{i}" for i in range(64)] + ["label"])]
    lines += [",".join([str(int(v)) for v in digits.data[r]] + [str(int(digits.target[r]))]) for r in indices]
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------------------------------------------------------
# Conformance probes


def _temp_dir():
    import tempfile

    return tempfile.TemporaryDirectory(prefix="parsyn-test-")
