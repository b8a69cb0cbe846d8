"""The public functions have the upstream signatures exactly: the two seeds' signature lines are kept in
seed_signatures.txt (copied from shared/seeds/*.txt, FlashInfer's documentation of them, and compared with
those files where shared/ is beside the checkout), the planner helpers are FlashInfer's
(flashinfer/mla/_sparse_mla_sm120/_cake_dsv4_nvfp4.py)."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import kiln
from conftest import REPO, have_torch

SIGNATURES = Path(__file__).with_name("seed_signatures.txt")
# shared/ lies beside the main checkout or beside a folder of worktrees; a fresh clone may have none.
SEEDS = next((p / "shared" / "seeds" for p in REPO.parents if (p / "shared" / "seeds").is_dir()), None)

PLANNERS = {
    "cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks": "topk: int, extra_topk: int = 0) -> int",
    "cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles":
        "*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int) -> int",
    "cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits":
        "*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int, max_splits: int = 16, "
        "head_tiles: int = 1) -> Tuple[int, int]",
    "cake_sparse_mla_sm120_dsv4_nvfp4_scratch_bytes":
        "num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0) -> int",
    # The DeepSeek-V4.1 entry's companions (flashinfer/mla/_sparse_mla_sm120/cake_dsv41_mixed.py).
    "cake_sparse_mla_sm120_dsv41_mixed_num_chunks": "topk: int, extra_topk: int = 0) -> int",
    "cake_sparse_mla_sm120_dsv41_mixed_plan_head_tiles":
        "*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int) -> int",
    "cake_sparse_mla_sm120_dsv41_mixed_plan_splits":
        "*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int, max_splits: int = 16, "
        "head_tiles: int = 1, unified_memory: bool = False, ragged: bool = False) -> Tuple[int, int]",
    "cake_sparse_mla_sm120_dsv41_mixed_scratch_bytes":
        "num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0) -> int",
    "cake_sparse_mla_sm120_dsv41_mixed_supported_heads": ") -> Tuple[int, ...]",
    "cake_sparse_mla_sm120_dsv41_mixed_decode":
        "q: Tensor, kv_cache: Tensor, indices: Tensor, output: Tensor, out_lse: Tensor, sm_scale: float, *, "
        "topk_length: Tensor | None = None, attn_sink: Tensor | None = None, extra_kv_cache: Tensor | None = None, "
        "extra_indices: Tensor | None = None, extra_topk_length: Tensor | None = None, mid_out: Tensor | None = None, "
        "mid_lse: Tensor | None = None, lse_scale: float = 1.0, num_splits: int | None = None, max_splits: int = 16, "
        "head_tiles: int | None = None, variant: str | None = None, compute_precision: str = 'bf16', "
        "enable_pdl: bool | None = None) -> Dict[str, Any]",
}


def signature_lines(text):
    """{qualified name: "params) -> return"} from the signature lines of a seed text."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([\w.]+)\((.*)\) → (.+)$", line.strip())
        if m:
            out[m.group(1)] = f"{m.group(2)}) -> {m.group(3)}"
    return out


def seed_texts():
    return signature_lines(SIGNATURES.read_text())


def expected(text):
    """[(name, kind, annotation, default source)], return annotation, from "params) -> ret"."""
    fn = ast.parse(f"def f({text}: ...").body[0]
    a = fn.args
    rows = []
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(a.args, defaults):
        rows.append((arg.arg, "positional", ast.unparse(arg.annotation), default and ast.unparse(default)))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        rows.append((arg.arg, "keyword-only", ast.unparse(arg.annotation), default and ast.unparse(default)))
    assert not a.posonlyargs and a.vararg is None and a.kwarg is None
    return rows, ast.unparse(fn.returns)


def default_source(value):
    if have_torch():
        import torch

        if isinstance(value, torch.dtype):
            return str(value)  # "torch.bfloat16"
    return repr(value)


def actual(fn):
    sig = inspect.signature(fn)
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional", inspect.Parameter.KEYWORD_ONLY: "keyword-only"}
    rows = []
    for p in sig.parameters.values():
        annotation = ast.unparse(ast.parse(p.annotation, mode="eval"))  # annotations are source strings
        default = None if p.default is inspect.Parameter.empty else default_source(p.default)
        rows.append((p.name, kinds[p.kind], annotation, default))
    return rows, ast.unparse(ast.parse(sig.return_annotation, mode="eval"))


def test_both_seeds_are_read():
    names = sorted(seed_texts())
    assert names == ["flashinfer.attention.prims_ts.prims_ts_batch_decode_with_kv_cache_mla",
                     "flashinfer.mla.cake_sparse_mla_sm120_dsv4_nvfp4_decode"], f"seeds in {SIGNATURES}: {names}"


@pytest.mark.skipif(SEEDS is None, reason="no shared/seeds beside this checkout to compare seed_signatures.txt with")
def test_signature_lines_match_the_seed_files():
    from_seeds = {}
    for path in sorted(SEEDS.glob("*.txt")):
        from_seeds.update(signature_lines(path.read_text()))
    assert seed_texts() == from_seeds


@pytest.mark.parametrize("qualified", sorted(seed_texts()))
def test_seed_signature(qualified):
    want_rows, want_return = expected(seed_texts()[qualified])
    got_rows, got_return = actual(getattr(kiln, qualified.rsplit(".", 1)[1]))
    assert got_return == want_return
    assert [r[:3] for r in got_rows] == [r[:3] for r in want_rows]
    for (name, _, _, got), (_, _, _, want) in zip(got_rows, want_rows):
        if want is not None and want.startswith("torch.") and not have_torch():
            continue  # test_seed_torch_defaults
        assert got == want, f"default of {name}"


@pytest.mark.skipif(not have_torch(), reason="without torch, out_dtype defaults to kiln's 'bfloat16' name, not "
                                             "torch.bfloat16; every other part of the signature is checked above")
@pytest.mark.parametrize("qualified", sorted(seed_texts()))
def test_seed_torch_defaults(qualified):
    want_rows, _ = expected(seed_texts()[qualified])
    got_rows, _ = actual(getattr(kiln, qualified.rsplit(".", 1)[1]))
    for got, want in zip(got_rows, want_rows):
        if want[3] is not None and want[3].startswith("torch."):
            assert got[3] == want[3], got[0]


@pytest.mark.parametrize("name", sorted(PLANNERS))
def test_planner_signature(name):
    assert actual(getattr(kiln, name)) == expected(PLANNERS[name])


def test_native_stub_lists_the_module():
    import kiln._native as native

    stub = (REPO / "tools/python/kiln/_native.pyi").read_text()
    stubbed = set(re.findall(r"^(?:def|class) (\w+)", stub, re.M))
    exported = {n for n in dir(native) if not n.startswith("__")}
    assert stubbed == exported
