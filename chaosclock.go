//go:build chaosclock

package main

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// A build for the chaos harness only (go build -tags chaosclock): the
// sidecar's wall clock follows the clock shim's offset file
// (internal/clockshim) named by CLOCKSHIM_FILE, the file the store's
// process steps by, so that one clock steps under both: Redis or
// PostgreSQL on the sidecar's node, or one NTP source for both. Go reads
// the time without the C library, which the shim replaces, so the offset
// is applied here, to what the sidecar writes for other processes and
// compares with theirs (proxy.Options.Clock, claim.WithClock); its own
// deadlines stay on the monotonic clock, as a real step leaves them.
func init() {
	file := os.Getenv("CLOCKSHIM_FILE")
	if file == "" {
		return
	}
	offset, err := mapOffset(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemproxy: chaosclock:", err)
		os.Exit(1)
	}
	wallClock = func() time.Time {
		// Round(0) drops the monotonic reading: comparisons of the
		// stepped time run on the wall clock.
		return time.Now().Add(time.Duration(atomic.LoadInt64(offset))).Round(0)
	}
}

// mapOffset maps the shim's offset file: nanoseconds as a little-endian
// int64, which the harness rewrites in place.
func mapOffset(file string) (*int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", file, err)
	}
	return (*int64)(unsafe.Pointer(&b[0])), nil
}
