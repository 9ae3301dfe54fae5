# syntax=docker/dockerfile:1
# The SGLangService operator: small and non-root. Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/sgl-rs/sgl-operator:0.1.0 .

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sgl-operator -p sgl-crds \
 && install -D target/release/sgl-operator /out/sgl-operator \
 && install -D target/release/crdgen /out/crdgen

# glibc and libgcc only (TLS is rustls); runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/sgl-operator /usr/local/bin/sgl-operator
COPY --from=build /out/crdgen /usr/local/bin/crdgen
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["sgl-operator"]
CMD ["run"]
