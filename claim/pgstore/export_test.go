package pgstore

// SetNamed sends the store's calls named (on) or unnamed, as after a
// fallback (named.go). For benchmarks.
func (s *Store) SetNamed(on bool) { s.named.Store(on) }

// NoteMidLook has every look of s, between its read and its result,
// hear a claim's read of another epoch marker (noteEpochRead), as a
// claim whose transaction read the store after the look did.
func (s *Store) NoteMidLook() {
	s.lookRead = func() { s.noteEpochRead(epochRead{marker: "another"}) }
}

// NoMidLook undoes NoteMidLook.
func (s *Store) NoMidLook() { s.lookRead = nil }
