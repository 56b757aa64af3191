// Command bench measures idemproxy side by side with a direct upstream, a
// plain httputil.ReverseProxy and (when installed) nginx, in one run, with
// one load generator at one concurrency.
//
//	go run ./bench                       # every target, 0 ms and 5 ms upstream
//	go run ./bench -duration 5s -c 64    # shorter, more concurrent
//	go run ./bench overload              # 3× the upstream's capacity of first attempts
//	go run ./bench soak -duration 30m    # resources over time at a steady rate
//	go run ./bench units                 # Redis cost per store operation, bytes per record
//	go run ./bench pgunits               # the PostgreSQL store's bytes per record on disk, WAL per operation
//
// Every server is its own process on 127.0.0.1, so CPU time and peak RSS
// are read per process from /proc. The load generator runs in this process.
// The run is bounded by -duration per target and stops by itself.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "upstream":
			exitOn(serveUpstream(os.Args[2:]))
			return
		case "reverseproxy":
			exitOn(serveReverseProxy(os.Args[2:]))
			return
		case "soak":
			exitOn(soak(os.Args[2:]))
			return
		case "units":
			exitOn(units(os.Args[2:]))
			return
		case "pgunits":
			exitOn(pgUnits(os.Args[2:]))
			return
		case "stream":
			exitOn(streamBench(os.Args[2:]))
			return
		case "overload":
			exitOn(overload(os.Args[2:]))
			return
		}
	}
	exitOn(run())
}

func exitOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	duration    time.Duration
	warmup      time.Duration
	concurrency int
	rounds      int
	rate        float64
	delays      []time.Duration
	only        string
	out         string
	plot        string
	previous    bool
}

func run() error {
	o, err := parseOptions()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return errors.New("redis-server not found: apt-get install -y redis-server")
	}
	dir, err := os.MkdirTemp("", "idemproxy-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bin, err := buildIdemproxy(dir)
	if err != nil {
		return err
	}
	// The in-app peer is its own module (bench/fiberpeer), so that the
	// sidecar does not depend on Fiber; without it its targets are skipped.
	fiberBin := filepath.Join(dir, "fiberpeer")
	build := exec.Command("go", "build", "-o", fiberBin, ".")
	build.Dir = filepath.Join("bench", "fiberpeer")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "Fiber peer not built (%v): run from the repository's root; its targets are skipped\n", err)
		fiberBin = ""
	}
	// The previous release (PREVIOUS_RELEASE), built from this clone's
	// history; without it (a shallow clone) its targets are skipped.
	prevBin, prevVersion := "", ""
	if o.previous {
		if r, err := binarytest.Previous(); err != nil {
			fmt.Fprintf(os.Stderr, "previous release not built (%v): its targets are skipped\n", err)
		} else if prevBin, err = r.Build(dir); err != nil {
			fmt.Fprintf(os.Stderr, "previous release %s not built (%v): its targets are skipped\n", r.Version, err)
			prevBin = ""
		} else {
			prevVersion = r.Version
		}
	}
	return bench(o, dir, self, bin, fiberBin, prevBin, prevVersion)
}

// parseOptions reads the flags of a plain run.
func parseOptions() (options, error) {
	var o options
	flag.DurationVar(&o.duration, "duration", 8*time.Second, "measured load per target")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load before each target")
	flag.IntVar(&o.concurrency, "c", 32, "concurrent connections (closed loop)")
	flag.IntVar(&o.rounds, "rounds", 1, "measure every target this many times, interleaved, and report the median")
	flag.Float64Var(&o.rate, "rate", 0, "fixed request rate per second instead of a closed loop (for latency)")
	delays := flag.String("upstream-delay", "0ms,5ms", "upstream service times, comma-separated")
	flag.StringVar(&o.only, "only", "", "run only these targets: exact names separated by \",\" (a comma followed by a space is part of a name)")
	flag.StringVar(&o.out, "out", "", "also write the markdown results to this file")
	flag.BoolVar(&o.previous, "previous", true, "also measure the previous release (PREVIOUS_RELEASE, built from this clone's history) beside this tree")
	flag.StringVar(&o.plot, "plot", "", "also draw the results to this SVG file: throughput against ReverseProxy and latency distributions")
	flag.Parse()
	if o.rounds < 1 {
		return o, errors.New("-rounds must be at least 1")
	}
	for d := range strings.SplitSeq(*delays, ",") {
		v, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil {
			return o, fmt.Errorf("-upstream-delay: %w", err)
		}
		o.delays = append(o.delays, v)
	}
	return o, nil
}

// buildIdemproxy builds the sidecar from this repository into dir.
func buildIdemproxy(dir string) (string, error) {
	bin := filepath.Join(dir, "idemproxy")
	return bin, binarytest.Build("", binarytest.Package, bin)
}
