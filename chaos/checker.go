package main

import (
	"bufio"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
)

func hashBody(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:8])
}

// fault is one injected fault and when it was in force.
type fault struct {
	Kind   string    `json:"kind"`
	Target int       `json:"target"` // the sidecar (or its link) hit; -1 for all
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
}

// Fault kinds. The first group can lose a settled outcome between the
// upstream's answer and the store: the dual-write window.
const (
	faultKillSidecar   = "kill-sidecar"
	faultRedisRestart  = "redis-restart-aof" // kill -9, restart from the AOF (everysec)
	faultRedisLost     = "redis-restart-lost"
	faultRedisPause    = "redis-client-pause"
	faultRedisLatency  = "redis-latency"
	faultUpstreamHang  = "upstream-hang"
	faultUpstreamReset = "upstream-reset"
	faultUpstream503   = "upstream-503"
	faultUpstreamSlow  = "upstream-slow"
	// faultSidecarPause SIGSTOPs a sidecar for 1.5-3 leases.
	faultSidecarPause = "sidecar-pause"
	// faultRedisStall SIGSTOPs Redis: claims are written, not answered.
	faultRedisStall = "redis-stall"
	// faultRedisPartition blackholes every sidecar's link to Redis.
	faultRedisPartition = "redis-partition"
	// faultStallUnderWindow and faultStallOverWindow SIGSTOP Redis for
	// just less and just more than the 1s confirm window.
	faultStallUnderWindow = "redis-stall-under-window"
	faultStallOverWindow  = "redis-stall-over-window"
	// faultLinkPartition blackholes one sidecar's link (Target).
	faultLinkPartition = "sidecar-link-partition"
	// faultReplyDelays makes single replies on one sidecar's link
	// (Target) late.
	faultReplyDelays = "sidecar-reply-delays"
	// faultRedisFlush runs FLUSHALL: the data is gone, the connections
	// stay up.
	faultRedisFlush = "redis-flushall"
	// faultRedisClockStep steps Redis' realtime clock (only Redis': a
	// clock shim in its process) by 0.5-3 s, forward or back.
	faultRedisClockStep = "redis-clock-step"
	// faultRedisClockLeap steps Redis' clock forward by more than
	// absent_after plus two leases (10-13 s), for 2-4 s, and back (-reconcile
	// runs): every claim looks orphaned on Redis' clock, and no live owner
	// may lose its claim to a retry for it.
	faultRedisClockLeap = "redis-clock-leap"
	// faultOwnerKilledLeap is the double fault of issue 63 (-reconcile
	// runs): while the upstream commits late (modeCommitLate), a sidecar
	// other than 0 is killed with requests in flight, then the clock
	// Redis and sidecar 0 share leaps forward as faultRedisClockLeap's:
	// both wall clocks agree that absent_after has passed while the
	// lookup truthfully says absent, and only sidecar 0's monotonic
	// clock holds the key until the late commit shows.
	faultOwnerKilledLeap = "owner-killed-shared-clock-leap"
	// The PostgreSQL store's (-store postgres): kill -9 of the
	// postmaster and a restart from the WAL, and the whole server stopped
	// (SIGSTOP) for 1.2-3 s. Neither loses what it acknowledged, so
	// neither explains a duplicate.
	faultPostgresKill = "postgres-kill-restart"
	faultPostgresStop = "postgres-stop"
)

// logLine is the part of a sidecar's per-request log line the checker
// reads.
type logLine struct {
	Msg       string `json:"msg"`
	Outcome   string `json:"outcome"`
	RequestID string `json:"request_id"`
	Route     string `json:"route"`
	Status    int    `json:"status"`
	// Result and OriginalRequestID are an "unconfirmed claim" line's: a
	// request (RequestID) that freed the claim of another as never
	// forwarded (cleared_on_retry).
	Result            string `json:"result"`
	OriginalRequestID string `json:"original_request_id"`
}

// readOutcomes maps request id to the sidecar's final outcome for it, and
// into freed each request that freed a claim as never forwarded to that
// claim's request.
func readOutcomes(r io.Reader, into, freed map[string]string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		if l.Msg == "unconfirmed claim" && l.Result == "cleared_on_retry" && freed != nil {
			freed[l.RequestID] = l.OriginalRequestID
		}
		// A late call's request line says upstream_timeout (its client got
		// 504); its "late answer" line, later, says how it settled.
		if l.Msg == "request" && (l.Outcome != "upstream_timeout" || into[l.RequestID] == "") || l.Msg == "late answer" {
			into[l.RequestID] = l.Outcome
		}
	}
}

