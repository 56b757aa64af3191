package main

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func exec1(principal, key, rid string, start int, resp string) execution {
	return execution{Principal: principal, Key: key, RequestID: rid, Status: 201, Start: at(start), Response: resp, BodyHash: "b"}
}

func answer(principal, key, rid string, sidecar int, status int, replayed bool, body string) attempt {
	return attempt{Principal: principal, Key: key, RequestID: rid, Sidecar: sidecar, Status: status, Replayed: replayed, Body: body, Start: at(0), End: at(1)}
}

const alice1 = `{"principal":"alice","key":"k","execution":1}`
const alice2 = `{"principal":"alice","key":"k","execution":2}`

// The checker must catch what it exists to catch: each case here is a
// history with exactly one defect.
func TestCheckerFindsDefects(t *testing.T) {
	execs := []execution{exec1("alice", "k", "r1", 0, alice1)}
	clean := []attempt{answer("alice", "k", "r1", 0, 201, false, alice1), answer("alice", "k", "r2", 1, 201, true, alice1)}
	if r := check(1, 0, clean, execs, nil, map[string]string{"r1": "stored"}, 0, false, nil); r.failed() {
		t.Fatalf("a clean history failed: %+v", r)
	}
	tests := []struct {
		name    string
		history []attempt
		execs   []execution
		faults  []fault
		stuck   int
		field   func(*report) int
	}{
		{"unexplained duplicate", clean, append(execs, exec1("alice", "k", "r3", 5, alice2)), nil, 0,
			func(r *report) int { return len(r.Unexplained) }},
		{"duplicate with a sidecar kill of another sidecar", clean, append(execs, exec1("alice", "k", "r3", 5, alice2)),
			[]fault{{Kind: faultKillSidecar, Target: 7, Start: at(1), End: at(2)}}, 0,
			func(r *report) int { return len(r.Unexplained) }},
		{"cross-principal answer", append(clean, answer("bob", "k", "r4", 0, 201, true, alice1)), execs, nil, 0,
			func(r *report) int { return r.CrossPrincipal }},
		{"replay that matches no execution", append(clean, answer("alice", "k", "r4", 0, 201, true, alice2)), execs, nil, 0,
			func(r *report) int { return r.ReplayMismatch }},
		{"replayed status differs", append(clean, answer("alice", "k", "r4", 0, 500, true, alice1)), execs, nil, 0,
			func(r *report) int { return r.ReplayMismatch }},
		{"transient replayed", append(clean, answer("alice", "k", "r4", 0, 503, true, "busy")), execs, nil, 0,
			func(r *report) int { return r.TransientReplayed }},
		{"stuck key", clean, execs, nil, 1, func(r *report) int { return r.Stuck }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := check(1, 0, tt.history, tt.execs, tt.faults, map[string]string{"r1": "stored"}, tt.stuck, false, nil)
			if tt.field(r) != 1 || !r.failed() {
				t.Fatalf("defect not reported: %+v", r)
			}
		})
	}
}

