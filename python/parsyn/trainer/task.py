"""The task file of the trainer contract (docs/trainer-contract.md, version 1) and the step plan that goes with it.

Task.load() reads a task file: paths are resolved against the task file's folder, `config` gets every key of the
job's config with its default filled in where the file leaves one out (docs/training.md, "Config keys"), keys this
version does not know are ignored (the contract allows Parsyn to add optional ones). A contract_version other than 1
raises UnsupportedContractVersion; any other problem raises TaskError("invalid_argument", ...) listing every problem
with its key.

optimizer_steps() is the built-in trainer's loop order (src/trainer/train_loop.cc): `steps` optimizer steps (or
`config.epochs` passes), each of up to `gradient_accumulation_steps` micro-batches of `batch_size` rows, never spanning
two epochs, each epoch in a SplitMix64 permutation seeded from (task seed, epoch), with the learning rate of the
job's schedule (warmup, then constant, linear or cosine to 0, continued across rounds by the task's `schedule`).

Plain values and pure functions: safe from any thread.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .errors import TaskError, UnsupportedContractVersion

CONTRACT_VERSION = 1
TASK_KINDS = ("train", "evaluate")
MODEL_KINDS = ("llama", "qwen2", "mistral", "tabular-mlp", "tabular-logreg", "custom")

# The job's config keys and their defaults (docs/training.md, "Config keys"; src/protocol/training_config.h).
DEFAULT_CONFIG: dict[str, Any] = {
    "epochs": 1,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "learning_rate": 2e-4,
    "weight_decay": 0.0,
    "warmup_steps": 0,
    "lr_scheduler": "linear",
    "max_grad_norm": 1.0,
    "mixed_precision": "no",
    "seed": 42,
    "validation_fraction": 0.1,
    "max_seq_len": 512,
    "use_peft": True,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "lora_target_modules": ["q_proj", "v_proj"],
    "label_column": "",
    "hidden_sizes": [],
}

_MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class Schedule:
    """This task's steps continue one learning-rate schedule: they are steps start_step.. of total_steps."""

    start_step: int
    total_steps: int | None


@dataclass(frozen=True)
class Output:
    weights: Path | None  # where a train task writes its update
    result: Path  # where every task writes its result
    model_dir: Path | None  # optional: a folder for a loadable model (parsyn train only)


