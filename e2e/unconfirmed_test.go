package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/faultlink"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestRedisStallDuringClaim, through the real binary on a real
// redis-server: Redis is paused (SIGSTOP) while a first attempt claims, so
// the claim's SET is written but not answered and the client gets 503
// store-unavailable; Redis resumes and runs that SET, leaving a claim no
// sidecar owns. Under unknown_outcome fail (the default) and keep, the
// retries must then execute the key exactly once and get 201, never a 502
// outcome-unknown or a lease of 409s. And the same when the claiming
// sidecar is killed (kill -9) while its claim waits on the paused Redis.
func TestRedisStallDuringClaim(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	for _, tc := range []struct {
		name, unknown string
		kill          bool
	}{
		{"fail", "fail", false},
		{"keep", "keep", false},
		{"fail, claiming sidecar killed", "fail", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			upstream := binarytest.NewRecorder(t)
			yaml := fmt.Sprintf(`upstream:
  url: %q
store:
  redis:
    addrs: [%q]
defaults:
  unknown_outcome: %s
routes:
  - name: pay
    match: "POST /payments"
`, upstream.URL, srv.Addr, tc.unknown)
			first := startBinary(t, yaml)
			second := first
			if tc.kill {
				second = startBinary(t, yaml)
			}
			if status, body := post(t, first.Client+"/payments", "warm-up", `{}`); status != http.StatusCreated {
				t.Fatalf("warm-up: %d %s", status, body) // the connection the stalled SET will sit on
			}

			srv.Pause()
			resumed := false
			defer func() {
				if !resumed {
					srv.Resume()
				}
			}()
			answered := make(chan [2]any, 1)
			go func() {
				resp, err := http.DefaultClient.Do(payRequest(first.Client+"/payments", "stalled", `{"amount":1}`))
				if err != nil {
					answered <- [2]any{0, err.Error()}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answered <- [2]any{resp.StatusCode, string(b)}
			}()
			if tc.kill {
				time.Sleep(300 * time.Millisecond) // the claim is written and waits on Redis
				first.Kill()                       // by the PID this test started
			} else {
				got := <-answered
				if got[0] != http.StatusServiceUnavailable || !strings.Contains(got[1].(string), "store-unavailable") {
					t.Fatalf("the claiming attempt: %v %v, want 503 store-unavailable", got[0], got[1])
				}
			}
			time.Sleep(3 * time.Second) // a stall well past the claim's confirm window
			srv.Resume()
			resumed = true

			var status int
			var body string
			poll.Until(t, "a retry executes", func() bool {
				status, body = post(t, second.Client+"/payments", "stalled", `{"amount":1}`)
				if status == http.StatusBadGateway {
					t.Fatalf("retry: 502 %s: a claim that was never forwarded became outcome-unknown", body)
				}
				return status == http.StatusCreated
			})
			if again, body2 := post(t, second.Client+"/payments", "stalled", `{"amount":1}`); again != http.StatusCreated || body2 != body {
				t.Errorf("replay: %d %s, want the 201 %s", again, body2, body)
			}
			if n := upstream.Total(); n != 2 { // the warm-up and the stalled key, once
				t.Errorf("upstream executed %d times, want 2 (warm-up + once)", n)
			}
			if tc.kill {
				return
			}
			poll.Until(t, "the unconfirmed claim is counted", func() bool {
				_, text := get(t, first.Admin+"/metrics")
				for _, result := range []string{"released", "not_found", "cleared_on_retry"} {
					if strings.Contains(text, `idemproxy_unconfirmed_claims_total{result="`+result+`"} 1`) {
						return true
					}
				}
				return false
			})
		})
	}
}

// TestLateReplyNeverFreesAForwardedClaim (issue 30), through two real
// sidecars on one real redis-server, each on its own link to it. Redis
// stalls for 0.9s while sidecar A claims a key: the confirmation still
// comes inside A's confirm window, so A forwards (the upstream takes 2s).
// The client's retry reaches sidecar B, whose link delays one reply, the
// one after B's claim finds A's record, by 0.85s: a retransmitted segment
// or a slow command queued ahead of it. v0.4.0's B estimated when A's SET
// ran from its own clock read after that reply, judged the claim never
// forwarded, freed it and forwarded again: two executions, every run
// (IDEMPROXY_TEST_BINARY=<v0.4.0 build> shows it). Now B reads when the
// SET ran on Redis' clock, in one script: it answers 409, the retries
// replay A's answer, and the upstream executes once.
func TestLateReplyNeverFreesAForwardedClaim(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	srv := redistest.Start(t)
	linkA, err := faultlink.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer linkA.Close()
	linkB, err := faultlink.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer linkB.Close()
	upstream := binarytest.NewRecorder(t)
	upstream.Delay = 2 * time.Second
	config := func(addr string) string {
		return fmt.Sprintf(`upstream:
  url: %q
store:
  redis:
    addrs: [%q]
routes:
  - name: pay
    match: "POST /payments"
`, upstream.URL, addr)
	}
	a, b := startBinary(t, config(linkA.Addr())), startBinary(t, config(linkB.Addr()))
	for _, sc := range []*sidecar{a, b} {
		if status, body := post(t, sc.Client+"/payments", "warm-up-"+sc.Client, `{}`); status != http.StatusCreated {
			t.Fatalf("warm-up: %d %s", status, body)
		}
	}
	time.Sleep(1500 * time.Millisecond) // both sidecars' store watchers have read Redis' clock

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	first := make(chan int, 1)
	go func() {
		status, _ := post(t, a.Client+"/payments", "k", `{"amount":1}`)
		first <- status
	}()
	time.Sleep(900 * time.Millisecond) // inside A's 1s confirm window
	srv.Resume()
	resumed = true
	poll.Until(t, "A forwarded", func() bool { return upstream.Executions("k") == 1 })

	// B's claim finds A's record: the claim script's reply (an array of
	// four: the record, its PTTL and Redis' TIME) comes 0.85s late. Only
	// that reply: the store watcher's TIME (an array of two) or epoch
	// look, sent between arming and B's claim, must not take the delay.
	late := linkB.DelayNextReply(func(b []byte) bool { return bytes.HasPrefix(b, []byte("*4\r\n")) }, 850*time.Millisecond)
	status, body := post(t, b.Client+"/payments", "k", `{"amount":1}`)
	select { // closed once the link's write returned, which B's read may beat
	case <-late:
	case <-time.After(2 * time.Second):
		t.Errorf("no reply was delayed on B's link: the test did not exercise a late reply (B answered %d %s)", status, body)
	}
	if status != http.StatusConflict {
		t.Errorf("the retry on B while A's request runs: %d %s, want 409", status, body)
	}
	if got := <-first; got != http.StatusCreated {
		t.Errorf("the first attempt on A: %d, want 201", got)
	}
	var replay string
	poll.Until(t, "the retry replays", func() bool {
		status, replay = post(t, b.Client+"/payments", "k", `{"amount":1}`)
		return status == http.StatusCreated
	})
	time.Sleep(2500 * time.Millisecond) // a second execution, had B forwarded, would have ended by now
	if n := upstream.Executions("k"); n != 1 {
		t.Fatalf("upstream executed %d times, want 1 (a forwarded claim was freed by a late reply)", n)
	}
	if !strings.Contains(replay, `"id":"ch_k_1"`) {
		t.Errorf("replay %q, want the first attempt's answer", replay)
	}
}