func TestCheckerExplainsInjectedFaults(t *testing.T) {
	history := []attempt{answer("alice", "k", "r1", 2, 201, false, alice1)}
	execs := []execution{exec1("alice", "k", "r1", 0, alice1), exec1("alice", "k", "r3", 5, alice2)}
	reset := []execution{execs[0], execs[1]}
	reset[0].Mode = "reset"
	hung := []execution{execs[0], execs[1]}
	hung[0].Mode = "hang"
	for _, tt := range []struct {
		name     string
		execs    []execution
		outcomes map[string]string
		faults   []fault
		strict   bool
		cause    string // "": must stay unexplained
	}{
		{"store failed", execs, map[string]string{"r1": "store_error"}, nil, false, "dual-write: store failed"},
		{"lost fence", execs, map[string]string{"r1": "fence_lost"}, nil, false, "dual-write: store failed"},
		{"owning sidecar killed before logging", execs, nil, []fault{{Kind: faultKillSidecar, Target: 2, Start: at(1), End: at(2)}}, false, "sidecar killed"},
		{"Redis lost its data", execs, map[string]string{"r1": "stored"}, []fault{{Kind: faultRedisLost, Start: at(3), End: at(3)}}, false, "Redis lost acknowledged data"},
		{"upstream reset after acting", reset, map[string]string{"r1": "claimed"}, nil, false, "unknown outcome: upstream reset"},
		// Late answers are stored: a hang explains no duplicate any more.
		{"upstream hung", hung, map[string]string{"r1": "claimed"}, []fault{{Kind: faultUpstreamHang, Start: at(0), End: at(1)}}, false, ""},
		{"claimed without an upstream fault", execs, map[string]string{"r1": "claimed"}, nil, false, ""},
		{"a fault after both executions", execs, map[string]string{"r1": "stored"}, []fault{{Kind: faultRedisLost, Start: at(9), End: at(9)}}, false, ""},
		// Strict (unknown_outcome: fail): only Redis losing data explains.
		{"strict: Redis lost its data", execs, map[string]string{"r1": "stored"}, []fault{{Kind: faultRedisRestart, Start: at(3), End: at(3)}}, true, "AOF everysec"},
		{"strict: store failed", execs, map[string]string{"r1": "store_error"}, nil, true, ""},
		{"strict: sidecar killed", execs, nil, []fault{{Kind: faultKillSidecar, Target: 2, Start: at(1), End: at(2)}}, true, ""},
		{"strict: upstream reset", reset, map[string]string{"r1": "claimed"}, nil, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := check(1, 0, history, tt.execs, tt.faults, tt.outcomes, 0, tt.strict, nil)
			if tt.cause == "" {
				if len(r.Unexplained) != 1 || !r.failed() {
					t.Fatalf("explained, want unexplained: %+v", r)
				}
				return
			}
			if len(r.Unexplained) != 0 || len(r.Explained) != 1 {
				t.Fatalf("report %+v", r)
			}
			for cause := range r.Explained {
				if !strings.Contains(cause, tt.cause) {
					t.Fatalf("explained as %q, want %q", cause, tt.cause)
				}
			}
		})
	}
}

// An operation answered 502 outcome-unknown for a key that never executed
// is a wrong answer: explained only when its claim's owner (the request id
// in the stored problem) was killed or paused while it held the claim.
func TestCheckerCountsNeverForwardedOutcomeUnknown(t *testing.T) {
	unknown := `{"type":"urn:idemproxy:problem:outcome-unknown","status":502,"request_id":"owner"}`
	owner := answer("alice", "g", "owner", 2, 0, false, "")
	owner.Op = 1
	retry := answer("alice", "g", "retry", 0, 502, true, unknown)
	retry.Op = 1
	history := []attempt{owner, retry}
	r := check(1, 0, history, nil, nil, nil, 0, true, nil)
	if r.NeverForwarded != 1 || len(r.NeverForwardedUnexplained) != 1 || !r.failed() {
		t.Fatalf("unexplained wrong outcome-unknown not reported: %+v", r)
	}
	paused := []fault{{Kind: faultSidecarPause, Target: 2, Start: at(0), End: at(4)}}
	r = check(1, 0, history, nil, paused, nil, 0, true, nil)
	if r.NeverForwarded != 1 || len(r.NeverForwardedUnexplained) != 0 || r.failed() {
		t.Fatalf("owner paused while holding the claim: %+v, want explained", r)
	}
	executed := []execution{exec1("alice", "g", "owner", 0, `{"principal":"alice","key":"g"}`)}
	if r = check(1, 0, history, executed, nil, nil, 0, true, nil); r.NeverForwarded != 0 {
		t.Fatalf("an outcome-unknown for a key that executed counted as wrong: %+v", r)
	}
}

