"""The complete trainer example of python/README.md, run as written through its command line (train and evaluate)
on scikit-learn's digits, so the README stays true."""

import json
import re
import sys
import tempfile
import unittest
from pathlib import Path

import torch

from parsyn import safetensors
from tests import support


class ReadmeExampleTest(unittest.TestCase):
    def test_the_readme_trainer_trains_and_evaluates(self):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-readme-")))
        readme = (support.PYTHON_DIR / "README.md").read_text()
        script = folder / "softmax.py"
        script.write_text(re.search(r"```python\n(#!/usr/bin/env python3\n.*?)```", readme, re.S).group(1))
        support.write_digits_csv(folder / "digits.csv", rows=list(range(400)))
        torch.manual_seed(0)
        safetensors.save_torch(folder / "w.safetensors", torch.nn.Linear(64, 10).state_dict())
        results = {}
        for kind in ("train", "evaluate"):
            task = support.write_task(folder / f"{kind}.json", kind=kind, model_kind="custom",
                                      initial_weights="w.safetensors", data="digits.csv", steps=30,
                                      config={"learning_rate": 0.01, "batch_size": 32},
                                      output={"weights": f"{kind}/u.safetensors", "result": f"{kind}/r.json"})
            run = support.run_trainer([sys.executable, str(script)], "run", str(task))
            self.assertEqual(run.returncode, 0, run.stderr)
            results[kind] = json.loads((folder / kind / "r.json").read_text())
        self.assertLess(results["train"]["validation_after"]["loss"], results["train"]["validation_before"]["loss"])
        self.assertEqual(results["evaluate"]["validation_after"], results["train"]["validation_before"])
        self.assertEqual(safetensors.layout(folder / "train" / "u.safetensors"),
                         safetensors.layout(folder / "w.safetensors"))


if __name__ == "__main__":
    unittest.main()
