"""Parity with FlashInfer's current Python surface for the two APIs (upstream's
flashinfer/attention/prims_ts/mla_decode.py and flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py):
the renamed functions and the wrapper's signatures, upstream's phrase inside every refusal both make,
and the validating path, all on a machine without a GPU (fake CUDA tensors, host metadata)."""
from __future__ import annotations

import inspect

import pytest

import kiln
from conftest import FakeCudaTensor, cuda, have_torch
from test_signatures import default_source, expected
from test_validation import mla, sparse

# Upstream's signatures as its source spells them (torch.dtype defaults compared only with torch).
UPSTREAM = {
    "prims_ts_batch_mla_decode_with_kv_cache":
        "query: Tensor, kv_cache: Tensor, workspace_buffer: Tensor, kv_lora_rank: int, qk_rope_head_dim: int, "
        "block_tables: Tensor, seq_lens: Tensor, max_seq_len: int, *, qo_indptr: Tensor | None = None, "
        "max_seq_len_q: int | None = None, out: Tensor | None = None, bmm1_scale: float = 1.0, "
        "bmm2_scale: float = 1.0, mask_type: Literal['dense', 'causal'] = 'causal', "
        "out_dtype: dtype = torch.bfloat16) -> Tensor",
    "get_prims_ts_batch_mla_decode_workspace_size":
        "batch_size: int, num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, page_size: int, "
        "max_seq_len: int, *, seq_len_q: Optional[int] = None, max_seq_len_q: Optional[int] = None, "
        "q_dtype: dtype = torch.bfloat16, kv_dtype: Optional[dtype] = None, out_dtype: dtype = torch.bfloat16, "
        "mask_type: Literal['dense', 'causal'] = 'causal', device: Any = None) -> int",
    "batch_mla_decode_with_paged_kv_cache":
        "query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, *, "
        "qo_indptr: Optional[Tensor] = None, max_seq_len_q: Optional[int] = None, kv_lora_rank: int = 512, "
        "qk_rope_head_dim: int = 64, mask_type: Literal['dense', 'causal'] = 'causal', "
        "max_kv_len: Optional[int] = None, bmm1_scale: float = 1.0, bmm2_scale: float = 1.0, "
        "out: Optional[Tensor] = None, out_dtype: dtype = torch.bfloat16) -> Tensor",
    "BatchMLADecodePagedTSWrapper.plan":
        "self, device: Any, batch_size: int, num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, "
        "page_size: int, max_kv_len: int, *, max_seq_len_q: int, packed_query: bool, q_data_type: dtype, "
        "kv_data_type: dtype, o_data_type: dtype, mask_type: Literal['dense', 'causal'] = 'causal', "
        "workspace_buffer: Optional[Tensor] = None) -> None",
    "BatchMLADecodePagedTSWrapper.run":
        "self, query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, *, "
        "qo_indptr: Optional[Tensor] = None, bmm1_scale: float = 1.0, bmm2_scale: float = 1.0, "
        "out: Optional[Tensor] = None, validate: bool = True) -> Tensor",
    "cake_sparse_mla_sm120_dsv4_nvfp4_format_info": ") -> dict",
    # flashinfer.mla's DeepSeek-V4.1 cache writers (docs: dsv41_fp8_quantize_pack_sparse_mla_cache and siblings).
    "dsv41_fp8_quantize_pack_sparse_mla_cache": "latent_kv: Tensor, *, kv_layout: str = 'HND') -> Tensor",
    "dsv41_fp4_quantize_pack_sparse_mla_cache": "latent_kv: Tensor, *, kv_layout: str = 'HND') -> Tensor",
    "dsv41_fp8_quantize_append_sparse_mla_cache": "latent_kv: Tensor, slot_mapping: Tensor, cache: Tensor) -> None",
    "dsv41_fp4_quantize_append_sparse_mla_cache": "latent_kv: Tensor, slot_mapping: Tensor, cache: Tensor) -> None",
}
# kiln's own keyword-only additions after upstream's parameters (documented in tools/python/README.md).
KILN_EXTRA = {"BatchMLADecodePagedTSWrapper.plan": ["precision"]}


