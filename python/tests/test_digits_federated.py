"""Federated training of examples/trainers/digits_cnn.py on non-IID digits: 5 workers, each holding a Dirichlet(0.5)
label-skewed shard of 80% of scikit-learn's digits, FedAvg by each task's num_samples; the global must classify the
other 20% (held out, never trained on) with >= 95% accuracy.

Every worker task goes through the example's real task-file path in this process (parsyn.trainer.run_task with a
task file, the example's `train`), and the final measurement is an evaluate task of the same script."""

import importlib.util
import json
import tempfile
import time
import unittest
from pathlib import Path

import numpy as np

from parsyn import safetensors, trainer
from tests import support

WORKERS = 5
ALPHA = 0.5
ROUNDS = 12
STEPS_PER_ROUND = 40
CONFIG = {"batch_size": 32, "learning_rate": 0.003, "max_grad_norm": 1.0, "lr_scheduler": "constant",
          "validation_fraction": 0.1}
TEST_FRACTION = 0.2
TARGET_ACCURACY = 0.95


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, support.EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dirichlet_shards(labels: np.ndarray, workers: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Per class, proportions ~ Dir(alpha) over the workers cut the class's rows (in random order) into runs of
    floor(n_c p_k) rows, the rest by largest remainder (docs/training.md, "Data partition"); a draw that leaves a
    worker empty is drawn again."""
    for _ in range(100):
        shards = [[] for _ in range(workers)]
        for c in np.unique(labels):
            rows = rng.permutation(np.flatnonzero(labels == c))
            share = rng.dirichlet([alpha] * workers) * len(rows)
            counts = np.floor(share).astype(int)
            for k in np.argsort(-(share - counts), kind="stable")[:len(rows) - counts.sum()]:
                counts[k] += 1
            for k, piece in enumerate(np.split(rows, np.cumsum(counts)[:-1])):
                shards[k].extend(piece.tolist())
        if all(shards):
            return [np.sort(np.asarray(s)) for s in shards]
    raise AssertionError("100 Dirichlet draws each left a worker without rows")


def fed_avg(updates: list[tuple[dict[str, np.ndarray], int]]) -> dict[str, np.ndarray]:
    """sum(n_i w_i) / sum(n_i), summed in float64 and rounded once to float32."""
    total = sum(n for _, n in updates)
    return {name: (sum(w[name].astype(np.float64) * n for w, n in updates) / total).astype(np.float32)
            for name in updates[0][0]}


class DigitsFederatedTest(unittest.TestCase):
    def test_five_dirichlet_workers_reach_95_percent_test_accuracy(self):
        from sklearn.datasets import load_digits

        started = time.monotonic()
        example = load_example("digits_cnn")
        folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-digits-")))
        labels = load_digits().target
        rng = np.random.default_rng(2024)
        order = rng.permutation(len(labels))
        num_test = round(len(labels) * TEST_FRACTION)
        test_rows, pool = np.sort(order[:num_test]), order[num_test:]
        test_csv = support.write_digits_csv(folder / "test.csv", test_rows)
        shards = dirichlet_shards(labels[pool], WORKERS, ALPHA, rng)
        self.assertEqual(sorted(np.concatenate(shards).tolist()), list(range(len(pool))))
        largest_class_share = max(np.bincount(labels[pool][s], minlength=10).max() / len(s) for s in shards)
        self.assertGreater(largest_class_share, 0.3, "a Dirichlet(0.5) split should be label-skewed")
        shard_files = [support.write_digits_csv(folder / f"shard{k}.csv", pool[s]) for k, s in enumerate(shards)]

        global_weights = example.init_model(folder / "model", seed=0) / "model.safetensors"
        for round_number in range(1, ROUNDS + 1):
            updates = []
            for k, shard_csv in enumerate(shard_files):
                work = folder / f"round{round_number}" / f"worker{k}"
                work.mkdir(parents=True)
                task_file = support.write_task(
                    work / "task.json", model_kind="custom", model_dir=str(folder / "model"),
                    initial_weights=str(global_weights), data=str(shard_csv), config=CONFIG, steps=STEPS_PER_ROUND,
                    seed=1000 * round_number + k, split_seed=k)
                result = trainer.run_task(task_file, example.train, describe=example.DESCRIBE)
                updates.append((safetensors.load(work / "out" / "update.safetensors"), result["num_samples"]))
            global_weights = folder / f"global{round_number}.safetensors"
            safetensors.save(global_weights, fed_avg(updates))

        evaluation = support.write_task(
            folder / "evaluate.json", kind="evaluate", model_kind="custom", model_dir=str(folder / "model"),
            initial_weights=str(global_weights), data=str(test_csv), validation_data=str(test_csv),
            output={"result": "evaluate-result.json"})
        result = trainer.run_task(evaluation, example.train, describe=example.DESCRIBE)
        accuracy = result["validation_before"]["accuracy"]
        print(f"\ndigits federated: {WORKERS} workers, Dirichlet({ALPHA}), {ROUNDS} rounds x {STEPS_PER_ROUND} steps: "
              f"test accuracy {accuracy:.4f} on {result['num_validation']} rows, {time.monotonic() - started:.1f} s")
        self.assertEqual(result["num_validation"], num_test)
        self.assertGreaterEqual(accuracy, TARGET_ACCURACY)
        self.assertEqual(json.loads((folder / "evaluate-result.json").read_text()), result)


if __name__ == "__main__":
    unittest.main()
