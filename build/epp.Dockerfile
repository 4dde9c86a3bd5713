# syntax=docker/dockerfile:1
# Image of the endpoint picker (cmd/epp).
# Build from the repository root:
#   docker build -f build/epp.Dockerfile -t laneway-epp:dev .
# Two stages: the Go toolchain compiles a static binary, and the runtime is
# distroless/static as the nonroot user (65532): no shell, no package
# manager, nothing to patch but the binary.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/gocache \
    GOCACHE=/gocache CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/epp ./cmd/epp

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/epp /epp
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["/epp"]
