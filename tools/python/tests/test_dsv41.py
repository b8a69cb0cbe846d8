"""The DeepSeek-V4.1 mixed-cache decode through the Python layer without torch: the companion
functions' reference points and refusals (runtime/sparse_dsv41/README.md), and the entry point's
host validation on views of CUDA memory that is never touched, each refusal with its upstream phrase."""
from __future__ import annotations

import ctypes
import math

import pytest

import kiln
from conftest import cuda, kDLCPU

P = "cake_sparse_mla_sm120_dsv41_mixed_"
num_chunks = getattr(kiln, P + "num_chunks")
plan_splits = getattr(kiln, P + "plan_splits")
plan_head_tiles = getattr(kiln, P + "plan_head_tiles")
scratch_bytes = getattr(kiln, P + "scratch_bytes")
supported_heads = getattr(kiln, P + "supported_heads")
format_info = getattr(kiln, P + "format_info")
decode = getattr(kiln, P + "decode")


def driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


no_driver = pytest.mark.skipif(driver_present(), reason="valid fake tensors would be launched on this GPU machine")


def test_num_chunks_reference_points():
    assert [num_chunks(128), num_chunks(1), num_chunks(130, 1), num_chunks(128, 512), num_chunks(0, 512),
            num_chunks(512, 1024)] == [2, 1, 4, 10, 8, 24]
    assert num_chunks(topk=64, extra_topk=65) == 3


def test_heads_head_tiles_and_scratch():
    assert supported_heads() == (8, 16, 32, 48, 64, 80, 96, 112, 128)
    for h in supported_heads():
        assert plan_head_tiles(num_tokens=1, num_heads=h, topk=1, num_sms=1) == (2 if h >= 32 else 1)
        assert plan_head_tiles(num_tokens=512, num_heads=h, topk=2048, extra_topk=512, num_sms=188) == (2 if h >= 32 else 1)
    with pytest.raises(ValueError, match="num_sms"):
        plan_head_tiles(num_tokens=1, num_heads=64, topk=128, num_sms=0)
    assert scratch_bytes(2, 64, 128, 512) == 2 * 64 * 10 * (512 * 2 + 4) + 2 * 64 * 4 + 48
    assert scratch_bytes(num_tokens=0, num_heads=8, topk=1) == 48


# (sms, T, H, topk, extra_topk, options) -> (num_splits, chunks_per_block); head_tiles from
# plan_head_tiles unless an option names it.
REFERENCE = [
    (188, 1, 64, 128, 512, {}, (10, 1)), (188, 8, 64, 128, 512, {}, (10, 1)), (188, 32, 64, 128, 512, {}, (3, 4)),
    (188, 32, 64, 128, 512, {"ragged": True}, (4, 3)), (188, 64, 64, 128, 512, {}, (1, 10)),
    (188, 128, 64, 128, 512, {}, (2, 5)), (188, 8, 8, 128, 512, {}, (10, 1)), (188, 32, 8, 128, 512, {}, (5, 2)),
    (188, 128, 8, 128, 512, {}, (1, 10)), (188, 8, 128, 128, 512, {}, (5, 2)), (188, 32, 128, 128, 512, {}, (1, 10)),
    (188, 8, 64, 128, 0, {}, (2, 1)), (188, 32, 64, 128, 0, {}, (1, 2)),
    (188, 1, 8, 128, 0, {"head_tiles": 1}, (2, 1)), (188, 18, 8, 128, 0, {"head_tiles": 1}, (2, 1)),
    (188, 19, 8, 128, 0, {"head_tiles": 1}, (1, 2)), (188, 1, 8, 128, 0, {"head_tiles": 1, "max_splits": 1}, (1, 2)),
    (188, 128, 128, 128, 0, {"head_tiles": 1}, (1, 2)), (188, 1, 16, 512, 0, {"head_tiles": 1}, (8, 1)),
    (188, 16, 16, 512, 0, {"head_tiles": 1}, (8, 1)), (188, 32, 16, 512, 0, {"head_tiles": 1}, (4, 2)),
    (188, 64, 16, 512, 0, {"head_tiles": 1}, (3, 3)), (188, 128, 16, 512, 0, {"head_tiles": 1}, (1, 8)),
    (188, 256, 16, 512, 0, {"head_tiles": 1}, (2, 4)), (188, 4, 128, 512, 0, {"head_tiles": 1, "max_splits": 1}, (1, 8)),
    (170, 32, 64, 128, 512, {}, (3, 4)), (170, 32, 64, 128, 512, {"ragged": True}, (3, 4)),
    (170, 128, 64, 128, 512, {}, (3, 4)), (170, 128, 128, 128, 512, {}, (3, 4)),
    (170, 8, 128, 512, 0, {"head_tiles": 2}, (4, 2)), (170, 256, 16, 512, 0, {}, (3, 3)), (170, 512, 16, 512, 0, {}, (3, 3)),
    (48, 1, 64, 128, 512, {"unified_memory": True}, (5, 2)), (48, 8, 64, 128, 512, {"unified_memory": True}, (2, 5)),
    (48, 1, 16, 512, 0, {"unified_memory": True}, (4, 2)), (48, 8, 16, 512, 0, {"unified_memory": True}, (2, 4)),
    (48, 32, 16, 512, 0, {"unified_memory": True}, (1, 8)), (48, 48, 16, 512, 0, {"unified_memory": True}, (1, 8)),
    (48, 49, 16, 512, 0, {"unified_memory": True}, (2, 4)), (48, 64, 16, 512, 0, {"unified_memory": True}, (2, 4)),
    (48, 65, 16, 512, 0, {"unified_memory": True}, (1, 8)), (48, 1, 8, 128, 0, {"unified_memory": True}, (1, 2)),
]


