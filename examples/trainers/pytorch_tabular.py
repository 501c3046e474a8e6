#!/usr/bin/env python3
"""Parsyn's built-in tabular classifier (src/trainer/tabular_model.h) re-implemented in PyTorch, as a trainer of the
trainer contract (docs/trainer-contract.md): same model folder, same tensor names, so its updates average with the
built-in trainer's.

Model folder (`parsyn model init --architecture mlp|logreg ...` writes one):
  tabular_model.json  {"format": "parsyn-tabular", "model_type": "mlp" | "logreg", "hidden_sizes": [16],
                       "label_column": "label", "feature_names": [...], "class_names": [...],
                       "standardizer": {"mean": [...], "std": [...]}}
  model.safetensors   F32 layers.{i}.weight (out, in) and layers.{i}.bias (out), i = 0 .. len(hidden_sizes):
                      Linear -> ReLU per hidden size, then Linear to the classes (logreg: one Linear)
Rows: features standardised with the stored mean/std (std 0 counts as 1), the label column's value (as written in
the CSV) mapped to its index in class_names, cross-entropy. AdamW (config learning_rate, weight_decay on weights but
not biases, the job's warmup/lr_scheduler), batch_size, gradient_accumulation_steps, max_grad_norm (0: no clipping),
`steps` optimizer steps (or config epochs passes) in the built-in trainer's seeded order, FedProx's proximal_mu.
Evaluation: loss and accuracy on the validation rows. On one task file it gives parsyn-trainer's losses and
metrics (python/tests/test_example_probes.py checks it to 1e-5): the same hold-out, step order and arithmetic.

Run it:
  python3 examples/trainers/pytorch_tabular.py --describe
  python3 examples/trainers/pytorch_tabular.py run TASK_FILE
  parsyn trainer check --trainer "python3 examples/trainers/pytorch_tabular.py"
Map it on a worker (a job selects it with config.trainer "pytorch-tabular"):
  parsyn worker --trainer pytorch-tabular="python3 examples/trainers/pytorch_tabular.py" ...
Needs python3 with NumPy and PyTorch, and the parsyn package (`pip install ./python`; run from a Parsyn checkout it
finds ../../python by itself). Uses task.device when torch sees CUDA, else the CPU (with a warning on stderr).
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

try:
    from parsyn import safetensors, trainer
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    from parsyn import safetensors, trainer

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DESCRIBE = {"task_kinds": ["train", "evaluate"], "model_kinds": ["tabular-mlp", "tabular-logreg"],
            "name": "pytorch-tabular", "version": "0.1"}
EVAL_BATCH = 4096


class TabularNet(nn.Module):
    """Linear -> ReLU per hidden size, then Linear to the classes; parameters named layers.{i}.weight/bias."""

    def __init__(self, sizes: list[int]):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, features) -> logits (B, classes)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


def read_spec(model_dir: Path) -> dict:
    """tabular_model.json, checked; TaskError naming the field that is wrong."""
    if model_dir is None:
        trainer.fail("invalid_argument", "the task has no model_dir: a tabular task needs the model folder "
                                         "(tabular_model.json)")
    path = model_dir / "tabular_model.json"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        trainer.fail("not_found", f"{path} does not exist: model_dir is not a tabular model folder")
    except (OSError, ValueError) as e:
        trainer.fail("invalid_argument", f"{path}: {e}")

    def bad(field: str, rule: str):
        trainer.fail("invalid_argument", f"{path}: {field} {rule}")

    if not isinstance(spec, dict) or spec.get("format") != "parsyn-tabular":
        bad("format", 'must be "parsyn-tabular"')
    if spec.get("model_type") not in ("mlp", "logreg"):
        bad("model_type", f'must be "mlp" or "logreg", got {spec.get("model_type")!r}')
    hidden = spec.get("hidden_sizes", [])
    if not isinstance(hidden, list) or not all(isinstance(h, int) and h >= 1 for h in hidden):
        bad("hidden_sizes", f"must be a list of integers >= 1, got {hidden!r}")
    if spec["model_type"] == "logreg" and hidden:
        bad("hidden_sizes", "must be empty for a logreg model")
    features, classes = spec.get("feature_names"), spec.get("class_names")
    if not isinstance(features, list) or not features or not all(isinstance(f, str) for f in features):
        bad("feature_names", "must be a non-empty list of strings")
    if not isinstance(classes, list) or len(classes) < 2 or not all(isinstance(c, str) for c in classes):
        bad("class_names", "must list at least 2 class names (strings)")
    standardizer = spec.get("standardizer") or {}
    for key in ("mean", "std"):
        values = standardizer.get(key)
        if not isinstance(values, list) or len(values) != len(features):
            bad(f"standardizer.{key}", f"must hold one number per feature ({len(features)})")
    spec.setdefault("label_column", "label")
    spec["hidden_sizes"] = hidden
    return spec


def layer_sizes(spec: dict) -> list[int]:
    return [len(spec["feature_names"]), *spec["hidden_sizes"], len(spec["class_names"])]


def expected_layout(spec: dict) -> dict:
    sizes = layer_sizes(spec)
    layout = {}
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        layout[f"layers.{i}.weight"] = ("F32", (n_out, n_in))
        layout[f"layers.{i}.bias"] = ("F32", (n_out,))
    return layout


def to_tensors(rows: trainer.Table, spec: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised features (N, F) and class ids (N,) on `device`."""
    rows.check_features(spec["feature_names"])
    mean = np.asarray(spec["standardizer"]["mean"], dtype=np.float32)
    std = np.asarray(spec["standardizer"]["std"], dtype=np.float32)
    std = np.where(std > 0, std, np.float32(1))
    x = (rows.features - mean) / std
    return torch.from_numpy(x).to(device), torch.from_numpy(rows.class_ids(spec["class_names"])).to(device)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict | None:
    """Mean cross-entropy and accuracy over the rows; None when there are none."""
    if len(y) == 0:
        return None
    model.eval()
    loss_sum, correct = 0.0, 0
    for begin in range(0, len(y), EVAL_BATCH):
        logits = model(x[begin:begin + EVAL_BATCH])
        labels = y[begin:begin + EVAL_BATCH]
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
    return {"loss": loss_sum / len(y), "accuracy": correct / len(y), "num_examples": len(y)}