def _resolve(name):
    obj = kiln
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _actual(fn):
    """[(name, kind, annotation, default)], return annotation; `self` left out."""
    import ast

    sig = inspect.signature(fn)
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional", inspect.Parameter.KEYWORD_ONLY: "keyword-only"}
    rows = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        annotation = ast.unparse(ast.parse(p.annotation, mode="eval"))
        default = None if p.default is inspect.Parameter.empty else default_source(p.default)
        rows.append((p.name, kinds[p.kind], annotation, default))
    return rows, ast.unparse(ast.parse(sig.return_annotation, mode="eval"))


def _rows_without_self(text):
    rows, ret = expected(text.replace("self, ", "self: Any, ", 1) if text.startswith("self") else text)
    return [r for r in rows if r[0] != "self"], ret


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_upstream_signature(name):
    want_rows, want_return = _rows_without_self(UPSTREAM[name])
    got_rows, got_return = _actual(_resolve(name))
    got_rows = [r for r in got_rows if r[0] not in KILN_EXTRA.get(name, [])]
    assert got_return == want_return
    # Optional[X] and X | None are the same annotation; compare names, kinds and defaults exactly.
    assert [r[:2] for r in got_rows] == [r[:2] for r in want_rows]
    for got, want in zip(got_rows, want_rows):
        if want[3] is not None and want[3].startswith("torch.") and not have_torch():
            continue
        assert got[3] == want[3], f"default of {got[0]}"


def test_kiln_extras_are_keyword_only_and_last():
    params = list(inspect.signature(kiln.BatchMLADecodePagedTSWrapper.plan).parameters.values())
    assert params[-1].name == "precision" and params[-1].kind is inspect.Parameter.KEYWORD_ONLY
    assert params[-1].default is None


def test_the_renamed_function_is_the_seed_function():
    # One callable under both names: the new name adds nothing to the per-call cost.
    assert kiln.prims_ts_batch_mla_decode_with_kv_cache is kiln.prims_ts_batch_decode_with_kv_cache_mla


def test_workspace_size_covers_fixed_and_packed():
    for batch, sq in ((1, 1), (8, 1), (64, 2), (132, 4)):
        want = max(kiln.mla_workspace_size(128, 64, 163840, sq, batch, packed=p) for p in (False, True))
        assert kiln.get_prims_ts_batch_mla_decode_workspace_size(batch, 128, 512, 64, 64, 163840,
                                                                  max_seq_len_q=sq) == want
        assert kiln.get_prims_ts_batch_mla_decode_workspace_size(batch, 128, 512, 64, 64, 163840,
                                                                  seq_len_q=sq) == want
    assert (kiln.get_prims_ts_batch_decode_mla_workspace_size(8, 16, 512, 64, 64, 4096)
            == kiln.get_prims_ts_batch_mla_decode_workspace_size(8, 16, 512, 64, 64, 4096))


def test_workspace_size_refusals_carry_upstream_phrases():
    with pytest.raises(ValueError, match="seq_len_q and max_seq_len_q must agree when both are provided"):
        kiln.get_prims_ts_batch_mla_decode_workspace_size(1, 16, 512, 64, 64, 4096, seq_len_q=1, max_seq_len_q=2)
    with pytest.raises(NotImplementedError, match="requires kv_lora_rank=512 and qk_rope_head_dim=64"):
        kiln.get_prims_ts_batch_mla_decode_workspace_size(1, 16, 256, 64, 64, 4096)


def test_format_info():
    info = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_format_info()
    assert set(info) == {"query_dim", "value_dim", "bytes_per_token", "chunk_width", "heads_per_block",
                         "max_chunks_per_block", "heads", "two_tile_heads", "runtime_page", "runtime_extra_page",
                         "kernel_commit", "prefill_heads", "prefill_head_tiles", "prefill_max_chunks",
                         "prefill_kernel_commit"}
    assert (info["query_dim"], info["value_dim"], info["bytes_per_token"]) == (512, 512, 384)
    assert info["chunk_width"] == 64 and info["heads_per_block"] == 16 and info["max_chunks_per_block"] == 16
    assert info["heads"] == kiln.cake_sparse_mla_sm120_dsv4_nvfp4_supported_heads() == tuple(range(8, 129, 8))
    assert info["two_tile_heads"] == (32, 64, 96, 128)
    assert info["prefill_heads"] == () and info["prefill_max_chunks"] == 0
    # The planners agree with the facts: chunk width 64, at most 16 chunks per block.
    assert kiln.cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks(65) == 2
    assert kiln.cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits(num_tokens=1, num_heads=64, topk=2048, num_sms=132,
                                                             max_splits=2) == (2, 16)


