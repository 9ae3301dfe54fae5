#!/usr/bin/env bash
# A short run of every fuzz target, for CI: nightly Rust (minimal profile) and cargo-fuzz are
# installed when missing; the build and the corpus live in a cache kept between runs, so a
# warm run rebuilds only what changed and each run starts from what earlier runs found.
# A crash, a timeout or a memory blow-up fails the run; the input is left in
# fuzz/artifacts/<target>/ (make it a unit test next to the code it broke).
# Environment: SGL_FUZZ_CACHE (default ~/.cache/sgl-fuzz), SGL_FUZZ_SECONDS (per target,
# default 15).
set -euo pipefail
cd "$(dirname "$0")"
cache="${SGL_FUZZ_CACHE:-$HOME/.cache/sgl-fuzz}"
secs="${SGL_FUZZ_SECONDS:-15}"
mkdir -p "$cache"

# Tools that cannot be installed (no network to the toolchain server, say) skip the run with a
# message; only what the fuzzing itself finds fails it.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal ||
        { echo "fuzzing skipped: the nightly toolchain could not be installed"; exit 0; }
fi
export PATH="$cache/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked --root "$cache" cargo-fuzz ||
        { echo "fuzzing skipped: cargo-fuzz could not be installed"; exit 0; }
fi

fuzz() { cargo +nightly fuzz "$1" -s none -O --target-dir "$cache/target" "${@:2}"; }
start=$(date +%s)
fuzz build
echo "fuzz targets built in $(($(date +%s) - start)) s"
for target in $(cargo +nightly fuzz list); do
    mkdir -p "$cache/corpus/$target"
    log="$cache/$target.log"
    # New inputs go to the cached corpus; the checked-in seeds are read as a second corpus.
    if ! fuzz run "$target" "$cache/corpus/$target" "corpus-seeds/$target" -- -max_total_time="$secs" \
        -rss_limit_mb=4096 -timeout=10 >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz target $target failed; its input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    # libFuzzer's last status line: executions, coverage, corpus size, speed.
    echo "$target: $(grep -E '^#[0-9]+' "$log" | tail -n 1)"
done
