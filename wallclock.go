package main

import "time"

// wallClock, when set, stands in for time.Now as this process' wall
// clock (proxy.Options.Clock, claim.WithClock): only the chaos harness's
// build sets it (chaosclock.go), to step it with the store's. Nil in
// every release build.
var wallClock func() time.Time
