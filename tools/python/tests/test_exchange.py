"""The binding's fast read of torch tensors through a DLPack C exchange table (`__dlpack_c_exchange_api__`),
without torch: a stand-in torch module whose Tensor type publishes a table built with ctypes. Each case
runs in its own interpreter, since the binding keeps the torch it was given for the life of the process."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_validation import driver_present

HERE = Path(__file__).resolve().parent

PRELUDE = textwrap.dedent('''
    import ctypes, math, sys, types
    sys.path.insert(0, HERE)
    import kiln
    from kiln import _native
    from conftest import _DLTensor, _DLDevice, _DLDataType, _DTYPES, _next_address

    torch = types.ModuleType("torch")

    class Dtype:
        def __init__(self, name):
            self.name = name
        def __str__(self):
            return "torch." + self.name

    for name in ("bfloat16", "float16", "float32", "float8_e4m3fn", "uint8", "int8", "int32", "int64"):
        setattr(torch, name, Dtype(name))

    class Tensor:
        """A stand-in torch.Tensor on cuda:0 at an address nobody allocated (never dereferenced)."""
        def __init__(self, shape, dtype, strides=None, data=None):
            self._shape = tuple(shape)
            self._dtype = dtype
            self._strides = tuple(strides) if strides else tuple(
                math.prod(self._shape[d + 1:]) for d in range(len(self._shape)))
            if data is None:
                data = _next_address[0]
                _next_address[0] += 1 << 26
            self._data = data
        dtype = property(lambda self: getattr(torch, self._dtype))
        shape = property(lambda self: self._shape)
        def get_device(self):
            return 0
        def stride(self):
            return self._strides
        def data_ptr(self):
            return self._data

    torch.Tensor = Tensor
    torch.nn = types.SimpleNamespace(Parameter=type("Parameter", (Tensor,), {}))
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0)

    calls = {"tensor": 0, "stream": 0}
    SKEW = 0  # bytes the table adds to every data pointer (0: an honest table)
    keep = []

    FROM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_DLTensor))
    STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))

    def from_py(obj, out):
        calls["tensor"] += 1
        t = ctypes.cast(obj, ctypes.py_object).value
        code, bits = _DTYPES.get(t._dtype, (10, 8))  # float8_e4m3fn: DLPack 1.1's code 10
        shape = (ctypes.c_int64 * len(t._shape))(*t._shape)
        strides = (ctypes.c_int64 * len(t._strides))(*t._strides)
        keep.extend([shape, strides])
        d = out.contents
        d.data, d.device, d.ndim = t._data + SKEW, _DLDevice(2, 0), len(t._shape)
        d.dtype = _DLDataType(code, bits, 1)
        d.shape, d.strides, d.byte_offset = shape, strides, 0
        return 0

    def stream(device_type, device_id, out):
        calls["stream"] += 1
        out[0] = None
        return 0

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]

    class Header(ctypes.Structure):
        _fields_ = [("version", Version), ("prev_api", ctypes.c_void_p)]

    class Api(ctypes.Structure):
        _fields_ = [("header", Header), ("allocator", ctypes.c_void_p), ("managed_from", ctypes.c_void_p),
                    ("managed_to", ctypes.c_void_p), ("dltensor_from", FROM), ("current_work_stream", STREAM)]

    api = Api(Header(Version(1, 3), None), None, None, None, FROM(from_py), STREAM(stream))
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    Tensor.__dlpack_c_exchange_api__ = new_capsule(ctypes.addressof(api), b"dlpack_exchange_api", None)

    def mla(**over):
        B, H = 2, 16
        a = dict(query=Tensor((B, 1, H, 576), "bfloat16"), kv_cache=Tensor((8, 64, 576), "bfloat16"),
                 workspace=Tensor((kiln.mla_workspace_size(H, 64, 512, 1, B),), "uint8"),
                 block_tables=Tensor((B, 8), "int32"), seq_lens=Tensor((B,), "int32"),
                 out=Tensor((B, 1, H, 512), "bfloat16"))
        a.update(over)
        _native.mla_decode(a["query"], a["kv_cache"], a["workspace"], 512, 64, a["block_tables"], a["seq_lens"], 512,
                           None, None, a["out"], 1.0, 1.0, "causal", "bfloat16", "exact")

    def message(**over):
        try:
            mla(**over)
        except kiln.Error as e:
            return str(e)
        raise AssertionError("no error")
''')


def run(body: str) -> None:
    script = f"HERE = {str(HERE)!r}\n" + PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# A call that passes validation would launch on the fake addresses on a machine with a GPU.
pytestmark = pytest.mark.skipif(driver_present(), reason="the stand-in tensors are only validated where no driver is")


def test_the_table_reads_tensors_after_its_first_read_agrees():
    run('''
        _native.init_torch(torch)
        # The first tensor is read both ways; from then on only through the table (and its stream).
        text = message(block_tables=Tensor((2, 8), "int32", strides=(4, 1)))
        assert "block_tables rows must not overlap" in text, text
        assert calls["tensor"] >= 6 and calls["stream"] >= 1, calls
        before = dict(calls)
        q = Tensor((2, 1, 16, 576), "bfloat16")
        text = message(query=q, out=Tensor((2, 1, 16, 512), "bfloat16", data=q._data))
        assert "out must not overlap query storage" in text, text
        assert calls["tensor"] - before["tensor"] == 6, (before, calls)  # every tensor of the call
        # Strides, dtypes and fp8 come through the table as they do through the attributes.
        text = message(block_tables=Tensor((2, 8), "int32", strides=(16, 2)))
        assert "block_tables must be contiguous within each row" in text, text
        text = message(kv_cache=Tensor((8, 64, 576), "float8_e4m3fn"))
        assert "same dtype" in text and "float8_e4m3fn" in text, text
        # nn.Parameter keeps the attribute path.
        n = calls["tensor"]
        text = message(query=torch.nn.Parameter((2, 1, 16, 500), "bfloat16"))
        assert "query last dimension must be 576, got 500" in text, text
        assert calls["tensor"] - n == 5, calls  # the other five tensors
    ''')


def test_a_table_that_disagrees_is_turned_off():
    run('''
        SKEW = 256
        _native.init_torch(torch)
        q = Tensor((2, 1, 16, 576), "bfloat16")
        text = message(query=q, out=Tensor((2, 1, 16, 512), "bfloat16", data=q._data + 64))
        # The skewed addresses were never used: the overlap is found at the attributes' addresses.
        assert "out must not overlap query storage" in text and hex(q._data + 64) in text, text
        assert calls["tensor"] == 1, calls  # read once (the check), then never again
        message(block_tables=Tensor((2, 8), "int32", strides=(4, 1)))
        assert calls["tensor"] == 1, calls
    ''')


def test_without_a_table_the_attributes_are_read():
    run('''
        del Tensor.__dlpack_c_exchange_api__
        _native.init_torch(torch)
        text = message(block_tables=Tensor((2, 8), "int32", strides=(4, 1)))
        assert "block_tables rows must not overlap" in text, text
        assert calls == {"tensor": 0, "stream": 0}, calls
    ''')


def test_the_older_integer_attribute_is_read_too():
    run('''
        del Tensor.__dlpack_c_exchange_api__
        Tensor.__c_dlpack_exchange_api__ = ctypes.addressof(api)
        _native.init_torch(torch)
        message(block_tables=Tensor((2, 8), "int32", strides=(4, 1)))
        before = calls["tensor"]
        text = message(block_tables=Tensor((2, 8), "int32", strides=(16, 2)))
        assert "block_tables must be contiguous within each row" in text, text
        assert calls["tensor"] - before == 6, calls
    ''')


def test_a_table_of_another_major_version_is_ignored():
    run('''
        api.header.version.major = 2
        _native.init_torch(torch)
        message(block_tables=Tensor((2, 8), "int32", strides=(4, 1)))
        assert calls["tensor"] == 0, calls
    ''')
