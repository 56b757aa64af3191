package pgstore

// SetNamed sends the store's calls named (on) or unnamed, as after a
// fallback (named.go). For benchmarks.
func (s *Store) SetNamed(on bool) { s.named.Store(on) }
