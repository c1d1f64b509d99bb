#!/usr/bin/env bash
# Fuzzes the REST API against its own OpenAPI document with schemathesis (PyPI), every check
# enabled: `tessera serve` on the seed fleet with a fresh data directory on a free loopback
# port, a tenant `fuzz` with a project and a workload made through the CLI, then one run with
# the platform-admin token and one with a member token of `fuzz`. Bounded: a fixed seed and
# a fixed number of examples per operation (FUZZ_EXAMPLES, default 40; FUZZ_SEED, default 42).
# The names that exist are also the document's `examples` for the run (scripts/fuzz-examples.py),
# which the coverage phase starts from. Prints, per run, the operations tested, the cases
# generated and passed, and the seconds taken.
# FUZZ_REPORT=DIR also writes each run's requests and responses there (ADMIN.har, member.har)
# and prints, per operation, how many responses were 2xx, 4xx and 5xx.
#
# Usage: scripts/fuzz-api.sh BINARY      (scripts/test.sh passes the test-profile build)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(realpath "${1:?usage: scripts/fuzz-api.sh path/to/tessera}")
[ -z "${FUZZ_REPORT:-}" ] || FUZZ_REPORT=$(mkdir -p "$FUZZ_REPORT" && realpath "$FUZZ_REPORT")
examples=${FUZZ_EXAMPLES:-40}
seed=${FUZZ_SEED:-42}
venv=$PWD/target/fuzz-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/requirements-fuzz.txt

work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" serve --data-dir "$work/data" --listen 127.0.0.1:0 >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
  grep -q "console http://" "$work/serve.log" 2>/dev/null && break
  sleep 0.5
done
grep -q "console http://" "$work/serve.log" || { cat "$work/serve.log"; echo "tessera serve did not start" >&2; exit 1; }
base=$(grep -o "console http://[^/]*" "$work/serve.log" | head -1 | sed 's/^console //')

admin=$(cat "$work/data/admin-token")
cli() { "$bin" --server "$base" --token "$admin" "$@"; }
cli tenants create fuzz >/dev/null
cli projects --tenant fuzz create train >/dev/null
member=$(cli -o json token create --tenant fuzz --role member --name fuzz-member |
  "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["token"])')
workload=$(cli -o json run --tenant fuzz --project train --name seed --mig 1g.10gb --duration 1h |
  "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["id"])')
# A MIG node out of placement with no work, so that switching a GPU's MIG mode can succeed.
mig_node=a100-27
cli node cordon "$mig_node" >/dev/null
"$venv/bin/python" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
  "$base/api/v1/openapi.json" >"$work/openapi.json"
# The coverage phase starts from the document's examples: the names above (scripts/fuzz-examples.py).
cat >"$work/names.json" <<EOF
{"tenant": ["fuzz"], "project": ["train"], "id": [$workload], "class": ["training", "serving", "development"],
 "pool": ["training", "serving", "development"], "mig": ["1g.10gb", "3g.40gb"], "node": ["$mig_node"], "gpu": [0, 1]}
EOF
"$venv/bin/python" scripts/fuzz-examples.py "$work/openapi.json" "$work/names.json"
# Most generated requests use the existing tenant, project and workload, and the seed fleet's
# pools, MIG profiles and the cordoned MIG node, in the path and in the body, so they reach past
# the 404s and 422s of made-up names to the handlers' logic; the rest keep testing those.
{
  cat scripts/schemathesis.toml
  printf '\n[dictionaries.tenant]\nvalues = ["fuzz"]\n[dictionaries.project]\nvalues = ["train"]\n'
  printf '[dictionaries.workload]\nvalues = [%s]\n' "$workload"
  printf '[dictionaries.pool]\nvalues = ["training", "serving", "development"]\n'
  printf '[dictionaries.mig]\nvalues = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]\n'
  printf '[dictionaries.node]\nvalues = ["%s"]\n' "$mig_node"
  printf '[dictionaries.gpu]\nvalues = [0, 1, 2, 3, 4, 5, 6, 7]\n'
  printf '\n[parameters]\n'
  printf '"path.tenant" = { dictionary = "tenant", probability = 0.7 }\n'
  printf '"path.project" = { dictionary = "project", probability = 0.7 }\n'
  printf '"path.id" = { dictionary = "workload", probability = 0.7 }\n'
  printf '"path.class" = { dictionary = "pool", probability = 0.7 }\n'
  printf '"path.node" = { dictionary = "node", probability = 0.7 }\n'
  printf '"path.gpu" = { dictionary = "gpu", probability = 0.7 }\n'
  printf '"body.tenant" = { dictionary = "tenant", probability = 0.7 }\n'
  printf '"body.project" = { dictionary = "project", probability = 0.7 }\n'
  printf '"body.shape.pool" = { dictionary = "pool", probability = 0.7 }\n'
  printf '"body.shape.mig" = { dictionary = "mig", probability = 0.7 }\n'
} >"$work/schemathesis.toml"

status=0
for who in admin member; do
  token=$admin
  [ "$who" = member ] && token=$member
  # The admin run changes the tenant (its priority grant, quotas, image policy): the member run
  # starts from the grant a new tenant has, so that its workloads can be accepted.
  "$venv/bin/python" -c 'import sys, urllib.request as u; u.urlopen(u.Request(sys.argv[1], data=b"{\"priorities\": null}", method="PUT", headers={"Authorization": "Bearer " + sys.argv[2], "Content-Type": "application/json"}))' \
    "$base/api/v1/tenants/fuzz/priorities" "$admin"
  echo "== schemathesis as $who ($examples examples per operation, seed $seed)"
  started=$(date +%s)
  rc=0
  # Run in the scratch directory (schemathesis keeps a cache in the working directory), with no
  # example database: each run is the same for the same seed. One worker: with two, Hypothesis
  # parsing lambda sources in two threads at once tripped Python 3.11's AST recursion-depth
  # check ("AST constructor recursion depth mismatch") at random; one costs a few seconds more.
  (cd "$work" && "$venv/bin/schemathesis" --config-file schemathesis.toml --no-color run openapi.json \
    --url "$base" -H "Authorization: Bearer $token" --checks all \
    --phases examples,coverage,fuzzing --max-examples "$examples" --seed "$seed" --workers 1 \
    --generation-database none ${FUZZ_REPORT:+--report har --report-har-path "$FUZZ_REPORT/$who.har"}) \
    >"$work/$who.txt" 2>&1 || rc=$?
  # The summary: operations selected and tested, generated cases, failures.
  sed -n '/^API Operations:/,$p' "$work/$who.txt" | grep -E "Selected|Tested|generated|Errored" | sed 's/^ */   /'
  # The operations schemathesis warns about (the summary only counts them); none is fine.
  sed -n '/^Schema validation mismatch:/,/^💡/p' "$work/$who.txt" | { grep -E '^ *- ' || true; } |
    sed 's/^ */   mostly rejected: /;s/- //'
  echo "   $(($(date +%s) - started)) s"
  if [ -n "${FUZZ_REPORT:-}" ]; then
    "$venv/bin/python" scripts/fuzz-statuses.py "$FUZZ_REPORT/$who.har" "$work/openapi.json"
  fi
  if [ "$rc" -ne 0 ]; then
    status=1
    sed -n '/^=* FAILURES =*$/,/^=* SUMMARY =*$/p; /^=* ERRORS =*$/,/^=* WARNINGS =*$/p' "$work/$who.txt"
  fi
done
if ! kill -0 "$pid" 2>/dev/null; then
  echo "tessera serve died during the fuzz run:" >&2
  tail -20 "$work/serve.log" >&2
  status=1
fi
exit "$status"