// report is the checker's verdict over one run's history.
type report struct {
	Ops      int
	Attempts int
	// GRPCOps and GRPCAttempts count the -grpc operations (their first
	// attempts hedged) and all their attempts.
	GRPCOps, GRPCAttempts int
	GaveUp                int
	Executions            int
	KeysExecuted          int
	Duplicates            int
	Explained             map[string]int // duplicate executions by cause
	Unexplained           []string       // must be empty
	// StreamsCut are streams their upstream wrote whole that a client got
	// broken off with no fault but the upstream's on its way (a slow or
	// stalled reader must not cut a stream): must be empty. StreamReaders
	// counts the streamed attempts by reader, followers included.
	StreamsCut        []string
	StreamReaders     map[string]int
	CrossPrincipal    int // must be 0
	WrongBody         int // must be 0: a 2xx/500 body that no execution of that key produced
	ReplayMismatch    int // must be 0: a replay that differs from every stored original
	TransientReplayed int // must be 0
	Stuck             int // must be 0
	Orphans           int // unknown_outcome: fail claims whose owner vanished, settled by the next attempt
	// NeverForwarded counts operations answered 502 outcome-unknown for
	// a key the upstream never executed: a wrong answer. Its causes are
	// the documented ones; NeverForwardedUnexplained must be empty.
	NeverForwarded            int
	NeverForwardedCauses      map[string]int
	NeverForwardedUnexplained []string
	// ToleratedUnknown is how many unexplained wrong outcome-unknowns the
	// run accepts (-allow-unexplained-unknown, for -mixed only): zero
	// unless asked. Duplicates are never tolerated.
	ToleratedUnknown int
	Changed          int // retries sent with a changed body
	ChangedRejected  int // of those, answered 422
	Faults           map[string]int
	FinalStatus      map[string]int
	AttemptStatus    map[string]int
	Violations       []string
}

func (r *report) failed() bool {
	return len(r.Unexplained) > 0 || len(r.StreamsCut) > 0 || r.CrossPrincipal > 0 || r.WrongBody > 0 ||
		r.ReplayMismatch > 0 || r.TransientReplayed > 0 || r.Stuck > 0 || len(r.NeverForwardedUnexplained) > r.ToleratedUnknown
}

type opKey struct{ principal, key string }

// check judges a history. outcomes maps request ids to the sidecars'
// logged outcomes; stuck is the number of in-progress records left after
// the quiet period. strict is a run with unknown_outcome: fail, where only
// Redis losing acknowledged data may explain a duplicate.
//
// freed maps each request that freed a claim as never forwarded to that
// claim's request; attempts say which version their sidecar ran (-mixed).
func check(ops int, gaveUp int, history []attempt, execs []execution, faults []fault, outcomes map[string]string, stuck int, strict bool, freed map[string]string) *report {
	r := &report{
		Ops: ops, Attempts: len(history), GaveUp: gaveUp, Executions: len(execs), Stuck: stuck,
		Explained: map[string]int{}, Faults: map[string]int{}, FinalStatus: map[string]int{}, AttemptStatus: map[string]int{},
		NeverForwardedCauses: map[string]int{}, StreamReaders: map[string]int{},
	}
	grpcOps := map[int]bool{}
	for _, a := range history {
		if a.Path == grpcPath {
			r.GRPCAttempts++
			grpcOps[a.Op] = true
		}
	}
	r.GRPCOps = len(grpcOps)
	for _, f := range faults {
		r.Faults[f.Kind]++
	}
	byKey := map[opKey][]execution{}
	for _, e := range execs {
		k := opKey{e.Principal, e.Key}
		byKey[k] = append(byKey[k], e)
	}
	r.KeysExecuted = len(byKey)
	sidecarOf := map[string]int{}
	previous := map[string]string{} // request id → the previous release its sidecar ran
	for _, a := range history {
		sidecarOf[a.RequestID] = a.Sidecar
		if a.Version != "" && a.Version != "current" {
			previous[a.RequestID] = a.Version
		}
	}

	sentFirst := map[string]bool{}
	for _, a := range history {
		sentFirst[a.RequestID] = a.FirstSent
	}
	r.duplicates(byKey, faults, outcomes, sidecarOf, strict, func(prev, next execution) string {
		if v, ok := previous[next.RequestID]; ok && freed[next.RequestID] == prev.RequestID {
			return "the previous release (" + v + ") freed a forwarded claim as never forwarded: a late reply (fixed since: issue 30)"
		}
		return ""
	}, sentFirst)
	r.neverForwarded(history, byKey, faults)
	r.streams(history, byKey, faults)
	final := map[int]attempt{}
	for _, a := range history {
		r.AttemptStatus[statusLabel(a)]++
		if a.Changed {
			r.Changed++
			if a.Status == http.StatusUnprocessableEntity {
				r.ChangedRejected++
			}
		} else if prev, ok := final[a.Op]; !ok || better(a, prev) {
			final[a.Op] = a
		}
		if a.Status == http.StatusTooManyRequests || a.Status == http.StatusServiceUnavailable {
			if a.Replayed {
				r.TransientReplayed++
				r.Violations = append(r.Violations, "transient status replayed: "+a.RequestID)
			}
			continue
		}
		if a.Status != http.StatusCreated && a.Status != http.StatusInternalServerError {
			continue
		}
		r.answer(a, byKey[opKey{a.Principal, a.Key}])
	}
	for _, a := range final {
		r.FinalStatus[statusLabel(a)]++
	}
	return r
}

