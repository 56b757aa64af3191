package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timeouts for every Redis connection. go-redis only honours a context's
// deadline on socket reads with ContextTimeoutEnabled; without these a
// stalled Redis held a "1 s" claim for 5 s.
const (
	dialTimeout  = time.Second
	ioTimeout    = time.Second
	poolTimeout  = time.Second
	maxRetries   = 2
	minRetryWait = 8 * time.Millisecond
	maxRetryWait = 64 * time.Millisecond
)

// ClientOptions say how to reach a Redis deployment.
type ClientOptions struct {
	// Addrs: one address is a standalone server, several are a Cluster;
	// with MasterName, the sentinels.
	Addrs []string
	// MasterName selects Sentinel and names the monitored master.
	MasterName string
	// Username and Password authenticate to the data nodes (and to the
	// sentinels, unless SentinelUsername or SentinelPassword is set).
	Username, Password                 string
	SentinelUsername, SentinelPassword string
	// TLS connects with TLS, verifying the server against TLSCAFile (PEM;
	// empty uses the system roots) and TLSServerName (empty uses the host
	// of the address).
	TLS           bool
	TLSCAFile     string
	TLSServerName string
}

// NewClient returns a go-redis universal client for cfg: one address is a
// standalone server, several are a Cluster, and MasterName selects Sentinel.
// go-redis may resend a command after a lost reply; every Store operation is
// written to be safe under that. It fails only when cfg names a TLS CA file
// that cannot be read or parsed.
func NewClient(cfg ClientOptions) (redis.UniversalClient, error) {
	opts := &redis.UniversalOptions{
		Addrs:                 cfg.Addrs,
		MasterName:            cfg.MasterName,
		Username:              cfg.Username,
		Password:              cfg.Password,
		SentinelUsername:      cfg.Username,
		SentinelPassword:      cfg.Password,
		DialTimeout:           dialTimeout,
		ReadTimeout:           ioTimeout,
		WriteTimeout:          ioTimeout,
		PoolTimeout:           poolTimeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            maxRetries,
		MinRetryBackoff:       minRetryWait,
		MaxRetryBackoff:       maxRetryWait,
		DisableIdentity:       true,
		Protocol:              2,
	}
	if cfg.SentinelUsername != "" || cfg.SentinelPassword != "" {
		opts.SentinelUsername, opts.SentinelPassword = cfg.SentinelUsername, cfg.SentinelPassword
	}
	if cfg.TLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLSServerName}
		if cfg.TLSCAFile != "" {
			pem, err := os.ReadFile(cfg.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("TLS CA file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("TLS CA file: no PEM certificate in %s", cfg.TLSCAFile)
			}
		}
		opts.TLSConfig = tc
	}
	return redis.NewUniversalClient(opts), nil
}

// SlogLogger routes go-redis' internal log lines into slog. go-redis has
// one process-wide logger, so main installs one with redis.SetLogger
// (NewSlogLogger). A message is logged at most once per logEvery (by its
// format: a Redis that refuses connections had go-redis report every
// failed dial, about four lines a second while idle), the next one saying
// how many it stands for.
type SlogLogger struct {
	logger *slog.Logger
	now    func() time.Time
	mu     sync.Mutex
	last   map[string]logged
}

// logged is when a message was last logged, and how many of it were left
// out since.
type logged struct {
	at      time.Time
	dropped int
}

// logEvery is the least time between two lines of one go-redis message.
const logEvery = 10 * time.Second

// NewSlogLogger is a SlogLogger on logger.
func NewSlogLogger(logger *slog.Logger) *SlogLogger {
	return &SlogLogger{logger: logger, now: time.Now, last: map[string]logged{}}
}

// Printf logs one go-redis message at warning level, unless the same
// message was logged less than logEvery ago.
func (l *SlogLogger) Printf(ctx context.Context, format string, v ...any) {
	now := l.now()
	l.mu.Lock()
	prev, seen := l.last[format]
	if seen && now.Sub(prev.at) < logEvery {
		prev.dropped++
		l.last[format] = prev
		l.mu.Unlock()
		return
	}
	l.last[format] = logged{at: now}
	l.mu.Unlock()
	attrs := []any{"component", "go-redis"}
	if prev.dropped > 0 {
		attrs = append(attrs, "repeats_not_logged", prev.dropped)
	}
	l.logger.WarnContext(ctx, fmt.Sprintf(format, v...), attrs...)
}
