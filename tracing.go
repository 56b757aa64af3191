package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemproxy/idemproxy/config"
)

// tracingOn reports whether traces are exported: tracing.enabled or an
// OTLP endpoint in the environment, unless OTEL_SDK_DISABLED=true.
func tracingOn(cfg config.Tracing, getenv func(string) string) bool {
	if getenv("OTEL_SDK_DISABLED") == "true" {
		return false
	}
	return cfg.Enabled || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// startTracing starts the OTLP/HTTP trace exporter when tracing is on;
// endpoint, headers, sampler (OTEL_TRACES_SAMPLER) and resource
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) come from the standard
// environment variables. It returns a nil provider when tracing is off;
// otherwise shutdown flushes what is buffered and stops the exporter.
func startTracing(ctx context.Context, cfg config.Tracing, logger *slog.Logger) (tp *sdktrace.TracerProvider, shutdown func(), err error) {
	if !tracingOn(cfg, os.Getenv) {
		return nil, func() {}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := tracingResource()
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	logger.Info("tracing on: exporting spans over OTLP/HTTP", slog.String("endpoint", endpointForLog()))
	shutdown = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			logger.Warn("tracing: flushing spans at exit failed", "err", err)
		}
	}
	return tp, shutdown, nil
}

// tracingResource describes the process: the SDK's defaults (telemetry.sdk.*,
// host and process detectors are not used), service.name idemproxy and
// service.version this build's, then OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES, which win.
func tracingResource() (*resource.Resource, error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", "idemproxy"),
		attribute.String("service.version", serviceVersion()),
	))
	if err != nil {
		return nil, err
	}
	return resource.Merge(res, resource.Environment())
}

func endpointForLog() string {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "https://localhost:4318 (the default)"
}

// propagator reads and writes W3C traceparent, tracestate and baggage.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