@dataclass(frozen=True)
class Task:
    """One task file, checked. Every path is absolute (resolved against the task file's folder)."""

    path: Path
    contract_version: int
    kind: str  # "train" | "evaluate"
    model_kind: str | None
    model_dir: Path | None
    initial_weights: Path | None
    data: Path
    validation_data: Path | None
    data_format: str  # "csv" | "jsonl" (given, else by data's extension)
    config: dict[str, Any]  # the job's config, every key present (defaults filled in)
    validation_fraction: float  # the task's validation_fraction when given, else config's
    steps: int | None  # optimizer steps to take; None: config epochs passes over the data
    seed: int
    split_seed: int
    schedule: Schedule | None
    proximal_mu: float
    device: str  # "cpu", "cuda" or "cuda:N"
    threads: int  # 0: the framework's default
    output: Output
    raw: dict[str, Any] = field(repr=False, compare=False)  # the file's JSON object, as read

    @classmethod
    def load(cls, path: os.PathLike | str) -> "Task":
        """Reads and checks a task file. Raises UnsupportedContractVersion for a contract_version other than 1 and
        TaskError (invalid_argument, or not_found for a missing task file) listing every other problem."""
        path = Path(path).absolute()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TaskError("not_found", f"task file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise TaskError("invalid_argument", f"cannot read task file {path}: {e}") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskError("invalid_argument", f"task file {path} is not JSON: {e}") from None
        return cls.from_json(raw, path)

    @classmethod
    def from_json(cls, raw: Any, path: Path) -> "Task":
        """A Task from a task file's parsed JSON; `path` is the file (relative paths are resolved against its
        folder). Errors as load()."""
        if not isinstance(raw, dict):
            raise TaskError("invalid_argument", f"task file {path} must hold a JSON object")
        _check_contract_version(raw.get("contract_version", None), path)
        reader = _Fields(raw, path.parent)
        kind = reader.choice("kind", TASK_KINDS, required=True)
        data = reader.path("data", required=True)
        data_format = reader.choice("data_format", ("csv", "jsonl"))
        output = reader.object("output", required=True)
        out = _Fields(output, path.parent, prefix="output.")
        weights = out.path("weights", required=kind == "train")
        result = out.path("result", required=True)
        config = dict(DEFAULT_CONFIG)
        config.update(reader.object("config") or {})
        validation_fraction = reader.number("validation_fraction", low=0.0, high=1.0, high_open=True)
        task_fraction = config.get("validation_fraction")
        if validation_fraction is None:
            if not _is_number(task_fraction) or not 0.0 <= task_fraction < 1.0:
                reader.problems.append(f"config.validation_fraction must be a number in [0, 1), got {task_fraction!r}")
                task_fraction = 0.0
            validation_fraction = float(task_fraction)
        schedule = reader.object("schedule")
        task = cls(
            path=path,
            contract_version=CONTRACT_VERSION,
            kind=kind or "train",
            model_kind=reader.string("model_kind"),
            model_dir=reader.path("model_dir"),
            initial_weights=reader.path("initial_weights"),
            data=data or path.parent,
            validation_data=reader.path("validation_data"),
            data_format=data_format or _format_from_name(data, reader.problems),
            config=config,
            validation_fraction=validation_fraction,
            steps=reader.integer("steps", low=0),
            seed=reader.integer("seed", low=0, high=_MAX_SEED) or 0,
            split_seed=reader.integer("split_seed", low=0, high=_MAX_SEED) or 0,
            schedule=_schedule(schedule, reader.problems) if schedule is not None else None,
            proximal_mu=reader.number("proximal_mu", low=0.0) or 0.0,
            device=reader.string("device") or "cpu",
            threads=reader.integer("threads", low=0) or 0,
            output=Output(weights=weights, result=result or path.parent, model_dir=out.path("model_dir")),
            raw=raw,
        )
        problems = reader.problems + out.problems
        if problems:
            raise TaskError("invalid_argument", f"task file {path}: " + "; ".join(problems))
        return task

    @property
    def label_column(self) -> str:
        """The CSV column holding the class: config.label_column, or "label" when it is empty."""
        return self.config.get("label_column") or "label"

    def should_stop(self) -> bool:
        """True once SIGTERM or SIGINT arrived (parsyn.trainer.main installs the handler). Leave the training loop and
        raise parsyn.trainer.Stopped (report_progress does this for you)."""
        from .state import stop_requested

        return stop_requested()

    def total_steps(self, num_examples: int) -> int:
        """The optimizer steps this task takes over `num_examples` training rows: `steps` when given, else
        config.epochs passes of ceil(ceil(rows / batch_size) / gradient_accumulation_steps) steps."""
        if self.steps is not None:
            return self.steps
        micro_batches = -(-num_examples // int(self.config["batch_size"]))
        per_epoch = -(-micro_batches // int(self.config["gradient_accumulation_steps"]))
        return int(self.config["epochs"]) * per_epoch

    def learning_rate(self, step: int, run_steps: int) -> float:
        """The learning rate of this run's step `step` (0-based) out of `run_steps`: config.learning_rate after
        config.warmup_steps of linear warmup, then config.lr_scheduler (constant, linear or cosine to 0) over the
        schedule's total_steps (the task's `schedule` continues one schedule across rounds)."""
        start = self.schedule.start_step if self.schedule else 0
        total = self.schedule.total_steps if self.schedule and self.schedule.total_steps else start + run_steps
        return learning_rate_at(self.config, start + step, total)


@dataclass(frozen=True)
class Step:
    """One optimizer step: its 0-based index, the run's step count, its micro-batches (row indices into the training
    rows, each at most batch_size long) and its learning rate."""

    index: int
    total: int
    epoch: int
    micro_batches: list[np.ndarray]
    learning_rate: float

    @property
    def num_examples(self) -> int:
        return sum(len(b) for b in self.micro_batches)

    @property
    def rows(self) -> np.ndarray:
        """All of the step's rows, its micro-batches joined (for a loop without gradient accumulation)."""
        return np.concatenate(self.micro_batches)


def optimizer_steps(task: Task, num_examples: int) -> Iterator[Step]:
    """The task's optimizer steps over `num_examples` training rows, in the built-in trainer's order (module
    docstring). Yields nothing when the plan has no steps or there are no rows."""
    total = task.total_steps(num_examples)
    if num_examples <= 0:
        return
    batch_size = int(task.config["batch_size"])
    accumulation = int(task.config["gradient_accumulation_steps"])
    epoch = 0
    order = shuffled_indices(num_examples, epoch_seed(task.seed, epoch))
    position = 0
    for index in range(total):
        if position >= num_examples:
            epoch += 1
            order = shuffled_indices(num_examples, epoch_seed(task.seed, epoch))
            position = 0
        batches = []
        while len(batches) < accumulation and position < num_examples:
            batches.append(order[position:position + batch_size])
            position += len(batches[-1])
        yield Step(index, total, epoch, batches, task.learning_rate(index, total))


def learning_rate_at(config: dict[str, Any], step: int, total_steps: int) -> float:
    """The schedule of docs/training.md at absolute step `step` (0-based) of `total_steps`."""
    peak = float(config["learning_rate"])
    warmup = int(config.get("warmup_steps", 0))
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_steps = total_steps - warmup
    scheduler = config.get("lr_scheduler", "linear")
    if scheduler == "constant" or decay_steps <= 0:
        return peak
    progress = min(max((step - warmup) / decay_steps, 0.0), 1.0)
    if scheduler == "linear":
        return peak * (1.0 - progress)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class SplitMix64:
    """The generator behind every seeded order in Parsyn (src/data/dataset.h), bit for bit."""

    def __init__(self, seed: int):
        self.state = seed & _MASK64

    def next(self) -> int:
        self.state = (self.state + _GOLDEN) & _MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def below(self, bound: int) -> int:
        """Uniform in [0, bound) by rejection (no modulo bias)."""
        threshold = ((1 << 64) - bound) % bound
        while True:
            r = self.next()
            if r >= threshold:
                return r % bound


def shuffled_indices(n: int, seed: int) -> np.ndarray:
    """A permutation of 0..n-1: Fisher-Yates driven by SplitMix64(seed), as Parsyn's ShuffledIndices."""
    order = list(range(max(n, 0)))
    rng = SplitMix64(seed)
    for i in range(len(order), 1, -1):
        j = rng.below(i)
        order[i - 1], order[j] = order[j], order[i - 1]
    return np.asarray(order, dtype=np.int64)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch `epoch`'s order (src/trainer/train_loop.cc EpochSeed)."""
    return SplitMix64((seed + _GOLDEN * (epoch + 1)) & _MASK64).next()


def _check_contract_version(version: Any, path: Path) -> None:
    if isinstance(version, int) and not isinstance(version, bool) and version == CONTRACT_VERSION:
        return
    said = "has no contract_version" if version is None else f"has contract_version {json.dumps(version)}"
    raise UnsupportedContractVersion(
        f"task file {path} {said}; this trainer reads contract version {CONTRACT_VERSION} "
        "(upgrade the trainer's parsyn package, or run it from a worker that writes version 1)")


def _format_from_name(data: Path | None, problems: list[str]) -> str:
    suffix = data.suffix.lower() if data else ""
    if suffix in (".csv", ".jsonl"):
        return suffix[1:]
    if data is not None:
        problems.append(f"data_format is absent and data {data.name!r} ends in neither .csv nor .jsonl: give "
                        "data_format \"csv\" or \"jsonl\"")
    return "csv"


def _schedule(value: dict[str, Any], problems: list[str]) -> Schedule:
    fields = _Fields(value, Path("."), prefix="schedule.")
    start = fields.integer("start_step", low=0) or 0
    total = fields.integer("total_steps", low=1)
    problems.extend(fields.problems)
    return Schedule(start, total)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Fields:
    """Typed reads of a JSON object's keys, collecting every problem (with the key's path) instead of stopping."""

    def __init__(self, obj: dict[str, Any], base: Path, prefix: str = ""):
        self.obj = obj
        self.base = base
        self.prefix = prefix
        self.problems: list[str] = []

    def _get(self, key: str, required: bool) -> Any:
        value = self.obj.get(key)
        if value is None and required:
            self.problems.append(f"{self.prefix}{key} is required")
        return value

    def string(self, key: str, required: bool = False) -> str | None:
        value = self._get(key, required)
        if value is not None and not isinstance(value, str):
            self.problems.append(f"{self.prefix}{key} must be a string, got {json.dumps(value)}")
            return None
        return value

    def path(self, key: str, required: bool = False) -> Path | None:
        value = self.string(key, required)
        if value == "":
            self.problems.append(f"{self.prefix}{key} is empty")
            return None
        return (self.base / value).absolute() if value is not None else None

    def choice(self, key: str, choices: tuple[str, ...], required: bool = False) -> str | None:
        value = self.string(key, required)
        if value is not None and value not in choices:
            self.problems.append(f"{self.prefix}{key} must be one of {', '.join(choices)}, got {value!r}")
            return None
        return value

    def integer(self, key: str, low: int | None = None, high: int | None = None) -> int | None:
        value = self._get(key, False)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            self.problems.append(f"{self.prefix}{key} must be an integer, got {json.dumps(value)}")
            return None
        if (low is not None and value < low) or (high is not None and value > high):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            self.problems.append(f"{self.prefix}{key} ({value}) must be {bound}")
            return None
        return value

    def number(self, key: str, low: float | None = None, high: float | None = None,
               high_open: bool = False) -> float | None:
        value = self._get(key, False)
        if value is None:
            return None
        if not _is_number(value):
            self.problems.append(f"{self.prefix}{key} must be a finite number, got {json.dumps(value)}")
            return None
        too_high = high is not None and (value >= high if high_open else value > high)
        if (low is not None and value < low) or too_high:
            bound = f"in [{low}, {high}{')' if high_open else ']'}" if high is not None else f">= {low}"
            self.problems.append(f"{self.prefix}{key} ({value}) must be {bound}")
            return None
        return float(value)

    def object(self, key: str, required: bool = False) -> dict[str, Any] | None:
        value = self._get(key, required)
        if value is not None and not isinstance(value, dict):
            self.problems.append(f"{self.prefix}{key} must be an object, got {json.dumps(value)}")
            return None
        return value
