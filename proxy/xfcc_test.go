package proxy

import "testing"

func TestXFCCPrincipal(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{`By=spiffe://cluster.local/ns/payments/sa/payments;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=spiffe://cluster.local/ns/shop/sa/checkout`, "spiffe://cluster.local/ns/shop/sa/checkout", false},
		// Two hops: the last element is the peer of this pod's proxy.
		{`By=spiffe://a;URI=spiffe://cluster.local/ns/edge/sa/gateway,By=spiffe://b;Hash=abc;URI=spiffe://cluster.local/ns/shop/sa/checkout`, "spiffe://cluster.local/ns/shop/sa/checkout", false},
		// Quoted fields with the separators inside them.
		{`Hash=x;Subject="CN=a, O=b; c";URI="spiffe://cluster.local/ns/shop/sa/check\"out"`, `spiffe://cluster.local/ns/shop/sa/check"out`, false},
		{`By=spiffe://a;Subject="CN=a,b",Hash=h;URI=spiffe://x/y`, "spiffe://x/y", false},
		// The Hash changes with every rotation; the URI does not.
		{`Hash=1111;URI=spiffe://x/y`, "spiffe://x/y", false},
		{`Hash=2222;URI=spiffe://x/y`, "spiffe://x/y", false},
		{`Hash=only;Subject="CN=x"`, "", false},
		{`URI="spiffe://unterminated`, "", true},
		{`Hash`, "", true},
	} {
		got, err := xfccPrincipal(tc.in)
		if got != tc.want || (err != nil) != tc.bad {
			t.Errorf("xfccPrincipal(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}
