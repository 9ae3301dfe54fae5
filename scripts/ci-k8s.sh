#!/usr/bin/env bash
# CI checks of the Kubernetes side: CRD drift, rendered objects against the official
# Kubernetes schemas, example resources against the CRD schema, helm lint, and every PromQL
# expression of the Grafana dashboard and the prometheus-adapter rules evaluated by a real
# Prometheus scraping a real engine and a real router in front of it.
#
# Needs: cargo, python3 + pip, curl, and apt-get (or an installed `prometheus`). The engine
# and router binaries are built when missing (`cargo build --release -p sgl-engine -p sgl-router`).
# Environment: SKIP_PROMQL=1 skips the Prometheus check; SGL_CI_ENGINE_PORT,
# SGL_CI_ROUTER_PORT and SGL_CI_PROM_PORT choose its ports (default 30055, 30056 and 9095).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

crd="helm/crds/sglangservices.serving.sgl-rs.io.yaml"

step "install tools (kubernetes-validate, helm-sdkpy, prometheus)"
python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate jsonschema pyyaml
python3 -m pip install --quiet --disable-pip-version-check --ignore-requires-python helm-sdkpy
if [ "${SKIP_PROMQL:-0}" != 1 ] && ! command -v prometheus >/dev/null; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

step "build crdgen and sgl-operator"
cargo build --release -p sgl-crds -p sgl-operator

step "CRD is up to date"
target/release/crdgen > "$work/crd.yaml"
diff -u "$crd" "$work/crd.yaml" ||
  fail "$crd is stale: run target/release/crdgen > $crd"

