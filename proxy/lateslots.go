package proxy

import "sync"

// Reasons a late call was refused its slot, the values of the reason label
// of idemproxy_late_calls_refused_total.
const (
	lateRefusedProcess   = "process_cap"     // upstream.max_late_calls are all taken
	lateRefusedPrincipal = "principal_share" // this principal holds its whole share of them
)

// lateSlots are the slots of the calls running past upstream.timeout: at
// most max in the process, at most share for one principal, so that one
// principal parking slow calls cannot take every slot and turn another
// principal's slow call into a cancelled one (an unknown outcome that a
// retry may execute again).
type lateSlots struct {
	max, share int64
	// mu guards n and held.
	mu   sync.Mutex
	n    int64
	held map[string]int64
}

// take reserves a slot for principal; when none is left it says why.
func (l *lateSlots) take(principal string) (ok bool, refused string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.share > 0 && l.held[principal] >= l.share:
		return false, lateRefusedPrincipal
	case l.n >= l.max:
		return false, lateRefusedProcess
	}
	l.n++
	if l.held == nil {
		l.held = map[string]int64{}
	}
	l.held[principal]++
	return true, ""
}

// give returns principal's slot.
func (l *lateSlots) give(principal string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.held[principal]--; l.held[principal] <= 0 {
		delete(l.held, principal)
	}
}