@pytest.mark.parametrize("sms,tokens,heads,topk,extra,options,want", REFERENCE)
def test_plan_splits_reference_points(sms, tokens, heads, topk, extra, options, want):
    options = dict(options)
    options.setdefault("head_tiles", plan_head_tiles(num_tokens=tokens, num_heads=heads, topk=topk, extra_topk=extra,
                                                     num_sms=sms))
    assert plan_splits(num_tokens=tokens, num_heads=heads, topk=topk, extra_topk=extra, num_sms=sms, **options) == want


def test_plan_splits_refusals():
    with pytest.raises(ValueError, match="num_sms"):
        plan_splits(num_tokens=1, num_heads=64, topk=128, num_sms=0)
    with pytest.raises(ValueError, match="head_tiles"):
        plan_splits(num_tokens=1, num_heads=64, topk=128, num_sms=188, head_tiles=4)
    with pytest.raises(ValueError, match="at least one candidate"):
        plan_splits(num_tokens=1, num_heads=64, topk=0, num_sms=188)
    with pytest.raises(ValueError, match=r"splits \(at most 16 chunks per block\), max_splits=1"):
        plan_splits(num_tokens=1, num_heads=64, topk=1024, extra_topk=1024, num_sms=188, max_splits=1)


def test_format_info():
    info = format_info()
    assert info["query_dim"] == info["value_dim"] == 512
    assert (info["main_bytes_per_token"], info["main_data_bytes"], info["main_scale_bytes"],
            info["main_scale_group"]) == (528, 512, 16, 32)
    assert (info["extra_bytes_per_token"], info["extra_data_bytes"], info["extra_scale_bytes"],
            info["extra_scale_group"]) == (288, 256, 32, 16)
    assert info["chunk_width"] == info["extra_chunk_width"] == 64
    assert (info["heads_per_block"], info["max_chunks_per_block"]) == (16, 16)
    assert info["heads"] == supported_heads()
    assert info["two_tile_heads"] == (32, 48, 64, 80, 96, 112, 128)
    assert info["compute_precisions"] == ("bf16",) and info["default_compute_precision"] == "bf16"
    assert info["variants"] == ("default", "sm90")
    assert info["runtime_page"] is True and info["runtime_extra_page"] is True
    assert isinstance(info["kernels_available"], bool)
    if not driver_present():
        assert info["kernels_available"] is False
    assert info["kernel_commit"].startswith("kiln-")


def args(T=4, H=64, topk=128, **over):
    a = dict(q=cuda((T, H, 512), "bfloat16"), kv_cache=cuda((16, 64, 528), "uint8"), indices=cuda((T, topk), "int32"),
             output=cuda((T, H, 512), "bfloat16"), out_lse=cuda((T, H), "float32"), sm_scale=512 ** -0.5)
    a.update(over)
    return a


def run(**over):
    return decode(**args(**over))


def refused(error, phrase, **over):
    with pytest.raises(error) as info:
        run(**over)
    assert isinstance(info.value, kiln.Error)
    assert phrase in str(info.value), str(info.value)
    return info.value


def test_zero_tokens_return_the_plan_without_a_driver():
    plan = run(T=0, extra_kv_cache=cuda((64, 2, 288), "uint8"), extra_indices=cuda((0, 512), "int32"))
    assert plan == {"variant": "default", "head_tiles": 1, "num_splits": 10, "chunks_per_block": 1, "precision": 0}
    plan = run(T=0, variant="sm90", compute_precision="default")
    assert plan == {"variant": "sm90", "head_tiles": 2, "num_splits": 2, "chunks_per_block": 1, "precision": 0}


@no_driver
def test_a_valid_call_reaches_the_driver():
    with pytest.raises(kiln.DriverError):
        run(mid_out=cuda((4, 64, 2, 512), "bfloat16"), mid_lse=cuda((4, 64, 2), "float32"))


