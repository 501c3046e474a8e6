"""parsyn.trainer's runner end to end: tests/fixtures/tiny_trainer.py run as a subprocess on real task files, checking
its command line, events, files and exit codes against docs/trainer-contract.md."""

import json
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

from parsyn import safetensors
from tests import support

TINY = [sys.executable, str(Path(__file__).parent / "fixtures" / "tiny_trainer.py")]


class RunnerTest(unittest.TestCase):
    def setUp(self):
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-runner-")))
        self.initial = self.folder / "global.safetensors"
        safetensors.save(self.initial, {"w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32),
                                        "b": np.array([0.5, -0.5], np.float32),
                                        "count": np.array([7], np.int64)})
        (self.folder / "rows.csv").write_text("x,label\n1,a\n2,b\n")

    def task(self, mode: str = "normal", **fields) -> Path:
        base = {"model_kind": "custom", "initial_weights": "global.safetensors", "data": "rows.csv",
                "config": {"mode": mode, "learning_rate": 0.5}, "steps": 3}
        base.update(fields)
        return support.write_task(self.folder / "task.json", **base)

    def run_task(self, task_file: Path) -> support.TrainerRun:
        return support.run_trainer(TINY, "run", str(task_file), timeout_s=60)

    def assert_error(self, run: support.TrainerRun, code: str, exit_code: int = 1) -> str:
        self.assertEqual(run.returncode, exit_code, run.stderr)
        self.assertEqual([e["event"] for e in run.events][-1], "error")
        self.assertEqual(len(run.events_named("error")), 1)
        self.assertEqual(run.events_named("done"), [])
        error = run.events_named("error")[0]
        self.assertEqual(error["code"], code, error)
        return error["message"]

    def assert_nothing_written(self) -> None:
        out = self.folder / "out"
        self.assertEqual(sorted(p.name for p in out.iterdir()) if out.exists() else [], [])

    def test_describe_prints_the_object_with_contract_version_1(self):
        run = support.run_trainer(TINY, "--describe")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(json.loads(run.stdout), {"contract_versions": [1], **{
            "task_kinds": ["train", "evaluate"], "model_kinds": ["custom", "tabular-mlp"], "name": "tiny",
            "version": "0.0"}})

    def test_a_command_line_it_does_not_understand_exits_2_with_the_usage(self):
        for args in ([], ["run"], ["train", "task.json"], ["run", "a.json", "b.json"], ["--describe", "x"]):
            run = support.run_trainer(TINY, *args)
            self.assertEqual(run.returncode, 2, args)
            self.assertEqual(run.stdout, "")
            self.assertIn("run TASK_FILE", run.stderr)

    def test_train_task_prints_progress_then_done_and_writes_result_and_update(self):
        run = self.run_task(self.task())
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual([e["event"] for e in run.events][0], "progress")
        self.assertEqual(run.events[-1]["event"], "done")
        self.assertEqual(run.events_named("progress")[0],
                         {"event": "progress", "step": 1, "total_steps": 3, "loss": 0.5, "throughput": 100.0,
                          "throughput_unit": "samples/s"})
        self.assertEqual(run.events_named("progress")[-1]["step"], 3)
        result = json.loads((self.folder / "out" / "result.json").read_text())
        self.assertEqual(result, {k: v for k, v in run.events[-1].items() if k != "event"})
        self.assertEqual(result["num_samples"], 10)
        self.assertEqual(result["train_loss"], 0.25)  # a NumPy float32 in the script, plain JSON here
        update = self.folder / "out" / "update.safetensors"
        self.assertEqual(safetensors.layout(update), safetensors.layout(self.initial))
        weights = safetensors.load(update)
        np.testing.assert_array_equal(weights["w"], np.array([[-0.5, 0.5], [1.5, 2.5]], np.float32))
        np.testing.assert_array_equal(weights["count"], [7])
        self.assertEqual(sorted(p.name for p in (self.folder / "out").iterdir()), ["result.json", "update.safetensors"])

    def test_print_in_the_script_goes_to_stderr_not_into_the_events(self):
        run = self.run_task(self.task("print"))
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertNotIn("hello", run.stdout)
        self.assertIn("hello from print()", run.stderr)
        self.assertIn("raw bytes on fd 1", run.stderr)
        self.assertEqual(run.events[-1]["event"], "done")

    def test_unknown_contract_version_is_refused_and_nothing_is_written(self):
        for version in (999, 0, "1", None):
            fields = {"contract_version": version} if version is not None else {}
            task_file = self.task(**fields)
            if version is None:
                raw = json.loads(task_file.read_text())
                del raw["contract_version"]
                task_file.write_text(json.dumps(raw))
            message = self.assert_error(self.run_task(task_file), "unsupported_contract_version")
            self.assertIn("contract version 1", message)
            self.assert_nothing_written()

    def test_nan_loss_is_an_error_and_removes_the_update_already_written(self):
        message = self.assert_error(self.run_task(self.task("nan")), "non_finite_loss")
        self.assertIn("step 2", message)
        self.assert_nothing_written()

    def test_sigterm_mid_run_exits_3_within_10_s_and_leaves_nothing(self):
        run, exited_s = support.run_and_sigterm(TINY, self.task("slow", steps=100_000))
        self.assertEqual(run.returncode, 3, run.stderr)
        self.assertLess(exited_s, 10)
        self.assertEqual(run.events_named("done") + run.events_named("error"), [])
        self.assert_nothing_written()

    def test_sigterm_to_a_script_that_never_checks_ends_it_within_10_s(self):
        run, exited_s = support.run_and_sigterm(TINY, self.task("deaf"))
        self.assertEqual(run.returncode, 3, run.stderr)
        self.assertLess(exited_s, 10)
        self.assertIn("did not stop within", run.stderr)
        self.assert_nothing_written()

    def test_an_exception_in_the_script_is_an_internal_error_naming_it(self):
        message = self.assert_error(self.run_task(self.task("raise")), "internal")
        self.assertEqual(message, "ValueError: the data is odd")
        self.assertIn("Traceback", self.run_task(self.task("raise")).stderr)
        self.assert_nothing_written()

    def test_memory_error_exits_4_with_out_of_memory(self):
        self.assert_error(self.run_task(self.task("memory")), "out_of_memory", exit_code=4)

    def test_fail_ends_with_its_code_and_message(self):
        message = self.assert_error(self.run_task(self.task("fail")), "invalid_argument")
        self.assertEqual(message, "column x is missing: add it")

    def test_a_train_task_without_an_update_fails_and_writes_no_result(self):
        message = self.assert_error(self.run_task(self.task("no_update")), "internal")
        self.assertIn("save_update", message)
        self.assert_nothing_written()

    def test_an_update_of_another_layout_is_refused_naming_the_tensor(self):
        message = self.assert_error(self.run_task(self.task("bad_update")), "invalid_argument")
        self.assertIn("'w'", message)
        self.assert_nothing_written()

    def test_a_result_without_num_samples_is_refused(self):
        message = self.assert_error(self.run_task(self.task("bad_result")), "internal")
        self.assertIn("num_samples", message)
        self.assert_nothing_written()

    def test_evaluate_task_writes_only_the_result(self):
        run = self.run_task(self.task(kind="evaluate", steps=0, output={"result": "out/result.json"}))
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(sorted(p.name for p in (self.folder / "out").iterdir()), ["result.json"])
        self.assertIsNone(json.loads((self.folder / "out" / "result.json").read_text())["train_loss"])

    def test_a_model_kind_the_trainer_does_not_list_is_refused(self):
        message = self.assert_error(self.run_task(self.task(model_kind="llama")), "invalid_argument")
        self.assertIn("llama", message)

    def test_a_missing_task_file_is_not_found(self):
        run = support.run_trainer(TINY, "run", str(self.folder / "absent.json"))
        self.assertIn("absent.json", self.assert_error(run, "not_found"))

    def test_a_malformed_task_file_lists_every_problem(self):
        task_file = self.task(kind="fit", steps=-1, output={})
        message = self.assert_error(self.run_task(task_file), "invalid_argument")
        for expected in ("kind must be one of train, evaluate", "steps (-1) must be >= 0", "output.result is required"):
            self.assertIn(expected, message)


if __name__ == "__main__":
    unittest.main()
