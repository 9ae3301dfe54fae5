#!/usr/bin/env bash
# Compile every CUDA kernel with NVRTC on a machine without a GPU, so a broken kernel fails CI,
# and assemble the sm_90 PTX with ptxas, so a kernel that spills registers fails it too.
# NVRTC and ptxas come from PyPI, pinned to the GPU machine's toolkit (13.0) so its PTX is
# accepted there.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 \
  nvidia-cuda-nvcc==13.0.88
lib="$(python3 - <<'PY'
import glob, os, site
for base in site.getsitepackages() + [site.getusersitepackages()]:
    hits = glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*"))
    if hits:
        print(os.path.dirname(hits[0]))
        break
PY
)"
if [ -z "$lib" ]; then echo "libnvrtc not found after pip install" >&2; exit 1; fi
ptxas="$(dirname "$lib")/bin/ptxas"
if [ ! -x "$ptxas" ]; then echo "ptxas not found at $ptxas after pip install" >&2; exit 1; fi
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" SGL_REQUIRE_NVRTC=1 SGL_PTXAS="$ptxas" \
  cargo test --release -p sgl-kernels --features cuda --test nvrtc_compile -- --nocapture
