"""Reading a task's rows: CSV tables and JSONL records, and the validation hold-out.

CSV (as Parsyn's reader, src/data/dataset.h): a header line, numeric feature columns and one label column; fields
may be "quoted"; header names and labels are trimmed of spaces and tabs; feature values are finite decimal numbers
("1", "-2.5e3", " +3"; not "nan", "inf" or "1_000"); blank lines are skipped. Labels stay strings, as written, so a
model maps them to its classes itself (Table.class_ids).

JSONL: one JSON object per line; blank lines are skipped.

Every content error raises TaskError("invalid_argument", ...) naming the file, the 1-based line and, for CSV, the
column; a missing file raises TaskError("not_found", ...).

The hold-out (split_indices) is Parsyn's own SplitTrainValidation, so a Python trainer holds out the very rows the
built-in trainer would: round(n x fraction) rows (half away from zero), at least 1 when n >= 2 and the fraction is
> 0, never all of them, chosen as the first rows of ShuffledIndices(n, split_seed) (SplitMix64 Fisher-Yates).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import TaskError
from .task import Task, shuffled_indices

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclass
class Table:
    """CSV rows: features (rows x columns, float32, in header order) and each row's label as written."""

    feature_names: list[str]
    features: np.ndarray
    labels: list[str]
    lines: list[int]  # each row's 1-based line in its file, for error messages
    source: Path

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, rows: Sequence[int] | np.ndarray) -> "Table":
        """The rows listed, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return Table(self.feature_names, self.features[rows], [self.labels[r] for r in rows],
                     [self.lines[r] for r in rows], self.source)

    def class_ids(self, class_names: Sequence[str]) -> np.ndarray:
        """Each row's index in `class_names` (labels compared as strings). TaskError naming the first row whose label
        is not among them."""
        index = {name: i for i, name in enumerate(class_names)}
        ids = np.empty(len(self.labels), dtype=np.int64)
        for r, label in enumerate(self.labels):
            if label not in index:
                raise TaskError("invalid_argument",
                                f"{self.source}: line {self.lines[r]}: label {label!r} is not one of the model's "
                                f"classes {list(class_names)}")
            ids[r] = index[label]
        return ids

    def check_features(self, feature_names: Sequence[str]) -> None:
        """TaskError unless the table's feature columns are exactly `feature_names`, in order."""
        if list(feature_names) != self.feature_names:
            raise TaskError("invalid_argument",
                            f"{self.source}: the data's feature columns {self.feature_names} differ from the model's "
                            f"{list(feature_names)}")


def _open_text(path: Path):
    try:
        return open(path, encoding="utf-8", newline="")
    except FileNotFoundError:
        raise TaskError("not_found", f"data file {path} does not exist") from None


def _feature_value(text: str, where: str) -> float:
    stripped = text.strip(" \t")
    if not _NUMBER.fullmatch(stripped):
        raise TaskError("invalid_argument", f"{where}: expected a finite number, got {text!r}")
    value = float(stripped)
    if not math.isfinite(value):
        raise TaskError("invalid_argument", f"{where}: {text!r} overflows a number")
    return value


