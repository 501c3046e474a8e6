"""A client of the Parsyn coordinator's REST API (docs/openapi.yaml), on the standard library only.

    from parsyn.client import Client, ParsynApiError

    client = Client("http://127.0.0.1:8080", key_file="parsyn-data/admin-key")
    dataset = client.upload_dataset("train.csv")
    model = client.upload_model("./points-mlp")
    job = client.create_job({"name": "points", "dataset_id": dataset["id"], "model_id": model["id"], ...})
    for event in client.watch(job["id"]):
        print(event.event, event.data)

Every method returns the API's JSON (dicts and lists as the API defines them). List methods are generators that
follow the cursor paging (`next_cursor`) to the end, one request per page of `limit` items. Every failure of a call
raises ParsynApiError: an HTTP error answer carries its status, the API's error code and message and, where the API
gives them, `errors` (one {"field", "message"} per problem); a server that cannot be reached is status None, code
"unavailable".

The server, the key, an extra CA and the project come from the arguments, else from the environment (PARSYN_SERVER,
PARSYN_API_KEY or PARSYN_KEY_FILE, PARSYN_CA_FILE, PARSYN_PROJECT), as the parsyn CLI takes them. Every call names the
project (X-Parsyn-Project; none: the server's "default"): lists and creates act in it (docs/operations.md, "Users,
projects and roles").

A Client holds no connection between calls (each call opens its own), so one Client may be used from several
threads at once.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

from . import safetensors

__all__ = ["Client", "ParsynApiError", "Event", "TERMINAL_JOB_STATUSES"]

TERMINAL_JOB_STATUSES = ("succeeded", "failed", "stopped", "cancelled")
_CHUNK_BYTES = 1 << 20


class ParsynApiError(Exception):
    """A call that failed. status: the HTTP status (None when no answer came); code and message: the API's
    error.code and error.message; errors: the API's error.errors list ([{"field", "message"}], empty when absent)."""

    def __init__(self, status: int | None, code: str, message: str, errors: list[dict[str, Any]] | None = None,
                 method: str = "", path: str = ""):
        self.status = status
        self.code = code
        self.message = message
        self.errors = list(errors or [])
        self.method = method
        self.path = path
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}{status if status is not None else 'no answer'} {code}: {message}")


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event: its name (`event:`), its data parsed as JSON (the raw text when not JSON) and `id`."""

    event: str
    data: Any
    id: str | None


class Client:
    """The coordinator's REST API. Raises ParsynApiError from every call; ValueError when no server is given."""

    def __init__(self, server_url: str | None = None, api_key: str | None = None,
                 key_file: str | os.PathLike | None = None, ca_file: str | os.PathLike | None = None,
                 timeout_s: float = 60.0, project: str | None = None):
        server_url = server_url or os.environ.get("PARSYN_SERVER")
        if not server_url:
            raise ValueError("no Parsyn server: pass server_url (http://HOST:PORT or https://...) or set PARSYN_SERVER")
        parsed = urllib.parse.urlsplit(server_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"server_url {server_url!r} must be http://HOST[:PORT] or https://HOST[:PORT]")
        self.server_url = server_url.rstrip("/")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port
        self._base_path = parsed.path.rstrip("/")
        self.timeout_s = timeout_s
        self._api_key = _api_key(api_key, key_file)
        self.project = project or os.environ.get("PARSYN_PROJECT") or None
        ca_file = ca_file or os.environ.get("PARSYN_CA_FILE")
        self._tls = None
        if self._scheme == "https":
            self._tls = ssl.create_default_context()
            if ca_file:
                self._tls.load_verify_locations(cafile=os.fspath(ca_file))

    # ----------------------------------------------------------------------------------------------------------
    # Health

    def health(self) -> dict:
        """GET /healthz (open)."""
        return self._json("GET", "/healthz")

    # ----------------------------------------------------------------------------------------------------------
    # Datasets

    def upload_dataset(self, path: str | os.PathLike, name: str | None = None, format: str | None = None,
                       label_column: str | None = None) -> dict:
        """Uploads a .jsonl or .csv file (streamed) as a dataset named `name` (default: the file's name); `format`
        ("jsonl" or "csv") defaults to the file's extension. Returns the Dataset."""
        path = Path(path)
        if format is None and path.suffix.lower() in (".csv", ".jsonl"):
            format = path.suffix.lower()[1:]
        query = {"name": name or path.name, "format": format, "label_column": label_column}
        with open(path, "rb") as body:
            return self._json("POST", "/api/v1/datasets", query=query, body=body, size=os.fstat(body.fileno()).st_size)

    def list_datasets(self, limit: int | None = None) -> Iterator[dict]:
        """Every dataset, oldest first (pages of `limit`)."""
        return self._paged("/api/v1/datasets", "datasets", {"limit": limit})

    def get_dataset(self, dataset_id: int) -> dict:
        return self._json("GET", f"/api/v1/datasets/{_id(dataset_id)}")

    def delete_dataset(self, dataset_id: int) -> None:
        """409 failed_precondition while a job refers to it."""
        self._json("DELETE", f"/api/v1/datasets/{_id(dataset_id)}")

    # ----------------------------------------------------------------------------------------------------------
    # Models

    def upload_model(self, folder: str | os.PathLike, name: str | None = None) -> dict:
        """Uploads every file under `folder` (POST /api/v1/uploads each, streamed) and registers them as one model
        named `name` (default: the folder's name): POST /api/v1/models. Returns the Model."""
        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"model folder {folder} is not a directory")
        files = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            files[path.relative_to(folder).as_posix()] = self.upload_file(path)["upload_id"]
        if not files:
            raise ValueError(f"model folder {folder} has no files")
        return self._json("POST", "/api/v1/models", json_body={"name": name or folder.resolve().name, "files": files})

    def upload_file(self, path: str | os.PathLike) -> dict:
        """Stages one file (POST /api/v1/uploads); returns {"upload_id", "size_bytes", "sha256"}."""
        with open(path, "rb") as body:
            return self._json("POST", "/api/v1/uploads", body=body, size=os.fstat(body.fileno()).st_size)

    def list_models(self, limit: int | None = None) -> Iterator[dict]:
        return self._paged("/api/v1/models", "models", {"limit": limit})

    def get_model(self, model_id: int) -> dict:
        return self._json("GET", f"/api/v1/models/{_id(model_id)}")

    def delete_model(self, model_id: int) -> None:
        """409 failed_precondition while a job refers to it."""
        self._json("DELETE", f"/api/v1/models/{_id(model_id)}")

    # ----------------------------------------------------------------------------------------------------------
    # Workers

    def register_worker(self, name: str, kind: str = "own") -> dict:
        """Registers a worker ("own" or "managed"); the answer's `token` (pwt_...) is shown this once."""
        return self._json("POST", "/api/v1/workers", json_body={"name": name, "kind": kind})

    def list_workers(self, limit: int | None = None) -> Iterator[dict]:
        return self._paged("/api/v1/workers", "workers", {"limit": limit})

    def get_worker(self, worker_id: int) -> dict:
        return self._json("GET", f"/api/v1/workers/{_id(worker_id)}")

    def revoke_worker(self, worker_id: int) -> dict:
        """Revokes the worker (its token stops working; the record stays). Returns the revoked Worker."""
        return self._json("DELETE", f"/api/v1/workers/{_id(worker_id)}")

    # ----------------------------------------------------------------------------------------------------------
    # Training jobs

    def create_job(self, spec: Mapping[str, Any]) -> dict:
        """Creates a job from its spec (docs/training.md). The answer is the Job, with `warnings`. A 400 lists every
        problem in ParsynApiError.errors, each {"field": "distributed.min_workers", "message": ...}."""
        return self._json("POST", "/api/v1/training-jobs", json_body=dict(spec))

    def get_job(self, job_id: int) -> dict:
        return self._json("GET", f"/api/v1/training-jobs/{_id(job_id)}")

    def list_jobs(self, status: str | None = None, limit: int | None = None) -> Iterator[dict]:
        """Every job (without its spec), oldest first; `status` keeps only jobs in that status."""
        return self._paged("/api/v1/training-jobs", "training_jobs", {"status": status, "limit": limit})

    def stop_job(self, job_id: int) -> dict:
        """Stops the job: the latest committed global becomes its result (status stopped). Returns the Job."""
        return self._json("POST", f"/api/v1/training-jobs/{_id(job_id)}/stop")

    def cancel_job(self, job_id: int) -> dict:
        """Cancels the job at once. Returns the Job."""
        return self._json("POST", f"/api/v1/training-jobs/{_id(job_id)}/cancel")

    def job_rounds(self, job_id: int) -> list[dict]:
        """Every round attempt of the job (GET .../rounds)."""
        return self._json("GET", f"/api/v1/training-jobs/{_id(job_id)}/rounds")["rounds"]

    def job_metrics(self, job_id: int, limit: int | None = None) -> Iterator[dict]:
        """The job's stored progress points in the order stored, each with its `worker_id` added: {"worker_id",
        "id", "round", "step", "loss", "throughput", "utilization", "time_ms"}."""
        for group in self._paged(f"/api/v1/training-jobs/{_id(job_id)}/metrics", "workers", {"limit": limit}):
            for point in group.get("points", []):
                yield {"worker_id": group["worker_id"], **point}

    def list_artifacts(self, job_id: int) -> list[dict]:
        """The job's files: [{"name", "size_bytes", "sha256", "created_at_ms"}]."""
        return self._json("GET", f"/api/v1/training-jobs/{_id(job_id)}/artifacts")["artifacts"]

    def download_artifact(self, job_id: int, name: str, destination: str | os.PathLike) -> Path:
        """Downloads one artifact (e.g. "best/adapter_config.json") to `destination` (a file path, or an existing
        folder to put it in under its name), streamed and written atomically. Returns the file's path."""
        destination = Path(destination)
        if destination.is_dir():
            destination = destination / name
        path = f"/api/v1/training-jobs/{_id(job_id)}/artifacts/{urllib.parse.quote(name, safe='')}"
        with self._open("GET", path, timeout_s=self.timeout_s) as response:
            _write_atomically(destination, response)
        return destination

    def download_artifacts(self, job_id: int, folder: str | os.PathLike) -> list[Path]:
        """Downloads every artifact of the job under `folder`, keeping their names' folders (best/, rounds/...).
        An artifact name that would land outside `folder` (absolute, or with a `..` segment) raises ParsynApiError
        (code invalid_response) before anything is written."""
        names = [a["name"] for a in self.list_artifacts(job_id)]
        for name in names:
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ParsynApiError(None, "invalid_response", f"job {job_id} lists an artifact named {name!r}, "
                                                               "which would be written outside the folder")
        return [self.download_artifact(job_id, name, Path(folder) / name) for name in names]

    def watch(self, job_id: int, last_event_id: str | None = None, max_reconnects: int = 5,
              idle_timeout_s: float = 60.0) -> Iterator[Event]:
        """Follows the job's event stream (GET /api/v1/training-jobs/{id}/events), yielding each Event from the
        first (or after `last_event_id`) until the terminal job_status event, which is yielded last.

        When the connection drops, or nothing arrives for `idle_timeout_s`, it reconnects with Last-Event-ID, so no
        event is lost or repeated; after `max_reconnects` attempts in a row without an event it raises
        ParsynApiError (code unavailable). HTTP errors (404 for an unknown job) raise at once."""
        path = f"/api/v1/training-jobs/{_id(job_id)}/events?after=0"  # from the first (a reconnect's header wins)
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            try:
                with self._open("GET", path, headers=headers, timeout_s=idle_timeout_s) as response:
                    for event in _read_events(response):
                        failures = 0
                        if event.id:
                            last_event_id = event.id
                        yield event
                        if _ends_job(event):
                            return
                error = None
            except ParsynApiError as e:
                if e.status is not None:
                    raise
                error = e
            except (OSError, http.client.HTTPException) as e:
                error = e
            failures += 1
            if failures > max_reconnects:
                raise ParsynApiError(None, "unavailable",
                                     f"the event stream of job {job_id} broke {failures} times in a row "
                                     f"(last: {error or 'the server closed it before the job ended'})", method="GET",
                                     path=path)
            time.sleep(min(0.5 * 2 ** (failures - 1), 5.0))

    # ----------------------------------------------------------------------------------------------------------
    # HTTP

    def _paged(self, path: str, key: str, query: Mapping[str, Any]) -> Iterator[dict]:
        cursor = None
        while True:
            page = self._json("GET", path, query={**query, "cursor": cursor})
            yield from page[key]
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    def _json(self, method: str, path: str, query: Mapping[str, Any] | None = None, json_body: Any = None,
              body: BinaryIO | None = None, size: int | None = None) -> Any:
        headers = {"Accept": "application/json"}
        data: Any = body
        if json_body is not None:
            data = json.dumps(json_body).encode("utf-8")
            headers["Content-Type"] = "application/json"
            size = len(data)
        elif body is not None:
            headers["Content-Type"] = "application/octet-stream"
        with self._open(method, path, query=query, headers=headers, body=data, size=size,
                        timeout_s=self.timeout_s) as response:
            text = response.read()
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ParsynApiError(response.status, "invalid_response",
                                 f"the server answered {response.status} with a body that is not JSON: "
                                 f"{text[:200]!r}", method=method, path=path) from None

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s, context=self._tls)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)

    def _open(self, method: str, path: str, query: Mapping[str, Any] | None = None,
              headers: Mapping[str, str] | None = None, body: Any = None, size: int | None = None,
              timeout_s: float = 60.0) -> "_Response":
        """Sends a request and returns the open response of a 2xx answer; any other answer raises ParsynApiError."""
        target = self._base_path + path
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            target += "?" + urllib.parse.urlencode(params)
        all_headers = dict(headers or {})
        if self._api_key:
            all_headers["Authorization"] = f"Bearer {self._api_key}"
        if self.project:
            all_headers["X-Parsyn-Project"] = self.project
        if body is not None or method in ("POST", "PUT"):
            all_headers["Content-Length"] = str(size if size is not None else 0)
        connection = self._connection(timeout_s)
        try:
            connection.request(method, target, body=body, headers=all_headers, encode_chunked=False)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as e:
            connection.close()
            raise ParsynApiError(None, "unavailable", f"cannot reach {self.server_url}: {e} (is parsyn server "
                                                      "running there? check the URL, PARSYN_SERVER and TLS settings)",
                                 method=method, path=path) from None
        if not 200 <= response.status < 300:
            raise _api_error(response, method, path, connection)
        return _Response(connection, response)


