#!/usr/bin/env bash
# Every example's engine command, as the operator renders it, is accepted by the engine's own
# `serve --check` (flags, and for a model present here its config, tokenizer and chat
# template; no weights are loaded and nothing is downloaded). Examples marked "refused at apply
# time" are refused by the CRD's rules instead (scripts/ci-k8s.sh checks that).
#
# A model path that lives in the pod's image (/models/...) is checked with the test model
# (scripts/fetch-model.sh) in its place; a Hub id is looked up in an empty Hub cache offline,
# so only its flags are checked.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p sgl-engine -p sgl-operator
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stand_in=$(scripts/fetch-model.sh)
checked=0
for example in examples/*.yaml; do
  grep -q "refused at apply time" "$example" && continue
  target/release/sgl-operator render -f "$example" > "$work/rendered.yaml"
  # One line per engine workload: its container's command line, NUL-separated words.
  python3 - "$work/rendered.yaml" "$work/cmd" <<'PY'
import sys, yaml
n = 0
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc.get("kind") not in ("StatefulSet", "Deployment"):
        continue
    for c in doc["spec"]["template"]["spec"]["containers"]:
        words = (c.get("command") or []) + (c.get("args") or [])
        if "serve" in words and any(w.endswith("sgl-engine") for w in words[:1]):
            with open(f"{sys.argv[2]}.{n}", "wb") as f:
                f.write(b"\0".join(w.encode() for w in words[words.index("serve") + 1:]))
            n += 1
PY
  for cmd in "$work"/cmd.*; do
    [ -e "$cmd" ] || { echo "$example: no engine container rendered" >&2; exit 1; }
    mapfile -d '' words < "$cmd"
    args=()
    for ((i = 0; i < ${#words[@]}; i++)); do
      args+=("${words[i]}")
      if [ "${words[i]}" = --model-path ] && [[ "${words[i+1]}" = /* ]] && [ ! -e "${words[i+1]}" ]; then
        args+=("$stand_in")
        i=$((i + 1))
      fi
    done
    if ! out=$(HF_HUB_OFFLINE=1 HF_HUB_CACHE="$work/hub" target/release/sgl-engine serve \
      "${args[@]}" --check 2> "$work/err"); then
      echo "$example: the engine refuses its rendered command: ${words[*]}" >&2
      cat "$work/err" >&2
      exit 1
    fi
    echo "$example: $out"
    checked=$((checked + 1))
    rm -f "$cmd"
  done
done
[ "$checked" -ge 3 ] || { echo "only $checked engine commands checked" >&2; exit 1; }
