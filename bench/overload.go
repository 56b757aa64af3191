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
	f, err := parseOverload(args)
	if err != nil {
		return err
	}
	limitBytes, err := parseMiB(f.memLimit)
	if err != nil {
		return fmt.Errorf("-gomemlimit: %w", err)
	}
	s, err := startStack([]string{"-delay", f.delay.String(), "-limit", strconv.Itoa(f.limit)}, f.route, []string{"GOMEMLIMIT=" + f.memLimit})
	if err != nil {
		return err
	}
	defer s.stop()
	o := &overloadRig{f: f, s: s, start: time.Now()}
	if err := o.seedReplays(); err != nil {
		return err
	}
	stopProbes, probesDone := o.probes()
	stopSampling, sampled := o.sample()
	time.Sleep(f.phase)
	stopLoad := make(chan struct{})
	go func() { time.Sleep(f.phase); close(stopLoad) }()
	openLoop(f.factor*f.capacity(), f.workers, stopLoad, o.firstAttempt("first attempt (overload)"))
	overEnd := time.Since(o.start)
	time.Sleep(f.phase)
	close(stopProbes)
	for range 3 {
		<-probesDone
	}
	close(stopSampling)
	<-sampled
	return o.verdict(overEnd, limitBytes)
}

// overloadFlags are overload's settings.
type overloadFlags struct {
	phase, delay    time.Duration
	limit, workers  int
	factor          float64
	memLimit, route string
	short           bool
	out             string
}

// capacity is the upstream's: requests per second.
func (f overloadFlags) capacity() float64 { return float64(f.limit) / f.delay.Seconds() }

// parseOverload reads overload's flags.
func parseOverload(args []string) (overloadFlags, error) {
	var f overloadFlags
	fs := flag.NewFlagSet("overload", flag.ContinueOnError)
	fs.DurationVar(&f.phase, "phase", 15*time.Second, "length of each phase")
	fs.DurationVar(&f.delay, "upstream-delay", 50*time.Millisecond, "the upstream's service time")
	fs.IntVar(&f.limit, "limit", 16, "requests the upstream serves at once (capacity = limit / delay)")
	fs.Float64Var(&f.factor, "factor", 3, "first attempts offered, as a multiple of the upstream's capacity")
	fs.IntVar(&f.workers, "c", 512, "concurrent connections of the overload")
	fs.StringVar(&f.memLimit, "gomemlimit", "128MiB", "idemproxy's GOMEMLIMIT")
	fs.StringVar(&f.route, "route", "", "extra settings for the route, YAML at the route's indentation")
	fs.BoolVar(&f.short, "short", false, "CI: 5 s phases; exit 1 on a duplicate execution or peak RSS over GOMEMLIMIT")
	fs.StringVar(&f.out, "out", "", "also write the markdown report to this file")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.short {
		f.phase = 5 * time.Second
	}
	return f, nil
}

// overloadRig is one overload run: its stack and what it saw.
type overloadRig struct {
	f     overloadFlags
	s     *stack
	start time.Time
	// replayKeys are stored before the run, for the replay probes.
	replayKeys []string
	all        calls
	seq        atomic.Int64
	// peakGoroutines is idemproxy's, sampled every 250 ms.
	peakGoroutines float64
}

// seedReplays stores the keys the replay probes replay.
func (o *overloadRig) seedReplays() error {
	probe := loadClient(8)
	o.replayKeys = make([]string, 100)
	for i := range o.replayKeys {
		o.replayKeys[i] = "replay-" + strconv.Itoa(i)
		if st := post(probe, o.s.base, "/payments", o.replayKeys[i]); st != 201 {
			return fmt.Errorf("storing the replays' keys: status %d", st)
		}
	}
	return nil
}

// firstAttempt is a load function that sends first attempts, each of a new
// key, counted as class.
func (o *overloadRig) firstAttempt(class string) func(int64, time.Time) {
	client := loadClient(o.f.workers)
	return func(_ int64, at time.Time) {
		st := post(client, o.s.base, "/payments", "load-"+strconv.FormatInt(o.seq.Add(1), 36))
		o.all.add(call{class: class, at: at.Sub(o.start), status: st, lat: time.Since(at)})
	}
}

// probes run through all three phases until stop closes: 20/s replays,
// 20/s pass-through, and 20/s first attempts on their own connections;
// done receives once per probe when it stopped.
func (o *overloadRig) probes() (stop chan struct{}, done chan struct{}) {
	stop, done = make(chan struct{}), make(chan struct{}, 3)
	go func() {
		c := loadClient(16)
		openLoop(20, 16, stop, func(n int64, at time.Time) {
			st := post(c, o.s.base, "/payments", o.replayKeys[n%int64(len(o.replayKeys))])
			o.all.add(call{class: "replay", at: at.Sub(o.start), status: st, lat: time.Since(at)})
		})
		done <- struct{}{}
	}()
	go func() {
		c := loadClient(16)
		openLoop(20, 16, stop, func(_ int64, at time.Time) {
			st := post(c, o.s.base, "/other", "")
			o.all.add(call{class: "pass-through", at: at.Sub(o.start), status: st, lat: time.Since(at)})
		})
		done <- struct{}{}
	}()
	go func() {
		openLoop(20, 64, stop, o.firstAttempt("first attempt (probe)"))
		done <- struct{}{}
	}()
	return stop, done
}

