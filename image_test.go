package main

import (
	"debug/elf"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestImageBuildFlags runs the Dockerfile's own build command (its RUN go
// build line, with the build args as the environment) on a copy of the
// build context that .dockerignore leaves (so no .git), natively and
// cross-compiled for arm64, as no container engine runs here. The native
// binary's -version must carry the stamped version and revision and no
// vcs.modified; the cross-compiled one must be an arm64 ELF. Both builds
// compile everything once more (minutes on a cold cache), so a plain go
// test ./... leaves them to .ci/run's image stage, which sets
// IDEMPROXY_IMAGE_CROSS=1.
func TestImageBuildFlags(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	if raceEnabled {
		t.Skip("builds the binary twice: runs in the plain go test pass, not under -race")
	}
	if os.Getenv("IDEMPROXY_IMAGE_CROSS") != "1" {
		// -trimpath and the stamps compile everything once more, the
		// arm64 build once again (minutes on a first run).
		t.Skip("the image build runs in .ci/run's image stage: set IDEMPROXY_IMAGE_CROSS=1 to run it here")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not in PATH")
	}
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(dockerfile), "\\\n", " ")
	build := regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 .*go build .*-o /out/idemproxy \.)\s*$`).FindStringSubmatch(text)
	if build == nil {
		t.Fatal("no RUN ... go build ... -o /out/idemproxy . line in the Dockerfile")
	}
	for _, want := range []string{"FROM --platform=$BUILDPLATFORM", "org.opencontainers.image.revision", "org.opencontainers.image.version"} {
		if !strings.Contains(text, want) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
	ctx := copyBuildContext(t)
	if _, err := os.Stat(filepath.Join(ctx, ".git")); err == nil {
		t.Fatal(".dockerignore lets .git into the build context: the VCS stamp would depend on the checkout")
	}
	for _, arch := range []string{runtime.GOARCH, "arm64"} {
		out := t.TempDir()
		cmd := exec.Command("sh", "-c", strings.ReplaceAll(build[1], "/out/", out+"/"))
		cmd.Dir = ctx
		cmd.Env = append(os.Environ(), "VERSION=v9.9.9-test", "VCS_REF=0123456789abcdef", "TARGETOS=linux", "TARGETARCH="+arch)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", arch, err, b)
		}
		bin := filepath.Join(out, "idemproxy")
		if arch != runtime.GOARCH {
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			if f.Machine != elf.EM_AARCH64 {
				t.Errorf("TARGETARCH=arm64 built a %v binary", f.Machine)
			}
			f.Close()
			continue
		}
		v, err := exec.Command(bin, "-version").Output()
		if err != nil {
			t.Fatal(err)
		}
		got := string(v)
		if !strings.Contains(got, "idemproxy v9.9.9-test ") || !strings.Contains(got, "vcs.revision=0123456789abcdef") || strings.Contains(got, "vcs.modified") {
			t.Errorf("-version of the image's binary: %q, want the stamped version and revision and no vcs.modified", got)
		}
	}
}

// copyBuildContext copies the tree into a temporary directory, leaving out
// what .dockerignore names (its patterns here are top-level names and
// paths, and *.md at the top).
func copyBuildContext(t *testing.T) string {
	t.Helper()
	ignore, err := os.ReadFile(".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.SplitSeq(string(ignore), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	ignored := func(rel string) bool {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, rel); ok || rel == p {
				return true
			}
		}
		return false
	}
	dst := t.TempDir()
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == "." {
			return err
		}
		if ignored(path) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, path)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}
