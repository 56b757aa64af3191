package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// startNginx runs nginx as a plain keep-alive reverse proxy, as tuned as
// the Go baseline: two workers (one per core), upstream keep-alive.
func startNginx(bin, dir, upstream string) (*proc, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort())
	ndir := filepath.Join(dir, "nginx")
	os.MkdirAll(ndir, 0o755)
	conf := filepath.Join(ndir, "nginx.conf")
	err := os.WriteFile(conf, []byte(fmt.Sprintf(`daemon off;
user root;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  client_max_body_size 2m;
  client_body_buffer_size 2m;
  upstream up { server %[2]s; keepalive 128; }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`, ndir, upstream, addr)), 0o644)
	if err != nil {
		return nil, err
	}
	return startProc("nginx", addr, bin, "-c", conf, "-p", ndir)
}

func report(o options, results []result, rttP50, rttP99 time.Duration) string {
	var b strings.Builder
	mode := fmt.Sprintf("closed loop, concurrency %d", o.concurrency)
	if o.rate > 0 {
		mode = fmt.Sprintf("fixed rate %.0f/s over %d connections", o.rate, o.concurrency)
	}
	rounds := ""
	if o.rounds > 1 {
		rounds = fmt.Sprintf(" %d interleaved rounds: each row is the round with the median rps, with the range of all rounds;", o.rounds)
	}
	fmt.Fprintf(&b, "Machine: %s. Load: %s, %s measured after %s warm-up per target;%s every server a separate process on 127.0.0.1; load generator in the harness process on the same cores.\n\n",
		machine(), mode, o.duration, o.warmup, rounds)
	fmt.Fprintf(&b, "Redis round trip (PING, same run): p50 %s, p99 %s.\n", rttP50.Round(time.Microsecond), rttP99.Round(time.Microsecond))
	for _, delay := range o.delays {
		reportTable(&b, results, delay)
		reportFloors(&b, results, delay)
	}
	return b.String()
}

// reportTable writes the table of results measured at delay.
func reportTable(b *strings.Builder, results []result, delay time.Duration) {
	var base *result
	for i := range results {
		if results[i].delay == delay && results[i].name == "ReverseProxy" {
			base = &results[i]
		}
	}
	fmt.Fprintf(b, "\n### Upstream service time %s\n\n", delay)
	fmt.Fprintf(b, "| target | rps | p50 | p99 | p99.9 | CPU s / 1k req | CPU vs ReverseProxy | store CPU s / 1k req (Redis; PostgreSQL's on its rows) | peak RSS | rps vs ReverseProxy | p50 added vs ReverseProxy |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		if r.delay == delay {
			reportRow(b, results, r, base)
		}
	}
}

// reportRow writes r's row, against its baseline (or base: ReverseProxy).
func reportRow(b *strings.Builder, results []result, r result, base *result) {
	ratio, added, cpu := "", "", ""
	if bl := baselineFor(results, r); bl != nil {
		ratio = fmt.Sprintf("%.2f×", r.rps/bl.rps)
		added = (r.p50 - bl.p50).Round(time.Microsecond).String()
		cpu = fmt.Sprintf("%.2f×", r.cpuPer1k/bl.cpuPer1k)
	} else if base != nil {
		ratio = fmt.Sprintf("%.2f×", r.rps/base.rps)
		if r.cpuPer1k > 0 {
			cpu = fmt.Sprintf("%.2f×", r.cpuPer1k/base.cpuPer1k)
		}
	}
	errs := ""
	if r.errors > 0 {
		errs = fmt.Sprintf(" (%d errors)", r.errors)
	}
	rps := fmt.Sprintf("%.0f", r.rps)
	if r.rounds > 1 {
		rps += fmt.Sprintf(" (%.0f–%.0f)", r.rpsMin, r.rpsMax)
	}
	fmt.Fprintf(b, "| %s%s | %s | %s | %s | %s | %.3f | %s | %.3f | %.1f MiB | %s | %s |\n",
		r.name, errs, rps, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.p999.Round(time.Microsecond),
		r.cpuPer1k, cpu, r.redisPer1k, float64(r.rss)/(1<<20), ratio, added)
}

