"""kiln from torch on the GPU: the MLA, sparse NVFP4 and DeepSeek-V4.1 decode ops and the NVFP4 and
DeepSeek-V4.1 writers against torch fp32 references at the spec tolerances, CUDA graph capture and
replay after in-place metadata changes, not-warm and sealed errors, torch.compile(fullgraph=True),
torch.library.opcheck, two streams, and (with two GPUs) per-device handles and refusal of tensors
spread over devices."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import kiln  # noqa: E402

LOG2E = 1.4426950408889634
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# ---------------------------------------------------------------- references (torch, fp32)

def mla_reference(q, kv, block_tables, seq_lens, bmm1, bmm2, causal, qo_indptr=None):
    """runtime/mla_decode/README.md "What it computes": one request at a time, fp32."""
    q, kv = q.float().cpu(), kv.float().cpu().reshape(-1, kv.shape[-2], 576)
    tables, lens = block_tables.cpu(), seq_lens.cpu()
    page = kv.shape[1]
    batch = lens.shape[0]
    starts = qo_indptr.cpu().tolist() if qo_indptr is not None else [b * q.shape[1] for b in range(batch + 1)]
    rows = q.reshape(-1, q.shape[-2], 576)
    out = torch.zeros(rows.shape[0], rows.shape[1], 512)
    for b in range(batch):
        L = int(lens[b])
        t = torch.arange(L)
        C = kv[tables[b, t // page].long(), t % page]  # [L, 576]
        qb = rows[starts[b]:starts[b + 1]]               # [q_len, H, 576]
        s = torch.einsum("ihd,td->iht", qb, C) * bmm1
        if causal:
            q_len = qb.shape[0]
            visible = t[None, :] <= (L - q_len + torch.arange(q_len))[:, None]
            s = s.masked_fill(~visible[:, None, :], float("-inf"))
        out[starts[b]:starts[b + 1]] = torch.einsum("iht,td->ihd", torch.softmax(s, -1), C[:, :512]) * bmm2
    return out.reshape(*q.shape[:-1], 512)


def nvfp4_quantize(rows_bf16):
    """runtime/nvfp4_writer/README.md (the quantisation rule): bf16 [N, 512] -> (codes [N, 224], scales [N, 28], rope [N, 128]) bytes."""
    x = rows_bf16.float()
    g = x[:, :448].reshape(-1, 28, 16)
    amax = g.abs().amax(-1)
    scale = (amax / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn)
    sf = scale.float()
    inv = torch.where(sf == 0, torch.zeros_like(sf), 1.0 / sf)
    y = g * inv[..., None]
    m = y.abs()
    code = ((m > 0.25).int() + (m >= 0.75).int() + (m > 1.25).int() + (m >= 1.75).int() + (m > 2.5).int()
            + (m >= 3.5).int() + (m > 5.0).int())
    # The sign is kept even when the magnitude rounds to zero (-0 is code 0x8); NaN is +6 (code 7).
    nan = torch.isnan(y)
    code = torch.where(nan, torch.full_like(code, 7), code)
    code = torch.where(torch.signbit(y) & ~nan, code + 8, code).reshape(-1, 448).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    rope = rows_bf16[:, 448:].contiguous().view(torch.uint8)
    return packed, scale.view(torch.uint8), rope


def nvfp4_pages(rows_bf16, page):
    """The 384-byte page layout of quantized rows: [P, page * 384] uint8."""
    packed, scales, rope = nvfp4_quantize(rows_bf16)
    pages = rows_bf16.shape[0] // page
    data = torch.cat([packed, rope], 1).reshape(pages, page * 352)
    pad = torch.zeros(scales.shape[0], 4, dtype=torch.uint8, device=scales.device)
    sc = torch.cat([scales, pad], 1).reshape(pages, page * 32)
    return torch.cat([data, sc], 1)


def nvfp4_dequantize(pages_u8, page):
    """[P, page * 384] bytes -> fp32 [P * page, 512] rows."""
    P = pages_u8.shape[0]
    data = pages_u8[:, :page * 352].reshape(P * page, 352)
    scales = pages_u8[:, page * 352:].reshape(P * page, 32)[:, :28].contiguous().view(torch.float8_e4m3fn).float()
    codes = torch.stack([data[:, :224] & 15, data[:, :224] >> 4], -1).reshape(-1, 448).long()
    table = torch.tensor(E2M1, device=pages_u8.device)
    mag = table[codes & 7]
    vals = torch.where(codes >= 8, -mag, mag).reshape(-1, 28, 16) * scales[..., None]
    rope = data[:, 224:352].contiguous().view(torch.bfloat16).float()
    return torch.cat([vals.reshape(-1, 448), rope], 1)


def token_attention(q, keys, sm_scale, sink=None, lse_scale=1.0):
    """One token's attention over its candidate rows (each key is also the value), fp32: (o [H, 512],
    base-2 LSE [H] times lse_scale). No candidate gives o = 0 and LSE -inf, or the sink's."""
    s = sm_scale * q.float() @ keys.T  # [H, n]
    L = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ keys
    if sink is not None:
        o = o * torch.sigmoid(L - sink)[:, None]
        L = torch.logaddexp(L, sink)
    return o, L * LOG2E * lse_scale


