"""Per-operation response counts of a schemathesis run, from its HAR report.

Usage: fuzz-statuses.py RUN.har openapi.json

Prints one line per operation of the document: how many of its requests were answered 2xx,
400/422 (refused as invalid), other 4xx and 5xx. An operation that never answers 2xx to
generated data is one whose generated requests never reach the handler's logic.
"""

import json
import re
import sys
from collections import Counter, defaultdict
from urllib.parse import urlsplit

har_path, doc_path = sys.argv[1], sys.argv[2]
with open(doc_path) as f:
    doc = json.load(f)
operations = []
for path, item in doc["paths"].items():
    pattern = re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path)) + "$")
    for method in item:
        if method in ("get", "put", "post", "delete", "patch"):
            operations.append((method.upper(), path, pattern))
# Literal paths before templated ones (`/workloads/dry-run` before `/workloads/{id}`).
operations.sort(key=lambda o: (o[1].count("{"), -len(o[1])))

with open(har_path) as f:
    entries = json.load(f)["log"]["entries"]
counts = defaultdict(Counter)
for e in entries:
    method = e["request"]["method"]
    path = urlsplit(e["request"]["url"]).path
    status = e["response"]["status"]
    name = next((f"{m} {p}" for m, p, rx in operations if m == method and rx.match(path)), f"{method} ?")
    kind = (
        "2xx"
        if 200 <= status < 300
        else "400/422"
        if status in (400, 422)
        else "4xx"
        if status < 500
        else "5xx"
    )
    counts[name][kind] += 1
print(f"   {'operation':58} {'2xx':>5} {'400/422':>8} {'4xx':>5} {'5xx':>4}")
for name in sorted(counts):
    c = counts[name]
    print(f"   {name:58} {c['2xx']:5} {c['400/422']:8} {c['4xx']:5} {c['5xx']:4}")