class _Response:
    """An open 2xx answer; closing it closes its connection."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse):
        self.connection = connection
        self.response = response
        self.status = response.status
        self.headers = response.headers

    def read(self, size: int | None = None) -> bytes:
        # None, not -1: HTTPResponse.read(-1) reads to the end of the connection, which keep-alive holds open.
        return self.response.read(size if size is not None and size >= 0 else None)

    def readline(self) -> bytes:
        return self.response.readline()

    def __enter__(self) -> "_Response":
        return self

    def __exit__(self, *exc) -> None:
        self.response.close()
        self.connection.close()


def _api_error(response: http.client.HTTPResponse, method: str, path: str,
               connection: http.client.HTTPConnection) -> ParsynApiError:
    try:
        text = response.read(1 << 20)
    except (OSError, http.client.HTTPException):
        text = b""
    finally:
        response.close()
        connection.close()
    try:
        error = json.loads(text)["error"]
        return ParsynApiError(response.status, str(error["code"]), str(error["message"]), error.get("errors") or [],
                              method=method, path=path)
    except (ValueError, KeyError, TypeError):
        message = text.decode("utf-8", "replace").strip()[:500] or response.reason
        return ParsynApiError(response.status, f"http_{response.status}", message, method=method, path=path)


def _read_events(response: _Response) -> Iterator[Event]:
    """Parses a text/event-stream (the WHATWG rules Parsyn's streams use: `event`, `data` (joined by newlines), `id`
    fields, `:` comments, a blank line dispatches)."""
    name, data, event_id = "", [], None
    while True:
        raw = response.readline()
        if not raw:
            return  # the stream ended; an event without its blank line is incomplete and dropped
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    parsed = json.loads(text)
                except json.JSONDecodeError:
                    parsed = text
                yield Event(name or "message", parsed, event_id)
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value


def _ends_job(event: Event) -> bool:
    return (event.event == "job_status" and isinstance(event.data, dict)
            and event.data.get("status") in TERMINAL_JOB_STATUSES)


def _api_key(api_key: str | None, key_file: str | os.PathLike | None) -> str | None:
    if api_key:
        return api_key.strip()
    if key_file:
        return _read_key(key_file)
    if os.environ.get("PARSYN_API_KEY"):
        return os.environ["PARSYN_API_KEY"].strip()
    if os.environ.get("PARSYN_KEY_FILE"):
        return _read_key(os.environ["PARSYN_KEY_FILE"])
    return None


def _read_key(path: str | os.PathLike) -> str:
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ValueError(f"cannot read the API key file {path}: {e}") from None
    if not key:
        raise ValueError(f"the API key file {path} is empty")
    return key


def _id(value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ids are integers >= 1, got {value!r}")
    return value


def _write_atomically(destination: Path, response: _Response) -> None:
    # The one atomic writer of the package (temporary file, fsync, rename), fed the body in chunks.
    safetensors.atomic_write(destination, iter(lambda: response.read(_CHUNK_BYTES), b""))