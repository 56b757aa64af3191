package proxy

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// First-sent times. Every idempotency system executes a retry again once
// its record is gone: the retention ran out, or the store lost its data.
// A client that says when it first sent a request lets the proxy tell: a
// new claim (no record) for a request first sent longer ago than the
// route's retention, or before the store's current epoch began (it lost
// its data then: claim/redisstore/epoch.go), cannot be told from one whose record is
// gone, so it is refused 412 and nothing is forwarded. The client then
// reconciles (looks the resource up) instead of paying twice.
//
// Sources: the OASIS Repeatable Requests header Repeatability-First-Sent
// (an HTTP date), and a UUIDv7 key's own timestamp (RFC 9562).

// firstSentHeaderName is the OASIS Repeatable Requests header.
const firstSentHeaderName = "Repeatability-First-Sent"

var errFirstSentTwice = errors.New(firstSentHeaderName + " appears more than once")

// firstSent is when the request was first sent, from the route's sources
// in order: ok is false when none says; an error is a malformed value.
func firstSent(sources []FirstSentSource, h http.Header, key string) (t time.Time, ok bool, err error) {
	for _, src := range sources {
		switch src {
		case FirstSentHeader:
			vs := h.Values(firstSentHeaderName)
			if len(vs) == 0 {
				continue
			}
			if len(vs) > 1 {
				return time.Time{}, false, errFirstSentTwice
			}
			t, err := http.ParseTime(strings.TrimSpace(vs[0]))
			if err != nil {
				return time.Time{}, false, errors.New(firstSentHeaderName + " must be an HTTP date, like Tue, 01 Dec 2026 15:04:05 GMT")
			}
			return t, true, nil
		case FirstSentUUIDv7:
			if t, ok := uuidv7Time(key); ok {
				return t, true, nil
			}
		}
	}
	return time.Time{}, false, nil
}

// uuidv7Time is a UUIDv7's timestamp: its first 48 bits, milliseconds
// since the Unix epoch. ok is false for anything else.
func uuidv7Time(s string) (time.Time, bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return time.Time{}, false
	}
	b, err := hex.DecodeString(s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36])
	if err != nil || b[6]>>4 != 7 || b[8]>>6 != 2 { // version 7, RFC 9562 variant
		return time.Time{}, false
	}
	var ms int64
	for _, c := range b[:6] {
		ms = ms<<8 | int64(c)
	}
	return time.UnixMilli(ms), true
}

// refuseUnrecorded decides, for a request that just claimed its key (no
// record was there), whether its first-sent time says a record should
// have been: first sent longer ago than the retention (key-expired), or
// before the store's epoch began (record-lost). Then the claim is
// released, the request answered 412 and nothing forwarded: it returns
// that reply, nil when the request goes on.
func (a *attempt) refuseUnrecorded(rec *claim.Record) *reply {
	if !a.hasFirstSent {
		return nil
	}
	s := &a.rt.settings
	reason := ""
	switch {
	case a.p.now().Sub(a.firstSent) > s.Retention+s.FirstSentSkew:
		reason = refusedKeyExpired
	default:
		ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), time.Second)
		var epoch time.Time
		err := a.storeOp(ctx, "epoch", func(ctx context.Context) (err error) {
			epoch, err = a.p.store.EpochStart(ctx, a.hashedKey)
			return err
		})
		cancel()
		if err != nil {
			// Whether the store lost this key's record cannot be told:
			// nothing is forwarded, the claim is released.
			a.releaseClaim(rec)
			return a.storeFailed("epoch", err, nil)
		}
		if !epoch.IsZero() && a.firstSent.Before(epoch.Add(-s.FirstSentSkew)) {
			reason = refusedRecordLost
		}
	}
	if reason == "" {
		return nil
	}
	a.releaseClaim(rec)
	a.p.metrics.firstSentRefused.WithLabelValues(a.rt.name, reason).Inc()
	if reason == refusedKeyExpired {
		return refuse(outcomeRejected, probKeyExpired.with("the request was first sent at "+a.firstSent.UTC().Format(time.RFC3339)+", longer ago than this route keeps records ("+s.Retention.String()+"): it may have executed and its record expired; nothing was forwarded. Look the resource up; send a new request with a new key"))
	}
	return refuse(outcomeRejected, probRecordLost.with("the request was first sent at "+a.firstSent.UTC().Format(time.RFC3339)+", before the idempotency store lost its records: it may have executed; nothing was forwarded. Look the resource up; send a new request with a new key"))
}

// releaseClaim frees rec's claim (fenced): nothing was forwarded. When
// the store does not answer, the cleanup deletes it once it does.
func (a *attempt) releaseClaim(rec *claim.Record) {
	err := a.detached("release", func(ctx context.Context) error { return a.p.store.Release(ctx, a.hashedKey, rec.Token) })
	a.p.unconfirmed.releaseFailed(a.rt.name, a.hashedKey, rec, a.claimedAt, a.rt.settings.Lease, err)
}

// readFirstSent reads when the request was first sent, from the route's
// first_sent sources into in. A malformed time, or one further ahead than
// first_sent_skew, is refused: the reply, nil when it was read.
func (x *exchange) readFirstSent(in *admittedAs) *reply {
	s := x.rt.settings.FirstSent
	if len(s) == 0 {
		return nil
	}
	t, ok, err := firstSent(s, x.r.Header, in.key)
	if err == nil && ok && t.After(x.p.now().Add(x.rt.settings.FirstSentSkew)) {
		// A date in the future (year 9999) would switch the check off for
		// this request: refused, like a malformed one.
		err = errors.New("the first-sent time " + t.UTC().Format(time.RFC3339) + " is in the future (more than first_sent_skew ahead of this sidecar's clock)")
	}
	if err != nil {
		return refuse(outcomeRejected, probFirstSentInvalid.with(err.Error()))
	}
	in.firstSent, in.hasFirstSent = t, ok
	return nil
}