def sparse_reference(q, rows, indices, sm_scale, extra_rows=None, extra_indices=None, sink=None, lse_scale=1.0):
    """runtime/sparse_nvfp4/README.md "What it computes": q with NoPE dims NVFP4-round-tripped, fp32."""
    T, H, _ = q.shape
    qr = q.reshape(T * H, 512)
    qhat = torch.cat([nvfp4_dequantize(nvfp4_pages(qr, 1), 1)[:, :448], qr[:, 448:].float()], 1).reshape(T, H, 512)
    out = torch.zeros(T, H, 512, device=q.device)
    lse = torch.empty(T, H, device=q.device)
    for t in range(T):
        K = rows[indices[t][indices[t] >= 0].long()]
        if extra_rows is not None:
            K = torch.cat([K, extra_rows[extra_indices[t][extra_indices[t] >= 0].long()]])
        out[t], lse[t] = token_attention(qhat[t], K, sm_scale, sink, lse_scale)
    return out, lse


def dsv41_dequantize(pages_u8, page, fmt):
    """FOOTER pages [P, page * record] bytes -> fp32 rows [P * page, 512], by the tables of
    runtime/sparse_dsv41/README.md ("The two cache formats")."""
    P = pages_u8.shape[0]
    data_bytes, group = (512, 32) if fmt == "fp8" else (256, 16)
    data = pages_u8[:, :page * data_bytes].reshape(P * page, data_bytes)
    scales = pages_u8[:, page * data_bytes:].reshape(P * page, 512 // group)
    if fmt == "fp8":
        vals = data.contiguous().view(torch.float8_e4m3fn).float()
        mult = torch.exp2(scales.float() - 127)
    else:
        codes = torch.stack([data & 15, data >> 4], -1).reshape(P * page, 512).long()
        mag = torch.tensor(E2M1, device=pages_u8.device)[codes & 7]
        vals = torch.where(codes >= 8, -mag, mag)
        mult = scales.contiguous().view(torch.float8_e4m3fn).float()
    return (vals.reshape(P * page, 512 // group, group) * mult[..., None]).reshape(P * page, 512)


def assert_close(got, want, rtol, atol, rel_l2=None):
    got, want = got.float().cpu(), want.float().cpu()
    err = (got - want).abs()
    bad = (err > atol + rtol * want.abs()) | got.isnan()
    assert int(bad.sum()) == 0, f"{int(bad.sum())} of {bad.numel()} out of tolerance, max|err| {float(err.max()):.3g}"
    if rel_l2 is not None:
        assert float((got - want).norm() / want.norm()) <= rel_l2


# ---------------------------------------------------------------- problems

class Mla:
    """A paged MLA decode problem on `device`: bf16, page 64, H 16, causal, max_seq_len 1024."""

    H, page, max_seq_len = 16, 64, 1024

    def __init__(self, device=0, B=4, SQ=2, seed=0, packed=False):
        g = torch.Generator().manual_seed(seed)
        self.device = torch.device("cuda", device)
        pages = B * self.max_seq_len // self.page
        self.kv = (torch.rand(pages, self.page, 576, generator=g) * 2 - 1).bfloat16().to(self.device)
        self.block_tables = torch.randperm(pages, generator=g).int().reshape(B, -1).to(self.device)
        self.seq_lens = torch.randint(SQ, self.max_seq_len + 1, (B,), generator=g).int().to(self.device)
        self.packed = packed
        if packed:
            q_lens = torch.randint(0, SQ + 1, (B,), generator=g)
            self.qo_indptr = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).int().to(self.device)
            shape = (int(q_lens.sum()), self.H, 576)
        else:
            self.qo_indptr = None
            shape = (B, SQ, self.H, 576)
        self.SQ, self.B = SQ, B
        self.q = (torch.rand(*shape, generator=g) * 2 - 1).bfloat16().to(self.device)
        self.out = torch.empty(*shape[:-1], 512, dtype=torch.bfloat16, device=self.device)
        self.workspace = torch.empty(kiln.mla_workspace_size(self.H, self.page, self.max_seq_len, SQ, B, packed=packed),
                                     dtype=torch.uint8, device=self.device)
        self.bmm1, self.bmm2 = 0.072, 1.3

    def warm(self, devices=None):
        kiln.warm_mla(self.H, self.page, self.max_seq_len, self.SQ, packed=self.packed,
                      devices=[self.device.index] if devices is None else devices)

    def run(self, out=None):
        kw = dict(qo_indptr=self.qo_indptr, max_seq_len_q=self.SQ) if self.packed else {}
        return kiln.prims_ts_batch_decode_with_kv_cache_mla(
            self.q, self.kv, self.workspace, 512, 64, self.block_tables, self.seq_lens, self.max_seq_len,
            out=self.out if out is None else out, bmm1_scale=self.bmm1, bmm2_scale=self.bmm2, **kw)

    def reference(self):
        return mla_reference(self.q, self.kv, self.block_tables, self.seq_lens, self.bmm1, self.bmm2, True,
                             self.qo_indptr)

    def check(self, got):
        assert_close(got, self.reference(), 1e-2, 5e-4, 0.02)


class Sparse:
    """A sparse NVFP4 decode problem: H 64, 512 main + 64 extra candidates, a sink, page 64."""

    H, page = 64, 64

    def __init__(self, device=0, T=8, topk=512, extra=64, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.device = torch.device("cuda", device)
        pool = 32 * self.page
        self.latent = torch.randn(pool, 512, generator=g).bfloat16().to(self.device)
        self.extra_latent = torch.randn(4 * self.page, 512, generator=g).bfloat16().to(self.device)
        self.cache = kiln.nvfp4_pack(self.latent.view(-1, self.page, 512))
        self.extra_cache = kiln.nvfp4_pack(self.extra_latent.view(-1, self.page, 512))
        self.indices = torch.randint(-1, pool, (T, topk), generator=g).int().to(self.device)
        self.extra_indices = torch.randint(0, 4 * self.page, (T, extra), generator=g).int().to(self.device)
        self.sink = (torch.rand(self.H, generator=g) * 6 - 2).to(self.device)
        self.q = torch.randn(T, self.H, 512, generator=g).bfloat16().to(self.device)
        self.output = torch.empty(T, self.H, 512, dtype=torch.bfloat16, device=self.device)
        self.out_lse = torch.empty(T, self.H, dtype=torch.float32, device=self.device)
        chunks = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks(topk, extra)
        self.mid_out = torch.empty(T, self.H, chunks, 512, dtype=torch.bfloat16, device=self.device)
        self.mid_lse = torch.empty(T, self.H, chunks, dtype=torch.float32, device=self.device)
        self.sm_scale = 512 ** -0.5

    def run(self, **kw):
        return kiln.cake_sparse_mla_sm120_dsv4_nvfp4_decode(
            self.q, self.cache, self.indices, self.output, self.out_lse, self.sm_scale, attn_sink=self.sink,
            extra_kv_cache=self.extra_cache, extra_indices=self.extra_indices, mid_out=self.mid_out,
            mid_lse=self.mid_lse, **kw)

    def check(self):
        rows = nvfp4_dequantize(nvfp4_pages(self.latent, self.page), self.page)
        extra = nvfp4_dequantize(nvfp4_pages(self.extra_latent, self.page), self.page)
        out, lse = sparse_reference(self.q, rows, self.indices, self.sm_scale, extra, self.extra_indices, self.sink)
        assert_close(self.output, out, 5e-2, 5e-2)
        assert_close(self.out_lse, lse, 2e-2, 2e-2)


class Dsv41:
    """A DeepSeek-V4.1 decode problem, shaped like upstream's dual-cache grid: the 528-byte main cache
    in 61-row pages inside a pool with 128 padding bytes a page, the 288-byte extra cache in 32-row
    pages, ragged lengths in both sections, masked slots, one token with no candidate, a sink."""

    main_page, extra_page = 61, 32

    def __init__(self, H=64, T=8, topk=128, extra=512, seed=9):
        g = torch.Generator().manual_seed(seed)
        dev = torch.device("cuda", 0)

        def latent(n):  # upstream's data: randn / 10 clamped to [-1, 1], in bf16
            return (torch.randn(n, 512, generator=g) / 10).clamp(-1, 1).bfloat16().to(dev)

        main_pages, extra_pages = 16, 4096 // self.extra_page
        main = kiln.dsv41_fp8_quantize_pack_sparse_mla_cache(
            latent(main_pages * self.main_page).view(main_pages, -1, 512))
        page_bytes = self.main_page * 528
        self.pool = torch.full((main_pages, page_bytes + 128), 0xAB, dtype=torch.uint8, device=dev)
        self.pool[:, :page_bytes] = main.view(main_pages, -1)
        self.cache = self.pool[:, :page_bytes].view(main_pages, self.main_page, 528)
        self.extra_cache = kiln.dsv41_fp4_quantize_pack_sparse_mla_cache(
            latent(extra_pages * self.extra_page).view(extra_pages, -1, 512))
        self.indices = torch.randint(-1, main_pages * self.main_page, (T, topk), generator=g).int().to(dev)
        self.indices[:, 120:] = -1
        self.extra_indices = torch.randint(0, extra_pages * self.extra_page, (T, extra), generator=g).int().to(dev)
        self.extra_indices[::2, :16] = -1
        self.topk_length = torch.randint(topk // 2, topk + 1, (T,), generator=g).int().to(dev)
        self.extra_topk_length = torch.randint(extra // 2, extra + 1, (T,), generator=g).int().to(dev)
        self.topk_length[3] = self.extra_topk_length[3] = 0
        self.sink = (torch.rand(H, generator=g) * 6 - 2).to(dev)
        self.q = latent(T * H).view(T, H, 512)
        self.output = torch.empty(T, H, 512, dtype=torch.bfloat16, device=dev)
        self.out_lse = torch.empty(T, H, dtype=torch.float32, device=dev)
        chunks = kiln.cake_sparse_mla_sm120_dsv41_mixed_num_chunks(topk, extra)
        self.mid_out = torch.empty(T, H, chunks, 512, dtype=torch.bfloat16, device=dev)
        self.mid_lse = torch.empty(T, H, chunks, dtype=torch.float32, device=dev)
        self.sm_scale, self.lse_scale = 512 ** -0.5, 0.5

    def run(self, **kw):
        return kiln.cake_sparse_mla_sm120_dsv41_mixed_decode(
            self.q, self.cache, self.indices, self.output, self.out_lse, self.sm_scale, topk_length=self.topk_length,
            attn_sink=self.sink, extra_kv_cache=self.extra_cache, extra_indices=self.extra_indices,
            extra_topk_length=self.extra_topk_length, mid_out=self.mid_out, mid_lse=self.mid_lse,
            lse_scale=self.lse_scale, **kw)

    def check(self):
        """The output and LSE against the fp32 reference at upstream's bf16-route tolerance, 1e-2."""
        rows = dsv41_dequantize(self.pool[:, :self.main_page * 528], self.main_page, "fp8")
        extra = dsv41_dequantize(self.extra_cache.view(self.extra_cache.shape[0], -1), self.extra_page, "fp4")
        assert bool(rows.isfinite().all() and extra.isfinite().all())
        out = torch.empty_like(self.output, dtype=torch.float32)
        lse = torch.empty_like(self.out_lse)
        for t in range(self.q.shape[0]):
            main_slots = self.indices[t, :int(self.topk_length[t])]
            extra_slots = self.extra_indices[t, :int(self.extra_topk_length[t])]
            keys = torch.cat([rows[main_slots[main_slots >= 0].long()], extra[extra_slots[extra_slots >= 0].long()]])
            out[t], lse[t] = token_attention(self.q[t], keys, self.sm_scale, self.sink, self.lse_scale)
            if keys.shape[0] == 0:  # exactly zero (its LSE, the sink's, is checked below)
                assert not bool(self.output[t].any()), f"token {t} has no candidate but a nonzero output"
        # These outputs are means of a few hundred rows of randn / 10, about 1e-2 in size, so the atol
        # alone would pass a zero output: the relative L2 error is bounded too. One bf16 P, the partial
        # rows and the output each round at 2^-9, a few tenths of a percent together.
        assert_close(self.output, out, 1e-2, 1e-2, rel_l2=0.02)
        assert_close(self.out_lse, lse, 1e-2, 1e-2)


# ---------------------------------------------------------------- tests

def test_writer_matches_the_reference_bytes():
    latent = torch.randn(6 * 64, 512, device="cuda").bfloat16()
    latent[5, :16] = 0  # an all-zero group: scale 0, codes 0
    latent[7, 32:48] *= 1e-3
    cache = kiln.nvfp4_pack(latent.view(6, 64, 512))
    assert cache.shape == (6, 64, 384) and cache.dtype == torch.uint8
    want = nvfp4_pages(latent, 64)
    assert torch.equal(cache.view(6, -1), want)
    # append into an HND view, with masked (-1, out of range) and duplicate slots (the lowest row wins)
    hnd = torch.zeros(6, 1, 64, 384, dtype=torch.uint8, device="cuda")
    rows = torch.randn(5, 512, device="cuda").bfloat16()
    slots = torch.tensor([3, -1, 100, 6 * 64, 3], dtype=torch.int32, device="cuda")
    kiln.nvfp4_append(rows, slots, hnd)
    got = nvfp4_dequantize(hnd.view(6, -1), 64)
    ref = nvfp4_dequantize(nvfp4_pages(rows[[0, 2]], 1), 1)  # one-token pages
    assert torch.equal(got[3], ref[0]) and torch.equal(got[100], ref[1])
    assert int(got.abs().sum(1).ne(0).sum()) == 2  # nothing else was written


def dsv41_reference(rows, fmt):
    """runtime/dsv41_writer/README.md "Byte rules" in torch: [N, 512] -> (data [N, 512 or 256], scales [N, 16 or 32]) bytes."""
    x = rows.float()
    n = x.shape[0]
    if fmt == "fp8":
        g = x.view(n, 16, 32)
        nan, inf = g.isnan().any(-1), g.isinf().any(-1)
        a = torch.where(g.isfinite(), g.abs(), torch.zeros_like(g)).amax(-1)
        floor = torch.tensor(0x38D1B717, dtype=torch.int32).view(torch.float32).item()
        r = torch.clamp(torch.clamp(a, min=floor) / 448.0, min=floor)
        m, e = torch.frexp(r)  # r = m * 2^e, m in [0.5, 1): the least k with 2^k >= r
        k = torch.where(m == 0.5, e - 1, e).float()
        y = (g * torch.exp2(-k)[..., None]).clamp(-448, 448)
        codes = torch.nan_to_num(y, nan=0.0).to(torch.float8_e4m3fn).view(torch.uint8)
        signed_zero = torch.where(torch.signbit(g), 0x80, 0x00).to(torch.uint8)
        codes = torch.where(inf[..., None], torch.where(g.isinf(), torch.full_like(codes, 0x7F), signed_zero), codes)
        codes = torch.where(nan[..., None], torch.full_like(codes, 0x7F), codes)
        scales = torch.where(nan | inf, torch.full_like(k, 255), k + 127).to(torch.uint8)
        return codes.view(n, 512), scales
    g = x.view(n, 32, 16)
    bad = (~g.isfinite()).any(-1)
    a = torch.where(bad[..., None], torch.zeros_like(g), g).abs().amax(-1)
    scale = (a / 6.0).clamp(2.0 ** -9, 448.0).to(torch.float8_e4m3fn)
    y = torch.where(bad[..., None], torch.zeros_like(g), g) / scale.float()[..., None]
    mag = y.abs()
    code = ((mag > 0.25).int() + (mag >= 0.75).int() + (mag > 1.25).int() + (mag >= 1.75).int() + (mag > 2.5).int()
            + (mag >= 3.5).int() + (mag > 5.0).int() + torch.signbit(y).int() * 8)
    code = torch.where(bad[..., None], torch.zeros_like(code), code).view(n, 256, 2)
    data = (code[..., 0] | (code[..., 1] << 4)).to(torch.uint8)
    scales = torch.where(bad, torch.full_like(scale.view(torch.uint8), 0x7F), scale.view(torch.uint8))
    return data, scales


def dsv41_pages(rows, page, fmt):
    """Rows packed into FOOTER pages: [P, page * record] bytes."""
    data, scales = dsv41_reference(rows, fmt)
    pages = rows.shape[0] // page
    return torch.cat([data.view(pages, -1), scales.view(pages, -1)], 1)


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dsv41_writers_match_the_reference_bytes(fmt, dtype):
    pack = getattr(kiln, f"dsv41_{fmt}_quantize_pack_sparse_mla_cache")
    append = getattr(kiln, f"dsv41_{fmt}_quantize_append_sparse_mla_cache")
    record = 528 if fmt == "fp8" else 288
    page, pages = 61, 5
    latent = (torch.randn(pages * page, 512, device="cuda") / 10).to(dtype)
    latent[3, :32] = 0
    latent[4, 64:96] *= 1000 if dtype == torch.bfloat16 else 60
    latent[5, 100:110] *= 1e-5
    latent[6, 200] = float("nan")
    latent[7, 300] = float("-inf")
    want = dsv41_pages(latent, page, fmt)
    hnd = pack(latent.view(pages, page, 512))
    assert hnd.shape == (pages, 1, page, record) and hnd.dtype == torch.uint8
    assert torch.equal(hnd.view(pages, -1), want)
    nhd = pack(latent.view(pages, page, 1, 512), kv_layout="NHD")
    assert nhd.shape == (pages, page, 1, record) and torch.equal(nhd.view(pages, -1), want)
    # A shuffled permutation of every slot reproduces pack, into a padded pool (padding untouched).
    perm = torch.randperm(pages * page, device="cuda")
    pool = torch.full((pages, page * record + 128), 0xAB, dtype=torch.uint8, device="cuda")
    view = pool[:, :page * record].view(pages, page, record)
    append(latent[perm], perm.to(torch.int64), view)
    assert torch.equal(pool[:, :page * record], want)
    assert bool((pool[:, page * record:] == 0xAB).all())
    # Duplicates keep the lowest row, invalid slots are skipped, other bytes stay.
    rows = torch.randn(4, 512, device="cuda").to(dtype)
    before = pool.clone()
    append(rows, torch.tensor([7, -1, 7, pages * page], dtype=torch.int32, device="cuda"), view)
    data, scales = dsv41_reference(rows[:1], fmt)
    d = data.shape[1]
    expected = before.clone()
    expected[0, 7 * d:8 * d] = data[0]
    expected[0, page * d + 7 * (record - d):page * d + 8 * (record - d)] = scales[0]
    assert torch.equal(pool, expected)


class DLPackOnly:
    """A DLPack producer that is not a torch.Tensor."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_any_dlpack_producer():
    latent = torch.randn(2 * 64, 512, device="cuda").bfloat16()
    cache = torch.zeros(2, 64, 384, dtype=torch.uint8, device="cuda")
    kiln.nvfp4_pack(DLPackOnly(latent.view(2, 64, 512)), DLPackOnly(cache))
    assert torch.equal(cache.view(2, -1), nvfp4_pages(latent, 64))
    again = torch.zeros_like(cache)
    kiln.nvfp4_pack(torch.utils.dlpack.to_dlpack(latent.view(2, 64, 512)), torch.utils.dlpack.to_dlpack(again))
    torch.cuda.synchronize()
    assert torch.equal(again, cache)


def test_mla_fixed_and_packed_and_out_none():
    for packed in (False, True):
        p = Mla(packed=packed, seed=2 + packed)
        p.check(p.run())
    p = Mla(seed=4)
    out = kiln.prims_ts_batch_decode_with_kv_cache_mla(p.q, p.kv, p.workspace, 512, 64, p.block_tables, p.seq_lens,
                                                      p.max_seq_len, bmm1_scale=p.bmm1, bmm2_scale=p.bmm2)
    assert out.dtype == torch.bfloat16 and out.device == p.device
    p.check(out)


def test_mla_precision_bf16():
    p = Mla(seed=5)
    kiln.warm_mla(p.H, p.page, p.max_seq_len, p.SQ, precision="bf16", devices=[p.device.index])
    exact = p.run().clone()
    with kiln.mla_precision("bf16"):
        one_p = p.run().clone()
    p.check(exact)
    # One bf16 P moves each output by at most bmm2 * 2^-9 * max|V| (|V| < 1 here) beyond the tolerances.
    assert_close(one_p, p.reference(), 1e-2, 5e-4 + p.bmm2 * 2.0 ** -9, 0.02)
    assert not torch.equal(one_p, exact)  # a different kernel ran


def test_mla_precision_traced():
    # torch.compile reads the scope once while tracing; the traced call runs the same kernel as eager.
    p = Mla(seed=6)
    kiln.warm_mla(p.H, p.page, p.max_seq_len, p.SQ, precision="bf16", devices=[p.device.index])

    def step(q):
        return kiln.prims_ts_batch_decode_with_kv_cache_mla(q, p.kv, p.workspace, 512, 64, p.block_tables, p.seq_lens,
                                                           p.max_seq_len, out=p.out, bmm1_scale=p.bmm1,
                                                           bmm2_scale=p.bmm2)

    with kiln.mla_precision("bf16"):
        eager = step(p.q).clone()
        traced = torch.compile(step, fullgraph=True)(p.q).clone()
    assert torch.equal(traced, eager)
    assert not torch.equal(eager, step(p.q))  # outside the scope: the exact kernel


def test_sparse_direct_and_split():
    p = Sparse()
    plan = p.run(num_splits=1)
    assert plan["num_splits"] == 1
    p.check()
    plan = p.run(num_splits=4)  # 9 chunks: 3 per block, so the plan normalises to 3 splits
    assert plan["num_splits"] == 3 and plan["chunks_per_block"] == 3
    p.check()
    plan = p.run()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles(num_tokens=8, num_heads=64, topk=512, extra_topk=64,
                                                                  num_sms=sms)
    splits = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits(num_tokens=8, num_heads=64, topk=512, extra_topk=64,
                                                               num_sms=sms, head_tiles=tiles)
    assert plan == {"head_tiles": tiles, "num_splits": splits[0], "chunks_per_block": splits[1]}
    p.check()


@pytest.mark.parametrize("heads", [8, 64, 128])
def test_dsv41_decode_planned_and_split(heads):
    p = Dsv41(H=heads)
    plan = p.run()
    assert set(plan) == {"variant", "head_tiles", "num_splits", "chunks_per_block", "precision"}
    assert plan["variant"] in kiln.cake_sparse_mla_sm120_dsv41_mixed_format_info()["variants"]
    assert plan["precision"] == 0
    p.check()
    plan = p.run(num_splits=2)  # 2 + 8 chunks: 5 per block
    assert (plan["num_splits"], plan["chunks_per_block"]) == (2, 5)
    p.check()


def test_dsv41_capture_after_warm_replays_new_indices():
    # 32 heads are used by no other test of this file, so only warm_sparse_dsv41 has loaded the kernels
    # the capture needs.
    p = Dsv41(H=32, seed=10)
    kiln.warm_sparse_dsv41(32, has_extra=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p.run()
    g = torch.Generator().manual_seed(11)
    p.indices.copy_(torch.randint(-1, p.pool.shape[0] * p.main_page, p.indices.shape, generator=g).int())
    p.extra_topk_length.copy_(torch.randint(0, p.extra_indices.shape[1] + 1, p.extra_topk_length.shape,
                                            generator=g).int())
    graph.replay()
    torch.cuda.synchronize()
    p.check()
    replayed = p.output.clone(), p.out_lse.clone()
    p.run()
    assert torch.equal(replayed[0], p.output) and torch.equal(replayed[1], p.out_lse)


def test_graph_capture_and_replay_after_metadata_changes():
    p = Mla(seed=5)
    p.warm()
    s = Sparse(seed=6)
    kiln.warm_sparse(64, has_extra=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p.run()
        s.run()
    p.seq_lens.copy_(torch.randint(2, p.max_seq_len + 1, (p.B,), device="cuda", dtype=torch.int32))
    p.block_tables.copy_(p.block_tables.flip(1))
    s.indices.copy_(torch.randint(-1, 32 * 64, s.indices.shape, device="cuda", dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    p.check(p.out)
    s.check()
    eager = p.out.clone()
    p.run()
    assert torch.equal(eager, p.out)


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused launch was its only work
def test_capture_of_a_cold_key_names_it_and_sealed_refuses():
    p = Mla(seed=7)
    p.max_seq_len = 1000  # a policy nobody warmed
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(kiln.NotWarmError) as info:
        with torch.cuda.graph(graph):
            p.run()
    assert info.value.key and "max_seq_len=1000" in info.value.key and info.value.code == "not_warm"
    p.max_seq_len = 999
    kiln.seal()
    try:
        with pytest.raises(kiln.SealedError) as info:
            p.run()
        assert "max_seq_len=999" in info.value.key
    finally:
        kiln.unseal()


def test_two_streams():
    a, b = Mla(seed=8), Mla(seed=9)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(s1):
            a.run()
        with torch.cuda.stream(s2):
            b.run()
    torch.cuda.synchronize()
    a.check(a.out)
    b.check(b.out)
    c = Mla(seed=10)
    with kiln.use_stream(s2):
        c.run()
    s2.synchronize()
    c.check(c.out)


def test_compile_fullgraph():
    p, s = Mla(seed=11), Sparse(seed=12)

    def step(q, seq_lens, out, sq, output, out_lse):
        o = kiln.prims_ts_batch_decode_with_kv_cache_mla(q, p.kv, p.workspace, 512, 64, p.block_tables, seq_lens,
                                                        p.max_seq_len, out=out, bmm1_scale=p.bmm1, bmm2_scale=p.bmm2)
        plan = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_decode(sq, s.cache, s.indices, output, out_lse, s.sm_scale,
                                                            attn_sink=s.sink, extra_kv_cache=s.extra_cache,
                                                            extra_indices=s.extra_indices, mid_out=s.mid_out,
                                                            mid_lse=s.mid_lse, num_splits=2)
        return o, plan["num_splits"]

    compiled = torch.compile(step, fullgraph=True)
    o, splits = compiled(p.q, p.seq_lens, p.out, s.q, s.output, s.out_lse)
    torch.cuda.synchronize()
    assert splits == 2
    p.check(o)
    p.check(p.out)  # the op's write reached the caller's tensor
    s.check()


def test_opcheck():
    p, s = Mla(seed=13), Sparse(seed=14)
    ops = torch.ops.kiln
    torch.library.opcheck(ops.mla_decode.default, (p.q, p.kv, p.workspace, 512, 64, p.block_tables, p.seq_lens,
                                                   p.max_seq_len, None, None, p.out, p.bmm1, p.bmm2, "causal",
                                                   torch.bfloat16, "bf16"))
    torch.library.opcheck(ops.sparse_decode.default, (s.q, s.cache, s.indices, s.output, s.out_lse, s.sm_scale, None,
                                                      s.sink, s.extra_cache, s.extra_indices, None, s.mid_out, s.mid_lse,
                                                      1.0, 2, 16, None))
    latent = torch.randn(2, 64, 512, device="cuda").bfloat16()
    cache = torch.empty(2, 64, 384, dtype=torch.uint8, device="cuda")
    torch.library.opcheck(ops.nvfp4_pack.default, (latent, cache))
    torch.library.opcheck(ops.nvfp4_append.default, (latent[0], torch.arange(64, dtype=torch.int32, device="cuda"),
                                                     cache))
    for fmt, record in (("fp8", 528), ("fp4", 288)):
        cache = torch.empty(2, 1, 64, record, dtype=torch.uint8, device="cuda")
        torch.library.opcheck(ops.dsv41_pack.default, (fmt, latent, cache))
        torch.library.opcheck(ops.dsv41_append.default, (fmt, latent[0], torch.arange(64, device="cuda"), cache))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_devices():
    p0, p1 = Mla(device=0, seed=15), Mla(device=1, seed=15)  # same values on both devices
    p0.warm(devices=[0, 1])
    kiln.warm_sparse(64, has_extra=True, devices=[0, 1])
    loads = kiln.counters()["loads"]
    # torch's current device stays 0: the launch follows the tensors (stream of cuda:1) all the same.
    assert torch.cuda.current_device() == 0
    p0.run()
    p1.run()
    on_stream = torch.empty_like(p1.out)
    with torch.cuda.stream(torch.cuda.Stream(device=1)):
        p1.run(out=on_stream)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert kiln.counters()["loads"] == loads  # both devices' handles were warm: nothing loaded
    assert torch.equal(p0.out.cpu(), p1.out.cpu()) and torch.equal(on_stream, p1.out)
    p1.check(p1.out)
    s1 = Sparse(device=1, seed=16)
    s1.run()
    torch.cuda.synchronize(1)
    s1.check()
    with pytest.raises(kiln.InvalidArgumentError, match="block_tables is on cuda:0 but query is on cuda:1"):
        kiln.prims_ts_batch_decode_with_kv_cache_mla(p1.q, p1.kv, p1.workspace, 512, 64, p0.block_tables, p1.seq_lens,
                                                    p1.max_seq_len, out=p1.out)
    with pytest.raises(kiln.InvalidArgumentError, match="query: the tensor is on cuda:1 but the stream belongs to cuda:0"):
        with kiln.use_stream(torch.cuda.Stream(device=0)):
            p1.run()


# ---------------------------------------------------------------- upstream's current surface

def _planned(p, **kw):
    wrapper = kiln.BatchMLADecodePagedTSWrapper()
    wrapper.plan(p.device, p.B, p.H, 512, 64, p.page, p.max_seq_len, max_seq_len_q=p.SQ, packed_query=p.packed,
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, o_data_type=torch.bfloat16, **kw)
    return wrapper


def _run(wrapper, p, **kw):
    return wrapper.run(p.q, p.kv, p.block_tables, p.seq_lens, qo_indptr=p.qo_indptr, bmm1_scale=p.bmm1,
                       bmm2_scale=p.bmm2, **kw)


def test_wrapper_matches_the_seed_function():
    for packed in (False, True):
        p = Mla(packed=packed, seed=20 + packed)
        wrapper = _planned(p)
        got = _run(wrapper, p)  # out=None: allocated; validate=True: metadata read back first
        p.check(got)
        assert torch.equal(got, p.run().clone())
        assert torch.equal(_run(wrapper, p, out=torch.empty_like(p.out), validate=False), got)
    p = Mla(seed=22)
    assert torch.equal(kiln.prims_ts_batch_mla_decode_with_kv_cache(
        p.q, p.kv, p.workspace, 512, 64, p.block_tables, p.seq_lens, p.max_seq_len, bmm1_scale=p.bmm1,
        bmm2_scale=p.bmm2).clone(), p.run().clone())


def test_wrapper_precision_follows_plan():
    p = Mla(seed=23)
    with kiln.mla_precision("bf16"):
        scoped = _planned(p)      # the scope at plan time
    explicit = _planned(p, precision="bf16")
    exact = _planned(p)
    a, b, c = (_run(w, p, validate=False).clone() for w in (scoped, explicit, exact))
    assert torch.equal(a, b) and not torch.equal(a, c)
    p.check(c)


def test_wrapper_validation_refuses_bad_metadata_and_launches_nothing():
    p = Mla(seed=24)
    wrapper = _planned(p)
    sentinel = torch.full_like(p.out, 7.0)
    for bad, phrase in ((0, "at least one KV token"), (p.max_seq_len + 1, "longer than max_kv_len")):
        lens = p.seq_lens.clone()
        lens[1] = bad
        out = sentinel.clone()
        with pytest.raises(ValueError, match=phrase):
            wrapper.run(p.q, p.kv, p.block_tables, lens, out=out)
        assert torch.equal(out, sentinel)
    tables = p.block_tables.clone()
    tables[0, 0] = p.kv.shape[0]
    with pytest.raises(ValueError, match="invalid page ID"):
        wrapper.run(p.q, p.kv, tables, p.seq_lens)
    lens = p.seq_lens.clone()
    lens[2] = 1  # SQ = 2 causal rows over one token
    with pytest.raises(ValueError, match="causal MLA decode requires every per-request Q length"):
        wrapper.run(p.q, p.kv, p.block_tables, lens)
    with pytest.raises(ValueError, match="causal MLA decode requires"):
        kiln.validate_mla_metadata(p.q, p.kv, p.block_tables, lens, p.max_seq_len)


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused capture launched nothing
def test_validation_is_refused_inside_capture_and_validate_false_replays():
    p = Mla(seed=25)
    wrapper = _planned(p)
    _run(wrapper, p, out=p.out, validate=False)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="pass validate=False inside the capture"):
        with torch.cuda.graph(graph):
            _run(wrapper, p, out=p.out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(wrapper, p, out=p.out, validate=False)
    p.seq_lens.copy_(torch.randint(2, p.max_seq_len + 1, (p.B,), device="cuda", dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    p.check(p.out)


def test_one_shot_allocating_form():
    p = Mla(seed=26)
    got = kiln.batch_mla_decode_with_paged_kv_cache(p.q, p.kv, p.block_tables, p.seq_lens, max_kv_len=p.max_seq_len,
                                                    bmm1_scale=p.bmm1, bmm2_scale=p.bmm2)
    p.check(got)
    lens = p.seq_lens.clone()
    lens[0] = 0
    with pytest.raises(ValueError, match="at least one KV token"):
        kiln.batch_mla_decode_with_paged_kv_cache(p.q, p.kv, p.block_tables, lens)


def test_sparse_validation_on_device_tensors():
    s = Sparse(seed=27)
    kiln.validate_sparse_metadata(s.cache, s.indices, extra_kv_cache=s.extra_cache, extra_indices=s.extra_indices)
    bad = s.indices.clone()
    bad[3, 5] = s.cache.shape[0] * s.page
    with pytest.raises(ValueError, match="indices entries must be -1 or a cache row"):
        kiln.validate_sparse_metadata(s.cache, bad)
    lengths = torch.full((s.q.shape[0],), 5, dtype=torch.int32, device="cuda")
    kiln.validate_sparse_metadata(s.cache, bad, topk_length=lengths)  # slot 5 is past every length
    lengths[0] = s.indices.shape[1] + 1
    with pytest.raises(ValueError, match="topk_length must be within"):
        kiln.validate_sparse_metadata(s.cache, s.indices, topk_length=lengths)


def test_eager_calls_show_as_kiln_ops_in_the_profiler():
    p = Mla(seed=28)
    p.warm()
    s = Sparse(seed=29)
    s.run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        p.run()
        s.run()
    names = {e.name for e in prof.events()}
    assert "kiln::mla_decode" in names and "kiln::sparse_decode" in names, sorted(names)[:20]
    p.check(p.out)
    s.check()
