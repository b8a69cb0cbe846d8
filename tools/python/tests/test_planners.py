"""Planner reference points of runtime/sparse_nvfp4/README.md ("Chunks, splits, head tiles"), through
the upstream helper names."""
from __future__ import annotations

import pytest

import kiln
from conftest import cuda

num_chunks = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks
plan_splits = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits
plan_head_tiles = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles
scratch_bytes = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_scratch_bytes


def test_chunks_and_scratch():
    assert num_chunks(1) == 1 and num_chunks(64) == 1 and num_chunks(65) == 2
    assert num_chunks(2048, 128) == 34 and num_chunks(topk=512, extra_topk=1) == 9
    # T*H*chunks*(512*2 + 4) + T*H*4 + 48
    assert scratch_bytes(2, 64, 512) == 2 * 64 * 8 * 1028 + 2 * 64 * 4 + 48


# The spec's reference points: 188 SMs, one head tile.
@pytest.mark.parametrize("tokens,heads,topk,max_splits,want", [
    (1, 8, 128, 16, (1, 2)), (128, 128, 128, 16, (1, 2)), (1, 16, 512, 16, (8, 1)), (8, 128, 512, 16, (2, 4)),
    (8, 8, 512, 16, (4, 2)), (128, 128, 512, 16, (1, 8)), (4, 128, 512, 1, (1, 8))])
def test_plan_splits_reference_points(tokens, heads, topk, max_splits, want):
    assert plan_splits(num_tokens=tokens, num_heads=heads, topk=topk, num_sms=188, max_splits=max_splits) == want


def test_plan_splits_limits():
    # More than 1024 candidates always split: 2048 + 128 are 34 chunks, at most 16 per block.
    assert plan_splits(num_tokens=512, num_heads=128, topk=2048, extra_topk=128, num_sms=132)[0] >= 3
    with pytest.raises(kiln.InvalidArgumentError):
        plan_splits(num_tokens=1, num_heads=64, topk=2048, extra_topk=128, num_sms=132, max_splits=2)


# Derived by hand from the spec's head-tile rule (ctas = T*H/16; third = sms/3, two_thirds = 2*sms/3).
@pytest.mark.parametrize("tokens,heads,topk,sms,want", [
    (64, 128, 2048, 132, 2),  # ctas 512 >= 132
    (1, 64, 512, 132, 1),     # ctas 4 < third 44
    (16, 64, 512, 132, 2),    # H 64: chunks 8, 44 <= ctas 64 < 88
    (64, 64, 512, 132, 2),    # ctas 256: a full wave
    (4, 48, 2048, 132, 1),    # H % 32 != 0
    (32, 128, 128, 48, 1),    # small die: 2 chunks, H > 32, ctas 256 > 96
    (32, 32, 128, 48, 2),     # small die, H = 32: ctas 64 >= 48
])
def test_plan_head_tiles(tokens, heads, topk, sms, want):
    assert plan_head_tiles(num_tokens=tokens, num_heads=heads, topk=topk, num_sms=sms) == want


def test_zero_tokens_resolve_like_the_planners():
    # T == 0: the launcher's plan, without a GPU, equals the planner functions' answer.
    plan = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_decode(
        cuda((0, 64, 512), "bfloat16"), cuda((4, 64, 384), "uint8"), cuda((0, 2048), "int32"),
        cuda((0, 64, 512), "bfloat16"), cuda((0, 64), "float32"), 0.04, mid_out=cuda((0, 64, 32, 512), "bfloat16"),
        mid_lse=cuda((0, 64, 32), "float32"))
    tiles = plan_head_tiles(num_tokens=0, num_heads=64, topk=2048, num_sms=132)
    splits = plan_splits(num_tokens=0, num_heads=64, topk=2048, num_sms=132, head_tiles=tiles)
    assert plan == {"head_tiles": tiles, "num_splits": splits[0], "chunks_per_block": splits[1]}
