#!/usr/bin/env bash
# Builds the test control plane's components from the Go module proxy, once, into a cache
# folder keyed by the pinned versions (versions.env and the wrapper modules under go/):
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm,
# prometheus-adapter (the custom metrics API) and KEDA's operator and metrics API server (with
# its module's CRDs and RBAC in bin/keda/). Does nothing when the binaries are there. Prints
# the bin folder on stdout; progress and timings go to stderr.
#
# Environment: SGL_K8S_CACHE (default ~/.cache/sgl-k8s) is the cache root.
# `build.sh --check` builds nothing: it prints the bin folder when everything is built and
# exits 3 otherwise.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
. "$here/versions.env"

# The version the Kubernetes binaries report (Helm checks the chart's kubeVersion against it).
minor="${K8S_VERSION#v1.}"
minor="${minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean"
done

# The folder's key covers the control plane's components. prometheus-adapter and KEDA have
# their own keys, kept next to their binaries, so pinning another version of one rebuilds
# that one alone.
core_mods=(etcd kubernetes)
key="$( (grep -v -e '^PROMETHEUS_ADAPTER_' -e '^KEDA_' -e '^# KEDA' "$here/versions.env"
  for m in "${core_mods[@]}"; do cat "$here/go/$m/go.mod"; done
  for m in "${core_mods[@]}"; do cat "$here/go/$m/go.sum"; done
  echo "$k8s_ldflags") |
  sha256sum | cut -c1-16)"
adapter_mod="$here/go/prometheus-adapter"
adapter_key="$( (grep -v -e '^KEDA_' -e '^# KEDA' "$here/versions.env"
  cat "$adapter_mod/go.mod" "$adapter_mod/go.sum") | sha256sum | cut -c1-16)"
# KEDA is built inside a copy of its own module (its go.sum pins every dependency; its go.mod
# has replace lines, which `go install …@version` refuses), so its key is its version and
# how it is built.
keda_ldflags="-s -w -X=github.com/kedacore/keda/v2/version.Version=$KEDA_VERSION"
keda_key="$( (grep -e '^KEDA_' "$here/versions.env"; echo "operator adapter CGO_ENABLED=0 $keda_ldflags") |
  sha256sum | cut -c1-16)"
cache="${SGL_K8S_CACHE:-$HOME/.cache/sgl-k8s}"
bin="$cache/$key/bin"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm prometheus-adapter)

missing=()
for c in "${components[@]}"; do
  [ -x "$bin/$c" ] || missing+=("$c")
done
if [ -x "$bin/prometheus-adapter" ] &&
  [ "$(cat "$bin/prometheus-adapter.key" 2> /dev/null)" != "$adapter_key" ]; then
  missing+=(prometheus-adapter)
fi
# KEDA (keda-operator, keda-adapter and bin/keda/) is built as one, under its key.
if [ ! -x "$bin/keda-operator" ] || [ ! -x "$bin/keda-adapter" ] ||
  [ "$(cat "$bin/keda-operator.key" 2> /dev/null)" != "$keda_key" ] ||
  [ ! -s "$bin/keda/crds/keda.sh_scaledobjects.yaml" ]; then
  missing+=(keda)