// streams counts the streamed attempts by reader, and lists each stream
// a client got broken off although its upstream wrote it whole, unless a
// fault other than the upstream's (a sidecar killed or paused, Redis
// stalled, lost or partitioned, late replies) came between the stream's
// execution and that answer: those cut a stream for every reader, by
// design. What remains is a stream a reader cut.
func (r *report) streams(history []attempt, byKey map[opKey][]execution, faults []fault) {
	upstreamFault := map[string]bool{faultUpstreamHang: true, faultUpstreamReset: true, faultUpstream503: true, faultUpstreamSlow: true}
	for _, a := range history {
		if a.Path != "/payments-stream" {
			continue
		}
		reader := cmp.Or(a.Reader, "at once")
		if a.Follower {
			reader += ", follower"
		}
		r.StreamReaders[reader]++
		if !a.Broken {
			continue
		}
		for _, e := range byKey[opKey{a.Principal, a.Key}] {
			if !e.Whole || !strings.HasPrefix(e.Response, a.Body) {
				continue
			}
			explained := false
			for _, f := range faults {
				if !upstreamFault[f.Kind] && !f.End.Before(e.Start) && !f.Start.After(a.End) {
					explained = true
					break
				}
			}
			if !explained {
				r.StreamsCut = append(r.StreamsCut, fmt.Sprintf("%s (%s): %s/%s streamed whole by the upstream, got broken off after %d bytes", a.RequestID, reader, a.Principal, a.Key, len(a.Body)))
			}
			break
		}
	}
}

// duplicates counts every execution of a key after its first, each with
// its cause or as unexplained.
func (r *report) duplicates(byKey map[opKey][]execution, faults []fault, outcomes map[string]string, sidecarOf map[string]int, strict bool, byPrevious func(prev, next execution) string, sentFirst map[string]bool) {
	for k, list := range byKey {
		sort.Slice(list, func(i, j int) bool { return list[i].Start.Before(list[j].Start) })
		for i := 1; i < len(list); i++ {
			r.Duplicates++
			cause := byPrevious(list[i-1], list[i])
			if cause == "" {
				cause = explain(list[i-1], list[i], faults, outcomes, sidecarOf, strict, sentFirst[list[i].RequestID])
			}
			if cause == "" {
				r.Unexplained = append(r.Unexplained, fmt.Sprintf("%s/%s: executions by %s then %s (first logged as %q)",
					k.principal, k.key, list[i-1].RequestID, list[i].RequestID, outcomes[list[i-1].RequestID]))
				continue
			}
			r.Explained[cause]++
		}
	}
}

