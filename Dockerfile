# syntax=docker/dockerfile:1
# Multi-stage build: a static binary on a distroless, non-root base image.
# Nothing in the final image needs a shell.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags="-s -w -X main.version=${VERSION}" \
      -o /out/idemproxy . \
 && /out/idemproxy -version

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/idemproxy /idemproxy
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/idemproxy"]
CMD ["-config", "/etc/idemproxy/config.yaml"]
