package config

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Store configures the store: Redis (the default, or the embedded store
// when no address is set) or PostgreSQL, never both.
type Store struct {
	// Redis says how to reach a Redis deployment.
	Redis Redis `yaml:"redis"`
	// Postgres, when its URL is set, keeps records in PostgreSQL instead.
	Postgres Postgres `yaml:"postgres"`
	// RecordFormat is the stored format written: 1 (what v0.3.0 reads,
	// the default), 2 (fingerprints keyed with KeySecretFile: turn it on
	// once every replica runs v0.4.0 or later) or 3 (2, plus compact
	// completed records and compressed bodies with Compression: once
	// every replica runs v0.5.0 or later), 4 (3, plus streamed answers
	// stored as they arrive: v0.6.0) or 5 (4, with a stream's chunks as
	// rows of their own on PostgreSQL, whose appends otherwise rewrite
	// the whole value: v0.8.0; on Redis the same as 4).
	// Every version reads the formats before it.
	RecordFormat int `yaml:"record_format"`
	// Compression is none or zstd: completed bodies from 256 bytes on
	// stored zstd-compressed, written only under RecordFormat 3.
	Compression string `yaml:"compression"`
	// KeyPrefix is prepended to every Redis key.
	KeyPrefix string `yaml:"key_prefix"`
	// Pipeline coalesces concurrent store operations into pipelines
	// (group commit; on PostgreSQL, a batch commits together); false
	// sends each on its own. No effect with WaitReplicas, whose WAIT
	// would hold up a whole batch.
	Pipeline bool `yaml:"pipeline"`
	// WaitReplicas, when positive, makes every claim and completion wait
	// for that many replicas to acknowledge it (Redis WAIT), up to
	// WaitTimeout. Zero never waits. Not consensus. On a Cluster the WAIT
	// goes to the key's master.
	WaitReplicas int `yaml:"wait_replicas"`
	// WaitTimeout bounds each WAIT.
	WaitTimeout time.Duration `yaml:"wait_timeout"`
	// ClaimMemoryLimit is the share of Redis' maxmemory above which new
	// claims are refused (503 store-full) so that claims in flight can
	// still store their outcome; 0 refuses none. Without a maxmemory it
	// has no effect.
	ClaimMemoryLimit float64 `yaml:"claim_memory_limit"`
	// Encryption seals what records hold of the upstream's answers.
	Encryption Encryption `yaml:"encryption"`
	// KeySecretFile, when set, holds the secret (base64) that keys the
	// derivation of Redis keys (HMAC-SHA-256); without it, with encryption
	// on, a subkey of the first key file is used.
	KeySecretFile string `yaml:"key_secret_file"`
}

// Encryption configures sealed records.
type Encryption struct {
	// KeyFiles each hold 32 random bytes, base64-encoded. The first seals,
	// all open: rotate by prepending a new key, and drop the old one once
	// retention has passed. Empty stores records unsealed.
	KeyFiles []string `yaml:"key_files"`
	// Required makes an unsealed record unreadable (500 record-unreadable)
	// instead of trusted.
	Required bool `yaml:"required"`
}

// Redis is the connection to the Redis deployment.
type Redis struct {
	// Addrs empty selects the embedded in-memory store (development only);
	// one address is a standalone server; several are a Cluster.
	Addrs []string `yaml:"addrs"`
	// MasterName set selects Sentinel, with Addrs naming the sentinels.
	MasterName string `yaml:"master_name"`
	// Username is the ACL user of the data nodes.
	Username string `yaml:"username"`
	// Password is the data nodes' password (prefer PasswordFile).
	Password string `yaml:"password"`
	// PasswordFile, when set, holds the password (a mounted Secret); it is
	// read at start, surrounding whitespace removed.
	PasswordFile string `yaml:"password_file"`
	// SentinelUsername and SentinelPassword (or SentinelPasswordFile)
	// authenticate to the sentinels when theirs differ from the data
	// nodes'; when all are empty the data nodes' credentials are used.
	SentinelUsername     string `yaml:"sentinel_username"`
	SentinelPassword     string `yaml:"sentinel_password"`
	SentinelPasswordFile string `yaml:"sentinel_password_file"`
	// TLS connects with TLS, verifying the server against TLSCAFile (PEM;
	// empty uses the system roots) and TLSServerName (empty uses the host
	// of the address).
	TLS           bool   `yaml:"tls"`
	TLSCAFile     string `yaml:"tls_ca_file"`
	TLSServerName string `yaml:"tls_server_name"`
}

// Postgres is the connection to the PostgreSQL database of the durable
// store (claim/pgstore).
type Postgres struct {
	// URL is a libpq connection string or URL (postgres://user@host:5432/
	// db?sslmode=verify-full); several hosts with
	// target_session_attrs=read-write follow a failover. Never a password:
	// PasswordFile holds it.
	URL string `yaml:"url"`
	// Password is the role's password (prefer PasswordFile, or the env
	// override IDEMPROXY_STORE_POSTGRES_PASSWORD from a Secret).
	Password string `yaml:"password"`
	// PasswordFile, when set, holds the password (a mounted Secret), read
	// at start, surrounding whitespace removed.
	PasswordFile string `yaml:"password_file"`
	// ListenURL is the LISTEN connection's own URL, straight to the
	// database past any transaction pooler (a LISTEN needs a session of
	// its own); empty: URL. Same rules as URL, the same password.
	ListenURL string `yaml:"listen_url"`
	// Schema holds idemproxy's tables and functions.
	Schema string `yaml:"schema"`
	// CreateSchema installs or updates the schema at start (idemproxy
	// store migrate does it alone); false expects it installed.
	CreateSchema bool `yaml:"create_schema"`
	// MaxConns bounds the connection pool (one more is held to listen
	// for wake-ups).
	MaxConns int `yaml:"max_conns"`
}

// Record compressions (store.compression).
const (
	CompressionNone = "none"
	CompressionZstd = "zstd"
)

func (c *Config) validateStore(add problemf) {
	st := &c.Store
	if st.RecordFormat < 1 || st.RecordFormat > 5 {
		add("store.record_format", "must be 1, 2, 3, 4 or 5, got %d", st.RecordFormat)
	}
	oneOf("store.compression", st.Compression, add, CompressionNone, CompressionZstd)
	if st.RecordFormat == 2 && st.KeySecretFile == "" {
		add("store.record_format", "2 keys fingerprints with store.key_secret_file (never a sealing key, which rotates), which is not set: set it, or keep 1")
	}
	if st.KeyPrefix == "" {
		add("store.key_prefix", "must not be empty: it keeps idemproxy's keys apart from other data")
	}
	c.validatePostgres(add)
	r := st.Redis
	if r.Password != "" && r.PasswordFile != "" {
		add("store.redis.password_file", "set either store.redis.password or store.redis.password_file, not both")
	}
	if r.MasterName == "" {
		for key, v := range map[string]string{"sentinel_username": r.SentinelUsername, "sentinel_password": r.SentinelPassword, "sentinel_password_file": r.SentinelPasswordFile} {
			if v != "" {
				add("store.redis."+key, "is only used with Sentinel: set store.redis.master_name, or remove it")
			}
		}
	} else if r.SentinelPassword != "" && r.SentinelPasswordFile != "" {
		add("store.redis.sentinel_password_file", "set either store.redis.sentinel_password or store.redis.sentinel_password_file, not both")
	}
	for i, a := range r.Addrs {
		if err := hostPort(a); err != nil {
			add(fmt.Sprintf("store.redis.addrs[%d]", i), "%v", err)
		}
	}
	if r.MasterName != "" && len(r.Addrs) == 0 {
		add("store.redis.addrs", "must list the sentinels when store.redis.master_name is set")
	}
	if !r.TLS && (r.TLSCAFile != "" || r.TLSServerName != "") {
		add("store.redis.tls", "must be true when store.redis.tls_ca_file or tls_server_name is set")
	}
	if st.ClaimMemoryLimit < 0 || st.ClaimMemoryLimit > 1 {
		add("store.claim_memory_limit", "must be between 0%% and 100%%, got %g%%", st.ClaimMemoryLimit*100)
	}
	if st.Encryption.Required && len(st.Encryption.KeyFiles) == 0 {
		add("store.encryption.required", "needs store.encryption.key_files")
	}
	for i, f := range st.Encryption.KeyFiles {
		if strings.TrimSpace(f) == "" {
			add(fmt.Sprintf("store.encryption.key_files[%d]", i), "must name a file")
		}
	}
	if st.WaitReplicas < 0 {
		add("store.wait_replicas", "must not be negative, got %d", st.WaitReplicas)
	}
	if st.WaitReplicas > 0 && st.WaitTimeout <= 0 {
		add("store.wait_timeout", "must be positive when store.wait_replicas is set, got %s", st.WaitTimeout)
	}
}

// validatePostgres checks store.postgres: exactly one store, no password
// in the URL, a schema name and a pool size.
func (c *Config) validatePostgres(add problemf) {
	pg := c.Store.Postgres
	if pg.URL == "" {
		if pg.PasswordFile != "" {
			add("store.postgres.password_file", "is only used with store.postgres.url")
		}
		if pg.Password != "" {
			add("store.postgres.password", "is only used with store.postgres.url")
		}
		if pg.ListenURL != "" {
			add("store.postgres.listen_url", "is only used with store.postgres.url")
		}
		return
	}
	if len(c.Store.Redis.Addrs) > 0 {
		add("store.postgres.url", "set either store.redis.addrs or store.postgres.url, not both: one fleet uses one store (docs/production.md, switching stores)")
	}
	checkPostgresURL(add, "store.postgres.url", pg.URL)
	if pg.Password != "" && pg.PasswordFile != "" {
		add("store.postgres.password", "set together with store.postgres.password_file: keep one (the file, or IDEMPROXY_STORE_POSTGRES_PASSWORD from a Secret)")
	}
	if pg.ListenURL != "" {
		checkPostgresURL(add, "store.postgres.listen_url", pg.ListenURL)
	}
	if !validIdentifier(pg.Schema) {
		add("store.postgres.schema", "must be a plain SQL name (letters, digits, _; not starting with a digit), got %q", pg.Schema)
	}
	if pg.MaxConns < 2 || pg.MaxConns > 1000 {
		add("store.postgres.max_conns", "must be between 2 and 1000, got %d", pg.MaxConns)
	}
	if c.Store.WaitReplicas > 0 {
		add("store.wait_replicas", "is Redis' WAIT: with store.postgres, a synchronous standby (synchronous_standby_names) does it in the database")
	}
}

// checkPostgresURL refuses a connection string that holds a password
// anywhere (the URL's userinfo, a password parameter in its query or in a
// key=value string), without echoing it, and one the driver cannot use as
// it parses it at start: an sslmode typo, a bad port or scheme fails
// here, not in the pod. (Files it names, such as sslrootcert, are read at
// start, and by -check unless -skip-files.)
func checkPostgresURL(add problemf, path, raw string) {
	if holdsPassword(raw) {
		add(path, "holds a password: put it in a file named by store.postgres.password_file (or the env override IDEMPROXY_STORE_POSTGRES_PASSWORD), and leave it out of the URL")
	}
	_, err := parsePostgres(raw)
	var pathErr *fs.PathError
	switch {
	case err == nil, errors.As(err, &pathErr):
	case strings.Contains(raw, "://") && !strings.HasPrefix(raw, "postgres://") && !strings.HasPrefix(raw, "postgresql://"):
		add(path, "the driver takes postgres:// or postgresql:// URLs (or key=value settings), not %q", raw[:strings.Index(raw, "://")+3])
	default:
		add(path, "the driver cannot use it: %s", driverError(err))
	}
}

// holdsPassword reports whether a connection string carries a password
// in any form the driver reads: a URL's userinfo (a multi-host URL too,
// which net/url cannot parse when a host lacks its port) or query, or a
// key=value setting (spaces and tabs around the = allowed, as libpq and
// pgx allow them).
func holdsPassword(raw string) bool {
	if rest, ok := cutScheme(raw); ok {
		authority, _, _ := strings.Cut(rest, "/")
		authority, query, _ := strings.Cut(authority, "?")
		if at := strings.LastIndex(authority, "@"); at >= 0 && strings.Contains(authority[:at], ":") {
			return true
		}
		if i := strings.Index(rest, "?"); i >= 0 {
			query = rest[i+1:]
		}
		if q, err := url.ParseQuery(query); err == nil && q.Has("password") {
			return true
		}
		return strings.Contains(strings.ToLower(query), "password=")
	}
	return keywordPassword.MatchString(raw)
}

// cutScheme is raw after postgres:// or postgresql:// (any case), and
// whether raw is such a URL.
func cutScheme(raw string) (string, bool) {
	lower := strings.ToLower(raw)
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if strings.HasPrefix(lower, scheme) {
			return raw[len(scheme):], true
		}
	}
	return "", false
}

