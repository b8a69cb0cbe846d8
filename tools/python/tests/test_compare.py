"""tools/bench/compare.py: a kiln report against the anchors, and against another report (--baseline)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

COMPARE = pathlib.Path(__file__).resolve().parents[2] / "bench" / "compare.py"


def run(*args):
    r = subprocess.run([sys.executable, str(COMPARE), *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def write(path, rows, gpu="NVIDIA H200"):
    path.write_text(json.dumps({"gpu": gpu, "results": rows}))
    return path


def dense(b, sq, h, l, us, precision="exact"):
    return {"B": b, "SQ": sq, "H": h, "L": l, "us_per_call": us, "precision": precision}


def test_baseline_ratios_per_config_and_mode(tmp_path):
    new = write(tmp_path / "new.json", [dense(1, 1, 16, 1024, 10.0), dense(8, 1, 128, 4096, 20.0),
                                       dense(1, 1, 16, 1024, 5.0, "bf16"), dense(64, 2, 64, 16384, 1.0)])
    base = write(tmp_path / "base.json", [dense(1, 1, 16, 1024, 20.0), dense(8, 1, 128, 4096, 10.0),
                                         dense(1, 1, 16, 1024, 20.0, "bf16")])
    rc, out, err = run(new, "--baseline", base)
    assert rc == 0, err
    exact, bf16 = out.split("== precision bf16")
    # base / new per config: 2.0 and 0.5 (geomean 1.0); the config missing from the baseline is left out.
    assert "against baseline: 2 configs  geomean 1.000  min 0.500  max 2.000" in exact
    assert "1  1  16  1024  10.0  20.0  2.00" in exact
    assert "64  2  64  16384" not in exact
    assert "against baseline: 1 configs  geomean 4.000" in bf16  # modes are matched with their own rows
    assert "FlashMLA" not in out


def test_sparse_rows_and_no_overlap(tmp_path):
    row = {"T": 1, "H": 64, "topk": 512, "extra_topk": 0, "us_per_call": 8.0}
    new = write(tmp_path / "new.json", [row])
    base = write(tmp_path / "base.json", [dict(row, us_per_call=12.0)])
    rc, out, _ = run(new, "--baseline", base)
    assert rc == 0 and "against baseline: 1 configs  geomean 1.500" in out and "T=1" in out
    other = write(tmp_path / "other.json", [dict(row, T=8)])
    rc, _, err = run(new, "--baseline", other)
    assert rc != 0 and "no config of this report is in the baseline report" in err


def test_anchors_of_the_reports_own_card(tmp_path):
    rc, out, err = run(write(tmp_path / "h200.json", [dense(1, 1, 16, 1024, 11.0)], "NVIDIA H200"))
    assert rc == 0, err
    assert "anchors: h200" in out and "against FlashMLA: 1 configs" in out and "flashmla_us" in out
    sparse = {"T": 1, "H": 64, "topk": 512, "extra_topk": 0, "us_per_call": 8.0}
    rc, out, err = run(write(tmp_path / "h100.json", [sparse], "NVIDIA H100 80GB HBM3"))
    assert rc == 0 and "anchors: h100 (sparse)" in out and "against FlashMLA: 1 configs" in out, err
    # A card without anchors is refused rather than compared with another card's timings...
    other = write(tmp_path / "a100.json", [dense(1, 1, 16, 1024, 11.0)], "NVIDIA A100-SXM4-80GB")
    rc, _, err = run(other)
    assert rc != 0 and "--anchors" in err
    # ...unless the caller names the anchors.
    rc, out, err = run(other, "--anchors", "h200")
    assert rc == 0 and "anchors: h200" in out, err


def test_several_runs_take_each_configs_fastest(tmp_path):
    new1 = write(tmp_path / "new1.json", [dense(1, 1, 16, 1024, 10.0), dense(8, 1, 128, 4096, 30.0)])
    new2 = write(tmp_path / "new2.json", [dense(1, 1, 16, 1024, 12.0), dense(8, 1, 128, 4096, 20.0)])
    base1 = write(tmp_path / "base1.json", [dense(1, 1, 16, 1024, 40.0), dense(8, 1, 128, 4096, 20.0)])
    base2 = write(tmp_path / "base2.json", [dense(1, 1, 16, 1024, 20.0), dense(8, 1, 128, 4096, 25.0)])
    rc, out, err = run(new1, new2, "--baseline", base1, base2)
    assert rc == 0, err
    # fastest of each side: new 10 and 20, baseline 20 and 20 -> ratios 2.0 and 1.0
    assert "1  1  16  1024  10.0  20.0  2.00" in out
    assert "8  1  128  4096  20.0  20.0  1.00" in out
    assert "against baseline: 2 configs  geomean 1.414  min 1.000  max 2.000" in out


def test_runs_of_different_configs_are_refused(tmp_path):
    one = write(tmp_path / "one.json", [dense(1, 1, 16, 1024, 10.0)])
    two = write(tmp_path / "two.json", [dense(8, 1, 16, 1024, 10.0)])
    rc, _, err = run(one, two)
    assert rc != 0 and "does not time the same configs" in err
