"""Write a Parsyn trainer in Python (docs/trainer-contract.md, version 1).

    from parsyn import trainer

    def train(task: trainer.Task) -> dict:
        ...                                         # read task.data, start from task.initial_weights
        trainer.report_progress(step, total, loss)  # each step; raises Stopped after SIGTERM
        trainer.save_update(task, weights)          # train tasks: exactly initial_weights' layout
        return {"num_samples": n, ...}              # checked, written to output.result, printed as `done`

    trainer.main(describe={"task_kinds": ["train", "evaluate"], "model_kinds": ["custom"]}, train=train)

See python/README.md for a complete example.
"""

from .data import Table, load_data, read_csv, read_jsonl, read_rows, split_indices
from .devices import torch_device
from .errors import NonFiniteLoss, Stopped, TaskError, UnsupportedContractVersion
from .outputs import (check_layout, check_result, load_initial_weights, load_initial_weights_torch,
                      save_update)
from .runner import done, fail, main, report_progress, run_task
from .state import current_task, stop_requested
from .task import (CONTRACT_VERSION, DEFAULT_CONFIG, Output, Schedule, SplitMix64, Step, Task, epoch_seed,
                   learning_rate_at, optimizer_steps, shuffled_indices)

__all__ = [
    "CONTRACT_VERSION", "DEFAULT_CONFIG", "NonFiniteLoss", "Output", "Schedule", "SplitMix64", "Step", "Stopped",
    "Table", "Task", "TaskError", "UnsupportedContractVersion", "check_layout", "check_result", "current_task", "done",
    "epoch_seed", "fail", "learning_rate_at", "load_data", "load_initial_weights", "load_initial_weights_torch", "main",
    "optimizer_steps", "read_csv", "read_jsonl", "read_rows", "report_progress", "run_task", "save_update",
    "shuffled_indices", "split_indices", "stop_requested", "torch_device",
]
