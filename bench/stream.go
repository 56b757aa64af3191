package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// streamConfig is idemproxy in front of the streaming upstream, under
// record_format 4 (streams stored chunk by chunk).
const streamConfig = `listen: "127.0.0.1:%d"
admin_listen: "127.0.0.1:%d"
upstream:
  url: %q
store:
  record_format: 4
  redis:
    addrs: [%q]
routes:
  - name: chat
    match: "POST /stream"
    stream_flush_interval: %s
%s`

// streamOptions are bench stream's flags.
type streamOptions struct {
	n, events, size, rounds int
	gap, flush              time.Duration
	out, profile            string
	storeFloor, nativeFloor bool
}

// streamBench (go run ./bench stream) measures a streamed answer (server-
// sent events, one flush per event) through idemproxy against the plain
// ReverseProxy and the upstream itself, one client at a time: time to the
// first event and to the end, and CPU per event of the proxy.
func streamBench(args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	var o streamOptions
	fs.IntVar(&o.n, "n", 200, "streams per target, one at a time")
	fs.IntVar(&o.events, "events", 20, "events per stream")
	fs.DurationVar(&o.gap, "gap", 5*time.Millisecond, "the upstream's pause between events")
	fs.IntVar(&o.size, "size", 200, "bytes per event")
	fs.DurationVar(&o.flush, "flush", 0, "idemproxy's routes[].stream_flush_interval")
	fs.StringVar(&o.out, "out", "", "also write the markdown results to this file")
	fs.IntVar(&o.rounds, "rounds", 5, "turns the targets take, each with its share of -n")
	fs.BoolVar(&o.storeFloor, "store-floor", false, "also measure ReverseProxy with idemproxy's own Redis store calls (claim, head, a fenced append per read, end), to split idemproxy's cost over the floor into the store protocol's and the proxy's own")
	fs.BoolVar(&o.nativeFloor, "native-floor", false, "with -store-floor: also measure the store floor with each read appended by one native XADD in place of the fenced script (an experiment: what a stream form without the script would cost)")
	fs.StringVar(&o.profile, "cpuprofile", "", "also write a CPU profile of idemproxy's measured streams to this file, and the floor's to this file + .floor")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.rounds = max(o.rounds, 1)
	if o.nativeFloor && !o.storeFloor {
		return errors.New("bench stream: -native-floor measures beside the store floor: add -store-floor")
	}
	dir, err := os.MkdirTemp("", "idemproxy-bench-stream-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rig, err := startStreamRig(dir, o)
	defer rig.stop()
	if err != nil {
		return err
	}
	rows, ratios, err := rig.rounds(o)
	if err != nil {
		return err
	}
	idemRow := &rows[2]
	for _, key := range idemRow.keys { // after the end: replays
		f, l, err := oneStream("http://"+rig.targets[2].addr+"/stream", key)
		if err != nil {
			return err
		}
		idemRow.attachFirst, idemRow.attachEnd = append(idemRow.attachFirst, f), append(idemRow.attachEnd, l)
	}
	report := streamReport(o, rig.rtt, rows, ratios, rig.floorRatios, rig.storeRatios)
	fmt.Print(report)
	if o.out != "" {
		return os.WriteFile(o.out, []byte(report), 0o644)
	}
	return nil
}

// streamTarget is one of the targets: its process (nil: the upstream
// itself, whose CPU is not measured) and address.
type streamTarget struct {
	name string
	p    *proc
	addr string
}

// streamRig is Redis, the streaming upstream, ReverseProxy and idemproxy,
// started for bench stream.
type streamRig struct {
	procs   []*proc
	targets []streamTarget
	// floorRatios are each round's idemproxy CPU per event over the
	// floor's (rounds); storeRatios over the store floor's (-store-floor).
	floorRatios, storeRatios []float64
	rtt                      time.Duration // Redis' round trip, p50
	// pprofAddr and floorPprof serve idemproxy's and the floor's
	// profiles, with -cpuprofile.
	pprofAddr, floorPprof string
}

func (r *streamRig) stop() {
	for _, p := range slices.Backward(r.procs) {
		p.stop()
	}
}

// startStreamRig starts the rig in dir; the caller stops it, also on
// an error.
func startStreamRig(dir string, o streamOptions) (*streamRig, error) {
	r := &streamRig{}
	self, err := os.Executable()
	if err != nil {
		return r, err
	}
	bin, err := buildIdemproxy(dir)
	if err != nil {
		return r, err
	}
	redisPort := freePort()
	redisAddr := fmt.Sprintf("127.0.0.1:%d", redisPort)
	if _, err := r.start("redis", redisAddr, "redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir); err != nil {
		return r, err
	}
	r.rtt, _ = redisRTT(redisAddr)
	upAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	if _, err := r.start("upstream", upAddr, self, "upstream", "-listen", upAddr,
		"-stream-events", strconv.Itoa(o.events), "-stream-gap", o.gap.String(), "-stream-size", strconv.Itoa(o.size)); err != nil {
		return r, err
	}
	rpAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	rp, err := r.start("reverseproxy", rpAddr, self, "reverseproxy", "-listen", rpAddr, "-upstream", "http://"+upAddr)
	if err != nil {
		return r, err
	}
	idem, err := r.startIdemproxy(dir, bin, o, upAddr, redisAddr)
	if err != nil {
		return r, err
	}
	floorAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	floorArgs := []string{"reverseproxy", "-listen", floorAddr, "-upstream", "http://" + upAddr, "-redis", redisAddr}
	if o.profile != "" {
		r.floorPprof = fmt.Sprintf("127.0.0.1:%d", freePort())
		floorArgs = append(floorArgs, "-pprof", r.floorPprof)
	}
	fl, err := r.start("floor", floorAddr, self, floorArgs...)
	if err != nil {
		return r, err
	}
	r.targets = []streamTarget{
		{"upstream direct", nil, upAddr},
		{"ReverseProxy", rp, rpAddr},
		{"idemproxy (stream: auto, record_format 4)", idem, idem.addr},
		{"floor (ReverseProxy, a SET NX claim, one APPEND per read)", fl, floorAddr},
	}
	if !o.storeFloor {
		return r, nil
	}
	return r, r.startStoreFloors(self, o, upAddr, redisAddr)
}

// start starts one of the rig's processes, stopped with the rig.
func (r *streamRig) start(name, addr, bin string, args ...string) (*proc, error) {
	p, err := startProc(name, addr, bin, args...)
	if err == nil {
		r.procs = append(r.procs, p)
	}
	return p, err
}

// startIdemproxy starts the sidecar of the rig, on its own Redis and
// upstream.
func (r *streamRig) startIdemproxy(dir, bin string, o streamOptions, upAddr, redisAddr string) (*proc, error) {
	port, admin := freePort(), freePort()
	cfg := filepath.Join(dir, "idemproxy.yaml")
	pprofCfg := ""
	if o.profile != "" {
		r.pprofAddr = fmt.Sprintf("127.0.0.1:%d", freePort())
		pprofCfg = fmt.Sprintf("admin_pprof_listen: %q\n", r.pprofAddr)
	}
	if err := os.WriteFile(cfg, fmt.Appendf(nil, streamConfig, port, admin, "http://"+upAddr, redisAddr, o.flush, pprofCfg), 0o644); err != nil {
		return nil, err
	}
	idem, err := startIdemproxy(bin, cfg, port, admin, nil)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, idem)
	return idem, nil
}