// A never-forwarded outcome-unknown is explained by a cut link only when
// the owner's own link (or every link) was cut from its attempt until past
// the lease: a shorter cut, or another sidecar's link, explains nothing.
func TestCheckerExplainsCutLinks(t *testing.T) {
	unknown := `{"type":"urn:idemproxy:problem:outcome-unknown","status":502,"request_id":"owner"}`
	owner := answer("alice", "g", "owner", 2, 503, false, "store-unavailable")
	owner.Op = 1
	retry := answer("alice", "g", "retry", 0, 502, true, unknown)
	retry.Op = 1
	history := []attempt{owner, retry}
	for _, tc := range []struct {
		name      string
		f         fault
		explained bool
	}{
		{"owner's link, 3s", fault{Kind: faultLinkPartition, Target: 2, Start: at(0), End: at(3)}, true},
		{"every link, 3s", fault{Kind: faultRedisPartition, Target: -1, Start: at(0), End: at(3)}, true},
		{"owner's link, 1s", fault{Kind: faultLinkPartition, Target: 2, Start: at(0), End: at(1)}, false},
		{"another sidecar's link", fault{Kind: faultLinkPartition, Target: 1, Start: at(0), End: at(3)}, false},
	} {
		r := check(1, 0, history, nil, []fault{tc.f}, nil, 0, true, nil)
		if got := len(r.NeverForwardedUnexplained) == 0; got != tc.explained {
			t.Errorf("%s: explained %t, want %t (%+v)", tc.name, got, tc.explained, r.NeverForwardedCauses)
		}
	}
}

// A duplicate in a mixed run is explained by the previous release only
// when a sidecar running it freed the first execution's claim (its
// cleared_on_retry line names that request); one freed by this version is
// a bug.
func TestCheckerExplainsThePreviousRelease(t *testing.T) {
	execs := []execution{exec1("alice", "k", "r1", 0, alice1), exec1("alice", "k", "r2", 1, alice2)}
	first := answer("alice", "k", "r1", 1, 201, false, alice1)
	second := answer("alice", "k", "r2", 0, 201, false, alice2)
	for _, tc := range []struct {
		name      string
		version   string
		freed     map[string]string
		explained bool
	}{
		{"previous release freed it", "v0.4.0", map[string]string{"r2": "r1"}, true},
		{"this version freed it", "current", map[string]string{"r2": "r1"}, false},
		{"previous release, freed nothing", "v0.4.0", nil, false},
	} {
		s := second
		s.Version = tc.version
		r := check(1, 0, []attempt{first, s}, execs, nil, map[string]string{"r1": "stored", "r2": "stored"}, 0, true, tc.freed)
		if got := len(r.Unexplained) == 0; got != tc.explained || r.Duplicates != 1 {
			t.Errorf("%s: explained %t, want %t (%+v)", tc.name, got, tc.explained, r.Explained)
		}
	}
}

// A late call's request line says upstream_timeout (its client got 504);
// its late answer line says how it settled, which is what explains a
// duplicate (store_error, fence_lost): whichever line comes first.
func TestReadOutcomesOfLateCalls(t *testing.T) {
	for _, logs := range []string{
		`{"msg":"request","outcome":"upstream_timeout","request_id":"r1"}` + "\n" + `{"msg":"late answer","outcome":"store_error","request_id":"r1"}`,
		`{"msg":"late answer","outcome":"store_error","request_id":"r1"}` + "\n" + `{"msg":"request","outcome":"upstream_timeout","request_id":"r1"}`,
	} {
		got := map[string]string{}
		readOutcomes(strings.NewReader(logs), got, nil)
		if got["r1"] != "store_error" {
			t.Errorf("outcome of a late call: %q, want store_error\n%s", got["r1"], logs)
		}
	}
}

// A duplicate after Redis lost its data is explained only for a client
// that sent no first-sent time: one that did must have been refused 412
// record-lost (issue 33).
func TestCheckerRedisLossAndFirstSent(t *testing.T) {
	execs := []execution{exec1("alice", "k", "r1", 0, alice1), exec1("alice", "k", "r2", 5, alice2)}
	lost := []fault{{Kind: faultRedisLost, Start: at(3), End: at(3)}}
	for _, sent := range []bool{false, true} {
		first := answer("alice", "k", "r1", 0, 201, false, alice1)
		second := answer("alice", "k", "r2", 1, 201, false, alice2)
		first.FirstSent, second.FirstSent = sent, sent
		r := check(1, 0, []attempt{first, second}, execs, lost, map[string]string{"r1": "stored", "r2": "stored"}, 0, true, nil)
		if explained := len(r.Unexplained) == 0; explained == sent {
			t.Errorf("first-sent %t: explained %t, want %t (%v)", sent, explained, !sent, r.Explained)
		}
	}
}