// reportFloors writes idemproxy's first attempts and replays against
// their floors and Fiber's middleware, at delay.
func reportFloors(b *strings.Builder, results []result, delay time.Duration) {
	first, fl := find(results, delay, "idemproxy first attempts"), find(results, delay, floorName)
	if first != nil && fl != nil {
		fmt.Fprintf(b, "\nidemproxy first attempts against the floor: %.2f× rps, %+.0f µs p50, %+.0f µs of proxy CPU and %+.0f µs of Redis CPU per request.\n",
			first.rps/fl.rps, float64(first.p50-fl.p50)/1e3, (first.cpuPer1k-fl.cpuPer1k)*1e3, (first.redisPer1k-fl.redisPer1k)*1e3)
	}
	fiber, fiberReplays := find(results, delay, fiberName), find(results, delay, fiberName+", replays")
	replays, replayFloor := find(results, delay, "idemproxy replays"), find(results, delay, replayFloorName)
	if replays != nil && replayFloor != nil {
		fmt.Fprintf(b, "idemproxy replays against the floor's replays: %.2f× rps, %+.0f µs p50, %+.0f µs of proxy CPU and %+.0f µs of Redis CPU per request.\n",
			replays.rps/replayFloor.rps, float64(replays.p50-replayFloor.p50)/1e3, (replays.cpuPer1k-replayFloor.cpuPer1k)*1e3, (replays.redisPer1k-replayFloor.redisPer1k)*1e3)
	}
	if first != nil && fiber != nil {
		fmt.Fprintf(b, "\nidemproxy first attempts against Fiber's in-app idempotency middleware: %.2f× rps, %+.0f µs p50.\n",
			first.rps/fiber.rps, float64(first.p50-fiber.p50)/1e3)
	}
	if replays != nil && fiberReplays != nil {
		fmt.Fprintf(b, "idemproxy replays against Fiber's replays: %.2f× rps.\n", replays.rps/fiberReplays.rps)
	}
}

// baselineFor is the ReverseProxy result with the same body size and
// upstream delay, which an idemproxy result is compared with.
func baselineFor(results []result, r result) *result {
	if !strings.HasPrefix(r.name, "idemproxy") && !strings.HasPrefix(r.name, "ReverseProxy + ") && !strings.HasPrefix(r.name, "Fiber") && !strings.HasPrefix(r.name, "previous release") {
		return nil
	}
	want := "ReverseProxy"
	for _, suffix := range []string{", 64 KiB body", ", 1 MiB body"} {
		if strings.HasSuffix(r.name, suffix) {
			want += suffix
		}
	}
	for i := range results {
		if results[i].delay == r.delay && results[i].name == want {
			return &results[i]
		}
	}
	return nil
}

const floorName = "ReverseProxy + 2 Redis round trips (floor)"

// replayFloorName is the floor answering a key it stored: one SET NX GET
// and the stored body written by net/http, no record, no checks.
const replayFloorName = floorName + ", replays"

// fiberName is the in-app peer: Fiber's idempotency middleware on Redis
// (bench/fiberpeer), no extra hop.
const fiberName = "Fiber idempotency middleware"

func find(results []result, delay time.Duration, name string) *result {
	for i := range results {
		if results[i].delay == delay && results[i].name == name {
			return &results[i]
		}
	}
	return nil
}

// machine names the machine and the day for reports.
func machine() string {
	host, _ := os.Hostname()
	cpu := "unknown CPU"
	if out, err := exec.Command("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").Output(); err == nil {
		cpu = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s, %d cores (%s), %s, %s", host, runtime.NumCPU(), cpu, runtime.Version(), time.Now().UTC().Format("2006-01-02"))
}
