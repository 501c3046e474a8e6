"""What a task writes and reads: the result's rules, the update (checked against initial_weights) and the initial
weights."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .. import safetensors
from . import state
from .errors import NonFiniteLoss, Stopped, TaskError
from .task import Task


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_VALIDATION_KEYS = ("loss", "accuracy", "perplexity", "exact_match", "num_examples", "num_counted")


def check_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """The result as plain JSON values (NumPy scalars converted), after checking the contract's rules:
    num_samples an integer >= 0 (required), num_validation an integer >= 0, train_loss a finite number or None,
    validation_before/validation_after None or objects with a finite `loss` (and finite accuracy, perplexity,
    exact_match, num_examples when given), metrics an object of finite numbers. NonFiniteLoss for a non-finite loss;
    TaskError("internal") for any other broken rule (it is the trainer's bug)."""
    if not isinstance(result, Mapping):
        raise TaskError("internal", f"the result must be a dict, got {type(result).__name__}")
    plain = _plain(dict(result))
    problems = []
    if "num_samples" not in plain:
        problems.append("num_samples is required (the training rows the task trained on)")
    for key in ("num_samples", "num_validation"):
        if key in plain and not (isinstance(plain[key], int) and not isinstance(plain[key], bool)
                                 and plain[key] >= 0):
            problems.append(f"{key} must be an integer >= 0, got {plain[key]!r}")
    train_loss = plain.get("train_loss")
    if train_loss is not None and not isinstance(train_loss, (int, float)):
        problems.append(f"train_loss must be a number or null, got {train_loss!r}")
    elif train_loss is not None and not math.isfinite(train_loss):
        raise NonFiniteLoss(f"the mean training loss is {train_loss}: the weights diverged or started non-finite")
    for key in ("validation_before", "validation_after"):
        problems += _check_validation(key, plain.get(key))
    metrics = plain.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, dict):
            problems.append(f"metrics must be an object, got {metrics!r}")
        else:
            problems += [f"metrics.{k} must be a finite number, got {v!r}" for k, v in metrics.items()
                         if v is not None and not _finite(v)]
    if problems:
        raise TaskError("internal", "the result breaks the contract: " + "; ".join(problems))
    return plain


def _check_validation(key: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, dict):
        return [f"{key} must be an object or null, got {value!r}"]
    loss = value.get("loss")
    if loss is None:
        return [f"{key}.loss is required"]
    if isinstance(loss, (int, float)) and not isinstance(loss, bool) and not math.isfinite(loss):
        raise NonFiniteLoss(f"{key}.loss is {loss}: the weights hold NaN or infinite values, or training diverged")
    return [f"{key}.{k} must be a finite number, got {value[k]!r}" for k in _VALIDATION_KEYS
            if value.get(k) is not None and not _finite(value[k])]


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays (and torch scalars) as Python numbers and lists, recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def load_initial_weights(task: Task) -> dict[str, np.ndarray]:
    """The task's initial_weights as NumPy arrays (BF16 widened to float32). TaskError when the task has none or the
    file is missing or malformed."""
    return _read_initial(task, safetensors.load)


def load_initial_weights_torch(task: Task, device: str = "cpu") -> dict:
    """The task's initial_weights as torch tensors of their stored dtypes, on `device`. Errors as
    load_initial_weights."""
    return _read_initial(task, lambda path: safetensors.load_torch(path, device))


def _read_initial(task: Task, read: Callable[[Path], dict]) -> dict:
    if task.initial_weights is None:
        raise TaskError("invalid_argument", "the task has no initial_weights to start from")
    try:
        return read(task.initial_weights)
    except FileNotFoundError:
        raise TaskError("not_found", f"initial_weights {task.initial_weights} does not exist") from None
    except safetensors.SafetensorsError as e:
        raise TaskError("invalid_argument", f"initial_weights: {e}") from None


Layout = Mapping[str, "tuple[str, tuple[int, ...]]"]


