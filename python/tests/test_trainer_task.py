"""parsyn.trainer in-process: the task file's parsing, the step plan and schedule, the seeded split (against values
pinned by Parsyn's own C++ tests), the data readers, results and updates."""

import json
import math
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch

from parsyn import safetensors, trainer
from tests import support


class TaskFileTest(unittest.TestCase):
    def setUp(self):
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-task-")))

    def load(self, **fields) -> trainer.Task:
        return trainer.Task.load(support.write_task(self.folder / "task.json", **fields))

    def test_every_field_is_read_with_paths_resolved_against_the_task_folder(self):
        task = self.load(model_kind="tabular-mlp", model_dir="model", initial_weights="/abs/global.safetensors",
                         data="shard.csv", validation_data="val.csv", config={"batch_size": 4, "extra": True},
                         validation_fraction=0.25, steps=20, seed=2**63 - 1, split_seed=5,
                         schedule={"start_step": 40, "total_steps": 100}, proximal_mu=0.01, device="cuda:1",
                         threads=2, unknown_key={"ignored": 1},
                         output={"weights": "out/u.safetensors", "result": "out/r.json", "model_dir": "m"})
        self.assertEqual(task.kind, "train")
        self.assertEqual(task.model_kind, "tabular-mlp")
        self.assertEqual(task.model_dir, self.folder / "model")
        self.assertEqual(task.initial_weights, Path("/abs/global.safetensors"))
        self.assertEqual(task.data, self.folder / "shard.csv")
        self.assertEqual(task.validation_data, self.folder / "val.csv")
        self.assertEqual(task.data_format, "csv")
        self.assertEqual(task.config["batch_size"], 4)
        self.assertEqual(task.config["learning_rate"], 2e-4)  # default filled in
        self.assertTrue(task.config["extra"])
        self.assertEqual(task.validation_fraction, 0.25)
        self.assertEqual((task.steps, task.seed, task.split_seed), (20, 2**63 - 1, 5))
        self.assertEqual(task.schedule, trainer.Schedule(40, 100))
        self.assertEqual((task.proximal_mu, task.device, task.threads), (0.01, "cuda:1", 2))
        self.assertEqual(task.output, trainer.Output(self.folder / "out/u.safetensors", self.folder / "out/r.json",
                                                     self.folder / "m"))
        self.assertEqual(task.label_column, "label")

    def test_defaults_of_a_minimal_task(self):
        task = self.load(data="rows.jsonl")
        self.assertEqual(task.data_format, "jsonl")
        self.assertIsNone(task.steps)
        self.assertEqual(task.validation_fraction, 0.1)
        self.assertEqual((task.proximal_mu, task.threads, task.schedule), (0.0, 0, None))
        self.assertEqual(self.load(data="x.csv", config={"label_column": "y"}).label_column, "y")
        self.assertEqual(self.load(data="x.csv", config={"validation_fraction": 0.3}).validation_fraction, 0.3)

    def test_contract_versions_other_than_1_are_unsupported(self):
        for version in (2, 999, "1", 1.5, True):
            with self.subTest(version=version), self.assertRaises(trainer.UnsupportedContractVersion) as caught:
                self.load(contract_version=version, data="x.csv")
            self.assertEqual(caught.exception.code, "unsupported_contract_version")

    def test_every_problem_is_listed_with_its_key(self):
        with self.assertRaises(trainer.TaskError) as caught:
            self.load(kind="predict", data=3, steps=1.5, seed=-1, proximal_mu=float("inf"), config=[],
                      schedule={"total_steps": 0}, validation_fraction=1.0, output={"weights": ""})
        message = caught.exception.message
        self.assertEqual(caught.exception.code, "invalid_argument")
        for expected in ("kind must be one of train, evaluate, got 'predict'", "data must be a string, got 3",
                         "steps must be an integer, got 1.5", "seed (-1) must be in [0, 9223372036854775807]",
                         "proximal_mu must be a finite number", "config must be an object",
                         "schedule.total_steps (0) must be >= 1", "validation_fraction (1.0) must be in [0.0, 1.0)",
                         "output.weights is empty", "output.result is required"):
            self.assertIn(expected, message)

    def test_data_without_a_known_extension_needs_data_format(self):
        with self.assertRaisesRegex(trainer.TaskError, "data_format"):
            self.load(data="rows.txt")
        self.assertEqual(self.load(data="rows.txt", data_format="jsonl").data_format, "jsonl")

    def test_missing_and_malformed_task_files(self):
        with self.assertRaises(trainer.TaskError) as caught:
            trainer.Task.load(self.folder / "absent.json")
        self.assertEqual(caught.exception.code, "not_found")
        (self.folder / "bad.json").write_text("{")
        with self.assertRaisesRegex(trainer.TaskError, "is not JSON"):
            trainer.Task.load(self.folder / "bad.json")


