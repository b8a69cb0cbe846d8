"""The DeepSeek-V4.1 cache writers through the Python package, without a GPU: kiln's checks run on
views of CUDA memory that is never touched, and each refusal carries upstream's phrase and names the
argument (runtime/dsv41_writer/README.md, "Errors")."""
from __future__ import annotations

import pytest

import kiln
from conftest import cuda, have_torch
from test_validation import expect, no_driver

PACK = {"fp8": kiln.dsv41_fp8_quantize_pack_sparse_mla_cache, "fp4": kiln.dsv41_fp4_quantize_pack_sparse_mla_cache}
APPEND = {"fp8": kiln.dsv41_fp8_quantize_append_sparse_mla_cache, "fp4": kiln.dsv41_fp4_quantize_append_sparse_mla_cache}
RECORD = {"fp8": 528, "fp4": 288}


@pytest.mark.parametrize("fmt", sorted(PACK))
def test_pack_checks_the_latent_before_allocating(fmt):
    pack = PACK[fmt]
    expect(kiln.InvalidArgumentError, "full-page pack requires a page dimension", lambda: pack(cuda((128, 512), "bfloat16")))
    expect(kiln.InvalidArgumentError, "kv_layout", lambda: pack(cuda((2, 64, 512), "bfloat16"), kv_layout="NDH"))
    expect(kiln.InvalidArgumentError, "float16", lambda: pack(cuda((2, 64, 512), "float32")))
    expect(kiln.InvalidArgumentError, "singleton", lambda: pack(cuda((2, 2, 32, 512), "float16")))
    expect(kiln.InvalidArgumentError, "512", lambda: pack(cuda((2, 64, 576), "bfloat16")))
    e = expect(kiln.InvalidArgumentError, "latent_kv", lambda: pack(cuda((2, 64, 512), "bfloat16", strides=(64 * 1024, 1024, 1))))
    assert "contiguous" in str(e)


@pytest.mark.skipif(have_torch(), reason="with torch, pack allocates its result and launches")
@pytest.mark.parametrize("fmt", sorted(PACK))
def test_pack_of_a_valid_latent_needs_torch_to_allocate(fmt):
    expect(kiln.InvalidArgumentError, "allocating one needs torch", lambda: PACK[fmt](cuda((2, 1, 61, 512), "float16"), kv_layout="NHD"))


def test_pack_shape_by_layout_and_format():
    import kiln._native as native

    assert native.dsv41_pack_shape("fp8", cuda((3, 61, 512), "bfloat16"), "HND") == (3, 1, 61, 528)
    assert native.dsv41_pack_shape("fp4", cuda((3, 61, 1, 512), "float16"), "NHD") == (3, 61, 1, 288)
    assert native.dsv41_pack_shape("fp4", cuda((3, 1, 61, 512), "float16"), "HND") == (3, 1, 61, 288)
    expect(kiln.InvalidArgumentError, "format", lambda: native.dsv41_pack_shape("fp6", cuda((3, 61, 512), "bfloat16"), "HND"))


@pytest.mark.parametrize("fmt", sorted(APPEND))
def test_append_argument_errors(fmt):
    append, rec = APPEND[fmt], RECORD[fmt]
    rows, slots, cache = cuda((10, 512), "bfloat16"), cuda((10,), "int64"), cuda((4, 1, 64, rec), "uint8")
    other = RECORD["fp4" if fmt == "fp8" else "fp8"]
    expect(kiln.InvalidArgumentError, str(rec), lambda: append(rows, slots, cuda((4, 64, other), "uint8")))
    expect(kiln.InvalidArgumentError, f"multiple of {rec}", lambda: append(rows, slots, cuda((4, 64 * rec + 16), "uint8")))
    expect(kiln.InvalidArgumentError, "singleton", lambda: append(rows, slots, cuda((4, 2, 32, rec), "uint8")))
    expect(kiln.InvalidArgumentError, "packed", lambda: append(rows, slots, cuda((4, 64, rec), "uint8", strides=(64 * (rec + 16), rec + 16, 1))))
    expect(kiln.InvalidArgumentError, "smaller than", lambda: append(rows, slots, cuda((4, 64, rec), "uint8", strides=(63 * rec, rec, 1))))
    expect(kiln.InvalidArgumentError, "multiple of 16", lambda: append(rows, slots, cuda((4, 61, rec), "uint8", strides=(61 * rec + 8, rec, 1))))
    expect(kiln.InvalidArgumentError, "at least one page", lambda: append(rows, slots, cuda((0, 64, rec), "uint8")))
    expect(kiln.InvalidArgumentError, "torch.uint8", lambda: append(rows, slots, cuda((4, 64, rec), "int8")))
    expect(kiln.InvalidArgumentError, "16-byte aligned", lambda: append(rows, slots, cuda((4, 64, rec), "uint8", data=0x7E0000000008)))
    expect(kiln.InvalidArgumentError, "int32 or int64", lambda: append(rows, cuda((10,), "float32"), cache))
    expect(kiln.InvalidArgumentError, "slot_mapping", lambda: append(rows, cuda((9,), "int32"), cache))
    expect(kiln.InvalidArgumentError, "latent_kv", lambda: append(cuda((10, 512), "float32"), slots, cache))


@pytest.mark.parametrize("fmt", sorted(APPEND))
def test_empty_append_launches_nothing(fmt):
    # No rows: validated, then no launch and no driver call (there is none on this machine).
    rec = RECORD[fmt]
    assert APPEND[fmt](cuda((0, 512), "float16"), cuda((0,), "int32"), cuda((2, 64 * rec), "uint8")) is None


@no_driver
@pytest.mark.parametrize("fmt", sorted(APPEND))
def test_valid_append_reaches_the_driver(fmt):
    rec = RECORD[fmt]
    for cache in (cuda((4, 1, 61, rec), "uint8"), cuda((4, 61, 1, rec), "uint8"), cuda((4, 61, rec), "uint8"),
                  cuda((4, 61 * rec), "uint8"), cuda((4, 61, rec), "uint8", strides=(61 * rec + 128, rec, 1))):
        e = expect(kiln.DriverError, "libcuda", lambda: APPEND[fmt](cuda((5, 512), "float16"), cuda((5,), "int32"), cache))
        assert e.code == "driver"


def test_warm_dsv41_writer_checks_its_words():
    expect(kiln.InvalidArgumentError, "format", lambda: kiln.warm_dsv41_writer(formats=("fp16",), devices=[0]))
    expect(kiln.InvalidArgumentError, "op", lambda: kiln.warm_dsv41_writer(ops=("scatter",), devices=[0]))


def test_default_manifest_lists_the_four_writer_keys_per_arch():
    keys = [k for k in kiln.manifest_keys(None) if k.startswith("dsv41_writer:")]
    for arch in ("sm_90a", "sm_120a"):
        mine = sorted(k.split(":")[2] for k in keys if k.split(":")[1] == arch)
        assert mine == ["format=fp4,op=append", "format=fp4,op=pack", "format=fp8,op=append", "format=fp8,op=pack"]
