package redisstore_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// TestTLS: a claim over TLS to a redis-server that accepts only TLS,
// verified against the configured CA; an unverifiable server is refused.
func TestTLS(t *testing.T) {
	t.Parallel() // on servers of its own
	srv, ca := redistest.StartTLS(t)
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}, TLS: true, TLSCAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := redisstore.New(c, "tls:")
	if res, err := s.Claim(context.Background(), s.Codec().Key("a", "r", "k"), contract.NewRecord(t), time.Second, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim over TLS: %+v %v", res, err)
	}
	// Without the CA the server's certificate is not trusted.
	plain, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}, TLS: true})
	defer plain.Close()
	if err := redisstore.New(plain, "tls:").Ping(context.Background()); err == nil {
		t.Fatal("a self-signed server was trusted without its CA")
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}, TLS: true, TLSCAFile: bad}); err == nil || !strings.Contains(err.Error(), "TLS CA file") {
		t.Fatalf("bad CA file: %v, want an error naming the TLS CA file", err)
	}
}
