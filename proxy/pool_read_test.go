package proxy

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// A declared length is not trusted: a body is held as it arrives, and one
// of exactly its declared length stays in that length's size class.
func TestReadAllGrowsAsBytesArrive(t *testing.T) {
	var held, most int
	reserve := func(n int) error { held += n; most = max(most, held); return nil }
	release := func(n int) { held -= n }

	body := strings.Repeat("x", 1<<20)
	buf, err := readAll(strings.NewReader(body), 1<<20, reserve, release)
	if err != nil || string(buf) != body || cap(buf) != 1<<20 {
		t.Fatalf("1 MiB declared and sent: %v, %d bytes, cap %d; want cap 1 MiB, not the next class", err, len(buf), cap(buf))
	}
	putBody(buf)

	held, most = 0, 0
	trickle := io.MultiReader(strings.NewReader("0123456789"), errReader{errors.New("client stalled")})
	buf, err = readAll(trickle, 1<<20, reserve, release)
	if err == nil || len(buf) != 10 || most > firstChunk {
		t.Fatalf("1 MiB declared, 10 bytes sent: %v, held at most %d bytes; want at most %d", err, most, firstChunk)
	}
	putBody(buf)

	buf, err = readAll(strings.NewReader("abc"), 3, reserve, release)
	if err != nil || string(buf) != "abc" || cap(buf) != 1<<minBodyClass {
		t.Fatalf("a 3-byte body: %v %q cap %d", err, buf, cap(buf))
	}
	putBody(buf)

	refuse := func(n int) error { return errOverBudget }
	if _, err := readAll(strings.NewReader("abc"), 3, refuse, release); !errors.Is(err, errOverBudget) {
		t.Fatalf("over budget: %v, want errOverBudget", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
