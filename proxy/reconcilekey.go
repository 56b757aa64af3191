package proxy

// The key API's reconcile-now (ReconcileKey): a lookup as a retry would
// make it, its answer rendered as the retry would get it.

import (
	"context"
	"fmt"
)

// ReconcileKey is the key API's reconcile-now: on route, it asks the
// upstream about principal's key as a retry would, when the key holds a
// vanished owner's claim or a stored outcome-unknown; nothing executes
// (an absent answer only frees the key, for the next retry to execute).
// It answers what it did (found, absent, too_early, unresolved; or
// not_reconcilable with the key's state) and the answer a retry would get
// now (status and body; none when the key was freed).
func (h *Handler) ReconcileKey(ctx context.Context, routeName, principal, key string) (result string, status int, body []byte, err error) {
	rt := h.routes.Load().byName[routeName]
	if rt == nil || rt.settings.Reconcile == nil {
		return "", 0, nil, fmt.Errorf("route %q does not reconcile", routeName)
	}
	a := h.p.newFront(ctx, rt, newRequestID(h.p.rand)).newAttempt(admittedAs{principal: principal, key: key})
	r := &reconciling{a: a}
	existing, ttl, err := h.p.store.Get(ctx, a.hashedKey)
	if err != nil {
		return "", 0, nil, err
	}
	if existing == nil {
		return "not_reconcilable: absent", 0, nil, nil
	}
	since, ok := r.reconcilable(existing, existing, ttl)
	if !ok {
		return "not_reconcilable: " + existing.State.String(), 0, nil, nil
	}
	if a.ownerAlive(existing, existing, ttl) != nil {
		return "not_reconcilable: in_progress, its owner not yet seen gone for a whole lease (ask again after one)", 0, nil, nil
	}
	rep, result := r.reconcileExisting(existing, existing, since)
	if rep == nil {
		if result == lookupAbsent {
			return lookupAbsent, 0, nil, nil // freed: the next retry executes
		}
		return "not_reconcilable: the key changed meanwhile", 0, nil, nil
	}
	status, body = r.render(rep)
	if result == "" {
		return "not_reconcilable: the store failed", status, body, nil
	}
	return result, status, body, nil
}

// render is the status and body rep answers with, as a retry would get
// them (a stored body inflated; a problem as the route's front frames it).
func (r *reconciling) render(rep *reply) (status int, body []byte) {
	a := r.a
	if rec := rep.record; rec != nil {
		if !rec.BodyCompressed {
			return rec.Status, rec.Body
		}
		n, err := rec.InflatedLen()
		if err == nil {
			buf := make([]byte, 0, n)
			if err = rec.Inflate(buf); err == nil {
				return rec.Status, rec.Body
			}
		}
		rep = a.storeFailed("get", err, nil)
	}
	f := a.rt.front.frame(rep.problem, a.requestID)
	return f.status, f.body
}
