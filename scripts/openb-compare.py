#!/usr/bin/env python3
"""Replays every workload file of the openb trace that has published results and prints
Tessera's unallocated GPU % at arrived 100 % next to the published FGD and BestFit figures,
and the least any policy that places every fractional share that arrives could leave (the
share limit of `tessera sim openb`).

Usage: scripts/openb-compare.py [--policy tessera] [--trace-dir ../shared/traces/openb]
       [--tessera target/release/tessera] [--files default,cpu050,...]
"""
import argparse, csv, json, os, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("--policy", default="tessera")
ap.add_argument("--trace-dir", default="../shared/traces/openb")
ap.add_argument("--tessera", default="target/release/tessera")
ap.add_argument("--files", default="")
ap.add_argument("--seeds", default="42-51")
a = ap.parse_args()

published = {}
path = os.path.join(a.trace_dir, "published_fgd_unallocated.csv")
if not os.path.exists(path):
    sys.exit(f"error: {path} not found; pass --trace-dir")
with open(path) as f:
    for row in csv.DictReader(f):
        if row["arrived_pct"] == "100":
            published[row["workload"]] = row
wanted = [w for w in published if not a.files or w.removeprefix("openb_pod_list_") in a.files.split(",")]
print(f"{'workload':<28} {a.policy:>9} {'FGD':>6} {'BestFit':>8} {'limit':>6}  wall")
worse = 0
for w in sorted(wanted):
    out = subprocess.run([a.tessera, "sim", "openb", "--trace-dir", a.trace_dir, "--pods",
                          os.path.join(a.trace_dir, w + ".csv"), "--policy", a.policy,
                          "--seeds", a.seeds, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip())
    r = json.loads(out.stdout)
    ours = r["unallocated_pct"]["100"]
    fgd = float(published[w]["06-FGD_mean"])
    bf = float(published[w]["05-BestFit_mean"])
    mark = "" if ours < fgd else "  <-- not below FGD"
    worse += ours >= fgd
    limit = r["share_limit_pct"]["100"]
    print(f"{w:<28} {ours:>9.2f} {fgd:>6.2f} {bf:>8.2f} {limit:>6.2f}  {r['wall_seconds']:.1f}s{mark}")
print(f"{len(wanted) - worse} of {len(wanted)} workloads below FGD")