def fit(task: trainer.Task, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float | None, int]:
    """Trains the task's optimizer steps; returns (mean training loss or None when no step ran, steps)."""
    config = task.config
    decay = [p for n, p in model.named_parameters() if not n.endswith(".bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": float(config["weight_decay"])},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=float(config["learning_rate"]))
    params = decay + no_decay
    anchors = [p.detach().clone() for p in params] if task.proximal_mu > 0 else None
    model.train()
    losses = []
    for step in trainer.optimizer_steps(task, len(y)):
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = step.learning_rate
        optimizer.zero_grad()
        loss_sum = 0.0
        for batch in step.micro_batches:
            rows = torch.from_numpy(batch).to(x.device)
            loss = F.cross_entropy(model(x[rows]), y[rows])
            # As the built-in trainer: the step's loss (and gradient) is the mean of its micro-batches' means.
            (loss / len(step.micro_batches)).backward()
            loss_sum += loss.item()
        if anchors is not None:  # FedProx: mu/2 * ||w - w_global||^2, not part of the reported loss
            (task.proximal_mu / 2 * sum(((p - a) ** 2).sum() for p, a in zip(params, anchors))).backward()
        if float(config["max_grad_norm"]) > 0:
            torch.nn.utils.clip_grad_norm_(params, float(config["max_grad_norm"]))
        optimizer.step()
        losses.append(loss_sum / len(step.micro_batches))
        trainer.report_progress(step.index + 1, step.total, loss=losses[-1],
                                throughput=step.num_examples / max(time.perf_counter() - started, 1e-9))
    return (sum(losses) / len(losses) if losses else None), len(losses)


def train(task: trainer.Task) -> dict:
    started = time.monotonic()
    device = trainer.torch_device(task)
    torch.manual_seed(task.seed)
    spec = read_spec(task.model_dir)
    initial = trainer.load_initial_weights_torch(task)
    trainer.check_layout(expected_layout(spec),
                         {n: (safetensors.torch_dtype_name(t.dtype), tuple(t.shape)) for n, t in initial.items()},
                         what="initial_weights", reference=f"{task.model_dir}/tabular_model.json")
    model = TabularNet(layer_sizes(spec))
    model.load_state_dict(initial)
    model.to(device)

    task = task if spec["label_column"] == task.label_column else _with_label_column(task, spec["label_column"])
    train_rows, validation_rows = trainer.load_data(task)
    x_train, y_train = to_tensors(train_rows, spec, device)
    x_val, y_val = to_tensors(validation_rows, spec, device)

    before = evaluate(model, x_val, y_val)
    train_loss, steps = (None, 0) if task.kind == "evaluate" else fit(task, model, x_train, y_train)
    after = evaluate(model, x_val, y_val) if steps else before
    if task.kind == "train":
        trainer.save_update(task, {n: t.detach().cpu() for n, t in model.state_dict().items()})
    return {"num_samples": len(y_train), "num_validation": len(y_val), "train_loss": train_loss,
            "validation_before": before, "validation_after": after,
            "metrics": {"steps": steps, "wall_s": time.monotonic() - started}}


def _with_label_column(task: trainer.Task, label_column: str) -> trainer.Task:
    """The task reading the model folder's label column: a tabular job trains on the folder's (docs/training.md)."""
    return dataclasses.replace(task, config={**task.config, "label_column": label_column})


if __name__ == "__main__":
    trainer.main(describe=DESCRIBE, train=train)
