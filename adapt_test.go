package main

import (
	"testing"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/proxy"
)

// The adapter turns YAML strings into the proxy's typed settings; a route
// written "post /payments" must protect POST /payments.
func TestProxyRoutes(t *testing.T) {
	s := config.DefaultSettings()
	s.Scope, s.Concurrent, s.UnknownOutcome, s.StoreUnavailable = config.ScopePrincipal, config.ConcurrentWait, config.OutcomeFail, config.FailOpen
	got := proxyRoutes([]config.Route{
		{Name: "a", Match: "post  /payments", Settings: s},
		{Name: "b", Match: "POST /refunds", Settings: config.DefaultSettings()},
	})
	a, b := got[0], got[1]
	if a.Pattern != "POST /payments" || !a.SharedScope || !a.Wait || a.Unknown != proxy.Fail || !a.FailOpen {
		t.Errorf("route a = %+v", a)
	}
	if b.Pattern != "POST /refunds" || b.SharedScope || b.Wait || b.Unknown != proxy.Keep || b.FailOpen || !b.RequireKey {
		t.Errorf("route b = %+v", b)
	}
	s.UnknownOutcome = config.OutcomeRelease
	if r := proxyRoutes([]config.Route{{Name: "c", Match: "POST /c", Settings: s}}); r[0].Unknown != proxy.Release {
		t.Errorf("release mapped to %v", r[0].Unknown)
	}
}