// startStoreFloors starts the store floor (and, with -native-floor, its
// native form) as targets of the rig.
func (r *streamRig) startStoreFloors(self string, o streamOptions, upAddr, redisAddr string) error {
	type floorTarget struct {
		name string
		args []string // beyond the store floor's
	}
	floors := []floorTarget{{"store floor (ReverseProxy, idemproxy's Redis store calls: claim, head, a fenced append per read, end)", nil}}
	if o.nativeFloor {
		floors = append(floors, floorTarget{"native store floor (the store floor with one XADD per read in place of the fenced append: an experiment)", []string{"-native-append"}})
	}
	for _, fl := range floors {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort())
		args := append([]string{"reverseproxy", "-listen", addr, "-upstream", "http://" + upAddr, "-redis", redisAddr, "-store-floor"}, fl.args...)
		p, err := r.start(strings.Fields(fl.name)[0], addr, self, args...)
		if err != nil {
			return err
		}
		r.targets = append(r.targets, streamTarget{fl.name, p, addr})
	}
	return nil
}

// streamRow is what one target measured, over the rounds.
type streamRow struct {
	name                   string
	first, last            []time.Duration
	cpu                    float64 // of the proxy, seconds, summed over the rounds
	runs                   float64 // times the proxy's threads were put on a CPU, summed
	events                 int
	attachFirst, attachEnd []time.Duration
	keys                   []string
}

