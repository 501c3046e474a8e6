"""Shared test helpers: task files, model folders and data, running a trainer's command line, and the conformance
probes of docs/trainer-contract.md ("Conformance") as a mixin that a test class binds to one trainer."""

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


class ConformanceProbes:
    """The probes of docs/trainer-contract.md, run through a trainer's command line. A test class mixes this into
    unittest.TestCase and defines:
      COMMAND        the trainer's command line (list)
      MODEL_KINDS    the model kinds its --describe must list
      make_inputs(folder) -> (model_dir, model_kind, data_file): a model folder and data for it
    Each task runs with config and steps small enough for a CPU test."""

    COMMAND: list[str]
    MODEL_KINDS: list[str]
    CONFIG: dict[str, Any] = {"batch_size": 16, "learning_rate": 0.01, "max_grad_norm": 1.0}
    STEPS = 5

    def make_inputs(self, folder: Path) -> tuple[Path, str, Path]:
        raise NotImplementedError

    def _task(self, folder: Path, **fields: Any) -> Path:
        model_dir, model_kind, data = self.make_inputs(folder)
        base = {"model_kind": model_kind, "model_dir": str(model_dir),
                "initial_weights": str(model_dir / "model.safetensors"), "data": str(data),
                "config": dict(self.CONFIG), "steps": self.STEPS}
        base.update(fields)
        return write_task(folder / "task.json", **base)

    def _outputs(self, task_file: Path) -> tuple[Path, Path]:
        return task_file.parent / "out" / "update.safetensors", task_file.parent / "out" / "result.json"

    def assert_nothing_written(self, task_file: Path) -> None:
        out = task_file.parent / "out"
        left = sorted(p.name for p in out.iterdir()) if out.exists() else []
        self.assertEqual(left, [], f"the trainer left files in {out}")

    def assert_failed_with_error(self, run: TrainerRun, code: str | None = None) -> dict:
        self.assertEqual(run.returncode, 1, run.stderr[-3000:])
        errors = run.events_named("error")
        self.assertEqual(len(errors), 1, run.stdout)
        self.assertIsInstance(errors[0]["message"], str)
        self.assertTrue(errors[0]["message"])
        if code is not None:
            self.assertEqual(errors[0]["code"], code, errors[0]["message"])
        self.assertEqual(run.events_named("done"), [])
        return errors[0]

    def test_probe_describe(self):
        run = run_trainer(self.COMMAND, "--describe", timeout_s=30)
        self.assertEqual(run.returncode, 0, run.stderr)
        description = json.loads(run.stdout)
        self.assertIn(1, description["contract_versions"])
        self.assertTrue(set(description["task_kinds"]) <= {"train", "evaluate"})
        self.assertEqual(sorted(description["model_kinds"]), sorted(self.MODEL_KINDS))

    def test_probe_train(self):
        folder = Path(self.enterContext(_temp_dir()))
        task_file = self._task(folder)
        run = run_trainer(self.COMMAND, "run", str(task_file))
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        self.assertEqual(run.events[-1]["event"], "done")
        progress = run.events_named("progress")
        self.assertTrue(progress)
        self.assertEqual(progress[-1]["step"], self.STEPS)
        self.assertEqual(progress[-1]["total_steps"], self.STEPS)
        update, result_file = self._outputs(task_file)
        result = json.loads(result_file.read_text())
        self.assertIsInstance(result["num_samples"], int)
        self.assertGreater(result["num_samples"], 0)
        self.assertTrue(math.isfinite(result["train_loss"]))
        self.assertEqual({k: v for k, v in run.events[-1].items() if k != "event"}, result)
        initial = json.loads(task_file.read_text())["initial_weights"]
        self.assertEqual(safetensors.layout(update), safetensors.layout(initial))
        for name, array in safetensors.load(update).items():
            self.assertTrue(np.isfinite(array).all(), name)
        changed = [n for n, (_, _, b) in tensor_bytes(update).items() if b != tensor_bytes(Path(initial))[n][2]]
        self.assertTrue(changed, "training changed no weight")

    def test_probe_evaluate(self):
        folder = Path(self.enterContext(_temp_dir()))
        task_file = self._task(folder, kind="evaluate", output={"result": "out/result.json"})
        run = run_trainer(self.COMMAND, "run", str(task_file))
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        result = json.loads(self._outputs(task_file)[1].read_text())
        self.assertTrue(math.isfinite(result["validation_before"]["loss"]))
        self.assertEqual(result["validation_after"], result["validation_before"])
        self.assertFalse(self._outputs(task_file)[0].exists())

    def test_probe_zero_steps(self):
        folder = Path(self.enterContext(_temp_dir()))
        task_file = self._task(folder, steps=0)
        run = run_trainer(self.COMMAND, "run", str(task_file))
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        initial = Path(json.loads(task_file.read_text())["initial_weights"])
        self.assertEqual(tensor_bytes(self._outputs(task_file)[0]), tensor_bytes(initial))
        result = json.loads(self._outputs(task_file)[1].read_text())
        self.assertIsNone(result.get("train_loss"))

    def test_probe_wrong_layout(self):
        folder = Path(self.enterContext(_temp_dir()))
        task_file = self._task(folder)
        initial = Path(json.loads(task_file.read_text())["initial_weights"])
        tensors = safetensors.load(initial)
        name = next(iter(tensors))
        tensors[name] = np.zeros((tensors[name].shape[0] + 1,) + tensors[name].shape[1:], np.float32)
        wrong = folder / "wrong.safetensors"
        safetensors.save(wrong, tensors)
        write_task(task_file, **{**json.loads(task_file.read_text()), "initial_weights": str(wrong)})
        run = run_trainer(self.COMMAND, "run", str(task_file))
        error = self.assert_failed_with_error(run, "invalid_argument")
        self.assertIn(name, error["message"])
        self.assert_nothing_written(task_file)

    def test_probe_nan_loss(self):
        folder = Path(self.enterContext(_temp_dir()))
        task_file = self._task(folder)
        initial = Path(json.loads(task_file.read_text())["initial_weights"])
        tensors = safetensors.load(initial)
        for array in tensors.values():
            array[...] = np.nan
        poisoned = folder / "nan.safetensors"
        safetensors.save(poisoned, tensors)
        write_task(task_file, **{**json.loads(task_file.read_text()), "initial_weights": str(poisoned)})
        run = run_trainer(self.COMMAND, "run", str(task_file))
        self.assert_failed_with_error(run, "non_finite_loss")
        self.assert_nothing_written(task_file)

    def test_probe_sigterm(self):
        folder = Path(self.enterContext(_temp_dir()))
        task_file = self._task(folder, steps=10_000_000)
        run, exited_s = run_and_sigterm(self.COMMAND, task_file)
        self.assertEqual(run.returncode, 3, run.stderr[-3000:])
        self.assertLess(exited_s, 10)
        self.assertEqual(run.events_named("done"), [])
        self.assert_nothing_written(task_file)

    def test_probe_unknown_version(self):
        folder = Path(self.enterContext(_temp_dir()))
        task_file = self._task(folder, contract_version=999)
        run = run_trainer(self.COMMAND, "run", str(task_file))
        self.assert_failed_with_error(run, "unsupported_contract_version")
        self.assert_nothing_written(task_file)


def _temp_dir():
    import tempfile

    return tempfile.TemporaryDirectory(prefix="parsyn-test-")
