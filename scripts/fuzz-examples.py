"""Adds the fuzzed server's own names to its OpenAPI document as `examples`, for scripts/fuzz-api.sh.

Usage: fuzz-examples.py openapi.json NAMES.json   (rewrites openapi.json in place)

NAMES.json maps a parameter or property name (`tenant`, `project`, `id`, `class`, `node`,
`gpu`, `pool`, `mig`) to values that exist on the server. Schemathesis's coverage phase builds
its requests from the schema alone (it does not use the fuzzing phase's dictionaries) and
starts from a schema's `examples`: without them, every workload it creates names tenant `0`,
which does not exist, and every quota it sets is for tenant `0`, so no schema-valid request of
theirs ever reaches the handler's logic. The examples change no rule of the document (an
example that did not fit its schema would not be used), and the coverage phase still sends its
boundary values (made-up names) beside them.
"""

import json
import sys

doc_path, names_path = sys.argv[1], sys.argv[2]
with open(doc_path) as f:
    doc = json.load(f)
with open(names_path) as f:
    names = json.load(f)

# Path parameters by name, every operation.
for item in doc["paths"].values():
    for op in item.values():
        if not isinstance(op, dict):
            continue
        for p in op.get("parameters", []):
            if p.get("in") == "path" and p["name"] in names:
                p["schema"]["examples"] = names[p["name"]]
# Request bodies' properties that name something on the server.
for schema, props in {
    "CreateWorkload": ["tenant", "project"],
    "CreateToken": ["tenant"],
    "GpuShape": ["pool", "mig"],
    "CreateRollout": ["pool"],
}.items():
    for prop in props:
        doc["components"]["schemas"][schema]["properties"][prop]["examples"] = names[prop]
with open(doc_path, "w") as f:
    json.dump(doc, f)
