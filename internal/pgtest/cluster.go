package pgtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
)

// New clusters. initdb costs about a second of CPU (1.3 s on two cores),
// and a test run starts some seventy servers: a cluster is a copy (cp -a,
// a tenth of that) of a template initdb made once per installation of
// PostgreSQL, kept in the user's cache directory like Go's build cache.
// Copies share the template's system identifier, which no test compares
// across servers it started apart (a standby or a restore is made from its
// primary; Reinit, a new cluster on purpose, runs initdb). Without a cache
// directory every cluster is initdb's.

// initdbArgs are initdb's arguments after -D.
var initdbArgs = []string{"-U", User, "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"}

// initdb makes a new cluster in data as cred.
func initdb(bin, data string, cred *syscall.Credential) error {
	cmd := exec.Command(filepath.Join(bin, "initdb"), append([]string{"-D", data}, initdbArgs...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return nil
}

var template struct {
	once sync.Once
	dir  string // "" when there is none: initdb each time
}

// newCluster makes a cluster in data (which does not exist yet) for s.
func (s *Server) newCluster(data string) error {
	template.once.Do(func() { template.dir = makeTemplate(s.bin, s.cred) })
	if template.dir != "" {
		if exec.Command("cp", "-a", template.dir, data).Run() == nil {
			return nil
		}
		os.RemoveAll(data) // initdb instead
	}
	return initdb(s.bin, data, s.cred)
}

// makeTemplate is the template's directory, made when missing; "" when it
// cannot be. It is named by initdb's binary and arguments, so a new
// PostgreSQL gets a template of its own.
func makeTemplate(bin string, cred *syscall.Credential) string {
	cache, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	fi, err := os.Stat(filepath.Join(bin, "initdb"))
	if err != nil {
		return ""
	}
	h := sha256.New()
	fmt.Fprintln(h, bin, fi.Size(), fi.ModTime().UnixNano(), initdbArgs, os.Geteuid())
	if cred != nil {
		fmt.Fprintln(h, cred.Uid, cred.Gid)
	}
	dir := filepath.Join(cache, "idemproxy-pgtest", hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return dir
	}
	// initdb as cred in a directory of its own, then moved into the cache
	// whole (another test process may be doing the same: the first
	// rename wins, and the loser's copy goes).
	tmp, err := os.MkdirTemp("", "idemproxy-pg-template-")
	if err != nil {
		return ""
	}
	defer os.RemoveAll(tmp)
	if cred != nil {
		if err := os.Chown(tmp, int(cred.Uid), int(cred.Gid)); err != nil {
			return ""
		}
	}
	if initdb(bin, filepath.Join(tmp, "data"), cred) != nil {
		return ""
	}
	if os.MkdirAll(filepath.Dir(dir), 0o755) != nil {
		return ""
	}
	staged := dir + ".tmp-" + filepath.Base(tmp)
	if exec.Command("cp", "-a", filepath.Join(tmp, "data"), staged).Run() != nil {
		os.RemoveAll(staged)
		return ""
	}
	if os.Rename(staged, dir) != nil {
		os.RemoveAll(staged)
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		return ""
	}
	return dir
}
