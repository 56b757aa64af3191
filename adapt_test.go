package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/proxy"
)

// The adapter turns YAML strings into the proxy's typed settings; a route
// written "post /payments" must protect POST /payments.
func TestProxyRoutes(t *testing.T) {
	s := config.DefaultSettings()
	s.Scope, s.Concurrent, s.UnknownOutcome, s.StoreUnavailable = config.ScopePrincipal, config.ConcurrentWait, config.OutcomeKeep, config.FailOpen
	got := proxyRoutes([]config.Route{
		{Name: "a", Match: "post  /payments", Settings: s},
		{Name: "b", Match: "POST /refunds", Settings: config.DefaultSettings()},
	})
	a, b := got[0], got[1]
	if a.Pattern != "POST /payments" || !a.SharedScope || !a.Wait || a.Unknown != proxy.Keep || !a.FailOpen {
		t.Errorf("route a = %+v", a)
	}
	if b.Pattern != "POST /refunds" || b.SharedScope || b.Wait || b.Unknown != proxy.Fail || b.FailOpen || !b.RequireKey {
		t.Errorf("route b = %+v", b)
	}
	s.UnknownOutcome = config.OutcomeRelease
	if r := proxyRoutes([]config.Route{{Name: "c", Match: "POST /c", Settings: s}}); r[0].Unknown != proxy.Release {
		t.Errorf("release mapped to %v", r[0].Unknown)
	}
}

// TestEverySettingReachesTheProxy: each leaf field of config.Settings,
// changed alone, changes the proxy.Route it compiles to, so a key added to
// the config and forgotten in proxyRoutes fails here.
func TestEverySettingReachesTheProxy(t *testing.T) {
	base := config.Route{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}
	want := proxyRoutes([]config.Route{base})[0]
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f, sf := v.Field(i), v.Type().Field(i)
			p := path + sf.Name
			if f.Kind() == reflect.Struct && f.Type() != reflect.TypeFor[time.Duration]() {
				walk(f, p+".")
				continue
			}
			r := base
			r.Settings = config.DefaultSettings()
			wantHere := want
			switch p {
			case "ProblemContentType": // it goes with a problem_body
				r.Settings.ProblemBody = `{"error":{{json .Code}}}`
				wantHere = proxyRoutes([]config.Route{r})[0]
			case "MaxInFlightPrincipalShare": // a share of a max_in_flight
				r.Settings.MaxInFlight = 8
				wantHere = proxyRoutes([]config.Route{r})[0]
			}
			changeLeaf(t, reflect.ValueOf(&r.Settings).Elem().FieldByIndex(fieldIndex(v, path, sf)), p)
			if got := proxyRoutes([]config.Route{r})[0]; reflect.DeepEqual(got, wantHere) {
				t.Errorf("config.Settings.%s does not reach proxy.Route", p)
			}
		}
	}
	walk(reflect.ValueOf(config.DefaultSettings()), "")
}

// fieldIndex is the index path of sf, a field of v found at path (dotted
// names from Settings), within Settings.
func fieldIndex(v reflect.Value, path string, sf reflect.StructField) []int {
	var idx []int
	t := reflect.TypeFor[config.Settings]()
	for name := range strings.SplitSeq(strings.TrimSuffix(path, "."), ".") {
		if name == "" {
			continue
		}
		f, _ := t.FieldByName(name)
		idx = append(idx, f.Index...)
		t = f.Type
	}
	return append(idx, sf.Index...)
}

// changeLeaf sets f to a valid value other than its default.
func changeLeaf(t *testing.T, f reflect.Value, path string) {
	t.Helper()
	switch v := f.Addr().Interface().(type) {
	case *string:
		*v = map[string]string{
			"KeyHeader": "X-Other-Key", "Scope": config.ScopePrincipal, "Concurrent": config.ConcurrentWait,
			"UnknownOutcome": config.OutcomeRelease, "StoreUnavailable": config.FailOpen,
			"Replay.AuthorizeURL": "http://127.0.0.1:1/allow",
			"KeyJSONPointer":      "/request_id",
			"ProblemBody":         `{"error":{"code":{{json .Code}}}}`,
			"ProblemContentType":  "application/vnd.api+json",
		}[path]
		if *v == "" {
			t.Fatalf("changeLeaf: no value for string setting %s; add one", path)
		}
	case *bool:
		*v = !*v
	case *int:
		*v++
	case *int64:
		*v++
	case *float64:
		*v /= 2
	case *time.Duration:
		*v += time.Second
	case *[]int:
		*v = append(*v, 500)
	case *[]string:
		*v = append(*v, "/x")
	default:
		t.Fatalf("changeLeaf: no change for %s (%T); add one", path, v)
	}
}