def test_every_listed_head_count_passes_the_launcher_head_check():
    # 24 heads is one upstream refuses and kiln serves: the refusal is not the head check.
    for heads in kiln.cake_sparse_mla_sm120_dsv4_nvfp4_format_info()["heads"]:
        args = dict(q=cuda((1, heads, 512), "bfloat16"), output=cuda((1, heads, 512), "bfloat16"),
                    out_lse=cuda((1, heads), "float32"), indices=cuda((1, 64), "int32"), num_splits=0)
        with pytest.raises(ValueError, match="num_splits must be positive"):
            sparse(**args)


# --- Refusals both make: (upstream's phrase, exception class upstream raises, the call) -------------------

def _overlapping(like_shape, dtype, other):
    return FakeCudaTensor(like_shape, dtype, data=other.data)


def _q():
    return cuda((2, 1, 16, 576), "bfloat16")


def _mla_overlap_out():
    q = _q()
    return mla(query=q, out=_overlapping((2, 1, 16, 512), "bfloat16", q))


def _mla_overlap_workspace():
    q = _q()
    size = kiln.mla_workspace_size(16, 64, 512, 1, 2)
    return mla(query=q, workspace_buffer=_overlapping((size,), "uint8", q))


def _packed(**over):
    a = dict(query=cuda((2, 16, 576), "bfloat16"), qo_indptr=cuda((3,), "int32"), out=cuda((2, 16, 512), "bfloat16"))
    a.update(over)
    return mla(**a)


