"""The one exception hierarchy of gridbench.

Every error says what failed, for which cell or file, and what to do next: ``hint`` is
printed on its own line by the CLI.
"""

from __future__ import annotations


class GridbenchError(Exception):
    """Base of every error gridbench raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  what to do: {self.hint}"


class ConfigError(GridbenchError):
    """The grid configuration is invalid: nothing was started."""

    exit_code = 2


class EngineError(GridbenchError):
    """An engine could not be started, became unhealthy or died."""

    def __init__(self, message: str, *, hint: str | None = None, log_tail: str = "") -> None:
        super().__init__(message, hint=hint)
        self.log_tail = log_tail

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n--- engine log tail ---\n{self.log_tail}" if self.log_tail else text


class ImageNotFoundError(EngineError):
    """The engine image is not present locally; gridbench never pulls at run time."""


class EngineStartError(EngineError):
    """The engine exited, or logged a fatal pattern, before it became ready."""


class EngineTimeoutError(EngineError):
    """The engine did not become ready within its start-up timeout."""


class EngineDiedError(EngineError):
    """The engine stopped while a cell was measuring."""


class EngineDeadlineError(EngineError):
    """The sweep's deadline comes before the engine would be ready: it was not started."""


class PortInUseError(EngineError):
    """The engine's port is taken by something gridbench did not start."""


class SlotBusyError(EngineError):
    """Another sweep holds the engine slot (GPU) and did not release it in time."""


class BenchmarkError(GridbenchError):
    """The load generator failed, hung, or produced a result that does not count."""


class DiskFullError(GridbenchError):
    """A result could not be written: the filesystem that holds it is full."""


class ResultFileError(GridbenchError):
    """A raw result file is malformed or foreign."""


class DraftStepError(GridbenchError):
    """A step of a draft head's recipe failed (gridbench.drafts)."""
