package proxy

import (
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
)

type fingerprintCase struct {
	name                string
	f                   *fingerprinter
	method, path, query string
	h                   http.Header
	body                string
}

func fingerprintGoldenCases() []fingerprintCase {
	plain, _ := newFingerprinter([]string{"Content-Type"}, nil)
	json, _ := newFingerprinter([]string{"content-type", "X-Tenant"}, []string{"/nonce"})
	none, _ := newFingerprinter(nil, nil)
	return []fingerprintCase{
		{"plain json", plain, "POST", "/payments", "", http.Header{"Content-Type": {"application/json"}}, `{"amount":1}`},
		{"params and capitals", plain, "POST", "/payments", "a=1&b=2", http.Header{"Content-Type": {"Application/JSON; Charset=UTF-8"}}, `{"amount":1}`},
		{"two values", plain, "PUT", "/orders/7", "", http.Header{"Content-Type": {"text/plain", "text/html"}}, "hello"},
		{"no header", plain, "POST", "/payments", "", http.Header{}, ""},
		{"canonical json", json, "POST", "/p", "", http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"t1"}}, `{"b":2,"nonce":"x","a":1}`},
		{"not json", json, "POST", "/p", "", http.Header{"Content-Type": {"application/json"}}, `{"b":`},
		{"no headers configured", none, "DELETE", "/x", "q", nil, strings.Repeat("y", 5000)},
	}
}

// The fingerprints stored in Redis compare equal across releases: these
// were computed by v0.5.0's sum (each part framed into the hash on its
// own); a change to how parts are framed or hashed must keep every one.
func TestFingerprintGolden(t *testing.T) {
	want := map[string]string{
		"plain json":            "6eb4f185cf09e36ca96b4a7023348c09bdf03f2c769a1330bb1b777c9b477e29",
		"params and capitals":   "ed3a9ace679c20a71bc22afef5508ac56f4eea95e0893015c8f784c404636978",
		"two values":            "d65283f3a0b96019989bbd0476258526a97f5f6da666adb2e45264071cb95219",
		"no header":             "dc3b466be5d9a5ee3ce584ebff2be89d400574ce62584b13886ef5f502165272",
		"canonical json":        "3a8ece56fdd5bdfc388a02de9df43b58dccb4b126c07193d5787ee962a4147e9",
		"not json":              "01533b52ea7801658340ce36efba91661e38c8d94c3defb2e20adad2cf63672c",
		"no headers configured": "fa7d31db3cb1c48720002185dd357435c3596f20ad94633c7f03df0be03ac383",
	}
	for _, c := range fingerprintGoldenCases() {
		fp := c.f.sum(c.method, c.path, c.query, c.h, []byte(c.body))
		if got := hex.EncodeToString(fp[:]); got != want[c.name] {
			t.Errorf("%s: fingerprint %s, want %s (v0.5.0's)", c.name, got, want[c.name])
		}
	}
}
