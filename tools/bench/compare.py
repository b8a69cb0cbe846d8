#!/usr/bin/env python3
"""Ratios of a `kiln bench mla|sparse|sparse_dsv41 --out FILE` report to the H200 anchors beside this script.

    python3 tools/bench/compare.py REPORT.json [--precision MODE] [--csv OUT]

ratio = anchor time / kiln time per config, so above 1 means kiln is faster. The anchors are
results/flashmla_h200_dense.csv and results/fa3_h200_dense.csv (dense MLA decode) and
results/flashmla_h200_sparse.csv (sparse decode, DeepSeek-V4 FP8 cache); results/README.md says how
they were measured. Prints one line per matched config, the geometric mean over all of them and per
group, and for dense reports the same again against the faster of FlashMLA and FlashAttention-3.
A dense report that times the grid in several precision modes is compared mode by mode;
--precision keeps only the rows whose "precision" field equals MODE.
"""
import argparse
import csv
import json
import math
import os
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Groups a reader compares against the anchors: name -> predicate over a config key.
DENSE_GROUPS = [  # key: (B, SQ, H, L)
    ("H*SQ<=32", lambda k: k[1] * k[2] <= 32),
    ("H*SQ=64", lambda k: k[1] * k[2] == 64),
    ("H*SQ>=128", lambda k: k[1] * k[2] >= 128),
    ("B=1", lambda k: k[0] == 1),
    ("B>=64", lambda k: k[0] >= 64),
]
SPARSE_GROUPS = [  # key: (T, H, main_topk, extra_topk)
    ("T=1", lambda k: k[0] == 1),
    ("H=64", lambda k: k[1] == 64),
    ("H=128", lambda k: k[1] == 128),
    ("T>=64", lambda k: k[0] >= 64),
]


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def read_anchor(name, key_of, keep=lambda row: True):
    """{config key: microseconds per call} of one anchor CSV ({} when the file is absent)."""
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {key_of(row): float(row["t_us"]) for row in csv.DictReader(f) if keep(row)}


def dense_key(row):
    return (int(row["b"]), int(row["s_q"]), int(row["h_q"]), int(row["seq_k"]))


def sparse_key(row):
    return (int(row["T"]), int(row["h_q"]), int(row["main_topk"]), int(row["extra_topk"]))


def summary(label, pairs, groups):
    """pairs: [(key, ratio)]. One line overall, one per non-empty group."""
    ratios = [r for _, r in pairs]
    print("%s: %d configs  geomean %.3f  min %.3f  max %.3f" % (label, len(ratios), geomean(ratios), min(ratios), max(ratios)))
    for name, member in groups:
        sel = [r for k, r in pairs if member(k)]
        if sel:
            print("  %-10s n=%3d  geomean %.3f  min %.3f" % (name, len(sel), geomean(sel), min(sel)))


def compare(rows, csv_out=None):
    """Prints the matched rows and the group ratios of one report's rows (one precision mode)."""
    sparse = "topk" in rows[0]
    if sparse:
        columns = ("T", "H", "main_topk", "extra_topk")
        anchor = read_anchor("flashmla_h200_sparse.csv", sparse_key, lambda row: row["fmt"] == "model1")
        groups = SPARSE_GROUPS
        key_of = lambda r: (r["T"], r["H"], r["topk"], r.get("extra_topk", 0))
        second = {}
    else:
        columns = ("B", "SQ", "H", "L")
        anchor = read_anchor("flashmla_h200_dense.csv", dense_key)
        groups = DENSE_GROUPS
        key_of = lambda r: (r["B"], r["SQ"], r["H"], r["L"])
        second = read_anchor("fa3_h200_dense.csv", dense_key)

    matched = sorted((key_of(r), r["us_per_call"], anchor[key_of(r)]) for r in rows if key_of(r) in anchor)
    if not matched:
        sys.exit("compare.py: no config of this report is in the anchor grid")

    print("  ".join(columns) + "  kiln_us  flashmla_us  ratio")
    for key, kiln_us, anchor_us in matched:
        print("%s  %.1f  %.1f  %.2f" % ("  ".join(str(v) for v in key), kiln_us, anchor_us, anchor_us / kiln_us))
    print()
    summary("against FlashMLA", [(k, a / t) for k, t, a in matched], groups)
    best = [(k, min(a, second[k]) / t) for k, t, a in matched if k in second]
    if best:
        summary("against the faster of FlashMLA and FA3", best, groups)

    if csv_out:
        with open(csv_out, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(list(columns) + ["kiln_us", "flashmla_us", "ratio"])
            for key, kiln_us, anchor_us in matched:
                out.writerow(list(key) + [kiln_us, anchor_us, round(anchor_us / kiln_us, 4)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="JSON written by kiln bench mla|sparse|sparse_dsv41 --out")
    parser.add_argument("--precision", help="dense reports: keep the rows of this precision mode only")
    parser.add_argument("--csv", help="also write the matched rows to this CSV file (with one precision mode)")
    args = parser.parse_args()

    with open(args.report) as f:
        rows = json.load(f)["results"]
    if args.precision:
        rows = [r for r in rows if r.get("precision") == args.precision]
    if not rows:
        sys.exit("compare.py: no result rows to compare" + (" with precision %r" % args.precision if args.precision else ""))

    # A report that times the grid in several precision modes is compared mode by mode: each mode's
    # rows stand for the same configs.
    modes = sorted({r.get("precision") for r in rows}, key=lambda m: (m is not None, m != "exact", m))
    if len(modes) > 1 and args.csv:
        sys.exit("compare.py: --csv takes one precision mode; add --precision MODE")
    for i, mode in enumerate(modes):
        if len(modes) > 1:
            print("%s== precision %s" % ("\n" if i else "", mode))
        compare([r for r in rows if r.get("precision") == mode], args.csv)


if __name__ == "__main__":
    main()
