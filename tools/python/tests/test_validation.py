"""Arguments are checked by kiln (C++) through the Python layer, on views of CUDA memory that is never
touched, and errors arrive as kiln's exception classes with kiln's message."""
from __future__ import annotations

import ctypes

import pytest

import kiln
from conftest import cuda, have_torch, kDLCPU


def driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# Checks that get past validation would launch on fake addresses on a machine with a GPU.
no_driver = pytest.mark.skipif(driver_present(), reason="valid fake tensors would be launched on this GPU machine")


def mla_args(B=2, H=16, page=64, max_seq_len=512, **over):
    a = dict(query=cuda((B, 1, H, 576), "bfloat16"), kv_cache=cuda((8, page, 576), "bfloat16"),
             workspace_buffer=cuda((kiln.mla_workspace_size(H, page, max_seq_len, 1, B),), "uint8"),
             kv_lora_rank=512, qk_rope_head_dim=64, block_tables=cuda((B, 8), "int32"),
             seq_lens=cuda((B,), "int32"), max_seq_len=max_seq_len, out=cuda((B, 1, H, 512), "bfloat16"))
    a.update(over)
    return a


def mla(**over):
    return kiln.prims_ts_batch_decode_with_kv_cache_mla(**mla_args(**over))


def sparse_args(T=4, H=64, topk=512, **over):
    a = dict(q=cuda((T, H, 512), "bfloat16"), kv_cache=cuda((16, 64, 384), "uint8"), indices=cuda((T, topk), "int32"),
             output=cuda((T, H, 512), "bfloat16"), out_lse=cuda((T, H), "float32"), sm_scale=0.04)
    a.update(over)
    return a


def sparse(**over):
    return kiln.cake_sparse_mla_sm120_dsv4_nvfp4_decode(**sparse_args(**over))


def expect(error, names, call):
    with pytest.raises(error) as info:
        call()
    e = info.value
    assert isinstance(e, kiln.Error)
    assert str(e).startswith(f"kiln [{e.code}]: "), str(e)
    assert names in str(e), str(e)
    return e


@no_driver
def test_valid_mla_call_reaches_the_driver():
    e = expect(kiln.DriverError, "libcuda", mla)
    assert e.code == "driver" and isinstance(e, RuntimeError)


def test_mla_argument_errors():
    e = expect(kiln.InvalidArgumentError, "query", lambda: mla(query=cuda((2, 1, 16, 576), "float32")))
    assert isinstance(e, ValueError) and e.code == "invalid_argument"
    e = expect(kiln.UnsupportedError, "kv_lora_rank", lambda: mla(kv_lora_rank=256))
    assert isinstance(e, NotImplementedError) and e.code == "unsupported"
    expect(kiln.UnsupportedError, "query", lambda: mla(query=cuda((2, 1, 256, 576), "bfloat16")))
    expect(kiln.InvalidArgumentError, "mask_type", lambda: mla(mask_type="sliding"))
    expect(kiln.UnsupportedError, "out_dtype", lambda: mla(out_dtype="float16"))
    expect(kiln.InvalidArgumentError, "workspace_buffer", lambda: mla(workspace_buffer=cuda((16,), "uint8")))
    expect(kiln.InvalidArgumentError, "block_tables", lambda: mla(block_tables=cuda((2, 4), "int32")))
    expect(kiln.InvalidArgumentError, "max_seq_len_q", lambda: mla(qo_indptr=cuda((3,), "int32"),
                                                                    query=cuda((2, 16, 576), "bfloat16"),
                                                                    out=cuda((2, 16, 512), "bfloat16")))
    q = cuda((2, 1, 16, 576), "bfloat16")
    expect(kiln.InvalidArgumentError, "out", lambda: mla(query=q, out=cuda((2, 1, 16, 512), "bfloat16", data=q.data)))


def test_mla_precision_scope():
    expect(kiln.InvalidArgumentError, "precision", lambda: kiln.mla_precision("fp32").__enter__())
    # fp8 pages keep their one f16 P: the bf16 precision is refused for them (the policy is checked
    # before any driver call).
    expect(kiln.UnsupportedError, "precision",
           lambda: kiln.warm_mla(16, 64, 512, dtype="float8_e4m3fn", precision="bf16", devices=[0]))
    expect(kiln.InvalidArgumentError, "precision", lambda: kiln.warm_mla(16, 64, 512, precision="fast", devices=[0]))


def test_warm_checks_the_policy_before_asking_the_driver():
    # devices=None lists the GPUs, which needs the driver: a bad policy must be reported first, as bad input.
    expect(kiln.UnsupportedError, "heads", lambda: kiln.warm_mla(256, 64, 512))
    expect(kiln.InvalidArgumentError, "heads", lambda: kiln.warm_sparse(7, head_tiles=1, split=False))
    expect(kiln.InvalidArgumentError, "heads", lambda: kiln.warm_sparse_dsv41(7, split=False))
    expect(kiln.InvalidArgumentError, "page_size", lambda: kiln.warm_nvfp4_writer(0, ops="pack"))
    expect(kiln.InvalidArgumentError, "cannot parse semantic key 'nope'", lambda: kiln.warm_keys(["nope"]))
    # A single str is one op, format or key, not its letters: the words pass, and what is left is
    # the driver (here) or a successful warm (with a GPU).
    for call in (lambda: kiln.warm_nvfp4_writer(64, ops="pack"),
                 lambda: kiln.warm_dsv41_writer(formats="fp8", ops="append"),
                 lambda: kiln.warm_keys("nvfp4_writer:sm_90a:op=pack,page_size=64:b9d99c6ca8170019")):
        try:
            call()
        except kiln.DriverError:
            pass


