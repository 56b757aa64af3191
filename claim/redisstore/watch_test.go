package redisstore

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestWatchNeverWaitsForRedis: starting and stopping watches is
// bookkeeping; the SUBSCRIBE is written by the subscription's own
// goroutine. With the connection to Redis stuck in its dial, twenty
// waiters start and stop at once; then, once the dial goes through, the
// watches that remain go live. (The SUBSCRIBE used to be written under
// the watcher's lock, so every waiter queued behind a slow dial.)
func TestWatchNeverWaitsForRedis(t *testing.T) {
	t.Parallel() // on servers of its own
	srv := redistest.Start(t)
	dialing := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	client := redis.NewClient(&redis.Options{
		Addr: srv.Addr,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			once.Do(func() { close(dialing) })
			<-release
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		DialTimeout: time.Minute,
	})
	defer client.Close()
	s := New(client, "w:")
	defer s.Close()

	started := make(chan claim.Watch, 1)
	go func() { started <- s.Watch(context.Background(), s.Codec().Key("p", "r", "first")) }()
	var first claim.Watch
	select {
	case first = <-started:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("a watch waited for the stuck dial")
	}
	defer first.Stop()
	<-dialing // the writer is now stuck in the dial
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			w := s.Watch(context.Background(), s.Codec().Key("p", "r", fmt.Sprint(i)))
			if i%2 == 0 {
				w.Stop()
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("watches waited for the stuck dial")
	}
	close(release)
	select {
	case <-first.C():
	case <-time.After(30 * time.Second):
		t.Fatal("the watch never went live once Redis answered")
	}
}
