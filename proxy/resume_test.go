package proxy

import "testing"

// TestAfterEvent: the end of the event an id names, under every line
// ending the standard allows, with or without the space after the colon;
// an id that is only a data value, or whose event has not ended, is not
// found.
func TestAfterEvent(t *testing.T) {
	for _, tc := range []struct {
		stream, id string
		want       int
		ok         bool
	}{
		{"id: 1\ndata: a\n\nid: 2\ndata: b\n\n", "1", len("id: 1\ndata: a\n\n"), true},
		{"id: 1\ndata: a\n\nid: 2\ndata: b\n\n", "2", len("id: 1\ndata: a\n\nid: 2\ndata: b\n\n"), true},
		{"id:1\r\ndata: a\r\n\r\nid:2\r\n\r\n", "1", len("id:1\r\ndata: a\r\n\r\n"), true},
		{"data: a\rid: x\r\rdata: b\r\r", "x", len("data: a\rid: x\r\r"), true},
		{"data: id: 1\n\n", "1", 0, false},
		{"id: 1\ndata: a\n", "1", 0, false},
		{"id: 1\ndata: a\n\n", "9", 0, false},
		{": comment\nid: 7\n\n", "7", len(": comment\nid: 7\n\n"), true},
		// A repeated id (issue 63): after its first occurrence, so that the
		// client gets the events between again: at least once, never a skip.
		{"id: 1\ndata: a\n\nid: 2\ndata: b\n\nid: 1\ndata: c\n\n", "1", len("id: 1\ndata: a\n\n"), true},
	} {
		got, ok := afterEvent([]byte(tc.stream), tc.id)
		if got != tc.want || ok != tc.ok {
			t.Errorf("afterEvent(%q, %q) = %d, %v; want %d, %v", tc.stream, tc.id, got, ok, tc.want, tc.ok)
		}
	}
}

// TestFollowersBoundedPerPrincipal (issue 55): one principal has at most
// maxAttached retries following streams on a sidecar, across its
// streams, as one stream has; giving one back makes room.
func TestFollowersBoundedPerPrincipal(t *testing.T) {
	var a attached
	for i := range maxAttached {
		if !a.take("stream-"+string(rune('a'+i%26))+string(rune('a'+i/26)), "alice") {
			t.Fatalf("follower %d of alice refused", i+1)
		}
	}
	if a.take("another-stream", "alice") {
		t.Error("alice's follower past maxAttached, on a stream of its own, was taken")
	}
	if !a.take("another-stream", "bob") {
		t.Error("bob's first follower was refused")
	}
	a.give("stream-aa", "alice")
	if !a.take("another-stream", "alice") {
		t.Error("alice's follower after one left was refused")
	}
}