class StepPlanTest(unittest.TestCase):
    def task(self, **fields) -> trainer.Task:
        raw = {"contract_version": 1, "kind": "train", "data": "x.csv", "seed": 3, "output": {"weights": "u",
                                                                                               "result": "r"}}
        raw.update(fields)
        return trainer.Task.from_json(raw, Path("/tmp/task.json"))

    def test_steps_follow_epochs_batches_and_accumulation(self):
        task = self.task(config={"epochs": 2, "batch_size": 4, "gradient_accumulation_steps": 2})
        steps = list(trainer.optimizer_steps(task, 10))
        # 10 rows: 3 micro-batches (4, 4, 2) an epoch, 2 steps an epoch (the second of one micro-batch), 2 epochs.
        self.assertEqual(task.total_steps(10), 4)
        self.assertEqual([[len(b) for b in s.micro_batches] for s in steps], [[4, 4], [2], [4, 4], [2]])
        self.assertEqual([s.epoch for s in steps], [0, 0, 1, 1])
        for epoch in (0, 1):
            rows = np.concatenate([b for s in steps if s.epoch == epoch for b in s.micro_batches])
            self.assertEqual(sorted(rows.tolist()), list(range(10)))
            np.testing.assert_array_equal(rows, trainer.shuffled_indices(10, trainer.epoch_seed(3, epoch)))
        self.assertFalse(np.array_equal(steps[0].micro_batches[0], steps[2].micro_batches[0]))

    def test_a_step_budget_wins_and_cycles_over_the_data(self):
        task = self.task(steps=5, config={"epochs": 9, "batch_size": 3})
        steps = list(trainer.optimizer_steps(task, 4))
        self.assertEqual([s.num_examples for s in steps], [3, 1, 3, 1, 3])
        self.assertEqual([s.total for s in steps], [5] * 5)
        self.assertEqual(list(trainer.optimizer_steps(self.task(steps=0), 4)), [])

    def test_learning_rate_schedules(self):
        config = {"learning_rate": 1.0, "warmup_steps": 2, "lr_scheduler": "linear"}
        self.assertEqual([trainer.learning_rate_at(config, s, 6) for s in range(6)], [0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
        cosine = {**config, "lr_scheduler": "cosine"}
        self.assertAlmostEqual(trainer.learning_rate_at(cosine, 4, 6), 0.5)
        self.assertEqual(trainer.learning_rate_at({**config, "lr_scheduler": "constant"}, 5, 6), 1.0)
        # A round's task continues the job's schedule: its step 0 is the schedule's step 40 of 100.
        task = self.task(schedule={"start_step": 40, "total_steps": 100},
                         config={"learning_rate": 1.0, "lr_scheduler": "linear"})
        self.assertAlmostEqual(task.learning_rate(0, 20), 0.6)
        self.assertAlmostEqual(self.task(config={"learning_rate": 1.0}).learning_rate(5, 10), 0.5)


class SplitTest(unittest.TestCase):
    def test_splitmix64_and_shuffle_match_parsyn(self):
        # The values src/data/dataset_test.cc pins for Parsyn's C++ generator.
        rng = trainer.SplitMix64(1234567)
        self.assertEqual([rng.next() for _ in range(3)],
                         [6457827717110365317, 3203168211198807973, 9817491932198370423])
        self.assertEqual(trainer.shuffled_indices(6, 42).tolist(), [4, 3, 0, 2, 5, 1])

    def test_validation_slice_sizes_match_parsyn(self):
        # src/data/dataset_test.cc ValidationSliceSizes.
        for n, fraction, expected in ((0, 0.1, 0), (1, 0.5, 0), (2, 0.01, 1), (10, 0.1, 1), (10, 0.25, 3),
                                      (10, 0.0, 0), (3, 0.99, 2), (1000, 0.1, 100)):
            train, validation = trainer.split_indices(n, fraction, 1)
            self.assertEqual(len(validation), expected, (n, fraction))
            self.assertEqual(sorted(np.concatenate([train, validation]).tolist()), list(range(n)))
            self.assertEqual(validation.tolist(), sorted(validation.tolist()))
        a, b = trainer.split_indices(50, 0.2, 99), trainer.split_indices(50, 0.2, 99)
        np.testing.assert_array_equal(a[1], b[1])
        self.assertFalse(np.array_equal(a[1], trainer.split_indices(50, 0.2, 100)[1]))


class DataTest(unittest.TestCase):
    def setUp(self):
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-data-")))

    def write(self, name: str, text: str) -> Path:
        path = self.folder / name
        path.write_text(text)
        return path

    def test_csv_features_labels_quotes_spaces_and_blank_lines(self):
        path = self.write("t.csv", ' a ,"b",label\n1, +2.5e1 , cat \n\n"3","-4",dog\r\n')
        table = trainer.read_csv(path)
        self.assertEqual(table.feature_names, ["a", "b"])
        np.testing.assert_array_equal(table.features, np.array([[1, 25], [3, -4]], np.float32))
        self.assertEqual(table.labels, ["cat", "dog"])
        self.assertEqual(table.lines, [2, 4])
        np.testing.assert_array_equal(table.class_ids(["dog", "cat"]), [1, 0])
        self.assertEqual(trainer.read_csv(self.write("y.csv", "y,x\n1,2\n"), "y").feature_names, ["x"])

    def test_csv_errors_name_the_line_and_column(self):
        cases = [("x,label\n1,a\nnan,b\n", "line 3, column 'x' (1): expected a finite number, got 'nan'"),
                 ("x,label\n1,a\n1_0,b\n", "got '1_0'"),
                 ("x,label\n1,a,3\n", "line 2: 3 fields, the header has 2"),
                 ("x,y\n1,2\n", "no label column 'label'"),
                 ("x,x,label\n", "column 'x' appears twice"),
                 ("label\na\n", "no feature column"),
                 ("x,label\n1,\n", "line 2: the label ('label') is empty"),
                 ("x,label\n", "no data rows"),
                 ("", "the file is empty"),
                 ('x,label\n"1,a\n', "line")]
        for text, message in cases:
            with self.subTest(text=text), self.assertRaises(trainer.TaskError) as caught:
                trainer.read_csv(self.write("bad.csv", text))
            self.assertEqual(caught.exception.code, "invalid_argument")
            self.assertIn(message, caught.exception.message)
        table = trainer.read_csv(self.write("ok.csv", "x,label\n1,a\n"))
        with self.assertRaisesRegex(trainer.TaskError, "line 2: label 'a' is not one of the model's classes"):
            table.class_ids(["b"])
        with self.assertRaisesRegex(trainer.TaskError, r"feature columns \['x'\] differ from the model's \['z'\]"):
            table.check_features(["z"])
        with self.assertRaises(trainer.TaskError) as caught:
            trainer.read_csv(self.folder / "absent.csv")
        self.assertEqual(caught.exception.code, "not_found")

    def test_jsonl_records_and_errors(self):
        records = trainer.read_jsonl(self.write("r.jsonl", '{"text": "a"}\n\n{"prompt": "p", "completion": "c"}\n'))
        self.assertEqual(records, [{"text": "a"}, {"prompt": "p", "completion": "c"}])
        for text, message in (('{"a": 1}\n[1]\n', "line 2: expected a JSON object"), ("{\n", "line 1: not JSON"),
                              ("\n\n", "no rows")):
            with self.subTest(text=text), self.assertRaisesRegex(trainer.TaskError, message):
                trainer.read_jsonl(self.write("bad.jsonl", text))

    def test_load_data_holds_out_the_split_or_reads_validation_data(self):
        support.write_tabular_csv(self.folder / "rows.csv", rows=20)
        base = {"contract_version": 1, "kind": "train", "data": "rows.csv", "split_seed": 4,
                "validation_fraction": 0.25, "output": {"weights": "u", "result": "r"}}
        task = trainer.Task.from_json(base, self.folder / "task.json")
        train, validation = trainer.load_data(task)
        all_rows = trainer.read_csv(self.folder / "rows.csv")
        expected_train, expected_validation = trainer.split_indices(20, 0.25, 4)
        self.assertEqual((len(train), len(validation)), (15, 5))
        np.testing.assert_array_equal(validation.features, all_rows.features[expected_validation])
        np.testing.assert_array_equal(train.features, all_rows.features[expected_train])
        support.write_tabular_csv(self.folder / "val.csv", rows=7, seed=9)
        with_validation = trainer.Task.from_json({**base, "validation_data": "val.csv"}, self.folder / "task.json")
        train, validation = trainer.load_data(with_validation)
        self.assertEqual((len(train), len(validation)), (20, 7))


class ResultAndUpdateTest(unittest.TestCase):
    def setUp(self):
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-out-")))
        safetensors.save(self.folder / "global.safetensors",
                         {"w": np.ones((2, 3), np.float32), "h": np.ones(4, np.float32)}, dtypes={"h": "BF16"})
        support.write_task(self.folder / "task.json", data="x.csv", initial_weights="global.safetensors")
        self.events = []

    def run_in_process(self, train) -> dict:
        return trainer.run_task(self.folder / "task.json", train, on_event=self.events.append)

    def test_check_result_converts_numpy_and_refuses_broken_rules(self):
        plain = trainer.check_result({"num_samples": np.int64(4), "train_loss": np.float32(0.5),
                                      "validation_before": None, "metrics": {"steps": np.int32(3)}})
        self.assertEqual(json.dumps(plain), '{"num_samples": 4, "train_loss": 0.5, "validation_before": null, '
                                            '"metrics": {"steps": 3}}')
        for result, error, message in (
                ({}, trainer.TaskError, "num_samples is required"),
                ({"num_samples": -1}, trainer.TaskError, "num_samples must be an integer >= 0"),
                ({"num_samples": True}, trainer.TaskError, "num_samples must be an integer >= 0"),
                ({"num_samples": 1, "train_loss": math.nan}, trainer.NonFiniteLoss, "mean training loss is nan"),
                ({"num_samples": 1, "validation_after": {"loss": math.inf}}, trainer.NonFiniteLoss,
                 "validation_after.loss is inf"),
                ({"num_samples": 1, "validation_after": {"accuracy": 1.0}}, trainer.TaskError,
                 "validation_after.loss is required"),
                ({"num_samples": 1, "metrics": {"wall_s": math.nan}}, trainer.TaskError,
                 "metrics.wall_s must be a finite number")):
            with self.subTest(result=result), self.assertRaises(error) as caught:
                trainer.check_result(result)
            self.assertIn(message, caught.exception.message)

    def test_run_task_in_process_returns_the_result_and_records_events(self):
        def train(task):
            trainer.report_progress(1, 1, loss=0.5)
            weights = trainer.load_initial_weights(task)
            trainer.save_update(task, {"h": weights["h"] * 3, "w": weights["w"] + 1})
            return {"num_samples": 8}

        self.assertEqual(self.run_in_process(train), {"num_samples": 8})
        self.assertEqual([e["event"] for e in self.events], ["progress", "done"])
        update = self.folder / "out" / "update.safetensors"
        # Written in initial_weights' order and dtypes: h as BF16 from the float32 array.
        self.assertEqual(list(safetensors.layout(update).items()), [("w", ("F32", (2, 3))), ("h", ("BF16", (4,)))])
        np.testing.assert_array_equal(safetensors.load(update)["h"], np.full(4, 3, np.float32))

    def test_save_update_checks_layout_dtype_and_finiteness(self):
        cases = [({"w": np.ones((2, 3), np.float32)}, "invalid_argument", "the update lacks tensor 'h'"),
                 ({"w": np.ones((3, 2), np.float32), "h": np.ones(4, np.float32)}, "invalid_argument",
                  "tensor 'w' of the update has shape [3, 2], initial_weights has [2, 3]"),
                 ({"w": np.ones((2, 3), np.float64), "h": np.ones(4, np.float32)}, "invalid_argument",
                  "tensor 'w' of the update is F64, initial_weights has F32"),
                 ({"w": torch.ones(2, 3), "h": torch.ones(4)}, "invalid_argument",
                  "tensor 'h' of the update is F32, initial_weights has BF16"),
                 ({"w": np.full((2, 3), np.nan, np.float32), "h": np.ones(4, np.float32)}, "non_finite_weights",
                  "tensor 'w' of the update holds NaN"),
                 ({"w": np.ones((2, 3), np.float32), "h": np.ones(4, np.float32), "x": np.ones(1, np.float32)},
                  "invalid_argument", "has tensor 'x', which initial_weights lacks")]
        for tensors, code, message in cases:
            with self.subTest(message), self.assertRaises(trainer.TaskError) as caught:
                self.run_in_process(lambda task: trainer.save_update(task, tensors))
            self.assertEqual(caught.exception.code, code)
            self.assertIn(message, caught.exception.message)
            self.assertFalse((self.folder / "out" / "update.safetensors").exists())

    def test_torch_update_keeps_bf16(self):
        def train(task):
            weights = trainer.load_initial_weights_torch(task)
            self.assertEqual(weights["h"].dtype, torch.bfloat16)
            trainer.save_update(task, {n: t * 2 for n, t in weights.items()})
            return {"num_samples": 1}

        self.run_in_process(train)
        loaded = safetensors.load_torch(self.folder / "out" / "update.safetensors")
        self.assertEqual(loaded["h"].dtype, torch.bfloat16)
        self.assertTrue(torch.equal(loaded["h"], torch.full((4,), 2.0, dtype=torch.bfloat16)))

    def test_an_exception_after_writing_removes_the_outputs(self):
        def train(task):
            trainer.save_update(task, trainer.load_initial_weights(task))
            raise RuntimeError("late")

        with self.assertRaisesRegex(RuntimeError, "late"):
            self.run_in_process(train)
        self.assertEqual(list((self.folder / "out").iterdir()), [])

    def test_functions_outside_a_task_say_where_to_call_them(self):
        with self.assertRaisesRegex(RuntimeError, "parsyn.trainer.main"):
            trainer.report_progress(1, 2)


if __name__ == "__main__":
    unittest.main()