// sample reads idemproxy's goroutines every 250 ms until stop closes;
// done closes when it stopped.
func (o *overloadRig) sample() (stop chan struct{}, done chan struct{}) {
	stop, done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
				o.peakGoroutines = max(o.peakGoroutines, o.s.gauge("go_goroutines"))
			}
		}
	}()
	return stop, done
}

// verdict reports the run, and fails it on a duplicate execution or a
// peak RSS at the GOMEMLIMIT (limitBytes).
func (o *overloadRig) verdict(overEnd time.Duration, limitBytes int64) error {
	f := o.f
	keys, dups, err := o.s.duplicates()
	if err != nil {
		return err
	}
	peak := o.s.idem.peakRSS()
	text := overloadReport(overloadRun{
		phase: f.phase, delay: f.delay, limit: f.limit, capacity: f.capacity(), factor: f.factor, workers: f.workers,
		memLimit: f.memLimit, route: f.route, overEnd: overEnd, calls: o.all.all,
		keys: keys, dups: dups, peakRSS: peak, peakGoroutines: o.peakGoroutines,
	})
	fmt.Print(text)
	if f.out != "" {
		if err := os.WriteFile(f.out, []byte(text), 0o644); err != nil {
			return err
		}
	}
	var problems []string
	if dups > 0 {
		problems = append(problems, fmt.Sprintf("%d duplicate executions at the upstream", dups))
	}
	if peak >= limitBytes {
		problems = append(problems, fmt.Sprintf("idemproxy's peak RSS %.1f MiB reached its GOMEMLIMIT %s", float64(peak)/(1<<20), f.memLimit))
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

// overloadCell is one phase's calls of one class.
type overloadCell struct{ phase, class string }

func overloadReport(r overloadRun) string {
	var b strings.Builder
	route := "defaults"
	if r.route != "" {
		route = strings.TrimSpace(r.route)
	}
	fmt.Fprintf(&b, "Overload: upstream %s per request, %d at once (capacity %.0f/s); first attempts offered at %.0f× that (%.0f/s) over %d connections for %s, between two %s phases of light load; probes all along at 20/s each: replays of stored keys, pass-through requests, first attempts on their own connections. idemproxy GOMEMLIMIT=%s, route settings: %s. %s.\n\n",
		r.delay, r.limit, r.capacity, r.factor, r.factor*r.capacity, r.workers, r.phase, r.phase, r.memLimit, route, machine())
	fmt.Fprintf(&b, "| phase | class | requests | answers | p50 | p99 |\n|---|---|---|---|---|---|\n")
	groups := map[overloadCell][]call{}
	for _, c := range r.calls {
		k := overloadCell{r.phaseOf(c.at), c.class}
		groups[k] = append(groups[k], c)
	}
	for _, ph := range []string{"before", "overload", "after"} {
		for _, class := range []string{"first attempt (overload)", "first attempt (probe)", "replay", "pass-through"} {
			if g := groups[overloadCell{ph, class}]; len(g) > 0 {
				overloadRow(&b, ph, class, g)
			}
		}
	}
	r.recovery(&b, groups)
	fmt.Fprintf(&b, "idemproxy peak RSS %.1f MiB (GOMEMLIMIT %s), peak goroutines %.0f. Upstream: %d keys executed, %d duplicate executions.\n",
		float64(r.peakRSS)/(1<<20), r.memLimit, r.peakGoroutines, r.keys, r.dups)
	return b.String()
}

// phaseOf is the phase a call sent at at fell in.
func (r overloadRun) phaseOf(at time.Duration) string {
	switch {
	case at < r.phase:
		return "before"
	case at < r.overEnd:
		return "overload"
	}
	return "after"
}

// overloadRow writes the row of g, one phase's calls of one class.
func overloadRow(b *strings.Builder, ph, class string, g []call) {
	lat := make([]time.Duration, len(g))
	statuses := map[int]int{}
	for i, c := range g {
		lat[i] = c.lat
		statuses[c.status]++
	}
	slices.Sort(lat)
	var parts []string
	for _, code := range slices.Sorted(maps.Keys(statuses)) {
		name := strconv.Itoa(code)
		if code == 0 {
			name = "transport error"
		}
		parts = append(parts, fmt.Sprintf("%s: %d", name, statuses[code]))
	}
	fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s |\n", ph, class, len(g), strings.Join(parts, ", "),
		lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)*99/100].Round(100*time.Microsecond))
}

// recovery writes when the after phase recovered: the last probe first
// attempt slower than twice the before phase's p99, or not answered 201.
func (r overloadRun) recovery(b *strings.Builder, groups map[overloadCell][]call) {
	var before []time.Duration
	for _, c := range groups[overloadCell{"before", "first attempt (probe)"}] {
		before = append(before, c.lat)
	}
	if len(before) == 0 {
		return
	}
	slices.Sort(before)
	recovered := time.Duration(0)
	bound := 2 * before[len(before)*99/100]
	for _, c := range groups[overloadCell{"after", "first attempt (probe)"}] {
		if c.status != 201 || c.lat > bound {
			recovered = max(recovered, c.at-r.overEnd)
		}
	}
	fmt.Fprintf(b, "\nRecovery: the last probe first attempt slower than 2× the before phase's p99 (%s), or not answered 201, was sent %s after the overload stopped.\n",
		bound.Round(100*time.Microsecond), recovered.Round(10*time.Millisecond))
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
