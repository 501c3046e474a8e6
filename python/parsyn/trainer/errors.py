"""The ways a task ends other than `done`; the runner (parsyn.trainer.main) turns each into its event and exit code."""

from __future__ import annotations


class TaskError(Exception):
    """Ends the task with the `error` event {"code", "message"} and exit 1 (exit 4 when code is out_of_memory).

    `code` is a short snake_case word (invalid_argument, not_found, non_finite_loss, ...); `message` says what went
    wrong and what to do."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class UnsupportedContractVersion(TaskError):
    """The task file's contract_version is not one this package reads (1)."""

    def __init__(self, message: str):
        super().__init__("unsupported_contract_version", message)


class NonFiniteLoss(TaskError):
    """A loss reported through report_progress or in the result is NaN or infinite."""

    def __init__(self, message: str):
        super().__init__("non_finite_loss", message)


class Stopped(BaseException):
    """Raised by report_progress (and done) once SIGTERM or SIGINT arrived: the runner removes what the task wrote and
    exits 3. A BaseException, like KeyboardInterrupt, so that `except Exception` in a training loop does not swallow
    it."""
