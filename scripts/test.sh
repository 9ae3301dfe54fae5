#!/usr/bin/env bash
# Run every test of the workspace: unit, property and integration tests, with the real
# default model and real clients (reqwest, the openai Python package) on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r engine/tests/python/requirements.txt \
    -r engine/tests/python/requirements-sglang.txt
python3 -m pip install --quiet --disable-pip-version-check --no-deps sglang==0.4.3
scripts/fetch-model.sh >/dev/null
# Integration tests start the binaries; build them once for the whole workspace.
cargo build --release --workspace --bins
cargo test --release --workspace
