package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// overload offers first attempts at several times what the upstream can
// take (a 50 ms upstream serving -limit at once) and watches what happens
// to them, to replays and to pass-through requests sent beside them, to
// idemproxy's memory against its GOMEMLIMIT, and to executions at the
// upstream; then the load drops and it measures how long service takes to
// recover. Three phases: before (light load), overload, after (light load
// again).
func overload(args []string) error {
	fs := flag.NewFlagSet("overload", flag.ContinueOnError)
	phase := fs.Duration("phase", 15*time.Second, "length of each phase")
	delay := fs.Duration("upstream-delay", 50*time.Millisecond, "the upstream's service time")
	limit := fs.Int("limit", 16, "requests the upstream serves at once (capacity = limit / delay)")
	factor := fs.Float64("factor", 3, "first attempts offered, as a multiple of the upstream's capacity")
	workers := fs.Int("c", 512, "concurrent connections of the overload")
	memLimit := fs.String("gomemlimit", "128MiB", "idemproxy's GOMEMLIMIT")
	route := fs.String("route", "", "extra settings for the route, YAML at the route's indentation")
	short := fs.Bool("short", false, "CI: 5 s phases; exit 1 on a duplicate execution or peak RSS over GOMEMLIMIT")
	out := fs.String("out", "", "also write the markdown report to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *short {
		*phase = 5 * time.Second
	}
	limitBytes, err := parseMiB(*memLimit)
	if err != nil {
		return fmt.Errorf("-gomemlimit: %w", err)
	}
	capacity := float64(*limit) / delay.Seconds()
	s, err := startStack([]string{"-delay", delay.String(), "-limit", strconv.Itoa(*limit)}, *route, []string{"GOMEMLIMIT=" + *memLimit})
	if err != nil {
		return err
	}
	defer s.stop()

	// Keys for the replays, stored before the run.
	probe := loadClient(8)
	replayKeys := make([]string, 100)
	for i := range replayKeys {
		replayKeys[i] = "replay-" + strconv.Itoa(i)
		if st := post(probe, s.base, "/payments", replayKeys[i]); st != 201 {
			return fmt.Errorf("storing the replays' keys: status %d", st)
		}
	}

	var all calls
	start := time.Now()
	var seq atomic.Int64
	firstAttempt := func(c *calls, class string) func(int64, time.Time) {
		client := loadClient(*workers)
		return func(_ int64, at time.Time) {
			st := post(client, s.base, "/payments", "load-"+strconv.FormatInt(seq.Add(1), 36))
			c.add(call{class: class, at: at.Sub(start), status: st, lat: time.Since(at)})
		}
	}
	// Probes run through all three phases: 20/s replays, 20/s
	// pass-through, and 20/s first attempts on their own connections.
	stopProbes := make(chan struct{})
	probesDone := make(chan struct{}, 3)
	go func() {
		c := loadClient(16)
		openLoop(20, 16, stopProbes, func(n int64, at time.Time) {
			st := post(c, s.base, "/payments", replayKeys[n%int64(len(replayKeys))])
			all.add(call{class: "replay", at: at.Sub(start), status: st, lat: time.Since(at)})
		})
		probesDone <- struct{}{}
	}()
	go func() {
		c := loadClient(16)
		openLoop(20, 16, stopProbes, func(_ int64, at time.Time) {
			st := post(c, s.base, "/other", "")
			all.add(call{class: "pass-through", at: at.Sub(start), status: st, lat: time.Since(at)})
		})
		probesDone <- struct{}{}
	}()
	go func() {
		openLoop(20, 64, stopProbes, firstAttempt(&all, "first attempt (probe)"))
		probesDone <- struct{}{}
	}()

	// Sample idemproxy's memory and goroutines every 250 ms.
	var peakGoroutines float64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(250 * time.Millisecond):
				peakGoroutines = max(peakGoroutines, s.gauge("go_goroutines"))
			}
		}
	}()

	time.Sleep(*phase)
	stopLoad := make(chan struct{})
	go func() { time.Sleep(*phase); close(stopLoad) }()
	openLoop(*factor*capacity, *workers, stopLoad, firstAttempt(&all, "first attempt (overload)"))
	overEnd := time.Since(start)
	time.Sleep(*phase)
	close(stopProbes)
	for range 3 {
		<-probesDone
	}
	close(stopSampling)
	<-sampled

	keys, dups, err := s.duplicates()
	if err != nil {
		return err
	}
	peak := s.idem.peakRSS()
	text := overloadReport(overloadRun{
		phase: *phase, delay: *delay, limit: *limit, capacity: capacity, factor: *factor, workers: *workers,
		memLimit: *memLimit, route: *route, overEnd: overEnd, calls: all.all,
		keys: keys, dups: dups, peakRSS: peak, peakGoroutines: peakGoroutines,
	})
	fmt.Print(text)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(text), 0o644); err != nil {
			return err
		}
	}
	var problems []string
	if dups > 0 {
		problems = append(problems, fmt.Sprintf("%d duplicate executions at the upstream", dups))
	}
	if peak >= limitBytes {
		problems = append(problems, fmt.Sprintf("idemproxy's peak RSS %.1f MiB reached its GOMEMLIMIT %s", float64(peak)/(1<<20), *memLimit))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

type overloadRun struct {
	phase, delay     time.Duration
	limit, workers   int
	capacity, factor float64
	memLimit, route  string
	overEnd          time.Duration
	calls            []call
	keys, dups       int
	peakRSS          int64
	peakGoroutines   float64
}

func overloadReport(r overloadRun) string {
	var b strings.Builder
	route := "defaults"
	if r.route != "" {
		route = strings.TrimSpace(r.route)
	}
	fmt.Fprintf(&b, "Overload: upstream %s per request, %d at once (capacity %.0f/s); first attempts offered at %.0f× that (%.0f/s) over %d connections for %s, between two %s phases of light load; probes all along at 20/s each: replays of stored keys, pass-through requests, first attempts on their own connections. idemproxy GOMEMLIMIT=%s, route settings: %s. %s.\n\n",
		r.delay, r.limit, r.capacity, r.factor, r.factor*r.capacity, r.workers, r.phase, r.phase, r.memLimit, route, machine())
	fmt.Fprintf(&b, "| phase | class | requests | answers | p50 | p99 |\n|---|---|---|---|---|---|\n")
	phaseOf := func(at time.Duration) string {
		switch {
		case at < r.phase:
			return "before"
		case at < r.overEnd:
			return "overload"
		}
		return "after"
	}
	type cell struct{ phase, class string }
	groups := map[cell][]call{}
	for _, c := range r.calls {
		k := cell{phaseOf(c.at), c.class}
		groups[k] = append(groups[k], c)
	}
	for _, ph := range []string{"before", "overload", "after"} {
		for _, class := range []string{"first attempt (overload)", "first attempt (probe)", "replay", "pass-through"} {
			g := groups[cell{ph, class}]
			if len(g) == 0 {
				continue
			}
			lat := make([]time.Duration, len(g))
			statuses := map[int]int{}
			for i, c := range g {
				lat[i] = c.lat
				statuses[c.status]++
			}
			slices.Sort(lat)
			codes := slices.Sorted(maps.Keys(statuses))
			var parts []string
			for _, code := range codes {
				name := strconv.Itoa(code)
				if code == 0 {
					name = "transport error"
				}
				parts = append(parts, fmt.Sprintf("%s: %d", name, statuses[code]))
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s |\n", ph, class, len(g), strings.Join(parts, ", "),
				lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)*99/100].Round(100*time.Microsecond))
		}
	}
	// Recovery: the last probe first attempt of the after phase that was
	// slower than twice the before phase's p99, or not answered 201.
	var before []time.Duration
	for _, c := range groups[cell{"before", "first attempt (probe)"}] {
		before = append(before, c.lat)
	}
	slices.Sort(before)
	recovered := time.Duration(0)
	if len(before) > 0 {
		bound := 2 * before[len(before)*99/100]
		for _, c := range groups[cell{"after", "first attempt (probe)"}] {
			if c.status != 201 || c.lat > bound {
				recovered = max(recovered, c.at-r.overEnd)
			}
		}
		fmt.Fprintf(&b, "\nRecovery: the last probe first attempt slower than 2× the before phase's p99 (%s), or not answered 201, was sent %s after the overload stopped.\n",
			bound.Round(100*time.Microsecond), recovered.Round(10*time.Millisecond))
	}
	fmt.Fprintf(&b, "idemproxy peak RSS %.1f MiB (GOMEMLIMIT %s), peak goroutines %.0f. Upstream: %d keys executed, %d duplicate executions.\n",
		float64(r.peakRSS)/(1<<20), r.memLimit, r.peakGoroutines, r.keys, r.dups)
	return b.String()
}

// parseMiB reads a GOMEMLIMIT written in MiB or GiB.
func parseMiB(s string) (int64, error) {
	for suffix, unit := range map[string]int64{"MiB": 1 << 20, "GiB": 1 << 30} {
		if v, ok := strings.CutSuffix(s, suffix); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return n * unit, err
		}
	}
	return 0, fmt.Errorf("%q: write it in MiB or GiB", s)
}
