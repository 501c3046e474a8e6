"""The contract's conformance probes (docs/trainer-contract.md) against the example trainers, each driven through
its real command line: pytorch_tabular.py on a random tabular MLP folder, digits_cnn.py on a folder from its own
`init` and scikit-learn's digits."""

import subprocess
import sys
import unittest
from pathlib import Path

from tests import support


class PytorchTabularProbes(support.ConformanceProbes, unittest.TestCase):
    COMMAND = [sys.executable, str(support.EXAMPLES / "pytorch_tabular.py")]
    MODEL_KINDS = ["tabular-mlp", "tabular-logreg"]

    def make_inputs(self, folder: Path):
        data = support.write_tabular_csv(folder / "rows.csv")
        return support.write_tabular_model(folder / "model", data), "tabular-mlp", data


class PytorchTabularLogregProbes(PytorchTabularProbes):
    """The logreg form (one Linear), through the train and zero_steps probes."""

    def make_inputs(self, folder: Path):
        data = support.write_tabular_csv(folder / "rows.csv", features=3, classes=2, seed=5)
        return support.write_tabular_model(folder / "model", data, hidden_sizes=[]), "tabular-logreg", data

    test_probe_describe = test_probe_evaluate = test_probe_wrong_layout = None
    test_probe_nan_loss = test_probe_sigterm = test_probe_unknown_version = None


class DigitsCnnProbes(support.ConformanceProbes, unittest.TestCase):
    COMMAND = [sys.executable, str(support.EXAMPLES / "digits_cnn.py")]
    MODEL_KINDS = ["custom"]
    CONFIG = {"batch_size": 32, "learning_rate": 0.003, "max_grad_norm": 1.0}

    def make_inputs(self, folder: Path):
        model = folder / "model"
        subprocess.run(self.COMMAND + ["init", str(model), "--seed", "3"], check=True, capture_output=True,
                       env=support.env_with_package(), timeout=60)
        rows = support.write_digits_csv(folder / "digits.csv", rows=list(range(300)))
        return model, "custom", rows


if __name__ == "__main__":
    unittest.main()
