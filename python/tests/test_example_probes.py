"""The contract's conformance probes (docs/trainer-contract.md, "Conformance") against the example trainers through
Parsyn's own checker, `parsyn trainer check`: pytorch_tabular.py on the checker's tabular MLP, digits_cnn.py on a
folder from its own `init` and scikit-learn's digits. Every probe must PASS."""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from tests import support

PARSYN_BIN = Path(os.environ.get("PARSYN_BIN") or support.REPO / "build" / "src" / "cli" / "parsyn")
BUILTIN_TRAINER = PARSYN_BIN.parent / "parsyn-trainer"


@unittest.skipIf(not PARSYN_BIN.exists() and os.environ.get("PARSYN_ALLOW_MISSING_SERVER") == "1",
                 f"{PARSYN_BIN} is not built and PARSYN_ALLOW_MISSING_SERVER=1")
class ParsynTrainerCheck(unittest.TestCase):
    """The examples through Parsyn's own conformance command, `parsyn trainer check`: every probe must PASS."""

    def setUp(self):
        if not PARSYN_BIN.exists():
            self.fail(f"{PARSYN_BIN} does not exist: build it with ./dev build, or set PARSYN_BIN")

    def check(self, *args: str) -> None:
        run = subprocess.run([str(PARSYN_BIN), "trainer", "check", *args], capture_output=True, text=True,
                             timeout=300, env=support.env_with_package())
        verdicts = [line for line in run.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr[-2000:])
        self.assertEqual(len(verdicts), 8, run.stdout)
        self.assertTrue(all(v.startswith("PASS") for v in verdicts), run.stdout)

    def test_pytorch_tabular(self):
        self.check("--trainer", f"{sys.executable} {support.EXAMPLES / 'pytorch_tabular.py'}")

    def test_digits_cnn(self):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-check-")))
        subprocess.run([sys.executable, str(support.EXAMPLES / "digits_cnn.py"), "init", str(folder / "model")],
                       check=True, capture_output=True, env=support.env_with_package(), timeout=60)
        data = support.write_digits_csv(folder / "digits.csv", rows=list(range(600)))
        self.check("--trainer", f"{sys.executable} {support.EXAMPLES / 'digits_cnn.py'}", "--model",
                   str(folder / "model"), "--data", str(data))


@unittest.skipIf(not BUILTIN_TRAINER.exists() and os.environ.get("PARSYN_ALLOW_MISSING_SERVER") == "1",
                 f"{BUILTIN_TRAINER} is not built and PARSYN_ALLOW_MISSING_SERVER=1")
class PytorchTabularMatchesTheBuiltinTrainer(unittest.TestCase):
    """pytorch_tabular.py and parsyn-trainer on one task file: the same hold-out, the same step order and the same
    arithmetic, so the same losses (within float32 rounding: 1e-5 relative)."""

    def test_same_losses_and_metrics(self):
        self.assertTrue(BUILTIN_TRAINER.exists(), f"{BUILTIN_TRAINER} does not exist: build it with ./dev build")
        folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-parity-")))
        data = support.write_tabular_csv(folder / "points.csv", rows=300, seed=3)
        support.write_tabular_model(folder / "model", data, hidden_sizes=[8], seed=1)
        runs = {}
        for name, command in (("builtin", [str(BUILTIN_TRAINER)]),
                              ("python", [sys.executable, str(support.EXAMPLES / "pytorch_tabular.py")])):
            task = support.write_task(
                folder / f"{name}.json", model_kind="tabular-mlp", model_dir="model",
                initial_weights="model/model.safetensors", data="points.csv", steps=12, seed=5, split_seed=2,
                config={"batch_size": 16, "learning_rate": 0.01, "warmup_steps": 2, "lr_scheduler": "cosine",
                        "max_grad_norm": 0.5, "weight_decay": 0.01, "gradient_accumulation_steps": 3},
                output={"weights": f"{name}/u.safetensors", "result": f"{name}/r.json"})
            run = subprocess.run(command + ["run", str(task)], capture_output=True, text=True, timeout=120,
                                 env=support.env_with_package())
            self.assertEqual(run.returncode, 0, run.stderr[-2000:])
            runs[name] = json.loads((folder / name / "r.json").read_text())
        builtin, python = runs["builtin"], runs["python"]
        self.assertEqual(python["num_samples"], builtin["num_samples"])
        for key in ("validation_before", "validation_after"):
            self.assertAlmostEqual(python[key]["loss"], builtin[key]["loss"], delta=1e-5 * builtin[key]["loss"])
            self.assertEqual(python[key]["accuracy"], builtin[key]["accuracy"])
        builtin_train = builtin["train_loss"]
        self.assertAlmostEqual(python["train_loss"], builtin_train, delta=1e-5 * builtin_train)


if __name__ == "__main__":
    unittest.main()
