"""Choosing the torch device and thread count a task asks for. torch is imported here only when called."""

from __future__ import annotations

import sys

from .errors import TaskError
from .task import Task


def torch_device(task: Task):
    """The torch.device for task.device, after applying task.threads (when > 0) to torch's intra-op threads.

    A CUDA device on a machine without CUDA falls back to the CPU with a warning on stderr (the worker's log); a GPU
    index the machine lacks is a TaskError("invalid_argument")."""
    import torch

    if task.threads > 0:
        torch.set_num_threads(task.threads)
    if not task.device.startswith("cuda"):
        return torch.device(task.device)
    if not torch.cuda.is_available():
        print(f"parsyn trainer: warning: the task asks for device {task.device} but torch sees no CUDA device "
              f"(torch {torch.__version__}); training on the CPU", file=sys.stderr)
        return torch.device("cpu")
    device = torch.device(task.device)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise TaskError("invalid_argument", f"device {task.device}: this machine has {torch.cuda.device_count()} "
                                            "CUDA device(s); start the worker with another --device")
    return device