// measure runs count streams of events through t, adding to r.
func (r *streamRow) measure(t streamTarget, count, events int) error {
	cpu0, runs0 := 0.0, 0.0
	if t.p != nil {
		cpu0 = t.p.cpuPrecise()
		_, runs0, _ = t.p.schedstat()
	}
	for range count {
		key := fmt.Sprintf("%s-%d", strings.Fields(t.name)[0], time.Now().UnixNano())
		first, last, err := oneStream("http://"+t.addr+"/stream", key)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		r.first, r.last, r.keys = append(r.first, first), append(r.last, last), append(r.keys, key)
	}
	if t.p != nil {
		r.cpu += t.p.cpuPrecise() - cpu0
		_, runs, _ := t.p.schedstat()
		r.runs += runs - runs0
	}
	r.events += count * events
	return nil
}

// rounds warms each target up, then has them take turns, o.rounds times,
// so that the machine's drift (other tenants, frequency) falls on each
// alike: a row per target, and each round's ratio of idemproxy's CPU per
// event to ReverseProxy's.
func (r *streamRig) rounds(o streamOptions) ([]streamRow, []float64, error) {
	for _, t := range r.targets {
		if err := (&streamRow{}).measure(t, max(o.n/10, 5), o.events); err != nil {
			return nil, nil, err
		}
	}
	var profiled chan error
	if r.pprofAddr != "" {
		perStream := time.Duration(o.events)*o.gap + 3*time.Millisecond
		seconds := int((time.Duration(len(r.targets)*o.n) * perStream).Seconds()) + 1
		profiled = make(chan error, 2)
		go func() { profiled <- fetchProfile(r.pprofAddr, seconds, o.profile) }()
		go func() { profiled <- fetchProfile(r.floorPprof, seconds, o.profile+".floor") }()
	}
	rows := make([]streamRow, len(r.targets))
	for i := range rows {
		rows[i].name = r.targets[i].name
	}
	var ratios []float64
	for round := range o.rounds {
		count := o.n / o.rounds
		if round < o.n%o.rounds {
			count++
		}
		cpu := make([]float64, len(r.targets))
		for i, t := range r.targets {
			before := rows[i].cpu
			if err := rows[i].measure(t, count, o.events); err != nil {
				return nil, nil, err
			}
			cpu[i] = rows[i].cpu - before
		}
		if cpu[1] > 0 {
			ratios = append(ratios, cpu[2]/cpu[1])
		}
		if cpu[3] > 0 {
			r.floorRatios = append(r.floorRatios, cpu[2]/cpu[3])
		}
		if len(cpu) > 4 && cpu[4] > 0 {
			r.storeRatios = append(r.storeRatios, cpu[2]/cpu[4])
		}
	}
	if profiled != nil {
		for range 2 {
			if err := <-profiled; err != nil {
				return nil, nil, err
			}
		}
	}
	return rows, ratios, nil
}