// TestStreamsCutByAReader: a stream its upstream wrote whole that a
// client got broken off is a failure, unless a fault other than the
// upstream's came between its execution and that answer.
func TestStreamsCutByAReader(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	whole := execution{Principal: "p", Key: "k", RequestID: "r1", Status: 201, Response: `{"principal":"p","key":"k"}`, Start: at(0), Whole: true}
	broken := attempt{Op: 1, Principal: "p", Key: "k", Path: "/payments-stream", RequestID: "r1", Status: 201, Broken: true, Body: `{"principal"`, Reader: readerSlow, Start: at(0), End: at(1)}
	for _, tc := range []struct {
		name   string
		exec   execution
		faults []fault
		cut    bool
	}{
		{"whole, no fault", whole, nil, true},
		{"whole, the upstream slow", whole, []fault{{Kind: faultUpstreamSlow, Start: at(0), End: at(2)}}, true},
		{"whole, Redis stalled meanwhile", whole, []fault{{Kind: faultRedisLatency, Start: at(0.5), End: at(0.7)}}, false},
		{"whole, Redis stalled before", whole, []fault{{Kind: faultRedisLatency, Start: at(-2), End: at(-1)}}, true},
		{"broken by the upstream", execution{Principal: "p", Key: "k", RequestID: "r1", Status: 201, Response: whole.Response, Start: at(0)}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := check(1, 0, []attempt{broken}, []execution{tc.exec}, tc.faults, nil, 0, false, nil)
			if got := len(r.StreamsCut) > 0; got != tc.cut || got != r.failed() {
				t.Errorf("cut %v (failed %v), want %v: %v", got, r.failed(), tc.cut, r.StreamsCut)
			}
		})
	}
}

// TestNeverForwardedOnPostgresDown: an owner's claim whose reply was lost
// to PostgreSQL killed (or stopped) until past the lease is a documented
// wrong outcome-unknown, as a cut link is on Redis; one whose fault ended
// within the lease is not.
func TestNeverForwardedOnPostgresDown(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	owner := attempt{Op: 1, Principal: "p", Key: "k", RequestID: "r1", Start: at(0), End: at(0.5)}
	retry := attempt{Op: 1, Principal: "p", Key: "k", RequestID: "r2", Status: 502, Body: `{"type":"problem:outcome-unknown","request_id":"r1"}`, Start: at(5), End: at(5.1)}
	for _, tc := range []struct {
		name      string
		end       float64
		explained bool
	}{{"back after the lease", 3, true}, {"back within the lease", 1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := check(1, 0, []attempt{owner, retry}, nil, []fault{{Kind: faultPostgresKill, Start: at(0.2), End: at(tc.end)}}, nil, 0, true, nil)
			if got := len(r.NeverForwardedUnexplained) == 0 && r.NeverForwarded == 1; got != tc.explained {
				t.Errorf("explained %v, want %v: %v %v", got, tc.explained, r.NeverForwardedCauses, r.NeverForwardedUnexplained)
			}
		})
	}
}

// TestNeverForwardedOwnerKilledBeforeCleanup: a claim whose owner
// answered 503 (its reply late) and whose sidecar was killed within the
// lease, before its background cleanup deleted it, is a documented wrong
// outcome-unknown; a kill after the lease explains nothing.
func TestNeverForwardedOwnerKilledBeforeCleanup(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	owner := attempt{Op: 1, Sidecar: 1, Principal: "p", Key: "k", RequestID: "r1", Status: 503, Start: at(0), End: at(1.1)}
	retry := attempt{Op: 1, Sidecar: 0, Principal: "p", Key: "k", RequestID: "r2", Status: 502, Body: `{"type":"problem:outcome-unknown","request_id":"r1"}`, Start: at(6), End: at(6.1)}
	for _, tc := range []struct {
		name      string
		kill      float64
		explained bool
	}{{"killed within the lease", 1.8, true}, {"killed after the lease", 2.5, false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := check(1, 0, []attempt{owner, retry}, nil, []fault{{Kind: faultKillSidecar, Target: 1, Start: at(tc.kill), End: at(tc.kill + 1)}}, nil, 0, true, nil)
			if got := len(r.NeverForwardedUnexplained) == 0; got != tc.explained {
				t.Errorf("explained %v, want %v: %v %v", got, tc.explained, r.NeverForwardedCauses, r.NeverForwardedUnexplained)
			}
		})
	}
}
