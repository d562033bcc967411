"""Transient store errors: which errors a later attempt may not meet, and bounded retries of them.

Object stores throttle (S3's 503 SlowDown comes in bursts of tens of seconds), answer 5xx, time
out and reset connections. Each client library (s3fs, gcsfs, adlfs) retries some of these for a
few seconds and then raises its own type, which is not damage: a file that failed to read under
throttling reads fine a minute later. :func:`is_transient` tells such errors from those a retry
cannot change (a corrupt file, a missing object, a refused credential), and
:func:`retry_transient` retries an idempotent call within a bounded time, logging each wait,
before it gives up with a retryable :class:`.errors.StoreUnavailableError`.

Writes are idempotent here only where retrying them cannot do harm (the same bytes to the same
name); a write whose outcome stays unknown is resolved by reading it back (:mod:`.files`).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

from airflow_provider_raybatch.pipeline.errors import ConfigError, StoreUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Environment variable: the longest a call is retried within a try, in seconds (0: not retried).
STORE_RETRY_ENV = "RAYBATCH_STORE_RETRY_S"
#: Two minutes on top of the client library's own retries (s3fs: ~45 s of SlowDown): longer than
#: the throttling bursts seen, short enough that a store outage fails the try for Airflow to retry.
DEFAULT_STORE_RETRY_S = 120.0
#: The longest wait between two attempts.
MAX_BACKOFF_S = 15.0

#: OS error numbers of failures a later attempt may not meet. s3fs maps 503 SlowDown and
#: ServiceUnavailable to EBUSY and 500 InternalError to EREMOTEIO.
_TRANSIENT_ERRNOS = {
    errno.EBUSY,
    getattr(errno, "EREMOTEIO", errno.EIO),
    errno.EAGAIN,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
    errno.ENETUNREACH,
    errno.EHOSTUNREACH,
}
#: HTTP statuses that a later request may not get.
_TRANSIENT_STATUSES = {408, 429, 500, 502, 503, 504}
#: Error codes of object stores (S3's, in botocore's ClientError) that mean "try again".
_TRANSIENT_CODES = {
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ServerBusy",
    "OperationTimedOut",
}
#: Exception classes of the client libraries (named, so that none needs importing) that are
#: connection failures or timeouts: botocore's, aiohttp's, azure-core's, google-auth's, fsspec's.
_TRANSIENT_CLASSES = {
    "HTTPClientError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ResponseParserError",
    "IncompleteRead",
    "ClientConnectionError",
    "ClientPayloadError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ServiceRequestError",
    "ServiceResponseError",
    "TransportError",
    "FSTimeoutError",
    "ServiceUnavailable",
    "TooManyRequests",
    "InternalServerError",
    "BadGateway",
    "GatewayTimeout",
}


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is one a later attempt may not meet."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_transient_one(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _is_transient_one(error: BaseException) -> bool:
    if isinstance(error, (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError)):
        return False
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
        return True
    if any(cls.__name__ in _TRANSIENT_CLASSES for cls in type(error).__mro__):
        return True
    for attribute in ("status", "status_code", "code"):
        value = getattr(error, attribute, None)
        if isinstance(value, int) and value in _TRANSIENT_STATUSES:
            return True
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code in _TRANSIENT_CODES or status in _TRANSIENT_STATUSES
    return False


def store_retry_seconds() -> float:
    """:data:`DEFAULT_STORE_RETRY_S`, or the value of :data:`STORE_RETRY_ENV`."""
    return seconds_from_env(STORE_RETRY_ENV, DEFAULT_STORE_RETRY_S)


def seconds_from_env(name: str, default: float) -> float:
    """The environment variable ``name`` as a number of seconds >= 0 (``default`` when unset).

    :raises ConfigError: a value that is not such a number, naming the variable.
    """
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return seconds


def retry_transient(call: Callable[[], T], what: str, *, budget_s: float | None = None) -> T:
    """``call()``, attempted again on transient errors with exponential backoff for up to
    ``budget_s`` seconds (default :func:`store_retry_seconds`).

    Other errors are raised as they are. Past the budget, raises :class:`StoreUnavailableError`
    (retryable) naming ``what`` and chained to the last error. Only for calls that may safely be
    made again: reads, deletes, and writes of the same bytes to the same name.

    :param what: what is being done, for the log and the error (e.g. ``"reading s3://b/in/x.parquet"``).
    """
    budget = store_retry_seconds() if budget_s is None else budget_s
    deadline = time.monotonic() + budget
    attempt = 0
    while True:
        try:
            return call()
        except Exception as e:
            if not is_transient(e):
                raise
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailableError(
                    f"{what}: the store kept failing for {budget:g} s ({attempt} attempt(s)): "
                    f"{type(e).__name__}: {e}. This try fails; a retry of the task resumes where it stopped "
                    f"({STORE_RETRY_ENV} sets how long a try waits)"
                ) from e
            # Full jitter: writers throttled together do not come back together.
            wait = min(left, random.uniform(0, min(MAX_BACKOFF_S, 0.5 * 2**attempt)))
            log.warning(
                "%s: transient store error (attempt %d): %s: %s; retrying in %.1f s",
                what,
                attempt,
                type(e).__name__,
                e,
                wait,
            )
            time.sleep(wait)
