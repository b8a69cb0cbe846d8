"""kiln's exceptions: one class per kiln::Error code, each also a familiar Python exception.

Every error raised by kiln's C++ core arrives as a subclass of :class:`Error` carrying kiln's message
and details (``code``, ``key``, ``path``, ``log``); argument errors are also ``ValueError`` (and a
Python object that is not a tensor at all raises ``TypeError``), requests kiln does not implement are
also ``NotImplementedError``.
"""
from __future__ import annotations


class Error(Exception):
    """Base of every kiln error. ``code`` is kiln's error code name (``"invalid_argument"``, ...)."""

    code = "internal"

    def __init__(self, message: str, key: str = "", path: str = "", log: str = "") -> None:
        super().__init__(message)
        self.key = key or None    # the semantic or cache key involved, if any
        self.path = path or None  # the file or directory involved, if any
        self.log = log or None    # compiler log or driver message, if any


class InvalidArgumentError(Error, ValueError):
    """An argument breaks the contract (shape, dtype, stride, alignment, overlap, value)."""

    code = "invalid_argument"


class UnsupportedError(Error, NotImplementedError):
    """A valid request kiln does not implement (e.g. 256 heads, an fp16 output)."""

    code = "unsupported"


class CompileError(Error, RuntimeError):
    """NVRTC rejected a rendered kernel; ``log`` holds the compiler output."""

    code = "compile_failed"


class CacheCorruptError(Error, RuntimeError):
    """An on-disk cache entry failed its checks."""

    code = "cache_corrupt"


class CacheIOError(Error, OSError):
    """The cache directory could not be read or written."""

    code = "cache_io"


class DriverError(Error, RuntimeError):
    """The CUDA driver is missing or returned an error."""

    code = "driver"


class NotWarmError(Error, RuntimeError):
    """A launch inside CUDA graph capture needed a kernel that was not warmed; ``key`` names it."""

    code = "not_warm"


class SealedError(Error, RuntimeError):
    """The kernel service is sealed and refused to compile or load ``key``."""

    code = "sealed"


class NotFoundError(Error, LookupError):
    """A key, file or cache entry named by the caller does not exist."""

    code = "not_found"


class InternalError(Error, RuntimeError):
    """A bug in kiln."""

    code = "internal"


class NotPlannedError(Error, RuntimeError):
    """A plan/run wrapper was run before a successful ``plan()``. Raised by the Python layer only."""

    code = "not_planned"


_BY_CODE = {cls.code: cls for cls in (InvalidArgumentError, UnsupportedError, CompileError, CacheCorruptError,
                                       CacheIOError, DriverError, NotWarmError, SealedError, NotFoundError,
                                       InternalError)}


def from_native(code: str, message: str, key: str, path: str, log: str) -> Error:
    """The exception for a kiln::Error (called by kiln._native)."""
    return _BY_CODE.get(code, InternalError)(message, key, path, log)


__all__ = ["Error", "NotPlannedError", *(cls.__name__ for cls in _BY_CODE.values())]
