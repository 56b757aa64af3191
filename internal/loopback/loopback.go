// Package loopback has what the test helpers and harnesses share for
// servers they start on 127.0.0.1.
package loopback

import (
	"net"
	"sync"
)

// given are the ports FreePort handed out in this process: the kernel
// may offer a port again as soon as it is closed, and two servers of one
// test (a sidecar's listen and admin_listen) must not get the same one.
var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that it has not returned before in this process. Another process can
// take it before the caller binds it; callers that start a server on it
// retry on a bind error.
func FreePort() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !given[port] {
			given[port] = true
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
