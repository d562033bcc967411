"""Errors raised by the pipeline; each message names the path, column, stage or setting at fault."""


class RayBatchError(Exception):
    """Base class of the provider's own errors."""


class ConfigError(RayBatchError):
    """A setting is invalid (paths, predictor, resources); raised before any model loads."""


class InputError(RayBatchError):
    """The input cannot be read as asked: missing path, unreadable file, missing column."""


class InputChangedError(InputError):
    """The input differs from the one the output's ranges were planned on."""


class StageError(RayBatchError):
    """A stage returned something that cannot be written (wrong type or row count)."""


class TooManyErrorsError(RayBatchError):
    """More rows failed in a model than ``max_error_fraction`` allows.

    The failed rows are committed to the rejects with their errors, so a retry of the same
    output would count the same errors and fail the same way: fix the cause, then rerun with
    ``mode="overwrite"``.
    """
