// Package clockshim steps the realtime clock of a process the tests start
// (redis-server), while it runs, as an NTP step, a resumed VM or a
// failover to a host whose clock is off would: a small LD_PRELOAD library
// (shim.c.txt: C, kept out of the Go build), built here with the C compiler, adds an offset that the test
// sets at any moment to every realtime clock read of that process. Its
// monotonic clock is left alone. Debian's libfaketime cannot do this for
// redis-server (its 0.9.10 recurses at jemalloc's start-up and the server
// never answers), so the shim is the project's own.
package clockshim

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

//go:embed shim.c.txt
var source []byte

// Clock is one shim library and the offset file of the processes started
// with its Env.
type Clock struct {
	lib, file string
}

// Build compiles the shim into dir and creates its offset file there, at
// zero. It needs a C compiler (cc or gcc).
func Build(dir string) (*Clock, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		if cc, err = exec.LookPath("gcc"); err != nil {
			return nil, errors.New("clockshim: no C compiler (cc, gcc) to build the clock shim")
		}
	}
	src := filepath.Join(dir, "clockshim.c")
	if err := os.WriteFile(src, source, 0o600); err != nil {
		return nil, err
	}
	c := &Clock{lib: filepath.Join(dir, "clockshim.so"), file: filepath.Join(dir, "clockshim.offset")}
	if out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-o", c.lib, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("clockshim: build: %v: %s", err, out)
	}
	if err := os.WriteFile(c.file, make([]byte, 8), 0o600); err != nil {
		return nil, err
	}
	return c, nil
}

// Env is what a process must be started with for Set to move its clock.
func (c *Clock) Env() []string {
	return []string{"LD_PRELOAD=" + c.lib, "CLOCKSHIM_FILE=" + c.file}
}

// SharedEnv is what a Go process built with -tags chaosclock (the
// sidecar, chaosclock.go) must be started with to share the clock of the
// processes started with Env: Go reads the time without the C library,
// so it reads the offset file itself.
func (c *Clock) SharedEnv() []string {
	return []string{"CLOCKSHIM_FILE=" + c.file}
}

// Set moves the clock of every process started with Env to the real time
// plus offset, at once (a forward step for a positive offset, back for a
// negative one).
func (c *Clock) Set(offset time.Duration) error {
	f, err := os.OpenFile(c.file, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(offset.Nanoseconds()))
	_, err = f.WriteAt(b[:], 0)
	return err
}
