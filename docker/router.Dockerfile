# syntax=docker/dockerfile:1
# Cache-aware router. Build from the repository root:
#   docker build -f docker/router.Dockerfile -t ghcr.io/sgl-rs/sgl-router:0.1.0 .

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sgl-router \
 && install -D target/release/sgl-router /out/sgl-router

# glibc and libgcc only; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/sgl-router /usr/local/bin/sgl-router
EXPOSE 30000
ENTRYPOINT ["sgl-router"]
CMD ["--host", "0.0.0.0", "--port", "30000"]
