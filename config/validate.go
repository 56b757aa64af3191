package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Validate checks the configuration and reports every problem at once, each
// prefixed with its YAML path.
func (c *Config) Validate() error { return c.validate(nil) }

// validate skips the paths in failed, which already have a decoding
// problem. Each section validates itself; every problem is reported, each
// by its YAML path.
func (c *Config) validate(failed map[string]bool) error {
	var errs []error
	add := func(path, format string, args ...any) {
		if failed[path] {
			return
		}
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{path + fromEnv(path)}, args...)...))
	}
	c.validateListeners(add)
	oneOf("log_level", c.LogLevel, add, "debug", "info", "warn", "error")
	oneOf("tracing.trust_incoming", c.Tracing.TrustIncoming, add, TraceTrustTrustedPeers, TraceTrustAll, TraceTrustNone)
	c.validateUpstream(add)
	c.validateStore(add)
	c.Identity.validate(add)
	c.Defaults.validate("defaults.", add)
	c.validateRoutes(add)
	return errors.Join(errs...)
}

// hostPort checks that addr is host:port with a numeric port, as a
// listener or a Redis address needs: "8080" alone parses as a YAML number
// and fails only when the listener is bound, or never, for Redis.
func hostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port (e.g. :8080, 127.0.0.1:8080, redis:6379), got %q", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("must be host:port with a port from 0 to 65535, got %q", addr)
	}
	return nil
}

// problemf records one problem at a YAML path.
type problemf = func(path, format string, args ...any)

func (c *Config) validateListeners(add problemf) {
	for _, l := range []struct{ key, addr string }{{"listen", c.Listen}, {"admin_listen", c.AdminListen}} {
		if l.addr == "" {
			add(l.key, "must not be empty")
		} else if err := hostPort(l.addr); err != nil {
			add(l.key, "%v", err)
		}
	}
	if c.Listen != "" && c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		add("admin_listen", "must differ from listen: the admin port is never exposed to clients")
	}
	if c.AdminPprofListen != "" {
		if err := loopbackAddr(c.AdminPprofListen); err != nil {
			add("admin_pprof_listen", "%v", err)
		} else if (c.AdminPprofListen == c.Listen || c.AdminPprofListen == c.AdminListen) && !strings.HasSuffix(c.AdminPprofListen, ":0") {
			add("admin_pprof_listen", "must differ from listen and admin_listen: pprof has a listener of its own")
		}
	}
	if c.Client.ReadHeaderTimeout <= 0 {
		add("client.read_header_timeout", "must be positive, got %s", c.Client.ReadHeaderTimeout)
	}
	if c.Client.BodyTimeout <= 0 {
		add("client.body_timeout", "must be positive, got %s", c.Client.BodyTimeout)
	}
	if c.Client.WriteTimeout < time.Second {
		add("client.write_timeout", "must be at least 1s (a client that takes nothing of an answer for this long is cut), got %s", c.Client.WriteTimeout)
	}
	if c.Drain.Delay < 0 {
		add("drain.delay", "must not be negative, got %s", c.Drain.Delay)
	}
	if c.Drain.Timeout < 0 {
		add("drain.timeout", "must not be negative, got %s", c.Drain.Timeout)
	}
	if c.Limits.PrincipalShare < 0 || c.Limits.PrincipalShare > 1 {
		add("limits.principal_share", "must be between 0%% and 100%%, got %g%%", c.Limits.PrincipalShare*100)
	}
	for i, p := range c.PassThroughUpgrades {
		if !validToken(p) {
			add(fmt.Sprintf("pass_through_upgrades[%d]", i), "%q is not a protocol name (an Upgrade header token, e.g. websocket)", p)
		}
	}
	for key, v := range map[string]string{"problems.type_base_url": c.Problems.TypeBaseURL, "problems.docs_url": c.Problems.DocsURL} {
		if u, err := url.Parse(v); v != "" && (err != nil || u.Scheme == "" || (u.Scheme != "urn" && u.Host == "")) {
			add(key, "must be an absolute URL (https://...) or a URN, got %q", v)
		}
	}
}