PAIRS = [
    ("out must not overlap query storage", ValueError, _mla_overlap_out),
    ("workspace_buffer must not overlap query storage", ValueError, _mla_overlap_workspace),
    ("query must have shape [B, SQ, H, 576]", ValueError, lambda: mla(query=cuda((2, 16, 576), "bfloat16"))),
    ("query must have shape [total_q, H, 576]", ValueError,
     lambda: _packed(query=cuda((2, 1, 16, 576), "bfloat16"), max_seq_len_q=1)),
    ("query last dimension must be 576, got 512", ValueError,
     lambda: mla(query=cuda((2, 1, 16, 512), "bfloat16"))),
    ("MLA decode currently requires kv_lora_rank=512 and qk_rope_head_dim=64", NotImplementedError,
     lambda: mla(kv_lora_rank=256)),
    ("MLA decode currently supports BF16 output only", NotImplementedError, lambda: mla(out_dtype="float16")),
    ("MLA decode requires query and KV cache to use the same dtype", ValueError,
     lambda: mla(kv_cache=cuda((8, 64, 576), "float16"))),
    ("block_tables must have one row per request: expected 2, got 3", ValueError,
     lambda: mla(block_tables=cuda((3, 8), "int32"))),
    ("block_tables must be contiguous within each row", ValueError,
     lambda: mla(block_tables=cuda((2, 8), "int32", strides=(16, 2)))),
    ("block_tables rows must not overlap", ValueError,
     lambda: mla(block_tables=cuda((2, 8), "int32", strides=(4, 1)))),
    ("block_tables must have at least ceil(max_seq_len / page_size) columns (8), got 4", ValueError,
     lambda: mla(block_tables=cuda((2, 4), "int32"))),
    ("max_seq_len_q is required when qo_indptr selects packed query", ValueError, lambda: _packed()),
    ("qo_indptr must contain batch_size + 1 cumulative offsets: expected 3, got 4", ValueError,
     lambda: _packed(qo_indptr=cuda((4,), "int32"), max_seq_len_q=1)),
    ("fixed query length must equal max_seq_len_q: got SQ=1 and max_seq_len_q=2", ValueError,
     lambda: mla(max_seq_len_q=2)),
    ("q must be [T, H, 512], got", ValueError, lambda: sparse(q=cuda((4, 64, 256), "bfloat16"))),
    ("q must be a contiguous CUDA bfloat16 tensor", ValueError, lambda: sparse(q=cuda((4, 64, 512), "float16"))),
    ("query heads, got 12", ValueError, lambda: sparse(q=cuda((4, 12, 512), "bfloat16"))),
    ("output must be a contiguous bfloat16 tensor of shape (4, 64, 512)", ValueError,
     lambda: sparse(output=cuda((4, 64, 256), "bfloat16"))),
    ("out_lse must be a contiguous float32 tensor of shape (4, 64)", ValueError,
     lambda: sparse(out_lse=cuda((4, 32), "float32"))),
    ("extra_kv_cache and extra_indices must be provided together", ValueError,
     lambda: sparse(extra_kv_cache=cuda((16, 64, 384), "uint8"))),
    ("extra_topk_length requires extra_indices", ValueError,
     lambda: sparse(extra_topk_length=cuda((4,), "int32"))),
    ("indices must be a [num_tokens, topk] or [num_tokens, 1, topk] int32 tensor", ValueError,
     lambda: sparse(indices=cuda((4, 512), "int64"))),
    ("indices must have 4 rows, got 3", ValueError, lambda: sparse(indices=cuda((3, 512), "int32"))),
    ("indices must select at least one slot per token", ValueError, lambda: sparse(indices=cuda((4, 0), "int32"))),
    ("topk_length must be a 1-D int32 tensor with at least 4 entries", ValueError,
     lambda: sparse(topk_length=cuda((3,), "int32"))),
    ("attn_sink must be a 1-D float32 tensor with at least 64 entries", ValueError,
     lambda: sparse(attn_sink=cuda((32,), "float32"))),
    ("head_tiles=3 is not valid for 64 heads", ValueError, lambda: sparse(head_tiles=3)),
    ("head_tiles=2 is not valid for 48 heads", ValueError,
     lambda: sparse(q=cuda((4, 48, 512), "bfloat16"), output=cuda((4, 48, 512), "bfloat16"),
                    out_lse=cuda((4, 48), "float32"), head_tiles=2)),
    ("num_splits must be positive, got 0", ValueError, lambda: sparse(num_splits=0)),
    ("num_splits=1 leaves 32 chunks per CTA; the index table holds at most 16", ValueError,
     lambda: sparse(indices=cuda((4, 2048), "int32"), num_splits=1)),
    ("this shape splits into 2 CTAs per head block; pass caller-owned mid_out / mid_lse scratch", ValueError,
     lambda: sparse(num_splits=2)),
    ("mid_out must be a contiguous bfloat16", ValueError,
     lambda: sparse(mid_out=cuda((4, 64, 2, 512), "float16"), mid_lse=cuda((4, 64, 2), "float32"))),
    ("mid_lse must be a contiguous float32", ValueError,
     lambda: sparse(mid_out=cuda((4, 64, 2, 512), "bfloat16"), mid_lse=cuda((4, 64, 2), "bfloat16"))),
    ("topk must be at least 1", ValueError,
     lambda: kiln.cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits(num_tokens=1, num_heads=64, topk=0, num_sms=132)),
    ("32 chunks need at least 2 splits (at most 16 chunks per block), max_splits=1", ValueError,
     lambda: kiln.cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits(num_tokens=1, num_heads=64, topk=2048, num_sms=132,
                                                               max_splits=1)),
]
# Where kiln's class differs from upstream's for the same refusal (kiln calls a head count it has no
# kernel for "unsupported"; upstream raises ValueError): the phrase matches, the class is kiln's.
KILN_CLASS = {"query heads, got 12": NotImplementedError}


@pytest.mark.parametrize("phrase,upstream_class,call", PAIRS, ids=[p[0][:60] for p in PAIRS])
def test_refusal_contains_upstream_phrase(phrase, upstream_class, call):
    with pytest.raises(kiln.Error) as info:
        call()
    message = str(info.value)
    assert phrase in message, message
    assert "argument '" in message, message  # kiln's detail (the argument, what to pass) follows
    assert isinstance(info.value, KILN_CLASS.get(phrase, upstream_class))


# --- The validating path ----------------------------------------------------------------------------------