def test_refusals_carry_upstream_phrases():
    e = refused(kiln.InvalidArgumentError, "query heads", H=24)
    assert isinstance(e, ValueError)
    refused(ValueError, "q must be [T, H, 512]", q=cuda((4, 64, 576), "bfloat16"))
    refused(ValueError, "contiguous CUDA bfloat16", q=cuda((4, 64, 512), "float16"))
    refused(ValueError, "output must be", output=cuda((4, 32, 512), "bfloat16"))
    refused(ValueError, "out_lse must be", out_lse=cuda((4, 64), "bfloat16"))
    refused(ValueError, "int32", indices=cuda((4, 128), "int64"))
    refused(ValueError, "rows", indices=cuda((3, 128), "int32"))
    refused(ValueError, "at least one slot", indices=cuda((4, 0), "int32"))
    refused(ValueError, "528", kv_cache=cuda((16, 64, 384), "uint8"))
    refused(ValueError, "multiple of 528", kv_cache=cuda((16, 64 * 384), "uint8"))
    refused(ValueError, "288", extra_kv_cache=cuda((16, 64, 528), "uint8"), extra_indices=cuda((4, 512), "int32"))
    refused(ValueError, "multiple of 288", extra_kv_cache=cuda((16, 1000), "uint8"), extra_indices=cuda((4, 512), "int32"))
    refused(ValueError, "singleton", kv_cache=cuda((16, 2, 32, 528), "uint8"))
    refused(ValueError, "packed", kv_cache=cuda((16, 64, 528), "uint8", strides=(64 * 544, 544, 1)))
    refused(ValueError, "contiguous", kv_cache=cuda((16, 64, 528), "uint8", strides=(64 * 528 * 2, 528 * 2, 2)))
    refused(ValueError, "rank", kv_cache=cuda((16 * 64 * 528,), "uint8"))
    refused(ValueError, "at least one page", kv_cache=cuda((0, 64, 528), "uint8"))
    refused(ValueError, "smaller than", kv_cache=cuda((16, 64, 528), "uint8", strides=(63 * 528, 528, 1)))
    refused(ValueError, "multiple of 16", kv_cache=cuda((16, 61, 528), "uint8", strides=(61 * 528 + 8, 528, 1)))
    refused(ValueError, "CUDA tensor", kv_cache=cuda((16, 64, 528), "uint8", device_type=kDLCPU))
    refused(ValueError, "torch.uint8", kv_cache=cuda((16, 64, 528), "int8"))
    refused(ValueError, "16-byte aligned", kv_cache=cuda((16, 64, 528), "uint8", data=0x7E0000000008))
    refused(ValueError, "provided together", extra_kv_cache=cuda((16, 2, 288), "uint8"))
    refused(ValueError, "provided together", extra_indices=cuda((4, 512), "int32"))
    refused(ValueError, "requires extra_indices", extra_topk_length=cuda((4,), "int32"))
    refused(ValueError, "1-D int32 tensor with at least", topk_length=cuda((3,), "int32"))
    refused(ValueError, "1-D float32 tensor with at least", attn_sink=cuda((64,), "bfloat16"))
    refused(ValueError, "compute_precision", compute_precision="fp16")
    refused(ValueError, "compute_precision", compute_precision=None)
    e = refused(kiln.UnsupportedError, "compute_precision", compute_precision="fp8")
    assert '("bf16",)' in str(e) and isinstance(e, NotImplementedError)
    refused(ValueError, "unknown exact variant", variant="ip+pw")
    refused(ValueError, "num_splits must be positive", num_splits=0)
    refused(ValueError, "at most", topk=1024, extra_kv_cache=cuda((16, 64, 288), "uint8"),
            extra_indices=cuda((4, 1024), "int32"), num_splits=1)
    # 2048 candidates split on every device, so missing scratch is refused before the driver.
    refused(ValueError, "mid_out", topk=1024, extra_kv_cache=cuda((16, 64, 288), "uint8"),
            extra_indices=cuda((4, 1024), "int32"))
    refused(ValueError, "mid_out must be", num_splits=2, mid_out=cuda((4, 64, 2, 512), "float32"),
            mid_lse=cuda((4, 64, 2), "float32"))
    refused(ValueError, "mid_lse must be", num_splits=2, mid_out=cuda((4, 64, 2, 512), "bfloat16"),
            mid_lse=cuda((4, 64, 3), "float32"))


def test_every_accepted_view_passes_validation():
    # T == 0 validates every argument and returns without a driver, whatever the view.
    for page in (1, 2, 53, 61, 64):
        for kv in (cuda((7, page * 528), "uint8"), cuda((7, page, 528), "uint8"), cuda((7, 1, page, 528), "uint8"),
                   cuda((7, page, 1, 528), "uint8"), cuda((7, page, 528), "uint8", strides=(page * 528 + 128, 528, 1))):
            for extra in (cuda((5, page * 288), "uint8"), cuda((5, 1, page, 288), "uint8")):
                plan = run(T=0, kv_cache=kv, extra_kv_cache=extra, extra_indices=cuda((0, 64), "int32"))
                assert plan["num_splits"] * plan["chunks_per_block"] >= math.ceil(128 / 64) + 1