// httpURL parses an absolute http or https URL; ok is false for anything
// else.
func httpURL(s string) (u *url.URL, ok bool) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, false
	}
	return u, true
}

func oneOf(path, got string, add func(path, format string, args ...any), allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	add(path, "must be one of %s, got %q", strings.Join(allowed, ", "), got)
}

// validToken reports whether s is an RFC 9110 token, as header names and
// methods must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// loopbackAddr checks that addr is host:port with a loopback host, so that
// what listens there is reachable only from inside the pod.
func loopbackAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("must be a loopback host:port like 127.0.0.1:6060, got %q", addr)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address: pprof's profiles and heap dumps hold request contents; use 127.0.0.1:6060 or [::1]:6060 and reach it with kubectl port-forward", addr)
}

// ownListener returns the key and address of the listener u points at,
// when u is on this host (loopback, localhost or the listener's own host)
// and on a port idemproxy itself listens on.
func ownListener(u *url.URL, listen, admin string) (key, addr string) {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	host := u.Hostname()
	local := strings.EqualFold(host, "localhost")
	if ip, err := netip.ParseAddr(host); err == nil {
		local = ip.IsLoopback() || ip.IsUnspecified()
	}
	for _, l := range []struct{ key, addr string }{{"listen", listen}, {"admin_listen", admin}} {
		lhost, lport, err := net.SplitHostPort(l.addr)
		if err != nil || lport != port || lport == "0" {
			continue
		}
		if local || strings.EqualFold(lhost, host) {
			return l.key, l.addr
		}
	}
	return "", ""
}

// exposedSecrets warns about each secret file that users other than this
// process can read: readable by everyone, or by a group this process is
// not in (groups lists its supplementary groups). A Kubernetes Secret
// mounted with defaultMode 0440 and the pod's fsGroup is readable by that
// group, which the process is in: no warning. Secret mounts are symlinks:
// Stat judges the file they lead to.
func (c *Config) exposedSecrets(groups func() ([]int, error)) []string {
	files := []struct{ key, path string }{
		{"store.redis.password_file", c.Store.Redis.PasswordFile},
		{"store.redis.sentinel_password_file", c.Store.Redis.SentinelPasswordFile},
		{"store.postgres.password_file", c.Store.Postgres.PasswordFile},
		{"store.key_secret_file", c.Store.KeySecretFile},
		{"admin.token_file", c.Admin.TokenFile},
	}
	for i, f := range c.Store.Encryption.KeyFiles {
		files = append(files, struct{ key, path string }{fmt.Sprintf("store.encryption.key_files[%d]", i), f})
	}
	for i, r := range c.Routes {
		for j, f := range r.Webhook.SecretFiles {
			files = append(files, struct{ key, path string }{fmt.Sprintf("routes[%d].webhook.secret_files[%d]", i, j), f})
		}
	}
	mine, _ := groups()
	var out []string
	for _, f := range files {
		if f.path == "" {
			continue
		}
		fi, err := os.Stat(f.path)
		if err != nil {
			continue // reading it reports that
		}
		mode, gid := fi.Mode().Perm(), -1
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			gid = int(st.Gid)
		}
		switch {
		case mode&0o004 != 0:
			out = append(out, fmt.Sprintf("%s: %s is readable by every user on this host (mode %s): make it 0400, or 0440 with the pod's fsGroup (a Kubernetes Secret volume: defaultMode: 0440)", f.key, f.path, mode))
		case mode&0o040 != 0 && gid != os.Getgid() && !slices.Contains(mine, gid):
			out = append(out, fmt.Sprintf("%s: %s is readable by group %d, which this process is not in (mode %s): make it 0400, or give it this process' group", f.key, f.path, gid, mode))
		}
	}
	return out
}