// keywordPassword finds a password setting in a key=value connection
// string.
var keywordPassword = regexp.MustCompile(`(?i)(^|[ \t\n\r])password[ \t\n\r]*=`)

// parsePostgres parses a connection string as the driver does at start
// (never asking for a key file's password).
func parsePostgres(raw string) (*pgconn.Config, error) {
	return pgconn.ParseConfigWithOptions(raw, pgconn.ParseConfigOptions{GetSSLPassword: func(context.Context) string { return "" }})
}

// driverError is what the driver says of a URL, without the URL it
// quotes (never echo a connection string).
func driverError(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) && pe.Unwrap() != nil {
		return pe.Unwrap().Error()
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// ReadFiles reads the files store.postgres' URLs name (sslrootcert,
// sslcert, sslkey) as the driver will at start: each must exist, be
// readable and hold PEM. Validate does not read files; -check does,
// unless -skip-files, so that a missing CA fails in CI, not in the pod.
func (p Postgres) ReadFiles() error {
	var errs []error
	for _, k := range []struct{ path, raw string }{{"store.postgres.url", p.URL}, {"store.postgres.listen_url", p.ListenURL}} {
		if k.raw == "" {
			continue
		}
		if _, err := parsePostgres(k.raw); err != nil {
			errs = append(errs, fmt.Errorf("%s: the TLS files it names (sslrootcert, sslcert, sslkey) cannot be used: %s", k.path, driverError(err)))
		}
	}
	return errors.Join(errs...)
}

// validIdentifier reports whether s is a plain SQL name.
func validIdentifier(s string) bool {
	if s == "" || len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