def read_csv(path: Path | str, label_column: str = "label") -> Table:
    """Reads a CSV table whose class is in `label_column`; every other column is a numeric feature."""
    path = Path(path)
    with _open_text(path) as file:
        try:
            reader = csv.reader(file, strict=True)
            header = None
            while header is None:
                record = next(reader, None)
                if record is None:
                    raise TaskError("invalid_argument", f"{path}: the file is empty (expected a header line)")
                if record:
                    header = [name.strip(" \t") for name in record]
            header_line = reader.line_num
            _check_header(header, label_column, path, header_line)
            label_at = header.index(label_column)
            names = [name for i, name in enumerate(header) if i != label_at]
            rows, labels, lines = [], [], []
            for record in reader:
                if not record or (len(record) == 1 and not record[0].strip(" \t")):
                    continue
                line = reader.line_num
                if len(record) != len(header):
                    raise TaskError("invalid_argument",
                                    f"{path}: line {line}: {len(record)} fields, the header has {len(header)}")
                label = record[label_at].strip(" \t")
                if not label:
                    raise TaskError("invalid_argument", f"{path}: line {line}: the label ({label_column!r}) is empty")
                rows.append([_feature_value(v, f"{path}: line {line}, column {header[i]!r} ({i + 1})")
                             for i, v in enumerate(record) if i != label_at])
                labels.append(label)
                lines.append(line)
        except csv.Error as e:
            raise TaskError("invalid_argument", f"{path}: line {reader.line_num}: {e}") from None
        except UnicodeDecodeError as e:
            raise TaskError("invalid_argument", f"{path}: not UTF-8 text ({e})") from None
    if not rows:
        raise TaskError("invalid_argument", f"{path}: no data rows after the header")
    return Table(names, np.asarray(rows, dtype=np.float32).reshape(len(rows), len(names)), labels, lines, path)


def _check_header(header: list[str], label_column: str, path: Path, line: int) -> None:
    seen = set()
    for i, name in enumerate(header):
        if not name:
            raise TaskError("invalid_argument", f"{path}: line {line}: column {i + 1} of the header has no name")
        if name in seen:
            raise TaskError("invalid_argument", f"{path}: line {line}: column {name!r} appears twice in the header")
        seen.add(name)
    if label_column not in seen:
        raise TaskError("invalid_argument",
                        f"{path}: line {line}: the header has no label column {label_column!r} (columns: {header}); "
                        "set config.label_column to the column holding the class")
    if len(header) < 2:
        raise TaskError("invalid_argument", f"{path}: line {line}: the header has no feature column")


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Reads one JSON object per line (blank lines skipped)."""
    path = Path(path)
    records = []
    with _open_text(path) as file:
        try:
            for line_number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TaskError("invalid_argument", f"{path}: line {line_number}: not JSON: {e.msg}") from None
                if not isinstance(record, dict):
                    raise TaskError("invalid_argument",
                                    f"{path}: line {line_number}: expected a JSON object, got {type(record).__name__}")
                records.append(record)
        except UnicodeDecodeError as e:
            raise TaskError("invalid_argument", f"{path}: not UTF-8 text ({e})") from None
    if not records:
        raise TaskError("invalid_argument", f"{path}: no rows: the file is empty or has only blank lines")
    return records


def split_indices(n: int, validation_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training rows in shuffled order, validation rows ascending) of rows 0..n-1 (module docstring)."""
    if not 0.0 <= validation_fraction < 1.0:
        raise TaskError("invalid_argument", f"validation fraction must be in [0, 1), got {validation_fraction}")
    num_validation = math.floor(n * validation_fraction + 0.5)  # llround for non-negative values
    if validation_fraction > 0 and n >= 2:
        num_validation = max(num_validation, 1)
    num_validation = min(num_validation, max(n - 1, 0))
    order = shuffled_indices(n, seed)
    return order[num_validation:], np.sort(order[:num_validation])


def read_rows(task: Task, path: Path) -> Table | list[dict[str, Any]]:
    """The rows of `path` in the task's data_format: a Table for CSV, a list of records for JSONL."""
    if task.data_format == "csv":
        return read_csv(path, task.label_column)
    return read_jsonl(path)


def load_data(task: Task) -> tuple[Table | list[dict[str, Any]], Table | list[dict[str, Any]]]:
    """The task's (training rows, validation rows): `data` and `validation_data` when the task gives one, else `data`
    split by split_indices(validation_fraction, split_seed). Tables for CSV, lists of records for JSONL; the
    validation side may be empty."""
    rows = read_rows(task, task.data)
    if task.validation_data is not None:
        return rows, read_rows(task, task.validation_data)
    train, validation = split_indices(len(rows), task.validation_fraction, task.split_seed)
    if isinstance(rows, Table):
        return rows.subset(train), rows.subset(validation)
    return [rows[i] for i in train], [rows[i] for i in validation]