def test_tensors_must_be_cuda_and_on_one_device():
    expect(kiln.InvalidArgumentError, "block_tables is on cuda:1 but query is on cuda:0",
           lambda: mla(block_tables=cuda((2, 8), "int32", device=1)))
    expect(kiln.InvalidArgumentError, "seq_lens: expected CUDA device memory",
           lambda: mla(seq_lens=cuda((2,), "int32", device_type=kDLCPU)))
    with pytest.raises(TypeError, match="block_tables: expected a CUDA tensor"):
        mla(block_tables=[[0] * 8] * 2)


@no_driver
def test_dlpack_export_uses_the_launch_stream():
    a = mla_args()
    with pytest.raises(kiln.DriverError):
        kiln.prims_ts_batch_decode_with_kv_cache_mla(**a)
    if not have_torch():
        assert a["query"].stream_seen == 1  # DLPack's code for the legacy default stream
    a = mla_args()
    with kiln.use_stream(0x1234):
        with pytest.raises(kiln.DriverError):
            kiln.prims_ts_batch_decode_with_kv_cache_mla(**a)
    assert a["query"].stream_seen == 0x1234 and a["out"].stream_seen == 0x1234


@pytest.mark.skipif(have_torch(), reason="with torch, out=None allocates with torch")
def test_mla_out_none_without_torch():
    expect(kiln.InvalidArgumentError, "out", lambda: mla(out=None))


@no_driver
def test_valid_sparse_call_reaches_the_driver():
    expect(kiln.DriverError, "libcuda", sparse)


def test_sparse_without_tokens_returns_the_plan_without_a_driver():
    plan = sparse(T=0)
    assert set(plan) == {"head_tiles", "num_splits", "chunks_per_block"}
    assert plan["num_splits"] * plan["chunks_per_block"] >= 8  # 512 candidates are 8 chunks


def test_sparse_argument_errors():
    expect(kiln.InvalidArgumentError, "indices", lambda: sparse(indices=cuda((4, 512), "int64")))
    expect(kiln.InvalidArgumentError, "mid_out", lambda: sparse(num_splits=4))
    expect(kiln.InvalidArgumentError, "head_tiles", lambda: sparse(H=48, q=cuda((4, 48, 512), "bfloat16"),
                                                                   output=cuda((4, 48, 512), "bfloat16"),
                                                                   out_lse=cuda((4, 48), "float32"), head_tiles=2))
    expect(kiln.InvalidArgumentError, "extra_kv_cache", lambda: sparse(extra_indices=cuda((4, 128), "int32")))
    expect(kiln.InvalidArgumentError, "out_lse", lambda: sparse(out_lse=cuda((4, 64), "bfloat16")))


def test_writer_argument_errors():
    expect(kiln.InvalidArgumentError, "latent",
           lambda: kiln.nvfp4_pack(cuda((4, 64, 512), "bfloat16"), cuda((8, 64, 384), "uint8")))
    expect(kiln.InvalidArgumentError, "slot_mapping",
           lambda: kiln.nvfp4_append(cuda((4, 512), "bfloat16"), cuda((5,), "int32"), cuda((8, 64, 384), "uint8")))
    expect(kiln.InvalidArgumentError, "rows",
           lambda: kiln.nvfp4_append(cuda((4, 448), "bfloat16"), cuda((4,), "int32"), cuda((8, 64, 384), "uint8")))


def test_error_classes():
    for code, cls, base in [("invalid_argument", kiln.InvalidArgumentError, ValueError),
                            ("unsupported", kiln.UnsupportedError, NotImplementedError),
                            ("not_warm", kiln.NotWarmError, RuntimeError), ("sealed", kiln.SealedError, RuntimeError),
                            ("not_found", kiln.NotFoundError, LookupError), ("cache_io", kiln.CacheIOError, OSError),
                            ("compile_failed", kiln.CompileError, RuntimeError), ("driver", kiln.DriverError, RuntimeError),
                            ("cache_corrupt", kiln.CacheCorruptError, RuntimeError),
                            ("internal", kiln.InternalError, RuntimeError)]:
        e = kiln.errors.from_native(code, "kiln [x]: m", "mla_decode:sm_90a:heads=16:0", "", "")
        assert type(e) is cls and isinstance(e, base) and isinstance(e, kiln.Error)
        assert e.code == code and e.key == "mla_decode:sm_90a:heads=16:0" and e.path is None


def test_workspace_sizes():
    # One request may split KV, so it needs scratch; the size is a pure function of the key and batch.
    assert kiln.mla_workspace_size(16, 64, 163840, 1, 1) > 0
    assert kiln.mla_workspace_size(16, 64, 163840, 1, 1) == kiln.mla_workspace_size(16, 64, 163840, 1, 1, mask_type="dense")
    assert kiln.mla_workspace_size(16, 64, 163840, 1, 0) == 0
    expect(kiln.UnsupportedError, "heads", lambda: kiln.mla_workspace_size(256, 64, 163840, 1, 1))
    expect(kiln.InvalidArgumentError, "dtype", lambda: kiln.mla_workspace_size(16, 64, 163840, 1, 1, dtype="complex"))
