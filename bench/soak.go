package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sample is the soak's view of the processes at one moment.
type sample struct {
	at                time.Duration
	rss               int64
	goroutines        float64
	fds               int
	keys, redisMemory int64
	requests, errors  int
}

// soak runs a steady mix of first attempts, replays and pass-through
// requests for a long time and samples idemproxy's resident memory,
// goroutines and open file descriptors, and Redis' key count and memory:
// all should be flat once the route's retention has gone by once.
func soak(args []string) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	duration := fs.Duration("duration", 30*time.Minute, "how long to run")
	rate := fs.Float64("rate", 200, "requests per second: 60% first attempts, 25% replays of recent keys, 15% pass-through")
	retention := fs.Duration("retention", 2*time.Minute, "the route's retention: records in Redis are bounded by first attempts/s × retention")
	every := fs.Duration("every", 10*time.Second, "sampling interval")
	out := fs.String("out", "", "also write the markdown report to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := startStack(nil, fmt.Sprintf("    retention: %s\n", *retention), nil)
	if err != nil {
		return err
	}
	defer s.stop()
	m := &soakMix{client: loadClient(64), base: s.base}
	stop := make(chan struct{})
	start := time.Now()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		openLoop(*rate, 64, stop, m.send)
	}()
	samples := soakSamples(s, &m.done, start, *duration, *every)
	close(stop)
	<-loaded
	keys, dups, err := s.duplicates()
	if err != nil {
		return err
	}
	text := soakReport(*duration, *rate, *retention, *every, samples, &m.done, keys, dups)
	fmt.Print(text)
	if *out != "" {
		return os.WriteFile(*out, []byte(text), 0o644)
	}
	return nil
}

// soakMix sends the soak's mix of requests: 60% first attempts, 25%
// replays of recent keys, 15% pass-through.
type soakMix struct {
	client *http.Client
	base   string
	mu     sync.Mutex
	recent []string // the last first-attempt keys answered, for replays; mu guards it
	done   tally
}

// send sends the n-th request of the mix.
func (m *soakMix) send(n int64, _ time.Time) {
	var key, class, path = "", "pass-through", "/other"
	switch r := n % 20; {
	case r < 12:
		key, class, path = "soak-"+strconv.FormatInt(n, 36), "first attempt", "/payments"
	case r < 17:
		m.mu.Lock()
		if len(m.recent) > 0 {
			key, class, path = m.recent[rand.IntN(len(m.recent))], "replay", "/payments"
		}
		m.mu.Unlock()
	}
	status := post(m.client, m.base, path, key)
	if class == "first attempt" && status == 201 {
		m.mu.Lock()
		if m.recent = append(m.recent, key); len(m.recent) > 1024 {
			m.recent = m.recent[len(m.recent)-1024:]
		}
		m.mu.Unlock()
	}
	m.done.add(class, status)
}

// soakSamples samples the stack every interval from start for duration:
// memory, goroutines, descriptors, Redis keys and requests.
func soakSamples(s *stack, done *tally, start time.Time, duration, every time.Duration) []sample {
	var samples []sample
	tick := time.NewTicker(every)
	defer tick.Stop()
	for now := range tick.C {
		keys, mem := s.redisKeys()
		n, bad := done.counts()
		last := sample{at: now.Sub(start), rss: s.idem.rss(), goroutines: s.gauge("go_goroutines"),
			fds: s.idem.fds(), keys: keys, redisMemory: mem, requests: n, errors: bad}
		samples = append(samples, last)
		fmt.Fprintf(os.Stderr, "soak %s: rss %.1f MiB, %0.f goroutines, %d fds, %d keys, %d requests, %d not 201\n",
			now.Sub(start).Round(time.Second), float64(last.rss)/(1<<20), last.goroutines, last.fds, keys, n, bad)
		if now.Sub(start) >= duration {
			break
		}
	}
	return samples
}