step "render every example"
mkdir -p "$work/rendered"
for example in examples/*.yaml; do
  out="$work/rendered/$(basename "$example")"
  # An example that needs what the engine does not serve yet says so in its header; the
  # CRD's rules (which render runs) must refuse it, with a message saying why.
  if grep -q "refused at apply time" "$example"; then
    if target/release/sgl-operator render -f "$example" > "$out" 2> "$work/refused.txt"; then
      fail "$example says it is refused at apply time, but it rendered"
    fi
    grep -q "not served by this engine version\|does not serve yet" "$work/refused.txt" ||
      { cat "$work/refused.txt"; fail "$example was refused without a rule's message"; }
    rm -f "$out"
    echo "$example: refused as its header says"
    continue
  fi
  target/release/sgl-operator render -f "$example" > "$out" ||
    fail "render of $example failed"
  echo "$example: $(grep -c '^kind:' "$out") objects"
done

step "validate the CRD and every rendered object against the Kubernetes schemas"
kubernetes-validate --strict --quiet "$crd" "$work"/rendered/*.yaml ||
  fail "kubernetes-validate refused an object"

step "validate every example SGLangService against the CRD's schema"
python3 - "$crd" examples/*.yaml <<'EOF'
import sys, yaml, jsonschema

def structural_to_jsonschema(s):
    """OpenAPI v3 structural schema -> JSON Schema (nullable, int-or-string, preserve-unknown)."""
    if not isinstance(s, dict):
        return s
    s = {k: structural_to_jsonschema(v) if isinstance(v, dict) else
         ([structural_to_jsonschema(i) for i in v] if isinstance(v, list) else v)
         for k, v in s.items() if not k.startswith("x-kubernetes-validations")}
    if "properties" in s:
        s["properties"] = {k: structural_to_jsonschema(v) for k, v in s["properties"].items()}
    if s.pop("x-kubernetes-int-or-string", False):
        s.pop("type", None)
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if s.pop("nullable", False) and "type" in s:
        s["type"] = [s["type"], "null"]
    return s

crd = yaml.safe_load(open(sys.argv[1]))
schema = structural_to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
checked = 0
for path in sys.argv[2:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc.get("kind") != "SGLangService":
            continue
        spec_schema = schema["properties"]["spec"]
        try:
            jsonschema.validate(doc["spec"], spec_schema)
        except jsonschema.ValidationError as e:
            sys.exit(f"{path}: {e.message} at {list(e.absolute_path)}")
        checked += 1
        print(f"{path}: {doc['metadata']['name']} valid")
if checked < 4:
    sys.exit(f"only {checked} SGLangService examples found")
EOF

step "the dashboard in examples/ is the chart's"
cmp helm/files/sglang-dashboard.json examples/grafana/sglang-dashboard.json ||
  fail "examples/grafana/sglang-dashboard.json differs from helm/files/sglang-dashboard.json"

step "helm lint"
python3 - helm <<'EOF'
import asyncio, sys
from helm_sdkpy import Configuration, Lint

result = asyncio.run(Lint(Configuration()).run(sys.argv[1]))
names = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
worst = 0
for m in result.get("Messages") or []:
    sev = m.get("Severity", 0)
    worst = max(worst, sev)
    print(f"[{names.get(sev, sev)}] {m.get('Path')}: {m.get('Err') or ''}")
print(f"{result.get('TotalChartsLinted')} chart(s) linted")
if worst >= 2 or result.get("Errors"):
    sys.exit("helm lint reported warnings or errors")
EOF

if [ "${SKIP_PROMQL:-0}" = 1 ]; then
  echo "SKIP_PROMQL=1: skipping the PromQL check"
  exit 0
fi

step "PromQL: start an engine, a router in front of it, and a Prometheus scraping both"
engine="target/release/sgl-engine"
router="target/release/sgl-router"
[ -x "$engine" ] || cargo build --release -p sgl-engine
[ -x "$router" ] || cargo build --release -p sgl-router
engine_port="${SGL_CI_ENGINE_PORT:-30055}"
router_port="${SGL_CI_ROUTER_PORT:-30056}"
prom_port="${SGL_CI_PROM_PORT:-9095}"
model="$(scripts/fetch-model.sh)"
"$engine" serve --model-path "$model" --port "$engine_port" --enable-metrics > "$work/engine.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$engine_port/health" >/dev/null && break
  sleep 1
done
curl -sf "http://127.0.0.1:$engine_port/health" >/dev/null || { cat "$work/engine.log"; fail "engine did not become healthy"; }
"$router" --port "$router_port" --worker-urls "http://127.0.0.1:$engine_port" > "$work/router.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 60); do
  curl -sf "http://127.0.0.1:$router_port/health" | grep -q '"available_workers":1' && break
  sleep 1
done
curl -sf "http://127.0.0.1:$router_port/health" | grep -q '"available_workers":1' ||
  { cat "$work/router.log"; fail "the router did not take the engine"; }

# The labels a ServiceMonitor would add (namespace, pod, service), so the adapter rules' selectors match.
cat > "$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: sglang-engine
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:$engine_port"]
        labels: {namespace: ci, pod: ci-engine-0, service: ci-engine}
  - job_name: sglang-router
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:$router_port"]
        labels: {namespace: ci, pod: ci-router-0, service: ci-router}
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
pids+=("$!")
prom="http://127.0.0.1:$prom_port"
for _ in $(seq 1 60); do
  if curl -sf "$prom/api/v1/query" --data-urlencode 'query=count(up == 1) == 2' | grep -q '"value"'; then break; fi
  sleep 1
done
curl -sf "$prom/api/v1/query" --data-urlencode 'query=count(up == 1) == 2' | grep -q '"value"' ||
  { cat "$work/prometheus.log"; fail "Prometheus never scraped the engine and the router"; }

step "PromQL: send requests through the router (shared prefixes, so some hit the cache)"
for prompt in Hello Hello "Hello there" "Tell me a story" Hello "Hello there"; do
  curl -sf "http://127.0.0.1:$router_port/generate" -H 'content-type: application/json' \
    -d "{\"text\":\"$prompt\",\"sampling_params\":{\"max_new_tokens\":8}}" > /dev/null ||
    fail "generate request failed"
  curl -sf "http://127.0.0.1:$router_port/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"default\",\"prompt\":\"$prompt\",\"max_tokens\":8}" > /dev/null ||
    fail "completion request failed"
done
sleep 5

step "PromQL: evaluate every dashboard and adapter expression"
python3 - "$prom" helm/files/sglang-dashboard.json helm/files/prometheus-adapter-rules.yaml <<'EOF'
import json, math, re, sys, urllib.parse, urllib.request, yaml

prom, dashboard_path, rules_path = sys.argv[1:]

def get(path, params):
    url = f"{prom}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)

def dashboard_vars(expr):
    return (expr.replace("$__rate_interval", "1m")
                .replace("$model_name", ".*").replace("$namespace", ".*"))

checks = []  # (origin, kind, expression)
dash = json.load(open(dashboard_path))
for panel in dash["panels"]:
    for t in panel["targets"]:
        checks.append((f"dashboard: {panel['title']}", "query", dashboard_vars(t["expr"])))
for var in dash["templating"]["list"]:
    q = var.get("definition", "")
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
    if m:
        checks.append((f"dashboard variable {var['name']}", f"label:{m.group(2)}", dashboard_vars(m.group(1))))

rules = yaml.safe_load(open(rules_path))["rules"]
for rule in rules:
    series = re.match(r"[\w:]+", rule["seriesQuery"]).group(0)
    checks.append((f"adapter series {series}", "series", rule["seriesQuery"]))
    # The object the rule describes: an engine pod, or (keyed on `service`) the router's Service.
    if "service" in rule["resources"]["overrides"]:
        matchers, group = 'namespace="ci",service="ci-router"', "service"
    else:
        matchers, group = 'namespace="ci",pod=~"ci-engine-0"', "pod"
    q = (rule["metricsQuery"].replace("<<.Series>>", series)
         .replace("<<.LabelMatchers>>", matchers)
         .replace("<<.GroupBy>>", group))
    checks.append((f"adapter {rule['name']['as']}", "query", q))
    # A rule that falls back to 0 (`... or 0 * x`) must return data without its fallback
    # too, or the check would pass on the fallback alone.
    if " or " in q:
        checks.append((f"adapter {rule['name']['as']} without its fallback", "query",
                       q.rsplit(" or ", 1)[0]))

failed = 0
for origin, kind, expr in checks:
    try:
        if kind == "query":
            body = get("/api/v1/query", {"query": expr})
            result = body["data"]["result"]
            values = [float(r["value"][1]) for r in result]
            ok = body["status"] == "success" and result and not any(math.isnan(v) for v in values)
            shown = values[:3]
        elif kind == "series":
            body = get("/api/v1/series", {"match[]": expr})
            ok = body["status"] == "success" and body["data"]
            shown = f"{len(body['data'])} series"
        else:
            label = kind.split(":", 1)[1]
            body = get(f"/api/v1/label/{label}/values", {"match[]": expr})
            ok = body["status"] == "success" and body["data"]
            shown = body["data"]
    except Exception as e:  # a refused query is a failure like an empty one
        ok, shown = False, repr(e)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {origin}: {expr} -> {shown}")
print(f"{len(checks) - failed}/{len(checks)} expressions returned data")
sys.exit(1 if failed else 0)
EOF

step "all Kubernetes checks passed"