// neverForwarded counts the operations answered 502 outcome-unknown for a
// key the upstream never executed, each once, with its cause: the claim's
// owner (the request id in the stored problem) was killed or paused after
// its claim was confirmed and before it forwarded, which the next attempt
// cannot tell from a death after forwarding (documented in docs/guarantee.md);
// anything else is unexplained.
func (r *report) neverForwarded(history []attempt, byKey map[opKey][]execution, faults []fault) {
	byID := map[string]attempt{}
	for _, a := range history {
		byID[a.RequestID] = a
	}
	seen := map[int]bool{}
	for _, a := range history {
		if !outcomeUnknown(a) || seen[a.Op] || len(byKey[opKey{a.Principal, a.Key}]) > 0 {
			continue
		}
		seen[a.Op] = true
		r.NeverForwarded++
		var p struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal([]byte(a.Body), &p)
		owner, ok := byID[p.RequestID]
		cause := ""
		if ok {
			for _, f := range faults {
				during := !f.End.Before(owner.Start) && !f.Start.After(owner.End)
				switch {
				case owner.Version != "" && owner.Version != "current":
					// -mixed: the previous release's cleanup of a claim
					// whose reply came late waits up to 5 s, and go-redis
					// may resend its SET (both fixed in v0.5.0).
					cause = "owner ran the previous release (" + owner.Version + "), whose unconfirmed-claim cleanup is slower (fixed since)"
				case (f.Kind == faultKillSidecar || f.Kind == faultSidecarPause) && f.Target == owner.Sidecar && during:
					cause = "owner " + f.Kind + " between its confirmed claim and forwarding (documented)"
				case (f.Kind == faultKillSidecar || f.Kind == faultSidecarPause) && f.Target == owner.Sidecar &&
					owner.Status != http.StatusCreated && !f.Start.Before(owner.End) && f.Start.Before(owner.Start.Add(leaseOf(owner))):
					// The claim's reply came too late (the owner answered
					// 503 and queued the claim for its background cleanup),
					// its write ran in time on the store's clock, and the
					// sidecar died within the lease, before the cleanup
					// deleted it: a claim no retry can tell from one
					// forwarded.
					cause = "owner " + f.Kind + " before its background cleanup deleted a claim it had not forwarded (documented)"
				case (f.Kind == faultRedisPartition || (f.Kind == faultLinkPartition && f.Target == owner.Sidecar)) && during &&
					owner.Status != http.StatusCreated && f.End.Sub(owner.Start) > leaseOf(owner):
					// The claim landed in time and its reply did not come
					// back; the owner knew it had not forwarded, and could
					// not free the claim before its lease ran out.
					cause = "owner's link to Redis cut from its claim's reply until past the lease (documented)"
				case (f.Kind == faultPostgresKill || f.Kind == faultPostgresStop) && during &&
					owner.Status != http.StatusCreated && f.End.Sub(owner.Start) > leaseOf(owner):
					// The same on PostgreSQL: the claim committed, and
					// the server was killed (its reply lost) or stopped
					// before answering; it was back only after the lease,
					// too late for the owner to free a claim it knew it
					// had not forwarded.
					cause = "owner's PostgreSQL down from its claim's reply until past the lease (documented)"
				}
			}
		}
		if cause == "" {
			r.NeverForwardedUnexplained = append(r.NeverForwardedUnexplained, fmt.Sprintf("%s/%s: op %d answered 502 outcome-unknown (claimed by %s), never executed", a.Principal, a.Key, a.Op, p.RequestID))
			continue
		}
		r.NeverForwardedCauses[cause]++
	}
}

// answer checks an upstream answer a client got (201, or the upstream's
// 500) against the key's executions: it is for the client's principal,
// and it is one of them byte for byte.
func (r *report) answer(a attempt, execs []execution) {
	if a.Broken {
		// A stream that ended abnormally: what came is a prefix of one
		// execution's answer (of this principal's key: execs are its).
		for _, e := range execs {
			if strings.HasPrefix(e.Response, a.Body) && e.Status == a.Status {
				return
			}
		}
		r.WrongBody++
		r.Violations = append(r.Violations, fmt.Sprintf("%s: broken stream %q is the prefix of no execution of %s/%s", a.RequestID, a.Body, a.Principal, a.Key))
		return
	}
	var got struct {
		Principal string `json:"principal"`
		Key       string `json:"key"`
	}
	if err := json.Unmarshal([]byte(a.Body), &got); err != nil || got.Principal != a.Principal {
		r.CrossPrincipal++
		r.Violations = append(r.Violations, fmt.Sprintf("%s: %s got a response for principal %q", a.RequestID, a.Principal, got.Principal))
		return
	}
	for _, e := range execs {
		if e.Response == a.Body && e.Status == a.Status {
			return
		}
	}
	if a.Replayed {
		r.ReplayMismatch++
		r.Violations = append(r.Violations, fmt.Sprintf("%s: replay %q matches no execution of %s/%s", a.RequestID, a.Body, a.Principal, a.Key))
		return
	}
	r.WrongBody++
	r.Violations = append(r.Violations, fmt.Sprintf("%s: answer %q matches no execution of %s/%s", a.RequestID, a.Body, a.Principal, a.Key))
}