fi
# The wrapper module must build the version pinned here.
grep -q "^require sigs.k8s.io/prometheus-adapter $PROMETHEUS_ADAPTER_VERSION\$" "$adapter_mod/go.mod" || {
  echo "$adapter_mod/go.mod does not require sigs.k8s.io/prometheus-adapter $PROMETHEUS_ADAPTER_VERSION (versions.env)" >&2
  exit 2
}
if [ "${1:-}" = --check ]; then
  # Prints the bin folder when every component is built; fails (status 3) otherwise.
  [ ${#missing[@]} -eq 0 ] || { echo "not built in $bin: ${missing[*]} (run tests/k8s/build.sh)" >&2; exit 3; }
  echo "$bin"
  exit 0
fi

log() { echo "[k8s build] $*" >&2; }
export GOFLAGS="-buildvcs=false"
flags=(-trimpath -ldflags=-s\ -w)
tmp="$cache/$key/tmp"

timed() {
  local name="$1"
  shift
  local start
  start=$(date +%s)
  log "building $name"
  "$@"
  log "built $name in $(($(date +%s) - start)) s"
  # Keep what is built even if a later component fails.
  for f in "$tmp"/*; do
    [ -e "$f" ] && mv "$f" "$bin/"
  done
}

# KEDA's operator and metrics API server (cmd/operator, cmd/adapter), built in a copy of the
# module github.com/kedacore/keda/v2 (its Dir from `go mod download`), and what running them
# needs from that module: its CRDs (config/crd/bases) and its RBAC (its namespace, service
# account, ClusterRoles and bindings, those of the metrics API server in
# bin/keda/metrics-server/), into bin/keda/.
build_keda() {
  local dir
  dir=$(cd "$cache" && GOFLAGS=-mod=mod go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] && [ -d "$dir/cmd/operator" ] || {
    echo "github.com/kedacore/keda/v2@$KEDA_VERSION: no module folder from the Go module proxy" >&2
    return 1
  }
  rm -rf "$tmp/keda-src" "$bin/keda"
  cp -r "$dir" "$tmp/keda-src"
  chmod -R u+w "$tmp/keda-src"
  (cd "$tmp/keda-src" && CGO_ENABLED=0 go build -trimpath "-ldflags=$keda_ldflags" \
    -o "$tmp/keda-operator" ./cmd/operator &&
    CGO_ENABLED=0 go build -trimpath "-ldflags=$keda_ldflags" -o "$tmp/keda-adapter" ./cmd/adapter)
  rm -rf "$tmp/keda-src"
  mkdir -p "$tmp/keda/crds" "$tmp/keda/rbac" "$tmp/keda/metrics-server"
  cp "$dir"/config/crd/bases/*.yaml "$tmp/keda/crds/"
  cp "$dir/config/general/namespace.yaml" "$dir/config/service_account/service_account.yaml" \
    "$dir/config/rbac/role.yaml" "$dir/config/rbac/role_binding.yaml" "$tmp/keda/rbac/"
  cp "$dir/config/metrics-server/role.yaml" "$dir/config/metrics-server/role_binding.yaml" \
    "$tmp/keda/metrics-server/"
  chmod -R u+w "$tmp/keda"
}

if [ ${#missing[@]} -gt 0 ]; then
  total_start=$(date +%s)
  log "missing: ${missing[*]} (cache $cache/$key)"
  rm -rf "$tmp"
  mkdir -p "$tmp" "$bin"
  want() { [[ " ${missing[*]} " == *" $1 "* ]]; }

  k8s_cmds=()
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    want "$c" && k8s_cmds+=("k8s.io/kubernetes/cmd/$c")
  done
  if [ ${#k8s_cmds[@]} -gt 0 ]; then
    timed "kubernetes $K8S_VERSION (${k8s_cmds[*]##*/})" \
      bash -c 'cd "$1/go/kubernetes" && shift && go build "$@"' _ "$here" \
      -trimpath "-ldflags=$k8s_ldflags" -o "$tmp/" "${k8s_cmds[@]}"
  fi
  if want etcd; then
    timed "etcd $ETCD_VERSION" \
      bash -c 'cd "$1/go/etcd" && shift && go build "$@"' _ "$here" \
      "${flags[@]}" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  fi
  # These modules carry no replace lines, so `go install module@version` builds them as pinned.
  if want kwok; then
    timed "kwok $KWOK_VERSION" env GOBIN="$tmp" go install "${flags[@]}" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  fi
  if want helm; then
    timed "helm $HELM_VERSION" env GOBIN="$tmp" go install "${flags[@]}" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  fi
  if want prometheus-adapter; then
    timed "prometheus-adapter $PROMETHEUS_ADAPTER_VERSION" \
      bash -c 'cd "$1/go/prometheus-adapter" && shift && go build "$@"' _ "$here" \
      "${flags[@]}" -o "$tmp/prometheus-adapter" sigs.k8s.io/prometheus-adapter/cmd/adapter
    echo "$adapter_key" > "$bin/prometheus-adapter.key"
  fi
  if want keda; then
    timed "keda-operator and keda-adapter $KEDA_VERSION" build_keda
    echo "$keda_key" > "$bin/keda-operator.key"
  fi
  rm -rf "$tmp"
  log "cold build of ${missing[*]} took $(($(date +%s) - total_start)) s"
fi

# Prometheus is Debian's package (cluster.sh scrapes the engines with it for the custom
# metrics API); installed here when missing, as CI's fresh machines need.
if [ -z "${SGL_K8S_PROMETHEUS:-}" ] && ! command -v prometheus > /dev/null && command -v apt-get > /dev/null; then
  sudo=""
  [ "$(id -u)" != 0 ] && sudo="sudo"
  log "installing Debian's prometheus"
  { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends prometheus; } >&2 ||
    log "could not install prometheus: the test cluster will serve no custom metrics API"
fi

echo "$bin"
