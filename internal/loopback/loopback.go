// Package loopback has what the test helpers and harnesses share for
// servers they start on 127.0.0.1.
package loopback

import "net"

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process can take it before the caller binds it; callers that
// start a server on it retry on a bind error.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
