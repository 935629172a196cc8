"""User-facing errors. The command line prints these as one line, without a traceback."""

from __future__ import annotations


class LongrangeError(Exception):
    """Base class of errors caused by the user's input, files or configuration."""


class ConfigError(LongrangeError, ValueError):
    """A configuration field is unknown or has a bad value; the message names the field."""


class DataMissingError(LongrangeError, FileNotFoundError):
    """Expected data files are absent; the message names the path and how to obtain the data."""


class DataFormatError(LongrangeError, ValueError):
    """A data file is malformed; the message names the file and the line or sample at fault."""

    def __init__(self, message: str, path: object = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f", line {line}"
            where += ": "
        super().__init__(where + message)
        self.path = path
        self.line = line


class DiskWriteError(LongrangeError, OSError):
    """A file could not be written (no space left, a read-only file system, no permission); the
    message names the file and the reason, and nothing half-written is left behind."""

    def __init__(self, message: str, path: object = None, errno: int | None = None):
        super().__init__(message)
        self.path, self.errno = path, errno

    def adding(self, note: str) -> DiskWriteError:
        """The same error with ``note`` added to its message (e.g. the last good checkpoint)."""
        return DiskWriteError(f"{self}; {note}", self.path, self.errno)


class CheckpointError(LongrangeError):
    """A checkpoint is missing, unreadable, unsafe, or does not fit the model."""


class TrainingDivergedError(LongrangeError):
    """The loss or the parameters became non-finite; the message names the step, the value and the
    last good checkpoint."""


class Preempted(LongrangeError):
    """A run stopped on request (SIGTERM, SIGUSR1: a scheduler's preemption or time limit; SIGINT:
    Ctrl-C) after writing a checkpoint; ``--resume`` continues it exactly. Exit status
    :attr:`exit_code`."""

    #: The exit status of a preempted command (EX_TEMPFAIL: "try again"), for job scripts to requeue on.
    PREEMPTED_EXIT = 75
    #: The exit status after Ctrl-C (128 + SIGINT), as shells report an interrupted command.
    INTERRUPTED_EXIT = 130

    def __init__(self, step: int, total: int, signal: int | None = None):
        import signal as signals

        self.interrupted = signal == signals.SIGINT
        what = "interrupted (Ctrl-C)" if self.interrupted else "preempted"
        super().__init__(f"{what} at step {step} of {total}, its checkpoint written; `--resume` continues")
        self.step, self.total, self.signal = step, total, signal

    @property
    def exit_code(self) -> int:
        return self.INTERRUPTED_EXIT if self.interrupted else self.PREEMPTED_EXIT