// streamReport is bench stream's markdown.
func streamReport(o streamOptions, rtt time.Duration, rows []streamRow, ratios, floorRatios, storeRatios []float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Streams of %d events of %d bytes, %s apart (one flush each), %d per target in %d rounds, one client at a time; idemproxy's stream_flush_interval %s; Redis round trip p50 %s. %s\n\n",
		o.events, o.size, o.gap, o.n, o.rounds, o.flush, rtt.Round(time.Microsecond), machine())
	b.WriteString("| target | first event p50 | p90 | last byte p50 | p90 | proxy CPU per event (the stream's connection and claim included) |\n|---|---|---|---|---|---|\n")
	base := rows[1]
	for _, r := range rows {
		cpu := "—"
		if r.cpu > 0 {
			cpu = fmt.Sprintf("%.1f µs", r.cpu/float64(r.events)*1e6)
			if r.name != base.name && base.cpu > 0 {
				cpu += fmt.Sprintf(" (%.2f× ReverseProxy)", r.cpu/float64(r.events)/(base.cpu/float64(base.events)))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.name, pct(r.first, 50), pct(r.first, 90), pct(r.last, 50), pct(r.last, 90), cpu)
		if len(r.attachFirst) > 0 {
			fmt.Fprintf(&b, "| idemproxy, a retry after the end (replayed) | %s | %s | %s | %s | |\n", pct(r.attachFirst, 50), pct(r.attachFirst, 90), pct(r.attachEnd, 50), pct(r.attachEnd, 90))
		}
	}
	fmt.Fprintf(&b, "\nAdded by idemproxy over ReverseProxy: first event %s (p50), last byte %s (p50).\n",
		(med(rows[2].first) - med(base.first)).Round(time.Microsecond), (med(rows[2].last) - med(base.last)).Round(time.Microsecond))
	if len(ratios) > 0 {
		slices.Sort(ratios)
		fmt.Fprintf(&b, "CPU per event, idemproxy over ReverseProxy, by round (%d rounds, the targets taking turns): median %.2f×, from %.2f× to %.2f×.\n",
			len(ratios), ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	}
	if fl := rows[3]; fl.cpu > 0 && rows[2].cpu > 0 {
		whole := rows[2].cpu / float64(rows[2].events) / (fl.cpu / float64(fl.events))
		fmt.Fprintf(&b, "CPU per event, idemproxy over its floor (stored before sent costs one store round trip per read: ReverseProxy, a SET NX claim and one APPEND per read): %.2f× over the whole run", whole)
		byRound(&b, floorRatios)
		b.WriteString("; the target is 1.2× (issue 65).\n")
	}
	if len(rows) > 4 {
		storeFloorReport(&b, rows, storeRatios)
	}
	if rows[1].runs > 0 && rows[2].runs > 0 {
		fmt.Fprintf(&b, "Thread wake-ups per event (each time one of the proxy's threads was put on a CPU, from schedstat): ReverseProxy %.1f, idemproxy %.1f", rows[1].runs/float64(rows[1].events), rows[2].runs/float64(rows[2].events))
		if rows[3].runs > 0 {
			fmt.Fprintf(&b, ", the floor %.1f", rows[3].runs/float64(rows[3].events))
		}
		if len(rows) > 4 && rows[4].runs > 0 {
			fmt.Fprintf(&b, ", the store floor %.1f", rows[4].runs/float64(rows[4].events))
		}
		if len(rows) > 5 && rows[5].runs > 0 {
			fmt.Fprintf(&b, ", the native store floor %.1f", rows[5].runs/float64(rows[5].events))
		}
		b.WriteString(".\n")
	}
	return b.String()
}

// storeFloorReport splits idemproxy's CPU per event over its floor in
// two: the store floor's over the floor (what the store's protocol costs:
// the fenced append and its time on Redis), and idemproxy's over the store
// floor (what the proxy itself costs), each over the whole run and by
// round.
func storeFloorReport(b *strings.Builder, rows []streamRow, storeRatios []float64) {
	perEvent := func(r streamRow) float64 { return r.cpu / float64(r.events) }
	if rows[4].cpu == 0 || rows[3].cpu == 0 || rows[2].cpu == 0 {
		return
	}
	fmt.Fprintf(b, "CPU per event, the store floor over the floor (the store's protocol: the fenced append, on Redis and in the client): %.2f×; idemproxy over the store floor (the proxy's own): %.2f× over the whole run",
		perEvent(rows[4])/perEvent(rows[3]), perEvent(rows[2])/perEvent(rows[4]))
	byRound(b, storeRatios)
	b.WriteString(".\n")
	if len(rows) > 5 && rows[5].cpu > 0 {
		fmt.Fprintf(b, "CPU per event, the native store floor (one XADD per read, no script) over the floor: %.2f×.\n", perEvent(rows[5])/perEvent(rows[3]))
	}
}

// byRound adds the median round's ratio and the range of ratios, when
// there are any.
func byRound(b *strings.Builder, ratios []float64) {
	if len(ratios) == 0 {
		return
	}
	slices.Sort(ratios)
	fmt.Fprintf(b, ", median round %.2f× (from %.2f× to %.2f×)", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
}

// streamClient opens a connection per stream, as an EventSource does: a
// kept-alive connection reused through ReverseProxy broke off one stream
// in a hundred here ("use of closed network connection" on its upstream
// side), which is ReverseProxy's to explain, not this benchmark's.
var streamClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// oneStream posts to url under key and reads the stream to its end: the
// time to its first event and to its last byte.
func oneStream(url, key string) (first, last time.Duration, err error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-User", "bench")
	req.Header.Set("Idempotency-Key", key)
	start := time.Now()
	resp, err := streamClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		return 0, 0, err
	}
	first = time.Since(start)
	if _, err := io.Copy(io.Discard, r); err != nil {
		return 0, 0, err
	}
	return first, time.Since(start), nil
}

func med(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func pct(d []time.Duration, p int) string {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(10 * time.Microsecond).String()
}

// fetchProfile writes a CPU profile of seconds from pprof at addr to path.
func fetchProfile(addr string, seconds int, path string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cpu profile: status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
