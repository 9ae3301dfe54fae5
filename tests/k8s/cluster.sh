#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, for tests:
#   etcd, kube-apiserver (RBAC, service-account tokens, aggregation layer),
#   kube-controller-manager (all default controllers, leader Lease), kube-scheduler, and kwok
#   (the API server and the controller manager with the HPAScaleToZero feature gate, alpha in
#   v1.36: an HPA with minReplicas 0 and an Object metric scales to zero and back),
#   with fake nodes whose pod CIDRs lie in 127.0.0.0/8; Prometheus scraping the engine pods
#   and prometheus-adapter with the chart's rules behind the custom metrics API (when a
#   prometheus binary is there).
#
#   tests/k8s/cluster.sh up    [--work DIR] [--owner-pid PID [--remove-work]] [--runner BIN -- ARGS...]
#   tests/k8s/cluster.sh env   [--work DIR]
#   tests/k8s/cluster.sh down  [--work DIR]
#   tests/k8s/cluster.sh apiserver-stop|apiserver-start  [--work DIR]
#   tests/k8s/cluster.sh keda-start  [--work DIR]
#
# `up` builds the components once (build.sh), makes certificates with openssl, starts every
# component on free ports and waits until a node is Ready; `up` and `env` end by printing
# `export KUBECONFIG=<path>`. --owner-pid stops the cluster when that process exits (tests pass
# their own pid so nothing outlives them); with --remove-work it then deletes the work folder
# too (etcd, Prometheus, pod folders and logs: over 100 MB a run), unless SGL_K8S_KEEP_WORK=1.
# --runner starts the pod runner with the cluster's kubeconfig; arguments after `--` are
# passed to it. `apiserver-stop` and `apiserver-start`
# stop the API server and start it again with the same flags (port, etcd, certificates).
# `keda-start` starts KEDA (its operator and its metrics API server) on a running cluster,
# once (it then runs until `down`; see keda_start below).
#
# Nodes (all kwok, label type=kwok, pod CIDRs in 127.0.0.0/8):
#   kwok-node-0     127.1.0.0/16, 32 CPUs, no taint (the examples apply unchanged);
#   kwok-gpu-0      127.2.0.0/16, 8 nvidia.com/gpu, taint nvidia.com/gpu=present:NoSchedule;
#   kwok-tainted-0  127.3.0.0/16, taint kwok.x-k8s.io/node=fake:NoSchedule.
# Environment: SGL_K8S_WORK (default .cache/k8s/cluster in the repository); SGL_K8S_BIN (a
# folder of already built components: skips build.sh).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cmd="${1:-}"
[ -n "$cmd" ] && shift
work="${SGL_K8S_WORK:-$root/.cache/k8s/cluster}"
owner_pid=""
remove_work=0
runner=""
runner_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work="$2"; shift 2 ;;
    --owner-pid) owner_pid="$2"; shift 2 ;;
    --remove-work) remove_work=1; shift ;;
    --runner) runner="$2"; shift 2 ;;
    --) shift; runner_args=("$@"); break ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

log() { echo "[cluster] $*" >&2; }
die() { echo "[cluster] FAIL: $*" >&2; exit 1; }

stop_all() {
  [ -d "$work/pids" ] || return 0
  # Reverse start order: the runner and kwok first, etcd last.
  local files
  files=$(ls -t "$work"/pids/ 2>/dev/null || true)
  for f in $files; do
    local pid
    pid=$(cat "$work/pids/$f" 2>/dev/null || true)
    [ -n "$pid" ] && { kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; }
  done
  for f in $files; do
    local pid
    pid=$(cat "$work/pids/$f" 2>/dev/null || true)
    [ -z "$pid" ] && continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
    rm -f "$work/pids/$f"
  done
}

# start NAME CMD...: runs CMD in its own process group with its log in logs/NAME.log.
start() {
  local name="$1"
  shift
  setsid "$@" >> "$work/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$work/pids/$name"
  sleep 0.01 # distinct mtimes keep the stop order
}

# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds or the deadline passes.
wait_for() {
  local what="$1" secs="$2"
  shift 2
  local deadline=$(($(date +%s) + secs))
  until "$@" > /dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      for f in "$work"/logs/*.log; do echo "--- $f" >&2; tail -n 30 "$f" >&2; done
      die "$what not ready after ${secs}s"
    fi
    sleep 0.2
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

print_env() {
  [ -s "$work/admin.kubeconfig" ] || die "no cluster in $work (run: $0 up)"
  echo "export KUBECONFIG=$work/admin.kubeconfig"
}

# The API server's command line is kept in the work folder, so it can be stopped and started
# again on the same port and etcd (a test of clients riding out an outage).
apiserver_start() {
  [ -s "$work/kube-apiserver.cmd" ] || die "no cluster in $work (run: $0 up)"
  local -a args
  mapfile -d '' args < "$work/kube-apiserver.cmd"
  start kube-apiserver "${args[@]}"
  KUBECONFIG="$work/admin.kubeconfig" wait_for kube-apiserver 120 \
    "$(dirname "${args[0]}")/kubectl" get --raw /readyz
}

# KEDA (built by build.sh, with the CRDs and RBAC of KEDA's module): its operator, which
# activates a workload (0 -> 1), takes it back to zero and creates the HPA for one replica and
# more, and its metrics API server (`external.metrics.k8s.io` through the aggregation layer,
# what that HPA reads; it asks the operator's gRPC metrics service for each value). Both act as
# KEDA's own service account with that RBAC (the keda-operator ClusterRole: read any object,
# update any `*/scale`; the metrics API server's delegated authentication and authorization),
# watch every namespace, and run without leader election, certificate rotation or webhooks.
# One certificate from the test CA serves the gRPC service, authenticates the metrics API
# server to it (mutual TLS), and serves the metrics API (its APIService names an ExternalName
# Service for localhost, as prometheus-adapter's does). Ports go to ports.env
# (KEDA_METRICS_PORT: the operator's /metrics; KEDA_HEALTH_PORT: its /healthz and /readyz;
# KEDA_METRICS_API_PORT: the metrics API server).
keda_start() {
  [ -s "$work/ports.env" ] || die "no cluster in $work (run: $0 up)"
  if [ -s "$work/pids/keda-operator" ] && kill -0 "$(cat "$work/pids/keda-operator")" 2> /dev/null; then
    log "KEDA's operator is already running"
    return 0
  fi
  local bin kubectl
  bin="$(cat "$work/bin.dir")"
  kubectl="$bin/kubectl"
  [ -x "$bin/keda-operator" ] || die "$bin/keda-operator is missing (run tests/k8s/build.sh)"
  export KUBECONFIG="$work/admin.kubeconfig"
  "$kubectl" apply --server-side -f "$bin/keda/crds/" > /dev/null
  "$kubectl" wait --for=condition=Established --timeout=60s -f "$bin/keda/crds/" > /dev/null
  local f
  for f in rbac/namespace rbac/service_account rbac/role rbac/role_binding metrics-server/role \
    metrics-server/role_binding; do
    "$kubectl" apply --server-side -f "$bin/keda/$f.yaml" > /dev/null
  done
  local token server
  token=$("$kubectl" create token keda-operator -n keda --duration 48h) ||
    die "no token for KEDA's service account"
  server=$(sed -n 's/^APISERVER_URL=//p' "$work/ports.env")
  cat > "$work/keda-operator.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sgl-test
  cluster:
    server: $server
    certificate-authority: $work/pki/ca.crt
users:
- name: keda-operator
  user:
    token: $token
contexts:
- name: sgl-test
  context: {cluster: sgl-test, user: keda-operator, namespace: keda}
current-context: sgl-test
EOF
  chmod 600 "$work/keda-operator.kubeconfig"
  local certs="$work/keda/certs"
  mkdir -p "$certs" "$work/keda/ca"
  cp "$work/pki/ca.crt" "$certs/ca.crt"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=keda-operator" -keyout "$certs/tls.key" \
    -out "$work/keda/tls.csr" 2> /dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth,clientAuth" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:keda-metrics-apiserver.keda.svc" \
    > "$work/keda/tls.ext"
  openssl x509 -req -in "$work/keda/tls.csr" -CA "$work/pki/ca.crt" -CAkey "$work/pki/ca.key" \
    -CAcreateserial -days 30 -extfile "$work/keda/tls.ext" -out "$certs/tls.crt" 2> /dev/null
  local metrics_port health_port grpc_port api_port api_metrics_port
  metrics_port=$(free_port)
  health_port=$(free_port)
  grpc_port=$(free_port)
  api_port=$(free_port)
  api_metrics_port=$(free_port)
  start keda-operator env KUBECONFIG="$work/keda-operator.kubeconfig" WATCH_NAMESPACE="" \
    KEDA_CLUSTER_OBJECT_NAMESPACE=keda POD_NAMESPACE=keda \
    "$bin/keda-operator" --leader-elect=false --enable-cert-rotation=false \
    --metrics-bind-address "127.0.0.1:$metrics_port" \
    --health-probe-bind-address "127.0.0.1:$health_port" \
    --metrics-service-bind-address "127.0.0.1:$grpc_port" \
    --cert-dir "$certs" --ca-dir "$work/keda/ca"
  wait_for "KEDA's operator" 120 curl -sf "http://127.0.0.1:$health_port/readyz"
  start keda-adapter env KUBECONFIG="$work/keda-operator.kubeconfig" WATCH_NAMESPACE="" \
    KEDA_CLUSTER_OBJECT_NAMESPACE=keda POD_NAMESPACE=keda \
    "$bin/keda-adapter" --bind-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$certs/tls.crt" --tls-private-key-file "$certs/tls.key" --cert-dir "$certs" \
    --lister-kubeconfig "$work/keda-operator.kubeconfig" \
    --authentication-kubeconfig "$work/keda-operator.kubeconfig" \
    --authorization-kubeconfig "$work/keda-operator.kubeconfig" \
    --metrics-service-address "127.0.0.1:$grpc_port" --port "$api_metrics_port"
  cat <<EOF | "$kubectl" apply -f - > /dev/null
apiVersion: v1
kind: Service
metadata: {name: keda-metrics-apiserver, namespace: keda}
spec:
  type: ExternalName
  externalName: localhost
  ports: [{name: https, port: $api_port}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.external.metrics.k8s.io}
spec:
  group: external.metrics.k8s.io
  version: v1beta1
  service: {name: keda-metrics-apiserver, namespace: keda, port: $api_port}
  caBundle: $(base64 -w0 "$work/pki/ca.crt")
  groupPriorityMinimum: 100
  versionPriority: 100
EOF
  wait_for "KEDA's metrics API" 120 "$kubectl" wait --for=condition=Available \
    apiservice/v1beta1.external.metrics.k8s.io --timeout=5s
  cat >> "$work/ports.env" <<EOF
KEDA_METRICS_PORT=$metrics_port
KEDA_HEALTH_PORT=$health_port
KEDA_METRICS_API_PORT=$api_port
EOF
  log "KEDA started (logs: $work/logs/keda-operator.log, $work/logs/keda-adapter.log)"
}

case "$cmd" in
  keda-start)
    keda_start
    exit 0 ;;
  apiserver-stop)
    f="$work/pids/kube-apiserver"
    [ -s "$f" ] || die "no API server is running in $work"
    pid=$(cat "$f")
    kill -- "-$pid" 2> /dev/null || kill "$pid" 2> /dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -9 -- "-$pid" 2> /dev/null || true
    rm -f "$f"
    log "kube-apiserver stopped"
    exit 0 ;;
  apiserver-start)
    [ -s "$work/pids/kube-apiserver" ] && die "the API server is running"
    apiserver_start
    log "kube-apiserver started"
    exit 0 ;;
  down)
    stop_all
    log "stopped (state kept in $work)"
    exit 0 ;;
  env)
    print_env
    exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down|env|apiserver-stop|apiserver-start [--work DIR] [--owner-pid PID [--remove-work]] [--runner BIN -- ARGS...]" >&2; exit 2 ;;
esac

start_time=$(date +%s)
bin="${SGL_K8S_BIN:-$("$here/build.sh")}"
export PATH="$bin:$PATH"
for c in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
  [ -x "$bin/$c" ] || die "$bin/$c is missing (run tests/k8s/build.sh)"
done
stop_all
rm -rf "$work"
mkdir -p "$work/pids" "$work/logs" "$work/pki"
echo "$bin" > "$work/bin.dir"
# A start that fails stops what it had started (the watchdog is started only at the end).
trap 'rc=$?; if [ "$rc" -ne 0 ]; then stop_all; fi; exit "$rc"' EXIT

# --- certificates -------------------------------------------------------------------------
pki="$work/pki"
ca() { # ca NAME CN
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=$2" \
    -keyout "$pki/$1.key" -out "$pki/$1.crt" 2> /dev/null
}
cert() { # cert NAME SIGNER SUBJECT EXT
  openssl req -newkey rsa:2048 -nodes -subj "$3" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2> /dev/null
  printf '%s\n' "$4" > "$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/$2.crt" -CAkey "$pki/$2.key" -CAcreateserial \
    -days 30 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2> /dev/null
}
client_ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
server_ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"

ca ca sgl-test-ca
ca front-proxy-ca sgl-test-front-proxy-ca
cert apiserver ca "/CN=kube-apiserver" "$server_ext"
cert admin ca "/O=system:masters/CN=sgl-test-admin" "$client_ext"
cert controller-manager ca "/CN=system:kube-controller-manager" "$client_ext"
cert scheduler ca "/CN=system:kube-scheduler" "$client_ext"
cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client_ext"
cert front-proxy-client front-proxy-ca "/CN=front-proxy-client" "$client_ext"
cert custom-metrics ca "/CN=custom-metrics-apiserver" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:custom-metrics-apiserver.custom-metrics.svc"
openssl genrsa -out "$pki/sa.key" 2048 2> /dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2> /dev/null

# --- ports and kubeconfigs ---------------------------------------------------------------
etcd_port=$(free_port)
etcd_peer_port=$(free_port)
api_port=$(free_port)
kcm_port=$(free_port)
sched_port=$(free_port)
server="https://127.0.0.1:$api_port"

kubeconfig() { # kubeconfig NAME CERT
  cat > "$work/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sgl-test
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: sgl-test
  context: {cluster: sgl-test, user: $2, namespace: default}
current-context: sgl-test
EOF
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
cat > "$work/ports.env" <<EOF
ETCD_PORT=$etcd_port
APISERVER_PORT=$api_port
APISERVER_URL=$server
EOF

# --- etcd and the API server -------------------------------------------------------------
start etcd etcd --name default --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "default=http://127.0.0.1:$etcd_peer_port" \
  --unsafe-no-fsync --log-level warn
wait_for etcd 60 curl -sf "http://127.0.0.1:$etcd_port/health"

apiserver_cmd=("$bin/kube-apiserver"
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --authorization-mode Node,RBAC \
  --feature-gates HPAScaleToZero=true \
  --service-cluster-ip-range 10.96.0.0/16 \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
  --requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
  --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key" \
  --enable-aggregator-routing=false \
  --allow-privileged=true \
  --profiling=false --v=1)
printf '%s\0' "${apiserver_cmd[@]}" > "$work/kube-apiserver.cmd"
export KUBECONFIG="$work/admin.kubeconfig"
apiserver_start

# --- controllers, scheduler, kwok ----------------------------------------------------------
# Leases long enough that both keep leading through an API server outage of 30 s (they exit
# when a renewal deadline passes, as they would on a real cluster).
leader_elect_times=(--leader-elect-lease-duration=60s --leader-elect-renew-deadline=45s)
start kube-controller-manager kube-controller-manager \
  --kubeconfig "$work/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$work/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$work/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" \
  --leader-elect=true "${leader_elect_times[@]}" --use-service-account-credentials=true \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --horizontal-pod-autoscaler-sync-period 5s --feature-gates HPAScaleToZero=true \
  --profiling=false --v=1
start kube-scheduler kube-scheduler \
  --kubeconfig "$work/scheduler.kubeconfig" \
  --authentication-kubeconfig "$work/scheduler.kubeconfig" \
  --authorization-kubeconfig "$work/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=true "${leader_elect_times[@]}" \
  --profiling=false --v=1
start kwok kwok --kubeconfig "$work/admin.kubeconfig" --config "$here/kwok.yaml" \
  --node-ip 127.0.0.1 --manage-all-nodes=true

# node NAME CIDR CPU MEMORY GPUS TAINTS
node() {
  local gpu="" gpulabel=""
  if [ "$5" != 0 ]; then gpu=", nvidia.com/gpu: \"$5\""; gpulabel="nvidia.com/gpu.present: \"true\""; fi
  cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    type: kwok
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    $gpulabel
spec:
  podCIDR: $2
  podCIDRs: [$2]
  taints: $6
status:
  allocatable: {cpu: "$3", memory: $4, pods: "110"$gpu}
  capacity: {cpu: "$3", memory: $4, pods: "110"$gpu}
EOF
}
kwok_taint='{key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}'
gpu_taint='{key: nvidia.com/gpu, value: present, effect: NoSchedule}'
{
  node kwok-node-0 127.1.0.0/16 32 64Gi 0 "[]"
  node kwok-gpu-0 127.2.0.0/16 64 512Gi 8 "[$gpu_taint]"
  node kwok-tainted-0 127.3.0.0/16 8 16Gi 0 "[$kwok_taint]"
} | kubectl apply -f - > /dev/null
wait_for "node kwok-node-0" 120 kubectl wait --for=condition=Ready node/kwok-node-0 --timeout=5s
wait_for "default service account" 120 kubectl get serviceaccount default -n default

# --- Prometheus and the custom metrics API --------------------------------------------------
# Prometheus (Debian's package, or SGL_K8S_PROMETHEUS) scrapes every engine and router pod's
# /metrics on its `http` port, as the chart's ServiceMonitor selects them, with namespace, pod
# and service labels (`service`: the Service in front of the pod, `<instance>-engine` or
# `<instance>-router`, as the Prometheus Operator labels a ServiceMonitor's targets).
# Debian builds Prometheus without Kubernetes discovery, so a loop here lists the engine pods
# every 2 s into a file_sd target file (and the Service's endpoints could not hold them
# anyway: the API server refuses endpoints in 127.0.0.0/8, where the kwok nodes' pods live).
# prometheus-adapter serves custom.metrics.k8s.io/v1beta1 from the chart's rules through the
# aggregation layer; its APIService names an ExternalName Service for localhost, which the
# aggregator dials directly.
prometheus="${SGL_K8S_PROMETHEUS:-$(command -v prometheus || true)}"
if [ -z "$prometheus" ]; then
  log "no prometheus binary (apt-get install prometheus, or set SGL_K8S_PROMETHEUS): the custom metrics API is not served"
else
  prom_port=$(free_port)
  adapter_port=$(free_port)
  mkdir -p "$work/prometheus"
  echo '[]' > "$work/prometheus/engines.json"
  cat > "$work/prometheus/prometheus.yml" <<EOF
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
- job_name: sglang-engines
  file_sd_configs:
  - files: [$work/prometheus/engines.json]
    refresh_interval: 2s
EOF
  start prometheus-targets python3 -c '
import json, os, subprocess, sys, time
kubectl, out = sys.argv[1:3]
selector = "app.kubernetes.io/managed-by=sgl-operator,app.kubernetes.io/component in (engine,router)"
while True:
    r = subprocess.run([kubectl, "get", "pods", "-A", "-l", selector, "-o", "json"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        targets = []
        for p in json.loads(r.stdout)["items"]:
            ip = p.get("status", {}).get("podIP")
            if not ip or p["metadata"].get("deletionTimestamp"):
                continue
            labels = p["metadata"].get("labels", {})
            for c in p["spec"]["containers"]:
                for port in c.get("ports", []):
                    if port.get("name") == "http":
                        targets.append({
                            "targets": ["%s:%d" % (ip, port["containerPort"])],
                            "labels": {"namespace": p["metadata"]["namespace"],
                                       "pod": p["metadata"]["name"],
                                       "service": "%s-%s" % (labels.get("app.kubernetes.io/instance", ""),
                                                             labels.get("app.kubernetes.io/component", ""))}})
        with open(out + ".tmp", "w") as f:
            json.dump(targets, f)
        os.replace(out + ".tmp", out)
    time.sleep(2)
' "$bin/kubectl" "$work/prometheus/engines.json"
  start prometheus "$prometheus" --config.file "$work/prometheus/prometheus.yml" \
    --storage.tsdb.path "$work/prometheus/data" --web.listen-address "127.0.0.1:$prom_port"
  wait_for prometheus 60 curl -sf "http://127.0.0.1:$prom_port/-/ready"
  # The adapter acts as its own ServiceAccount with the RBAC of prometheus-adapter-rbac.yaml
  # (delegated authentication and authorization, the front proxy's CA, reading pods and
  # namespaces), never as admin: a token of that account is its only credential.
  kubectl apply -f "$here/prometheus-adapter-rbac.yaml" > /dev/null
  adapter_token=$(kubectl create token custom-metrics-apiserver -n custom-metrics --duration 48h) ||
    die "no token for the adapter's service account"
  cat > "$work/prometheus-adapter.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sgl-test
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: custom-metrics-apiserver
  user:
    token: $adapter_token
contexts:
- name: sgl-test
  context: {cluster: sgl-test, user: custom-metrics-apiserver, namespace: custom-metrics}
current-context: sgl-test
EOF
  chmod 600 "$work/prometheus-adapter.kubeconfig"
  start prometheus-adapter "$bin/prometheus-adapter" \
    --bind-address 127.0.0.1 --secure-port "$adapter_port" \
    --tls-cert-file "$pki/custom-metrics.crt" --tls-private-key-file "$pki/custom-metrics.key" \
    --lister-kubeconfig "$work/prometheus-adapter.kubeconfig" \
    --authentication-kubeconfig "$work/prometheus-adapter.kubeconfig" \
    --authorization-kubeconfig "$work/prometheus-adapter.kubeconfig" \
    --prometheus-url "http://127.0.0.1:$prom_port" \
    --config "$root/helm/files/prometheus-adapter-rules.yaml" \
    --metrics-relist-interval 5s --v=1
  cat >> "$work/ports.env" <<EOF
PROMETHEUS_URL=http://127.0.0.1:$prom_port
CUSTOM_METRICS_PORT=$adapter_port
EOF
  cat <<EOF | kubectl apply -f - > /dev/null
apiVersion: v1
kind: Service
metadata: {name: custom-metrics-apiserver, namespace: custom-metrics}
spec:
  type: ExternalName
  externalName: localhost
  ports: [{name: https, port: $adapter_port}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.custom.metrics.k8s.io}
spec:
  group: custom.metrics.k8s.io
  version: v1beta1
  service: {name: custom-metrics-apiserver, namespace: custom-metrics, port: $adapter_port}
  caBundle: $(base64 -w0 "$pki/ca.crt")
  groupPriorityMinimum: 100
  versionPriority: 100
EOF
  wait_for "the custom metrics API" 120 kubectl wait --for=condition=Available \
    apiservice/v1beta1.custom.metrics.k8s.io --timeout=5s
fi

if [ -n "$runner" ]; then
  start pod-runner "$runner" --kubeconfig "$work/admin.kubeconfig" "${runner_args[@]}"
fi
if [ -n "$owner_pid" ]; then
  # Stops everything when the owner exits, whether it finished, failed or was killed.
  [ "${SGL_K8S_KEEP_WORK:-0}" = 1 ] && remove_work=0
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" down --work "$3"
    if [ "$4" = 1 ]; then rm -rf "$3"; fi' _ \
    "$owner_pid" "$here/cluster.sh" "$work" "$remove_work" > "$work/logs/watchdog.log" 2>&1 < /dev/null &
fi

trap - EXIT
log "up in $(($(date +%s) - start_time)) s (work dir $work, bin $bin)"
print_env
