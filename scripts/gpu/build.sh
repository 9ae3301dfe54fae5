#!/usr/bin/env bash
# Build here (no GPU needed) what the GPU scripts carry in .dev/gpu: the server (sgl-engine) and
# the benchmarks (sgl-bench) with CUDA, and the kernel checks' test binary (sgl-kernels' test
# `kernel_check`, which `cargo test` runs and which skips without a GPU) as `kernel-check`.
# Stripped: with debug info they exceed what one device call may carry (64 MiB in all).
# Usage: scripts/gpu/build.sh [DIR] (default .dev/gpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
target="${CARGO_TARGET_DIR:-target}"
dest="${1:-.dev/gpu}"
cargo build --release -p sgl-engine -p sgl-bench --features cuda
checks=$(cargo test --release -p sgl-kernels --features cuda --test kernel_check --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == "kernel_check":
        print(m["executable"])
')
mkdir -p "$dest"
cp "$target/release/sgl-engine" "$target/release/sgl-bench" "$dest/"
cp "$checks" "$dest/kernel-check"
strip "$dest/sgl-engine" "$dest/sgl-bench" "$dest/kernel-check"
du -sh "$dest"/*
