package claim

import "time"

// ForceScriptClaim makes s claim with the Lua script, as it does on Redis
// < 7.0, for tests of the external package on Redis 7.
func ForceScriptClaim(s *Store) { s.scriptClaim.Store(true) }

// SetClock makes s read now instead of time.Now, as a process whose
// replies come late, or whose clock is off, sees the time.
func SetClock(s *Store, now func() time.Time) { s.clockNow = now }
