package claim

// ForceScriptClaim makes s claim with the Lua script, as it does on Redis
// < 7.0, for tests of the external package on Redis 7.
func ForceScriptClaim(s *Store) { s.scriptClaim.Store(true) }
