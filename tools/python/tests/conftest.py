"""Shared helpers: tensors that describe CUDA memory without any (kiln's host-side validation reads no
device memory, so views of addresses nobody allocated exercise it on a machine without a GPU)."""
from __future__ import annotations

import ctypes
import math
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]

# DLPack (v0.6+) structures and type codes.
kDLCPU, kDLCUDA = 1, 2
_DTYPES = {"bfloat16": (4, 16), "float16": (2, 16), "float32": (2, 32), "uint8": (1, 8), "int8": (0, 8),
           "int32": (0, 32), "int64": (0, 64)}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# Fake device addresses: 1 MiB apart, 256-byte aligned, never dereferenced.
_next_address = [0x7F0000000000]


class FakeCudaTensor:
    """A DLPack producer describing `shape` elements of `dtype` at an address no one allocated."""

    def __init__(self, shape, dtype, *, device=0, device_type=kDLCUDA, strides=None, data=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        if data is None:
            data = _next_address[0]
            nbytes = math.prod(self.shape) * _DTYPES[dtype][1] // 8
            _next_address[0] += max(1 << 20, (nbytes + (1 << 20)) & ~((1 << 20) - 1))
        self.data = data
        self.device = (device_type, device)
        self._shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        self._strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.stream_seen = "not exported"

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.stream_seen = stream
        code, bits = _DTYPES[self.dtype]
        managed = _DLManagedTensor()
        t = managed.dl_tensor
        t.data = self.data
        t.device = _DLDevice(*self.device)
        t.ndim = len(self.shape)
        t.dtype = _DLDataType(code, bits, 1)
        t.shape = self._shape
        t.strides = self._strides
        t.byte_offset = 0
        self._managed = managed  # alive as long as this object; no deleter needed
        return _PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)


def cuda(shape, dtype, **kwargs) -> FakeCudaTensor:
    return FakeCudaTensor(shape, dtype, **kwargs)


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


needs_torch = pytest.mark.skipif(not have_torch(), reason="torch is not installed (CI installs no torch: the torch "
                                                         "integration is tested on the GPU machine)")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh writable cache for the service (KILN_CACHE_DIR is read when the process's global
    service starts, so tests pass cache_dir explicitly)."""
    return tmp_path / "cache"