func soakReport(duration time.Duration, rate float64, retention, every time.Duration, samples []sample, done *tally, keys, dups int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Soak: %s at %.0f requests/s (60%% first attempts, 25%% replays of recent keys, 15%% pass-through), retention %s, sampled every %s; %s.\n\n",
		duration, rate, retention, every, machine())
	fmt.Fprintf(&b, "| time | idemproxy RSS | goroutines | open fds | Redis keys | Redis used_memory | requests | not 201 |\n|---|---|---|---|---|---|---|---|\n")
	for i, x := range samples {
		if i%6 == 5 || i == len(samples)-1 {
			fmt.Fprintf(&b, "| %s | %.1f MiB | %.0f | %d | %d | %.1f MiB | %d | %d |\n", x.at.Round(time.Second),
				float64(x.rss)/(1<<20), x.goroutines, x.fds, x.keys, float64(x.redisMemory)/(1<<20), x.requests, x.errors)
		}
	}
	// Steady state: once a retention has gone by (plus a minute), records
	// expire as fast as they are made.
	var steady []sample
	for _, x := range samples {
		if x.at >= retention+time.Minute {
			steady = append(steady, x)
		}
	}
	if len(steady) < 3 {
		steady = samples[len(samples)/2:]
	}
	fmt.Fprintf(&b, "\nSlopes over the steady state (%s to %s, %d samples; least squares, per hour):\n\n", steady[0].at.Round(time.Second), steady[len(steady)-1].at.Round(time.Second), len(steady))
	slope := func(f func(sample) float64) (mean, perHour float64) { return fit(steady, f) }
	m, sl := slope(func(x sample) float64 { return float64(x.rss) / (1 << 20) })
	fmt.Fprintf(&b, "- idemproxy RSS: mean %.1f MiB, slope %+.2f MiB/h\n", m, sl)
	m, sl = slope(func(x sample) float64 { return x.goroutines })
	fmt.Fprintf(&b, "- goroutines: mean %.0f, slope %+.1f/h\n", m, sl)
	m, sl = slope(func(x sample) float64 { return float64(x.fds) })
	fmt.Fprintf(&b, "- open file descriptors: mean %.0f, slope %+.1f/h\n", m, sl)
	m, sl = slope(func(x sample) float64 { return float64(x.keys) })
	expected := rate * 0.6 * retention.Seconds()
	fmt.Fprintf(&b, "- Redis keys: mean %.0f, slope %+.0f/h; first attempts/s × retention = %.0f\n", m, sl, expected)
	m, sl = slope(func(x sample) float64 { return float64(x.redisMemory) / (1 << 20) })
	fmt.Fprintf(&b, "- Redis used_memory: mean %.1f MiB, slope %+.2f MiB/h\n", m, sl)
	done.mu.Lock()
	fmt.Fprintf(&b, "\nAnswers by class and status (0: transport error): %v. Upstream: %d keys executed, %d duplicate executions.\n", done.by, keys, dups)
	done.mu.Unlock()
	return b.String()
}

// fit is the mean of f over xs and its least-squares slope per hour.
func fit(xs []sample, f func(sample) float64) (mean, perHour float64) {
	var st, sy, stt, sty float64
	n := float64(len(xs))
	for _, x := range xs {
		t, y := x.at.Hours(), f(x)
		st, sy, stt, sty = st+t, sy+y, stt+t*t, sty+t*y
	}
	mean = sy / n
	if d := n*stt - st*st; d != 0 {
		perHour = (n*sty - st*sy) / d
	}
	return mean, perHour
}

// tally counts the soak's answers by class and status: a long soak keeps
// no per-request record.
type tally struct {
	mu     sync.Mutex
	by     map[string]map[int]int
	n, bad int
}

func (t *tally) add(class string, status int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = map[string]map[int]int{}
	}
	if t.by[class] == nil {
		t.by[class] = map[int]int{}
	}
	t.by[class][status]++
	t.n++
	if status != 201 {
		t.bad++
	}
}

// counts is how many answers came, and how many were not 201.
func (t *tally) counts() (n, bad int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n, t.bad
}
