# syntax=docker/dockerfile:1
# Multi-stage build: a static binary on a distroless, non-root base image.
# Nothing in the final image needs a shell.
#
# Reproducible and multi-arch ready: the build context has no .git
# (.dockerignore), so the version and revision are stamped explicitly, and
# the build stage runs on the builder's platform and cross-compiles for
# the target's (docker buildx build --platform linux/amd64,linux/arm64).
#   docker build --build-arg VERSION=v0.3.0 --build-arg VCS_REF=$(git rev-parse HEAD) -t idemproxy .
# Pin the base images by digest for byte-identical rebuilds (README).
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG VCS_REF=unknown
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false \
      -ldflags="-s -w -buildid= -X main.version=${VERSION} -X main.revision=${VCS_REF}" \
      -o /out/idemproxy .

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG VCS_REF=unknown
LABEL org.opencontainers.image.title="idemproxy" \
      org.opencontainers.image.description="Reverse-proxy sidecar that makes retries of unsafe HTTP requests safe" \
      org.opencontainers.image.source="https://github.com/idemproxy/idemproxy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}"
COPY --from=build /out/idemproxy /idemproxy
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/idemproxy"]
CMD ["-config", "/etc/idemproxy/config.yaml"]
