// Package parallel sets how many of a test binary's parallel tests run at
// once, for packages whose tests mostly wait (on servers, leases and
// clocks) rather than compute.
package parallel

import (
	"flag"
	"runtime"
	"strconv"
)

// AtLeast raises go test's -parallel to n, from its default of GOMAXPROCS
// (two on a two-core machine), unless the command line set it: a package
// whose parallel tests each wait for seconds spent most of its run with
// both cores idle. Call it from TestMain, before m.Run.
func AtLeast(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < n {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
}
