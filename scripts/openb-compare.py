#!/usr/bin/env python3
"""Replays every workload file of the openb trace that has published results with Tessera's
policy, the repository's FGD and BestFit, in one run, and prints them side by side with the
published FGD and BestFit figures and the floors of the replay (unallocated GPU % at arrived
100 %, mean over the seeds).

  floor     the least a scheduler that never refuses a pod that fits could leave
  any       the least any scheduler could leave, even one refusing pods that fit
  failed    shares (of all pods) that failed under Tessera by the end of the 100 % window

Usage: scripts/openb-compare.py [--trace-dir ../shared/traces/openb] [--files default,cpu050]
       [--seeds 42-51] [--threads 2] [--sweep target/release/examples/openb_sweep]
       [--order protocol|simulator]
--order simulator builds each seed's arrival order as the paper's simulator does (the pod list
shuffled, the random copies after it; docs/openb-replay.md), instead of the README's protocol.

It runs the replay example (`cargo build --release -p tessera-sched --examples` builds it; the
script builds it when it is missing), which calls the same library as `tessera sim openb`.
"""
import argparse, csv, json, os, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--trace-dir", default="../shared/traces/openb")
ap.add_argument("--sweep", default="target/release/examples/openb_sweep")
ap.add_argument("--files", default="")
ap.add_argument("--seeds", default="42-51")
ap.add_argument("--threads", default=str(os.cpu_count() or 2))
ap.add_argument("--order", default="protocol", choices=["protocol", "simulator"])
a = ap.parse_args()

path = os.path.join(a.trace_dir, "published_fgd_unallocated.csv")
if not os.path.exists(path):
    sys.exit(f"error: {path} not found; pass --trace-dir")
published = {}
with open(path) as f:
    for row in csv.DictReader(f):
        if row["arrived_pct"] == "100":
            published[row["workload"].removeprefix("openb_pod_list_")] = row
files = [w for w in sorted(published) if not a.files or w in a.files.split(",")]
if not files:
    sys.exit("error: no workload file with published figures selected")
if not os.path.exists(a.sweep):
    subprocess.run(["cargo", "build", "--release", "-p", "tessera-sched", "--examples"], check=True)

started = time.time()
measured = {}
for policy in ["tessera", "fgd", "bestfit"]:
    env = dict(os.environ, JSON="1", THREADS=a.threads, TESSERA_OPENB_DIR=a.trace_dir, ORDER=a.order)
    out = subprocess.run([a.sweep, ",".join(files), a.seeds, policy], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip())
    for line in out.stdout.splitlines():
        r = json.loads(line)
        measured[(r["file"], policy)] = r

print(f"unallocated GPU % at arrived 100 %, seeds {a.seeds}, {a.order} order")
print(f"{'workload':<12} {'Tessera':>7} {'FGD':>6} {'FGD pub':>12} {'BestFit':>7} {'BF pub':>6}"
      f" {'floor':>6} {'any':>5} {'failed':>14}")
for w in files:
    t, g, b = (measured[(w, p)] for p in ("tessera", "fgd", "bestfit"))
    p = published[w]
    fgd_pub = f"{float(p['06-FGD_mean']):.2f}±{float(p['06-FGD_sd']):.2f}"
    failed = f"{t['failed_shares_100']:.0f} ({t['failed_pods_100']:.0f})"
    print(f"{w:<12} {t['unallocated_100']:>7.2f} {g['unallocated_100']:>6.2f} {fgd_pub:>12}"
          f" {b['unallocated_100']:>7.2f} {float(p['05-BestFit_mean']):>6.2f}"
          f" {t['non_refusing_floor_100']:>6.2f} {t['any_floor_100']:>5.2f} {failed:>14}")
far = [w for w in files if abs(measured[(w, "fgd")]["unallocated_100"] - float(published[w]["06-FGD_mean"])) > 0.3]
print(f"FGD (ours) within 0.3 point of the published figure on {len(files) - len(far)} of {len(files)} files"
      + (f"; not on {', '.join(far)}" if far else ""))
below = sum(measured[(w, "tessera")]["unallocated_100"] < measured[(w, "fgd")]["unallocated_100"] for w in files)
print(f"Tessera below FGD (ours) on {below} of {len(files)} files; {time.time() - started:.0f} s")
