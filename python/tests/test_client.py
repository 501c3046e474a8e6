"""parsyn.client against a real `parsyn server` on 127.0.0.1 (a free port, a temporary data directory), and one real
`parsyn worker` for a federated job the client watches to its end.

The binary is $PARSYN_BIN, else build/src/cli/parsyn under the repository root. Without it these tests FAIL saying
how to build it; PARSYN_ALLOW_MISSING_SERVER=1 turns that into a skip (for machines that build no C++)."""

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

import numpy as np

from parsyn import safetensors
from parsyn.client import Client, ParsynApiError
from tests import support

PARSYN_BIN = Path(os.environ.get("PARSYN_BIN") or support.REPO / "build" / "src" / "cli" / "parsyn")
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")
START_TIMEOUT_S = 30
JOB_TIMEOUT_S = 240


class Server:
    """`parsyn server` on a free loopback port with its own data directory; stopped by close()."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.log = open(data_dir.parent / "server.log", "w+")
        self.process = subprocess.Popen([str(PARSYN_BIN), "server", "--data-dir", str(data_dir), "--listen",
                                         "127.0.0.1:0", "--progress-interval-ms", "100"],
                                        stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True)
        self.url = self._wait_for_url()
        self.key_file = data_dir / "admin-key"

    def _wait_for_url(self) -> str:
        found: list[str] = []
        reader = threading.Thread(target=self._read_stdout, args=(found,), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not found:
            self.close()
            raise AssertionError(f"parsyn server did not say where it listens within {START_TIMEOUT_S} s: "
                                 f"{self.server_log()[-3000:]}")
        return found[0]

    def _read_stdout(self, found: list[str]) -> None:
        for line in self.process.stdout:
            match = LISTENING.search(line)
            if match:
                found.append(match.group(1))
                break
        self.drain = threading.Thread(target=self.process.stdout.read, daemon=True)  # keep the pipe drained
        self.drain.start()

    def server_log(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.data_dir.parent / "server.log").read_text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "drain", None) is not None:
            self.drain.join(timeout=5)
        self.process.stdout.close()
        self.log.close()


def missing_binary_message() -> str:
    return (f"parsyn server binary {PARSYN_BIN} does not exist: build it with `./dev build` from the repository "
            "root (or point PARSYN_BIN at a built `parsyn`); set PARSYN_ALLOW_MISSING_SERVER=1 to skip these tests")


class ClientTest(unittest.TestCase):
    server: Server | None = None

    @classmethod
    def setUpClass(cls):
        if not PARSYN_BIN.exists():
            if os.environ.get("PARSYN_ALLOW_MISSING_SERVER") == "1":
                raise unittest.SkipTest(missing_binary_message())
            return  # each test fails with the message (setUp)
        cls.temp = tempfile.TemporaryDirectory(prefix="parsyn-client-")
        cls.folder = Path(cls.temp.name)
        cls.server = Server(cls.folder / "data")
        cls.client = Client(cls.server.url, key_file=cls.server.key_file, timeout_s=30)

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.server.close()
            cls.temp.cleanup()

    def setUp(self):
        if self.server is None:
            self.fail(missing_binary_message())
        self.work = Path(self.enterContext(tempfile.TemporaryDirectory(dir=self.folder)))

    def tabular_inputs(self, rows: int = 300) -> tuple[dict, dict]:
        """A CSV dataset and a tabular MLP model folder for it, uploaded."""
        data = support.write_tabular_csv(self.work / "points.csv", rows=rows, seed=3)
        model = support.write_tabular_model(self.work / "points-mlp", data, hidden_sizes=[8], seed=1)
        return self.client.upload_dataset(data), self.client.upload_model(model)

    def test_health_and_credentials_from_the_environment(self):
        self.assertEqual(self.client.health()["status"], "ok")
        environment = {"PARSYN_SERVER": self.server.url, "PARSYN_KEY_FILE": str(self.server.key_file),
                       "PARSYN_API_KEY": ""}
        with _environment(environment):
            self.assertIsInstance(list(Client().list_datasets()), list)
        with _environment({"PARSYN_SERVER": "", "PARSYN_API_KEY": "", "PARSYN_KEY_FILE": ""}):
            with self.assertRaisesRegex(ValueError, "PARSYN_SERVER"):
                Client()
            with self.assertRaises(ParsynApiError) as caught:
                list(Client(self.server.url).list_models())
        self.assertEqual((caught.exception.status, caught.exception.code), (401, "unauthenticated"))

    def test_datasets_upload_get_list_in_pages_and_delete(self):
        ids = []
        for i in range(3):
            path = support.write_tabular_csv(self.work / f"d{i}.csv", rows=20 + i)
            dataset = self.client.upload_dataset(path, name=f"pages-{i}")
            self.assertEqual((dataset["name"], dataset["format"], dataset["kind"], dataset["row_count"]),
                             (f"pages-{i}", "csv", "tabular", 20 + i))
            ids.append(dataset["id"])
        jsonl = self.work / "text.jsonl"
        jsonl.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d"}\n')
        self.assertEqual(self.client.upload_dataset(jsonl)["kind"], "prompt_completion")
        listed = [d["id"] for d in self.client.list_datasets(limit=1)]
        self.assertEqual(listed, sorted(set(listed)))  # ascending, each once, across pages of one
        self.assertTrue(set(ids) <= set(listed))
        self.assertEqual(self.client.get_dataset(ids[1])["row_count"], 21)
        self.client.delete_dataset(ids[0])
        with self.assertRaises(ParsynApiError) as caught:
            self.client.get_dataset(ids[0])
        self.assertEqual((caught.exception.status, caught.exception.code), (404, "not_found"))

    def test_a_bad_dataset_is_refused_naming_the_line(self):
        bad = self.work / "bad.csv"
        bad.write_text("x,label\n1,a\noops,b\n")
        with self.assertRaises(ParsynApiError) as caught:
            self.client.upload_dataset(bad)
        self.assertEqual((caught.exception.status, caught.exception.code), (400, "invalid_argument"))
        self.assertIn("line 3", caught.exception.message)

    def test_models_upload_a_folder_list_get_and_delete(self):
        _, model = self.tabular_inputs()
        self.assertEqual(model["model_type"], "tabular-mlp")
        self.assertEqual(sorted(f["path"] for f in model["files"]), ["model.safetensors", "tabular_model.json"])
        self.assertEqual(self.client.get_model(model["id"])["name"], "points-mlp")
        self.assertIn(model["id"], [m["id"] for m in self.client.list_models(limit=1)])
        self.client.delete_model(model["id"])
        with self.assertRaises(ParsynApiError) as caught:
            self.client.get_model(model["id"])
        self.assertEqual(caught.exception.status, 404)

    def test_a_model_whose_weights_the_strict_reader_refuses_is_a_400_naming_the_file(self):
        data = support.write_tabular_csv(self.work / "p.csv", rows=30)
        folder = support.write_tabular_model(self.work / "broken", data)
        raw = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(raw + b"\0\0\0\0")  # trailing bytes
        with self.assertRaises(ParsynApiError) as caught:
            self.client.upload_model(folder)
        self.assertEqual(caught.exception.status, 400)
        self.assertIn("model.safetensors", caught.exception.message)

    def test_workers_register_list_get_and_revoke(self):
        registered = [self.client.register_worker(f"box-{i}") for i in range(3)]
        self.assertTrue(all(w["token"].startswith("pwt_") for w in registered))
        listed = [w["id"] for w in self.client.list_workers(limit=2)]
        self.assertTrue({w["id"] for w in registered} <= set(listed))
        self.assertEqual(listed, sorted(set(listed)))
        worker = self.client.get_worker(registered[0]["id"])
        self.assertEqual((worker["name"], worker["kind"], worker["revoked"]), ("box-0", "own", False))
        self.assertNotIn("token", worker)
        self.assertTrue(self.client.revoke_worker(registered[0]["id"])["revoked"])
        self.assertEqual(self.client.register_worker("managed-1", kind="managed")["kind"], "managed")

    def test_a_client_of_a_project_lists_and_registers_in_it(self):
        self.client._json("POST", "/api/v1/projects", json_body={"name": "py-team"})
        in_team = Client(self.client.server_url, api_key=self.client._api_key, project="py-team")
        worker = in_team.register_worker("team-box")
        self.assertEqual([w["name"] for w in in_team.list_workers() if w["kind"] == "own"], ["team-box"])
        self.assertNotIn(worker["id"], [w["id"] for w in self.client.list_workers()])  # not the default project's
        with self.assertRaises(ParsynApiError) as refused:
            list(Client(self.client.server_url, api_key=self.client._api_key, project="nope").list_workers())
        self.assertEqual(refused.exception.status, 404)

    def test_a_job_spec_with_problems_raises_one_error_listing_each_field(self):
        dataset, model = self.tabular_inputs(rows=40)
        spec = {"name": "bad", "dataset_id": dataset["id"], "model_id": model["id"],
                "config": {"batch_size": 0, "lerning_rate": 1},
                "distributed": {"enabled": True, "min_workers": 3, "max_workers": 2}}
        with self.assertRaises(ParsynApiError) as caught:
            self.client.create_job(spec)
        error = caught.exception
        self.assertEqual((error.status, error.code), (400, "invalid_argument"))
        fields = {problem["field"] for problem in error.errors}
        self.assertTrue({"config.batch_size", "distributed.min_workers"} <= fields, error.errors)
        self.assertTrue(any("lerning_rate" in (p["field"] or "") + p["message"] for p in error.errors))
        for problem in error.errors:
            self.assertIn(problem["message"], error.message)

    def test_a_cancelled_job_streams_to_its_terminal_status(self):
        dataset, model = self.tabular_inputs(rows=60)
        worker = self.client.register_worker("never-started")
        job = self.client.create_job(self.job_spec(dataset, model, [worker["id"]], name="to-cancel"))
        self.assertEqual(job["status"], "queued")
        self.assertIsInstance(job["warnings"], list)
        self.assertIn(job["id"], [j["id"] for j in self.client.list_jobs(limit=1)])
        self.assertEqual(self.client.get_job(job["id"])["name"], "to-cancel")
        self.client.cancel_job(job["id"])
        events = list(self.client.watch(job["id"]))
        self.assertEqual((events[-1].event, events[-1].data["status"]), ("job_status", "cancelled"))
        self.assertTrue(all(e.data["job_id"] == job["id"] for e in events))
        ids = [int(e.id) for e in events]
        self.assertEqual(ids, sorted(set(ids)))
        self.assertIn(job["id"], [j["id"] for j in self.client.list_jobs(status="cancelled")])
        with self.assertRaises(ParsynApiError) as caught:
            self.client.stop_job(job["id"])
        self.assertEqual(caught.exception.status, 409)
        # Resuming after an event gives exactly the events after it.
        resumed = list(self.client.watch(job["id"], last_event_id=events[0].id))
        self.assertEqual([e.id for e in resumed], [e.id for e in events[1:]])

    def test_a_federated_job_with_a_real_worker_watched_to_success(self):
        dataset, model = self.tabular_inputs(rows=300)
        worker = self.client.register_worker("real-worker")
        with self.running_worker(worker):
            job = self.client.create_job(self.job_spec(dataset, model, [worker["id"]], rounds=2, steps=10))
            # The first connection drops after 3 events: watch reconnects with Last-Event-ID, losing and repeating
            # nothing.
            events = []
            deadline = time.monotonic() + JOB_TIMEOUT_S
            dropping = _dropping_first_stream(self.client, after_events=3)
            for event in dropping.watch(job["id"], idle_timeout_s=20):
                events.append(event)
                self.assertLess(time.monotonic(), deadline, f"the job did not end within {JOB_TIMEOUT_S} s")
        self.assertEqual(dropping.streams_opened, 2)  # the dropped one and the resumed one
        names = [e.event for e in events]
        self.assertEqual((names[-1], events[-1].data["status"]), ("job_status", "succeeded"),
                         self.server.server_log()[-3000:])
        ids = [int(e.id) for e in events]
        self.assertEqual(ids, sorted(set(ids)))
        self.assertEqual(ids, [int(e.id) for e in self.client.watch(job["id"])])
        self.assertEqual(names.count("round_committed"), 2)
        self.assertIn("worker_progress", names)
        rounds = self.client.job_rounds(job["id"])
        self.assertEqual([r["outcome"] for r in rounds], ["committed", "committed"])
        self.assertEqual(rounds[0]["updates"][0]["worker_id"], worker["id"])
        points = list(self.client.job_metrics(job["id"], limit=2))
        self.assertTrue(points)
        self.assertTrue(all(p["worker_id"] == worker["id"] for p in points))
        self.assertEqual(len({p["id"] for p in points}), len(points))
        artifacts = {a["name"] for a in self.client.list_artifacts(job["id"])}
        self.assertIn("model.safetensors", artifacts)
        path = self.client.download_artifact(job["id"], "model.safetensors", self.work)
        downloaded = safetensors.load(path)  # the coordinator's writer, read by ours
        self.assertEqual(safetensors.layout(path), safetensors.layout(self.work / "points-mlp" / "model.safetensors"))
        self.assertTrue(all(np.isfinite(t).all() for t in downloaded.values()))
        every = self.client.download_artifacts(job["id"], self.work / "all")
        self.assertEqual({p.relative_to(self.work / "all").as_posix() for p in every}, artifacts)
        with self.assertRaises(ParsynApiError) as caught:
            self.client.download_artifact(job["id"], "no/such.file", self.work / "x")
        self.assertEqual(caught.exception.status, 404)
        self.assertFalse((self.work / "x").exists())

    def test_a_job_trained_by_the_python_example_trainer_in_a_real_worker(self):
        if "--trainer" not in subprocess.run([str(PARSYN_BIN), "worker", "--help"], capture_output=True,
                                             text=True).stdout:
            self.skipTest(f"{PARSYN_BIN} is a worker without --trainer (trainer contract); rebuild with ./dev build")
        dataset, model = self.tabular_inputs(rows=300)
        worker = self.client.register_worker("python-trainer")
        trainer = f"pytorch-tabular={sys.executable} {support.EXAMPLES / 'pytorch_tabular.py'}"
        with self.running_worker(worker, "--trainer", trainer):
            spec = self.job_spec(dataset, model, [worker["id"]], name="python-trainer", rounds=2, steps=10)
            spec["config"]["trainer"] = "pytorch-tabular"
            job = self.client.create_job(spec)
            events = list(self.client.watch(job["id"], idle_timeout_s=20))
        self.assertEqual(events[-1].data["status"], "succeeded", (self.work / "worker.log").read_text()[-3000:])
        progress = [e.data for e in events if e.event == "worker_progress"]
        self.assertTrue(progress)
        self.assertEqual(progress[-1]["throughput_unit"], "samples/s")
        self.assertEqual([r["outcome"] for r in self.client.job_rounds(job["id"])], ["committed", "committed"])
        self.assertIn("pytorch-tabular", (self.work / "worker.log").read_text())

    def job_spec(self, dataset: dict, model: dict, worker_ids: list[int], name: str = "points", rounds: int = 2,
                 steps: int = 10) -> dict:
        return {"name": name, "dataset_id": dataset["id"], "model_id": model["id"],
                "config": {"batch_size": 16, "learning_rate": 0.01, "use_peft": False},
                "distributed": {"enabled": True, "num_rounds": rounds, "steps_per_round": steps, "min_workers": 1,
                                "aggregation_timeout": 120, "fault_tolerance": 1},
                "worker_selection": {"mode": "own", "worker_ids": worker_ids}}

    @contextlib.contextmanager
    def running_worker(self, worker: dict, *args: str):
        log = open(self.work / "worker.log", "w")
        process = subprocess.Popen([str(PARSYN_BIN), "worker", "--server", self.server.url, "--token",
                                    worker["token"], "--cache-dir", str(self.work / "cache"), "--threads", "1", *args],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=support.env_with_package())
        try:
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _dropping_first_stream(client: Client, after_events: int) -> Client:
    """A copy of `client` whose first event stream breaks (ConnectionResetError) after `after_events` events."""
    copy = Client(client.server_url, api_key=client._api_key, timeout_s=client.timeout_s)
    original_open = copy._open
    copy.streams_opened = 0

    def open_(method, path, **kwargs):
        response = original_open(method, path, **kwargs)
        if not path.split("?")[0].endswith("/events"):
            return response
        copy.streams_opened += 1
        return _Breaking(response, after_events) if copy.streams_opened == 1 else response

    copy._open = open_
    return copy


class _Breaking:
    """Passes lines through until `after_events` events were read (blank lines ending them), then raises."""

    def __init__(self, response, after_events: int):
        self.response = response
        self.left = after_events

    def readline(self) -> bytes:
        if self.left == 0:
            raise ConnectionResetError("test: the connection dropped")
        line = self.response.readline()
        if line in (b"\n", b"\r\n"):
            self.left -= 1
        return line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.response.__exit__(*exc)


if __name__ == "__main__":
    unittest.main()
