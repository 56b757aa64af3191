package redisstore

import "time"

// SetClock makes s read now instead of time.Now, as a process whose
// replies come late, or whose clock is off, sees the time.
func SetClock(s *Store, now func() time.Time) { s.clockNow = now }
