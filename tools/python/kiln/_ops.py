"""kiln's launchers as torch custom ops (torch.ops.kiln.*), defined with torch.library define/impl.

Each op mutates exactly the tensors its kernel writes (declared with ``(a!)``) and returns nothing;
its fake implementation does nothing, since the outputs are preallocated arguments. So
``torch.compile(fullgraph=True)`` traces the public functions through these ops, and
``torch.library.opcheck`` checks them. Eager calls of the public functions skip the dispatcher
(kiln's native binding reads torch tensors directly); tensor subclasses and compiled graphs come here.
"""
from __future__ import annotations

import torch

from . import _native

_lib = torch.library.Library("kiln", "DEF")

_lib.define(
    "mla_decode(Tensor query, Tensor kv_cache, Tensor(a!) workspace_buffer, int kv_lora_rank, "
    "int qk_rope_head_dim, Tensor block_tables, Tensor seq_lens, int max_seq_len, Tensor? qo_indptr, "
    "int? max_seq_len_q, Tensor(b!) out, float bmm1_scale, float bmm2_scale, str mask_type, "
    "ScalarType out_dtype, str precision) -> ()")
_lib.define(
    "sparse_decode(Tensor q, Tensor kv_cache, Tensor indices, Tensor(a!) output, Tensor(b!) out_lse, "
    "float sm_scale, Tensor? topk_length, Tensor? attn_sink, Tensor? extra_kv_cache, Tensor? extra_indices, "
    "Tensor? extra_topk_length, Tensor(c!)? mid_out, Tensor(d!)? mid_lse, float lse_scale, int? num_splits, "
    "int max_splits, int? head_tiles) -> ()")
_lib.define(
    "dsv41_decode(Tensor q, Tensor kv_cache, Tensor indices, Tensor(a!) output, Tensor(b!) out_lse, "
    "float sm_scale, Tensor? topk_length, Tensor? attn_sink, Tensor? extra_kv_cache, Tensor? extra_indices, "
    "Tensor? extra_topk_length, Tensor(c!)? mid_out, Tensor(d!)? mid_lse, float lse_scale, int? num_splits, "
    "int max_splits, int? head_tiles, str? variant, str compute_precision, bool? enable_pdl) -> ()")
_lib.define("nvfp4_pack(Tensor latent, Tensor(a!) cache) -> ()")
_lib.define("nvfp4_append(Tensor rows, Tensor slot_mapping, Tensor(a!) cache) -> ()")


def _sparse_decode(*args) -> None:
    _native.sparse_decode(*args)


def _dsv41_decode(*args) -> None:
    _native.dsv41_decode(*args)


_lib.impl("mla_decode", _native.mla_decode, "CUDA")
_lib.impl("sparse_decode", _sparse_decode, "CUDA")
_lib.impl("dsv41_decode", _dsv41_decode, "CUDA")
_lib.impl("nvfp4_pack", _native.nvfp4_pack, "CUDA")
_lib.impl("nvfp4_append", _native.nvfp4_append, "CUDA")


@torch.library.register_fake("kiln::mla_decode")
def _mla_decode_fake(query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                     max_seq_len, qo_indptr, max_seq_len_q, out, bmm1_scale, bmm2_scale, mask_type, out_dtype,
                     precision):
    return None


@torch.library.register_fake("kiln::sparse_decode")
def _sparse_decode_fake(q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache,
                        extra_indices, extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits,
                        head_tiles):
    return None


@torch.library.register_fake("kiln::dsv41_decode")
def _dsv41_decode_fake(q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache,
                       extra_indices, extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits,
                       head_tiles, variant, compute_precision, enable_pdl):
    return None


@torch.library.register_fake("kiln::nvfp4_pack")
def _nvfp4_pack_fake(latent, cache):
    return None


@torch.library.register_fake("kiln::nvfp4_append")
def _nvfp4_append_fake(rows, slot_mapping, cache):
    return None


mla_decode = torch.ops.kiln.mla_decode.default
sparse_decode = torch.ops.kiln.sparse_decode.default
dsv41_decode = torch.ops.kiln.dsv41_decode.default
nvfp4_pack = torch.ops.kiln.nvfp4_pack.default
nvfp4_append = torch.ops.kiln.nvfp4_append.default
