"""torch integration that needs no GPU: the custom ops' schemas, the dispatcher route taken by tensor
subclasses (fake tensors), and torch.compile(fullgraph=True) tracing the public functions (run here
on CPU tensors through a CPU stand-in implementation registered by the test; the CUDA kernels
themselves are tested in test_gpu.py)."""
from __future__ import annotations

import pytest

from conftest import needs_torch

pytestmark = needs_torch

WRITES = {"mla_decode": {"workspace_buffer", "out"}, "sparse_decode": {"output", "out_lse", "mid_out", "mid_lse"},
          "dsv41_decode": {"output", "out_lse", "mid_out", "mid_lse"},
          "nvfp4_pack": {"cache"}, "nvfp4_append": {"cache"}}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_ops_declare_exactly_what_they_write(name):
    import torch

    import kiln  # noqa: F401  (registers torch.ops.kiln)

    schema = getattr(torch.ops.kiln, name).default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == WRITES[name]
    assert len(schema.returns) == 0


def mla_inputs(device):
    import torch

    B, H, page, max_seq_len = 2, 16, 64, 512
    import kiln

    return dict(query=torch.zeros(B, 1, H, 576, dtype=torch.bfloat16, device=device),
                kv_cache=torch.zeros(8, page, 576, dtype=torch.bfloat16, device=device),
                workspace_buffer=torch.empty(kiln.mla_workspace_size(H, page, max_seq_len, 1, B), dtype=torch.uint8,
                                             device=device),
                kv_lora_rank=512, qk_rope_head_dim=64,
                block_tables=torch.zeros(B, 8, dtype=torch.int32, device=device),
                seq_lens=torch.full((B,), 7, dtype=torch.int32, device=device), max_seq_len=max_seq_len)


def test_fake_tensors_go_through_the_dispatcher():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import kiln

    with FakeTensorMode():
        args = mla_inputs("cpu")
        out = kiln.prims_ts_batch_decode_with_kv_cache_mla(**args)  # out=None: allocated (fake)
        assert out.shape == (2, 1, 16, 512) and out.dtype == torch.bfloat16
        given = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16)
        assert kiln.prims_ts_batch_decode_with_kv_cache_mla(**args, out=given) is given
        latent = torch.empty(4, 64, 512, dtype=torch.bfloat16)
        assert kiln.nvfp4_pack(latent).shape == (4, 64, 384)


def test_eager_cpu_tensors_are_refused_by_name():
    import torch

    import kiln

    args = mla_inputs("cpu")
    with pytest.raises(kiln.InvalidArgumentError, match="query: expected a CUDA tensor, got one on cpu"):
        kiln.prims_ts_batch_decode_with_kv_cache_mla(**args, out=torch.empty(2, 1, 16, 512, dtype=torch.bfloat16))


@pytest.fixture
def cpu_stand_in():
    """A CPU implementation of kiln::mla_decode for tracing tests: out = seq_lens[b] * bmm2_scale."""
    import torch

    lib = torch.library.Library("kiln", "IMPL")

    def mla_cpu(query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                max_seq_len, qo_indptr, max_seq_len_q, out, bmm1_scale, bmm2_scale, mask_type, out_dtype, precision):
        assert precision == "exact"  # the default scope, read while tracing
        out.copy_((seq_lens.float() * bmm2_scale).view(-1, 1, 1, 1).expand_as(out))

    lib.impl("mla_decode", mla_cpu, "CPU")
    yield
    lib._destroy()


def test_compile_fullgraph_traces_the_public_function(cpu_stand_in):
    import torch

    import kiln

    args = mla_inputs("cpu")

    def step(query, seq_lens, out):
        a = dict(args, query=query, seq_lens=seq_lens)
        return kiln.prims_ts_batch_decode_with_kv_cache_mla(**a, out=out, bmm2_scale=0.5) + 1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = torch.zeros(2, 1, 16, 512, dtype=torch.bfloat16)
    seq_lens = torch.tensor([4, 6], dtype=torch.int32)
    result = compiled(args["query"], seq_lens, out)
    assert torch.equal(out[:, 0, 0, 0].float(), torch.tensor([2.0, 3.0]))  # the op's write reached `out`
    assert torch.equal(result[:, 0, 0, 0].float(), torch.tensor([3.0, 4.0]))
    seq_lens[1] = 10  # same graph, new values
    compiled(args["query"], seq_lens, out)
    assert out[1, 0, 0, 0].item() == 5.0
