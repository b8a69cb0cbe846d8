#!/usr/bin/env python3
"""Ratios of a `kiln bench mla|sparse|sparse_dsv41 --out FILE` report to the anchors beside this script.

    python3 tools/bench/compare.py REPORT.json [--precision MODE] [--csv OUT] [--anchors CARD]

ratio = anchor time / kiln time per config, so above 1 means kiln is faster. The anchors are
results/flashmla_CARD_dense.csv and results/fa3_CARD_dense.csv (dense MLA decode) and
results/flashmla_CARD_sparse.csv (sparse decode, DeepSeek-V4 FP8 cache), CARD h200 or h100;
results/README.md says how they were measured. CARD is the report's own GPU unless --anchors names
one: a ratio only means something between timings of one kind of card. Prints one line per matched
config, the geometric mean over all of them and per group, and for dense reports the same again
against the faster of FlashMLA and FlashAttention-3 where that card has both.
A dense report that times the grid in several precision modes is compared mode by mode;
--precision keeps only the rows whose "precision" field equals MODE.

    python3 tools/bench/compare.py REPORT.json --baseline BASE.json

compares two kiln reports instead (a before/after of one change, ideally timed in one session,
interleaved): ratio = BASE time / REPORT time per config present in both, so above 1 means REPORT
is faster; the same lines, geometric means and groups.

    python3 tools/bench/compare.py NEW1.json NEW2.json --baseline BASE1.json BASE2.json

takes several runs on either side (of one binary, e.g. a grid timed twice, alternating with the
other binary) and uses each config's fastest time: a run's slow outliers (power state, another
process) then weigh on neither side. Every run must time the same configs.
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


ANCHOR_CARDS = ("h200", "h100")


def card_of(report):
    """The anchor card of a report's GPU ("NVIDIA H100 80GB HBM3" -> h100), or None."""
    gpu = report.get("gpu", "").lower()
    return next((card for card in ANCHOR_CARDS if card in gpu), None)


def load_reports(paths):
    reports = []
    for path in paths:
        with open(path) as f:
            reports.append(json.load(f))
    return reports


def read_anchor(name, key_of, keep=lambda row: True, required=False):
    """{config key: microseconds per call} of one anchor CSV ({} when an optional file is absent)."""
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        if required:
            sys.exit("compare.py: no anchor file %s; pass --anchors with one of %s" % (path, ", ".join(ANCHOR_CARDS)))
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


def report_key(r):
    """A report row's config: (T, H, main_topk, extra_topk) for sparse rows, (B, SQ, H, L) for dense."""
    if "topk" in r:
        return (r["T"], r["H"], r["topk"], r.get("extra_topk", 0))
    return (r["B"], r["SQ"], r["H"], r["L"])


def compare(rows, card, csv_out=None, baseline=None):
    """Prints the matched rows and the group ratios of one report's rows (one precision mode), against
    the anchors of `card`, or against `baseline` ({config: us per call} of another report) when given."""
    sparse = "topk" in rows[0]
    columns = ("T", "H", "main_topk", "extra_topk") if sparse else ("B", "SQ", "H", "L")
    groups = SPARSE_GROUPS if sparse else DENSE_GROUPS
    second = {}
    if baseline is not None:
        anchor, anchor_name = baseline, "baseline"
    elif sparse:
        anchor = read_anchor("flashmla_%s_sparse.csv" % card, sparse_key, lambda row: row["fmt"] == "model1", True)
        anchor_name = "FlashMLA"
    else:
        anchor, anchor_name = read_anchor("flashmla_%s_dense.csv" % card, dense_key, required=True), "FlashMLA"
        second = read_anchor("fa3_%s_dense.csv" % card, dense_key)
    if baseline is None:
        print("anchors: %s (%s)" % (card, "sparse" if sparse else "dense"))

    matched = sorted((report_key(r), r["us_per_call"], anchor[report_key(r)]) for r in rows if report_key(r) in anchor)
    if not matched:
        sys.exit("compare.py: no config of this report is in the %s" % ("baseline report" if baseline is not None else "anchor grid"))

    print("  ".join(columns) + "  kiln_us  %s_us  ratio" % anchor_name.lower())
    for key, kiln_us, anchor_us in matched:
        print("%s  %.1f  %.1f  %.2f" % ("  ".join(str(v) for v in key), kiln_us, anchor_us, anchor_us / kiln_us))
    print()
    summary("against " + anchor_name, [(k, a / t) for k, t, a in matched], groups)
    best = [(k, min(a, second[k]) / t) for k, t, a in matched if k in second]
    if best:
        summary("against the faster of FlashMLA and FA3", best, groups)

    if csv_out:
        with open(csv_out, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(list(columns) + ["kiln_us", anchor_name.lower() + "_us", "ratio"])
            for key, kiln_us, anchor_us in matched:
                out.writerow(list(key) + [kiln_us, anchor_us, round(anchor_us / kiln_us, 4)])


def fastest_rows(paths, reports):
    """The first report's rows, each with the fastest us_per_call any of the reports (read from
    `paths`) has for its config and precision mode; exits when the reports do not time the same configs."""
    runs = [report["results"] for report in reports]
    ident = lambda r: (r.get("precision"), report_key(r))
    first = {ident(r) for r in runs[0]}
    for path, run_rows in zip(paths[1:], runs[1:]):
        if {ident(r) for r in run_rows} != first:
            sys.exit("compare.py: %s does not time the same configs as %s" % (path, paths[0]))
    best = {}
    for run_rows in runs:
        for r in run_rows:
            best[ident(r)] = min(best.get(ident(r), r["us_per_call"]), r["us_per_call"])
    return [dict(r, us_per_call=best[ident(r)]) for r in runs[0]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="+",
                        help="JSON written by kiln bench mla|sparse|sparse_dsv41 --out; several runs: each config's fastest")
    parser.add_argument("--precision", help="dense reports: keep the rows of this precision mode only")
    parser.add_argument("--csv", help="also write the matched rows to this CSV file (with one precision mode)")
    parser.add_argument("--anchors", choices=ANCHOR_CARDS,
                        help="the card whose anchors to compare with (default: the report's own GPU)")
    parser.add_argument("--baseline", nargs="+",
                        help="another kiln report of the same bench (or several runs of it): ratios to it instead of the anchors")
    args = parser.parse_args()

    reports = load_reports(args.report)
    card = args.anchors or card_of(reports[0])
    if card is None and not args.baseline:
        sys.exit("compare.py: %s names no GPU with anchors; pass --anchors with one of %s"
                 % (args.report[0], ", ".join(ANCHOR_CARDS)))
    rows = fastest_rows(args.report, reports)
    base_rows = fastest_rows(args.baseline, load_reports(args.baseline)) if args.baseline else None
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
        baseline = None
        if base_rows is not None:
            baseline = {report_key(r): r["us_per_call"] for r in base_rows if r.get("precision") == mode}
        compare([r for r in rows if r.get("precision") == mode], card, args.csv, baseline)


if __name__ == "__main__":
    main()