def check_layout(expected: Layout, actual: Layout, what: str = "the update",
                 reference: str = "initial_weights") -> None:
    """TaskError("invalid_argument") naming the first tensor whose name, dtype or shape differs between `actual`
    (described as `what`) and `expected` (described as `reference`). Layouts map names to (dtype, shape)."""
    missing = [n for n in expected if n not in actual]
    if missing:
        raise TaskError("invalid_argument", f"{what} lacks tensor {missing[0]!r} of {reference}"
                                            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    extra = [n for n in actual if n not in expected]
    if extra:
        raise TaskError("invalid_argument", f"{what} has tensor {extra[0]!r}, which {reference} lacks")
    for name, (dtype, shape) in expected.items():
        got_dtype, got_shape = actual[name]
        if tuple(got_shape) != tuple(shape):
            raise TaskError("invalid_argument", f"tensor {name!r} of {what} has shape {list(got_shape)}, {reference} "
                                                f"has {list(shape)}")
        if got_dtype != dtype:
            raise TaskError("invalid_argument", f"tensor {name!r} of {what} is {got_dtype}, {reference} has {dtype}")


def save_update(task: Task, tensors: Mapping[str, Any]) -> None:
    """Writes the update to output.weights atomically, in initial_weights' tensor order and dtypes, after checking
    that it holds exactly initial_weights' tensors (names, shapes, dtypes) with finite values.

    Tensors may be torch tensors (their dtype must be initial_weights', torch.bfloat16 for BF16) or NumPy arrays (of
    the dtype `safetensors.load` gives: float32 for F32 and for BF16, which is then rounded to nearest even).
    TaskError("invalid_argument") naming the tensor whose layout differs; TaskError("non_finite_weights") naming the
    tensor holding NaN or infinity."""
    run = state.current_run()
    if task.output.weights is None:
        raise TaskError("invalid_argument", "the task has no output.weights to write an update to")
    reference = _reference_layout(task, tensors)
    actual = {name: (_dtype_name(value, reference.get(name, (None,))[0]), tuple(value.shape))
              for name, value in tensors.items()}
    check_layout(reference, actual)
    ordered = {name: tensors[name] for name in reference}
    for name, value in ordered.items():
        if not _all_finite(value):
            raise TaskError("non_finite_weights", f"tensor {name!r} of the update holds NaN or infinite values: "
                                                  "training diverged (lower learning_rate or check the data)")
    if run.stop.is_set():
        raise Stopped()
    run.written.append(task.output.weights)
    if all(_is_torch(v) for v in ordered.values()):
        safetensors.save_torch(task.output.weights, ordered)
    else:
        arrays = {name: _as_numpy(value) for name, value in ordered.items()}
        safetensors.save(task.output.weights, arrays, dtypes={n: d for n, (d, _) in reference.items()})
    run.update_written = True


def _reference_layout(task: Task, tensors: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    if task.initial_weights is None:  # a `parsyn train` task: nothing to match, keep the tensors' own dtypes
        return {name: (_dtype_name(value, None), tuple(value.shape)) for name, value in tensors.items()}
    try:
        return safetensors.layout(task.initial_weights)
    except FileNotFoundError:
        raise TaskError("not_found", f"initial_weights {task.initial_weights} does not exist") from None
    except safetensors.SafetensorsError as e:
        raise TaskError("invalid_argument", f"initial_weights: {e}") from None


def _is_torch(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _dtype_name(value: Any, expected: str | None) -> str:
    """The safetensors dtype a tensor would be written as; a NumPy float32 array counts as BF16 where BF16 is
    expected (NumPy has no bfloat16)."""
    if _is_torch(value):
        return safetensors.torch_dtype_name(value.dtype)
    array = np.asarray(value)
    if expected == "BF16" and array.dtype == np.float32:
        return "BF16"
    for name, dtype in safetensors.DTYPES.items():
        if name != "BF16" and array.dtype == dtype.newbyteorder("="):
            return name
    return f"numpy {array.dtype}"


def _all_finite(value: Any) -> bool:
    if _is_torch(value):
        import torch

        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    array = np.asarray(value)
    return array.dtype.kind != "f" or bool(np.isfinite(array).all())


def _as_numpy(value: Any) -> np.ndarray:
    if _is_torch(value):
        import torch

        tensor = value.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    return np.asarray(value)

