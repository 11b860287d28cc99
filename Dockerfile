# ration's image: regiond, agent and ration in /usr/local/bin of a distroless
# static base (no shell, no libc, CA certificates and /etc/passwd only),
# running as the non-root user nonroot (UID 65532). The Terraform module
# (deploy/terraform) runs it with command ["/usr/local/bin/regiond"] or
# ["/usr/local/bin/agent"]. Build and push: see deploy/README.md.
#
#   docker build -t ghcr.io/ration-dev/ration:v0.1.0 .
#
# The binaries come from scripts/build, the same command that builds them
# without Docker (deploy/deploy_test.go checks this file still runs it).

# The build stage runs on the builder's own platform and cross-compiles for
# the target (BuildKit sets TARGETOS and TARGETARCH; docker buildx build
# --platform linux/amd64,linux/arm64 builds both without emulation).
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules first: this layer stays cached while only the sources change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
RUN GOOS=$TARGETOS GOARCH=$TARGETARCH scripts/build /out

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/regiond /out/agent /out/ration /usr/local/bin/
USER 65532:65532
# regiond's default: lease API 7070 (gRPC), admin 7071 (/healthz, /readyz,
# /metrics); flags choose others. cmd/agent's listeners are set by its flags.
EXPOSE 7070 7071
ENTRYPOINT ["/usr/local/bin/regiond"]