// better reports whether a stands for its operation's outcome rather than
// prev: a settled answer over an unsettled one (a concurrent sibling may
// finish later with a 409), else the later one.
func better(a, prev attempt) bool {
	if settled(a) != settled(prev) {
		return settled(a)
	}
	return a.End.After(prev.End)
}

func statusLabel(a attempt) string {
	switch {
	case a.Status == 0:
		return "no answer (timeout, disconnect, reset)"
	case a.Broken && a.Replayed:
		return fmt.Sprintf("%d stream broken off, replayed", a.Status)
	case a.Broken:
		return fmt.Sprintf("%d stream broken off", a.Status)
	case outcomeUnknown(a) && a.Replayed:
		return "502 outcome-unknown replayed"
	case outcomeUnknown(a):
		return "502 outcome-unknown"
	case a.Reconciled && a.Replayed:
		return fmt.Sprintf("%d reconciled, replayed", a.Status)
	case a.Reconciled:
		return fmt.Sprintf("%d reconciled", a.Status)
	case a.Replayed:
		return fmt.Sprintf("%d replayed", a.Status)
	}
	return fmt.Sprint(a.Status)
}

// explain names the injected fault that let next execute after prev had
// already executed the same key, or "" when none did: a bug. In a strict
// run (unknown_outcome: fail) only Redis losing acknowledged data can: an
// owner that failed to store, lost its lease or was killed leaves a claim
// the next attempt settles as outcome-unknown, and an upstream that never
// answered gets a stored outcome-unknown.
//
// firstSent says the second execution's request said when its operation
// was first sent: then a Redis that lost its data explains nothing (the
// retry must have been refused 412 record-lost).
func explain(prev, next execution, faults []fault, outcomes map[string]string, sidecarOf map[string]int, strict, firstSent bool) string {
	overlaps := func(kinds ...string) bool {
		for _, f := range faults {
			for _, k := range kinds {
				if f.Kind == k && !f.End.Before(prev.Start) && !f.Start.After(next.Start) {
					if k == faultKillSidecar && f.Target != sidecarOf[prev.RequestID] {
						continue
					}
					return true
				}
			}
		}
		return false
	}
	outcome, logged := outcomes[prev.RequestID]
	switch {
	case overlaps(faultRedisLost, faultRedisFlush) && !firstSent:
		return "Redis lost acknowledged data: restart without persistence or FLUSHALL (the client sent no first-sent time)"
	case overlaps(faultRedisLost, faultRedisFlush) && lostSoonAfter(prev, faults):
		// A first-sent time (an HTTP date: whole seconds) within
		// first_sent_skew (2 s) of the loss still executes, by design.
		return "Redis lost acknowledged data within first_sent_skew of the request's first send (documented)"
	case overlaps(faultRedisRestart):
		return "Redis lost acknowledged data: killed, AOF everysec lost the last second"
	case strict:
		return ""
	case outcome == "store_error" || outcome == "fence_lost":
		// The sidecar could not store the answer (Redis unreachable, slow
		// or lost its lease): the dual-write window, counted by idemproxy.
		return "dual-write: store failed after the upstream acted (" + outcome + ")"
	case outcome == "claimed" && prev.Mode == modeNames[modeReset]:
		// The upstream acted and dropped the connection: no answer to
		// store. unknown_outcome: keep holds the claim one lease, then a
		// retry executes again. By design, and counted as "claimed".
		return "unknown outcome: upstream reset the connection after acting (keep: claim lapsed after its lease)"
	case !logged && overlaps(faultKillSidecar):
		return "dual-write: sidecar killed (kill -9) before storing"
	}
	return ""
}

