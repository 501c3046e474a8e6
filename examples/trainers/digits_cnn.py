#!/usr/bin/env python3
"""A small convolutional network on scikit-learn's digits (8x8 images, 10 classes), as a CUSTOM model of the trainer
contract (docs/trainer-contract.md): Parsyn stores and averages its weights without knowing the network; this
script is the only code that reads them.

Data: CSV rows of 64 pixel columns p0..p63 (0..16) and `label` (0..9): `python3 bench/digits_csv.py digits.csv`.
Model folder (`init` writes it): model.safetensors (F32: conv1, conv2, fc1, fc2 weights and biases) and
parsyn_model.json {"kind": "custom", "trainer": "digits-cnn", "files": ["model.safetensors", "parsyn_model.json"]}.
Network: pixels / 16 -> Conv 3x3 (16) -> ReLU -> Conv 3x3 (32) -> ReLU -> MaxPool 2 -> Linear 512->64 -> ReLU
-> Linear 64->10; cross-entropy, AdamW with the task's config (learning_rate, weight_decay, batch_size,
max_grad_norm, warmup/lr_scheduler), `steps` optimizer steps or config epochs passes, FedProx's proximal_mu.

Run it:
  python3 examples/trainers/digits_cnn.py init ./digits-cnn [--seed N]
  python3 examples/trainers/digits_cnn.py --describe
  python3 examples/trainers/digits_cnn.py run TASK_FILE
  parsyn trainer check --trainer "python3 examples/trainers/digits_cnn.py" --model ./digits-cnn --data digits.csv
Map it on a worker (a job selects it with config.trainer "digits-cnn"):
  parsyn worker --trainer digits-cnn="python3 examples/trainers/digits_cnn.py" ...
Settings that work (python/tests/test_digits_federated.py: 5 workers, a Dirichlet(0.5) label split of 80% of the
rows, FedAvg by num_samples, the other 20% (359 rows) as the test set): 12 rounds of 40 steps, batch_size 32,
learning_rate 0.003, lr_scheduler constant, max_grad_norm 1, validation_fraction 0.1: 97.5% test accuracy
(98.0-98.9% with three other split seeds), about 20 s on 2 CPU cores.
Needs python3 with NumPy and PyTorch, and the parsyn package (`pip install ./python`; run from a Parsyn checkout it
finds ../../python by itself).
"""

import argparse
import json
import sys
import time
from pathlib import Path

try:
    from parsyn import safetensors, trainer
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    from parsyn import safetensors, trainer

import torch
import torch.nn.functional as F
from torch import nn

DESCRIBE = {"task_kinds": ["train", "evaluate"], "model_kinds": ["custom"], "name": "digits-cnn", "version": "0.1"}
MODEL_FILE = "parsyn_model.json"
WEIGHTS_FILE = "model.safetensors"
PIXELS = [f"p{i}" for i in range(64)]
CLASSES = [str(d) for d in range(10)]
EVAL_BATCH = 1024


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, len(CLASSES))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # pixels: (B, 64), 0..16 -> logits (B, 10)
        x = pixels.view(-1, 1, 8, 8) / 16.0
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (B, 32, 4, 4)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def expected_layout() -> dict:
    return {n: ("F32", tuple(t.shape)) for n, t in DigitsCNN().state_dict().items()}


def init_model(out_dir: Path, seed: int = 0) -> Path:
    """Writes a new model folder with torch's default initialisation drawn from `seed`."""
    torch.manual_seed(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    safetensors.save_torch(out_dir / WEIGHTS_FILE, DigitsCNN().state_dict(), metadata={"seed": str(seed)})
    manifest = {"kind": "custom", "trainer": DESCRIBE["name"], "files": [WEIGHTS_FILE, MODEL_FILE]}
    safetensors.atomic_write(out_dir / MODEL_FILE, [(json.dumps(manifest, indent=2) + "\n").encode()])
    return out_dir


def check_model_dir(model_dir: Path | None) -> None:
    """TaskError unless model_dir is a digits-cnn folder."""
    if model_dir is None:
        trainer.fail("invalid_argument", f"the task has no model_dir: digits-cnn needs its folder ({MODEL_FILE})")
    try:
        manifest = json.loads((model_dir / MODEL_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        trainer.fail("not_found", f"{model_dir / MODEL_FILE} does not exist: make the folder with "
                                  f"`{Path(__file__).name} init DIR`")
    except (OSError, ValueError) as e:
        trainer.fail("invalid_argument", f"{model_dir / MODEL_FILE}: {e}")
    if not isinstance(manifest, dict) or manifest.get("kind") != "custom" or manifest.get("trainer") != "digits-cnn":
        trainer.fail("invalid_argument", f"{model_dir / MODEL_FILE} is not a digits-cnn model folder "
                                         '(expected "kind": "custom", "trainer": "digits-cnn")')


def to_tensors(rows: trainer.Table, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    rows.check_features(PIXELS)
    return torch.from_numpy(rows.features).to(device), torch.from_numpy(rows.class_ids(CLASSES)).to(device)


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
    """Runs one train or evaluate task (the function trainer.main calls)."""
    started = time.monotonic()
    device = trainer.torch_device(task)
    torch.manual_seed(task.seed)
    check_model_dir(task.model_dir)
    initial = trainer.load_initial_weights_torch(task)
    trainer.check_layout(expected_layout(),
                         {n: (safetensors.torch_dtype_name(t.dtype), tuple(t.shape)) for n, t in initial.items()},
                         what="initial_weights", reference="the digits-cnn network")
    model = DigitsCNN()
    model.load_state_dict(initial)
    model.to(device)

    train_rows, validation_rows = trainer.load_data(task)
    x_train, y_train = to_tensors(train_rows, device)
    x_val, y_val = to_tensors(validation_rows, device)
    before = evaluate(model, x_val, y_val)
    train_loss, steps = (None, 0) if task.kind == "evaluate" else fit(task, model, x_train, y_train)
    after = evaluate(model, x_val, y_val) if steps else before
    if task.kind == "train":
        trainer.save_update(task, {n: t.detach().cpu() for n, t in model.state_dict().items()})
    return {"num_samples": len(y_train), "num_validation": len(y_val), "train_loss": train_loss,
            "validation_before": before, "validation_after": after,
            "metrics": {"steps": steps, "wall_s": time.monotonic() - started}}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "init":
        parser = argparse.ArgumentParser(prog=f"{Path(sys.argv[0]).name} init",
                                         description="write a new digits-cnn model folder")
        parser.add_argument("out_dir", type=Path)
        parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
        args = parser.parse_args(sys.argv[2:])
        print(f"wrote {init_model(args.out_dir, args.seed)}", file=sys.stderr)
        return
    trainer.main(describe=DESCRIBE, train=train)


if __name__ == "__main__":
    main()