def _validate(lens, tables=None, *, max_seq_len=512, pages=8, query=None, **kw):
    tables = tables if tables is not None else [[0] * 8 for _ in lens]
    query = query if query is not None else cuda((len(lens), 1, 16, 576), "bfloat16")
    return kiln.validate_mla_metadata(query, cuda((pages, 64, 576), "bfloat16"), tables, lens, max_seq_len, **kw)


def test_valid_metadata_passes():
    assert _validate([1, 512], [[0] * 8, [7, 6, 5, 4, 3, 2, 1, 0]]) is None
    # Only a request's active pages are read: padding past ceil(len / page) may hold anything.
    assert _validate([64, 65], [[3, -1, 99, 99, 99, 99, 99, 99], [0, 1, -5, -5, -5, -5, -5, -5]]) is None


@pytest.mark.parametrize("lens,tables,phrase", [
    ([0, 4], None, "every runtime request must contain at least one KV token"),
    ([-1, 4], None, "every runtime request must contain at least one KV token"),
    ([513, 4], None, "runtime KV metadata contains a request longer than max_kv_len (512): got 513"),
    ([65, 4], [[0, 8] + [0] * 6, [0] * 8],
     "block_tables values for active pages must index the physical K/V cache in [0, 8); request 0"),
    ([4, 4], [[0] * 8, [-1] + [0] * 7],
     "block_tables values for active pages must index the physical K/V cache in [0, 8); request 1"),
])
def test_invalid_metadata_is_refused(lens, tables, phrase):
    with pytest.raises(ValueError) as info:
        _validate(lens, tables)
    assert phrase in str(info.value) and isinstance(info.value, kiln.InvalidArgumentError)


def test_causal_query_longer_than_kv():
    q = cuda((2, 4, 16, 576), "bfloat16")
    with pytest.raises(ValueError, match="causal MLA decode requires every per-request Q length to be no greater"):
        _validate([4, 3], query=q)
    assert _validate([4, 3], query=q, mask_type="dense") is None


@pytest.mark.parametrize("indptr,phrase", [
    ([0, 1], "qo_indptr must contain batch_size + 1 offsets"),
    ([1, 2, 3], "qo_indptr must start at 0"),
    ([0, 2, 1], "qo_indptr must be nondecreasing"),
    ([0, 1, 2], "qo_indptr must end at the packed query row count (3), got 2"),
    ([0, 3, 3], "qo_indptr contains a per-request Q length larger than max_seq_len_q (2): got 3"),
])
def test_broken_qo_indptr(indptr, phrase):
    q = cuda((3, 16, 576), "bfloat16")
    with pytest.raises(ValueError) as info:
        _validate([8, 8], query=q, qo_indptr=indptr, max_seq_len_q=2)
    assert phrase in str(info.value)


def test_packed_metadata_passes_with_empty_requests():
    q = cuda((3, 16, 576), "bfloat16")
    assert _validate([8, 8, 8], query=q, qo_indptr=[0, 2, 2, 3], max_seq_len_q=2) is None


def test_metadata_that_cannot_be_read_on_the_host_is_a_type_error():
    with pytest.raises(TypeError, match="seq_lens"):
        kiln.validate_mla_metadata(_q(), cuda((8, 64, 576), "bfloat16"), cuda((2, 8), "int32"),
                                   cuda((2,), "int32"), 512)


def _sparse_validate(indices, lengths=None, **kw):
    return kiln.validate_sparse_metadata(cuda((4, 64, 384), "uint8"), indices, topk_length=lengths, **kw)


def test_sparse_valid_slots_pass():
    assert _sparse_validate([[0, 255, -1], [-1, -1, -1]]) is None
    assert _sparse_validate([[[0, 1, 2]]]) is None  # [T, 1, topk]
    # Slots past a token's length are never read, so they may hold anything.
    assert _sparse_validate([[0, 999, -7], [5, 6, 7]], [1, 3]) is None
    hnd = cuda((2, 1, 64, 384), "uint8")
    assert kiln.validate_sparse_metadata(hnd, [[127]]) is None


@pytest.mark.parametrize("indices,lengths,phrase", [
    ([[0, 256]], None, "indices entries must be -1 or a cache row in [0, 256)"),
    ([[0, -2]], None, "indices entries must be -1 or a cache row in [0, 256)"),
    ([[0, 1]], [3], "topk_length must be within [0, topk]"),
    ([[0, 1]], [-1], "topk_length must be within [0, topk]"),
])
def test_sparse_invalid_slots_are_refused(indices, lengths, phrase):
    with pytest.raises(ValueError) as info:
        _sparse_validate(indices, lengths)
    assert phrase in str(info.value)


