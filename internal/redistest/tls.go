package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/loopback"
)

// StartTLS starts a redis-server that accepts only TLS, with a
// self-signed certificate for 127.0.0.1 generated for this test. caFile is
// that certificate in PEM, for clients to verify the server with.
func StartTLS(t testing.TB) (s *Server, caFile string) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Start(t) // skips or fails with the usual message
	}
	dir := t.TempDir()
	caFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeSelfSigned(t, caFile, keyFile)
	pool := x509.NewCertPool()
	b, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(b)
	for range 5 {
		port, err := loopback.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s = &Server{t: t, bin: bin, dir: dir, Addr: "127.0.0.1:" + strconv.Itoa(port),
			tls: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
		err = s.startWith("--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--tls-cert-file", caFile, "--tls-key-file", keyFile,
			"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no", "--loglevel", "warning")
		if err == nil {
			t.Cleanup(s.Stop)
			return s, caFile
		}
	}
	t.Fatal("could not start a TLS redis-server")
	return nil, ""
}

func writeSelfSigned(t testing.TB, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idemproxy test redis"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
}
