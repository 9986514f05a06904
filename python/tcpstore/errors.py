"""Typed exceptions for tcpstore, one per C API status code (tcpstore.h)."""


class StoreError(RuntimeError):
    """Base class: every error raised by tcpstore.Client.

    ``code`` is the C API status (TCPSTORE_E_*), ``name`` its name.
    Subclass of RuntimeError, like torch's store errors.
    """

    code = -1
    name = "error"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class StoreTimeout(StoreError, TimeoutError):
    code, name = 1, "timeout"


class ConnectionRefused(StoreError, ConnectionRefusedError):
    code, name = 2, "refused"


class ConnectionClosed(StoreError, ConnectionError):
    code, name = 3, "closed"


class StoreIOError(StoreError, OSError):
    code, name = 4, "io error"


class ProtocolError(StoreError):
    code, name = 5, "protocol error"


class LimitExceeded(StoreError):
    code, name = 6, "limit exceeded"


class InvalidArgument(StoreError, ValueError):
    code, name = 7, "invalid argument"


class NotSupported(StoreError, NotImplementedError):
    code, name = 8, "not supported"


class NotFound(StoreError, KeyError):
    code, name = 9, "not found"

    def __str__(self):  # KeyError would quote the message
        return RuntimeError.__str__(self)


class JoinError(StoreError):
    """A job's join did not complete: ``missing`` lists the absent ranks."""

    name = "join failed"

    def __init__(self, message, missing=(), job=None):
        super().__init__(message)
        self.missing = list(missing)
        self.job = job


class JobConflict(StoreError):
    """Another live job already uses this job id's keys."""

    name = "job conflict"


_BY_CODE = {
    cls.code: cls
    for cls in (StoreTimeout, ConnectionRefused, ConnectionClosed, StoreIOError,
                ProtocolError, LimitExceeded, InvalidArgument, NotSupported, NotFound)
}


def error_for(code, message):
    """The exception for a C API status code (StoreError for unknown codes)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return StoreError(message, code)
    return cls(message)