def test_sparse_extra_pool_is_checked_against_its_own_cache():
    extra = cuda((1, 16, 384), "uint8")
    assert _sparse_validate([[0]], extra_kv_cache=extra, extra_indices=[[15]]) is None
    with pytest.raises(ValueError, match="extra_indices entries must be -1 or a cache row in \\[0, 16\\)"):
        _sparse_validate([[0]], extra_kv_cache=extra, extra_indices=[[16]])
    with pytest.raises(ValueError, match="extra_topk_length must be within"):
        _sparse_validate([[0]], extra_kv_cache=extra, extra_indices=[[1]], extra_topk_length=[2])


# --- The wrapper without a GPU: everything before the kernel is loaded ----------------------------------

def test_run_before_plan():
    with pytest.raises(RuntimeError, match=r"plan\(\) must be called before run\(\)") as info:
        kiln.BatchMLADecodePagedTSWrapper().run(_q(), cuda((8, 64, 576), "bfloat16"), [[0]], [1])
    assert isinstance(info.value, kiln.NotPlannedError) and info.value.code == "not_planned"


def _plan(wrapper, **over):
    a = dict(device=0, batch_size=2, num_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, page_size=64,
             max_kv_len=512, max_seq_len_q=1, packed_query=False, q_data_type="bfloat16", kv_data_type="bfloat16",
             o_data_type="bfloat16")
    a.update(over)
    positional = [a.pop(k) for k in ("device", "batch_size", "num_heads", "kv_lora_rank", "qk_rope_head_dim",
                                     "page_size", "max_kv_len")]
    return wrapper.plan(*positional, **a)


@pytest.mark.parametrize("over,error,phrase", [
    (dict(packed_query=1), TypeError, "packed_query must be a bool"),
    (dict(kv_lora_rank=256), NotImplementedError, "requires kv_lora_rank=512 and qk_rope_head_dim=64"),
    (dict(kv_data_type="float16"), NotImplementedError, "requires query and KV cache to use the same dtype"),
    (dict(mask_type="sliding"), ValueError, "mask_type"),
    (dict(precision="fp8"), ValueError, "precision"),
    (dict(batch_size=0), ValueError, "batch_size must be positive"),
    (dict(page_size=48), NotImplementedError, "page_size"),
    (dict(workspace_buffer=cuda((4, 4), "uint8")), ValueError, "workspace_buffer"),
])
def test_plan_refusals(over, error, phrase):
    wrapper = kiln.BatchMLADecodePagedTSWrapper()
    with pytest.raises(error, match=phrase):
        _plan(wrapper, **over)
    assert wrapper._plan is None  # nothing was published


def test_run_checks_qo_indptr_against_the_plan_mode():
    wrapper = kiln.BatchMLADecodePagedTSWrapper()
    wrapper._plan = object.__new__(kiln.prims_ts._MlaPlan)
    wrapper._plan.packed = True
    with pytest.raises(ValueError, match="packed-query MLA run requires qo_indptr"):
        wrapper.run(_q(), cuda((8, 64, 576), "bfloat16"), [[0]], [1], validate=False)
    wrapper._plan.packed = False
    with pytest.raises(ValueError, match="fixed-query MLA plan does not accept qo_indptr"):
        wrapper.run(_q(), cuda((8, 64, 576), "bfloat16"), [[0]], [1], qo_indptr=[0, 1], validate=False)
    with pytest.raises(TypeError, match="validate must be a bool"):
        wrapper.run(_q(), cuda((8, 64, 576), "bfloat16"), [[0]], [1], validate=1)


def test_dtype_names_and_torch_dtypes_mix():
    # A dtype given by name and the same dtype as an object are one dtype.
    size = kiln.get_prims_ts_batch_mla_decode_workspace_size(8, 16, 512, 64, 64, 4096, q_dtype="bfloat16",
                                                             kv_dtype=kiln.decode.bfloat16)
    assert size == kiln.get_prims_ts_batch_mla_decode_workspace_size(8, 16, 512, 64, 64, 4096)