// markdown renders the report.
func (r *report) markdown() string {
	var b strings.Builder
	mustZero := func(name string, v int) {
		mark := "ok"
		if v != 0 {
			mark = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %d | %s |\n", name, v, mark)
	}
	fmt.Fprintf(&b, "| figure | value | |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| logical operations | %d | |\n", r.Ops)
	fmt.Fprintf(&b, "| HTTP attempts | %d | |\n", r.Attempts)
	if r.GRPCOps > 0 {
		fmt.Fprintf(&b, "| of them gRPC calls (-grpc: first attempts hedged to 2-3 sidecars) | %d attempts, %d operations | |\n", r.GRPCAttempts, r.GRPCOps)
	}
	fmt.Fprintf(&b, "| operations that gave up (no settled answer in 14 attempts / 20 s) | %d | |\n", r.GaveUp)
	fmt.Fprintf(&b, "| upstream executions | %d | |\n", r.Executions)
	fmt.Fprintf(&b, "| keys executed at least once | %d | |\n", r.KeysExecuted)
	fmt.Fprintf(&b, "| duplicate executions | %d | |\n", r.Duplicates)
	for _, cause := range sortedKeys(r.Explained) {
		fmt.Fprintf(&b, "| &nbsp;&nbsp;explained: %s | %d | |\n", cause, r.Explained[cause])
	}
	mustZero("&nbsp;&nbsp;**unexplained duplicates**", len(r.Unexplained))
	mustZero("cross-principal answers", r.CrossPrincipal)
	mustZero("replays that differ from the original", r.ReplayMismatch)
	mustZero("answers matching no execution", r.WrongBody)
	mustZero("transient responses (429/503) replayed", r.TransientReplayed)
	mustZero("keys stuck in progress after lease + upstream timeout", r.Stuck)
	fmt.Fprintf(&b, "| orphaned claims left (fail mode: the next attempt settles them as outcome-unknown) | %d | |\n", r.Orphans)
	fmt.Fprintf(&b, "| operations answered 502 outcome-unknown although the upstream never executed (wrong answers) | %d | |\n", r.NeverForwarded)
	for _, cause := range sortedKeys(r.NeverForwardedCauses) {
		fmt.Fprintf(&b, "| &nbsp;&nbsp;explained: %s | %d | |\n", cause, r.NeverForwardedCauses[cause])
	}
	mustZero("&nbsp;&nbsp;**unexplained wrong outcome-unknown answers**", len(r.NeverForwardedUnexplained))
	fmt.Fprintf(&b, "| retries with a changed body, answered 422 | %d of %d | |\n", r.ChangedRejected, r.Changed)
	if len(r.StreamReaders) > 0 {
		for _, k := range sortedKeys(r.StreamReaders) {
			fmt.Fprintf(&b, "| streamed attempts read %s | %d | |\n", k, r.StreamReaders[k])
		}
		mustZero("**streams their upstream wrote whole, broken off for a client by no fault but a reader's**", len(r.StreamsCut))
	}
	fmt.Fprintf(&b, "\nFaults injected:\n\n| fault | count |\n|---|---|\n")
	for _, k := range sortedKeys(r.Faults) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.Faults[k])
	}
	fmt.Fprintf(&b, "\nClient-visible outcome of each operation (its settled answer, else its last attempt):\n\n| answer | operations |\n|---|---|\n")
	for _, k := range sortedKeys(r.FinalStatus) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.FinalStatus[k])
	}
	fmt.Fprintf(&b, "\nEvery attempt:\n\n| answer | attempts |\n|---|---|\n")
	for _, k := range sortedKeys(r.AttemptStatus) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.AttemptStatus[k])
	}
	for _, u := range r.Unexplained {
		fmt.Fprintf(&b, "\nUNEXPLAINED: %s", u)
	}
	for _, u := range r.NeverForwardedUnexplained {
		fmt.Fprintf(&b, "\nUNEXPLAINED OUTCOME-UNKNOWN: %s", u)
	}
	for _, u := range r.StreamsCut {
		fmt.Fprintf(&b, "\nSTREAM CUT: %s", u)
	}
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(&b, "\n... %d more violations", len(r.Violations)-20)
			break
		}
		fmt.Fprintf(&b, "\nVIOLATION: %s", v)
	}
	return b.String()
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// leaseOf is the lease of the route a attempted (chaos runs every route
// with lease: 2s).
func leaseOf(attempt) time.Duration { return 2 * time.Second }

// lostSoonAfter reports whether Redis lost its data less than 3 s (the
// 2 s first_sent_skew, plus the second an HTTP date truncates) after
// prev's execution began, its request's first-sent time at the latest.
func lostSoonAfter(prev execution, faults []fault) bool {
	for _, f := range faults {
		if (f.Kind == faultRedisLost || f.Kind == faultRedisFlush) && !f.Start.Before(prev.Start) && f.Start.Sub(prev.Start) < 3*time.Second {
			return true
		}
	}
	return false
}
