package claim

import (
	"strings"
	"testing"
)

// Redis keys are derived alike by every release: these were derived by
// v0.5.0's code (each part framed into the hash on its own), and a change
// to how derive frames or hashes must keep every one, or retries stop
// finding the records their first attempts stored.
func TestKeyDerivationGolden(t *testing.T) {
	plain := &Codec{prefix: "idem:"}
	keyed := &Codec{prefix: "idem:", keyMAC: []byte("0123456789abcdef0123456789abcdef")}
	long := "sha256:" + strings.Repeat("\x00", 300)
	want := []string{
		"idem:d4d907c3891d8b3dd1da15c4d670e87a0740045e5327f8c3e3d20e5bb7b7e6da",
		"idem:709e80c88487a2411e1ee4dfb9f22a861492d20c4765150c0c794abd70f8147c",
		"idem:q:1000a79d1feaf81367dc83d3d8295e1f7ee32f3b93df5bdc127ec3206ea64d72",
		"idem:01dce1ab6dc1131f44aef8c67e0794569bade3b7e78620c91ef6c1c14c0036d1",
		"idem:1d4f3d83e77226bc67229c3abd85d8e9667eaaa4118635ef281603262f04b9cf",
		"idem:aa1203a692eb07dde8f16daa3c4385da7598af083f4205357240f98413b85d2e",
		"idem:q:a90ca89b6f848a1875bcecac1ad7fd411ed4ee879ee3de24e9d4ab1ebf0aee40",
		"idem:b0a1c5cc4400f974610a24724de7a0e01cb4a4b26656b1d8a895227b1271566f",
	}
	for round := range 2 { // the second round from the pooled buffers and HMAC
		var got []string
		for _, s := range []*Codec{plain, keyed} {
			got = append(got, s.Key("alice", "pay", "k-1"), s.Key("", "", ""), s.QuotaKey("bob", "route:x"), s.Key("webhook:stripe", "hook", long))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("round %d, key %d = %s, want %s (v0.5.0's)", round, i, got[i], want[i])
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { keyed.Key("alice", "pay", "k-1") }); n > 1 && !raceEnabled {
		t.Errorf("a keyed derivation allocates %v times, want 1 (the key itself)", n)
	}
}
