package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/internal/sizing"
)

// units measures what one store operation costs Redis (CPU from INFO cpu,
// command time from INFO commandstats, network bytes from INFO stats),
// serially and pipelined, and what one record holds in memory (MEMORY
// USAGE) as a function of the stored response's size, sealed and not: the
// unit costs behind docs/scaling.md's sizing model (internal/sizing).
func units(args []string) error {
	fs := flag.NewFlagSet("units", flag.ContinueOnError)
	n := fs.Int("n", 20000, "operations of each kind per mode")
	out := fs.String("out", "", "also write the markdown report to this file")
	records := fs.Int("records", 12000, "records stored per row of the sizing model's check against used_memory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "idemproxy-units-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	port := freePort()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rp, err := startProc("redis", addr, "redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err != nil {
		return err
	}
	defer rp.stop()
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{addr}})
	if err != nil {
		return err
	}
	defer c.Close()

	var b strings.Builder
	fmt.Fprintf(&b, "Unit costs: `go run ./bench units -n %d`; redis-server %s on 127.0.0.1, no persistence; %s.\n\n", *n, redisVersion(c), machine())
	fmt.Fprintf(&b, "| operation | mode | Redis CPU µs/op | command µs/op | bytes in/op | bytes out/op |\n|---|---|---|---|---|---|\n")
	for _, mode := range []struct {
		name     string
		pipeline bool
		workers  int
	}{{"serial (one at a time)", false, 1}, {"pipelined (32 at once)", true, 32}} {
		s := redisstore.New(c, "units:"+strconv.FormatBool(mode.pipeline)+":", claim.WithPipeline(mode.pipeline))
		if err := s.Preload(context.Background()); err != nil {
			return err
		}
		for _, op := range unitOps(s, *n) {
			cost, err := measureOp(c, *n, mode.workers, op)
			if err != nil {
				return fmt.Errorf("%s: %w", op.name, err)
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.0f | %.0f |\n", op.name, mode.name, cost.cpu, cost.command, cost.in, cost.out)
		}
	}
	if err := recordSizes(&b, c); err != nil {
		return err
	}
	if err := modelCheck(&b, c, *records); err != nil {
		return err
	}
	fmt.Print(b.String())
	if *out != "" {
		return os.WriteFile(*out, []byte(b.String()), 0o644)
	}
	return nil
}

// unitOp is one kind of operation: setup (untimed, may be nil) prepares
// its keys, do(i) runs it on key i.
type unitOp struct {
	name  string
	setup func() error
	do    func(i int) error
}

// unitOps are the four operations of the model, each on its own keys: a
// claim of a new key, the completion of a claimed key with a 1 KiB answer,
// a replay read (a claim that finds the completed record), and a renewal.
func unitOps(s *redisstore.Store, n int) []unitOp {
	ctx := context.Background()
	key := func(kind string, i int) string { return s.Codec().Key("units", kind, strconv.Itoa(i)) }
	token := func(i int) claim.Token {
		var t claim.Token
		binary.LittleEndian.PutUint64(t[:], uint64(i)+1)
		return t
	}
	inProgress := func(i int) *claim.Record {
		return &claim.Record{State: claim.InProgress, Created: time.Now(), Token: token(i)}
	}
	claimed := func(kind string, i int) error {
		res, err := s.Claim(ctx, key(kind, i), inProgress(i), 10*time.Second, claim.Quota{})
		if err == nil && !res.Claimed {
			err = fmt.Errorf("key %d: not claimed", i)
		}
		return err
	}
	complete := func(kind string, i int) error {
		rec := unitRecord(1024)
		rec.Token = token(i)
		how, err := s.Complete(ctx, key(kind, i), rec, time.Hour)
		if err == nil && how != claim.Stored {
			err = fmt.Errorf("key %d: %v", i, how)
		}
		return err
	}
	// Keys for completion, replay and renewal are prepared untimed: the
	// measured loop runs one kind of operation only.
	prepare := func(kind string, then func(string, int) error) func() error {
		return func() error {
			for i := range n {
				if err := claimed(kind, i); err != nil {
					return err
				}
				if then != nil {
					if err := then(kind, i); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	return []unitOp{
		{"claim (new key)", nil, func(i int) error { return claimed("claim", i) }},
		{"complete (1 KiB answer)", prepare("complete", nil), func(i int) error { return complete("complete", i) }},
		{"replay read", prepare("replay", complete), func(i int) error {
			res, err := s.Claim(ctx, key("replay", i), inProgress(n+i), 10*time.Second, claim.Quota{})
			if err == nil && (res.Claimed || res.Existing == nil || res.Existing.State != claim.Completed) {
				err = fmt.Errorf("key %d: not a replay", i)
			}
			return err
		}},
		{"renewal", prepare("renew", nil), func(i int) error {
			return s.Renew(ctx, key("renew", i), inProgress(i), 10*time.Second)
		}},
	}
}

// unitRecord is a completed record with a 4-header answer of size bytes
// and a 32-byte request id, as docs/scaling.md measures it.
func unitRecord(size int) *claim.Record {
	now := time.Now()
	return &claim.Record{
		State: claim.Completed, Created: now, Completed: now, RequestID: "0123456789abcdef0123456789abcdef",
		Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Date": {now.UTC().Format(http.TimeFormat)},
			"Content-Length": {strconv.Itoa(size)}, "X-Request-Id": {"0123456789abcdef0123456789abcdef"}},
		Body: []byte(strings.Repeat("x", size)),
	}
}

type opCost struct{ cpu, command, in, out float64 }

// measureOp runs op's setup, then op.do(0..n-1) over workers goroutines and divides Redis'
// counters' growth by n.
func measureOp(c redis.UniversalClient, n, workers int, op unitOp) (opCost, error) {
	if op.setup != nil {
		if err := op.setup(); err != nil {
			return opCost{}, err
		}
	}
	do := op.do
	before, err := redisCounters(c)
	if err != nil {
		return opCost{}, err
	}
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := do(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return opCost{}, first
	}
	after, err := redisCounters(c)
	if err != nil {
		return opCost{}, err
	}
	per := func(k string) float64 { return (after[k] - before[k]) / float64(n) }
	return opCost{cpu: per("cpu") * 1e6, command: per("usec"), in: per("in"), out: per("out")}, nil
}

// redisCounters reads CPU seconds, total command µs (every command but
// INFO) and network bytes from INFO.
func redisCounters(c redis.UniversalClient) (map[string]float64, error) {
	info, err := c.Info(context.Background(), "cpu", "commandstats", "stats").Result()
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			m["cpu"] += f
		case k == "total_net_input_bytes":
			m["in"], _ = strconv.ParseFloat(v, 64)
		case k == "total_net_output_bytes":
			m["out"], _ = strconv.ParseFloat(v, 64)
		case strings.HasPrefix(k, "cmdstat_") && k != "cmdstat_info":
			for f := range strings.SplitSeq(v, ",") {
				if u, ok := strings.CutPrefix(f, "usec="); ok {
					x, _ := strconv.ParseFloat(u, 64)
					m["usec"] += x
				}
			}
		}
	}
	return m, nil
}

// recordSizes stores completed records with answers of several sizes in
// each stored form (store.record_format 1 and 3, sealed) and reads their
// MEMORY USAGE (value, key and Redis' per-key overhead).
func recordSizes(b *strings.Builder, c redis.UniversalClient) error {
	key := make([]byte, 32)
	rand.Read(key)
	sealing, err := claim.WithSealing([][]byte{key}, true, nil)
	if err != nil {
		return err
	}
	stores := []*redisstore.Store{
		redisstore.New(c, "sz1p:"),
		redisstore.New(c, "sz3p:", claim.WithCompactRecords()),
		redisstore.New(c, "szsl:", sealing),
	}
	fmt.Fprintf(b, "\nBytes per completed record (`MEMORY USAGE`, SAMPLES 0), 4 headers, 32-byte request id:\n\n| answer body | record_format 1 or 2 | record_format 3 | sealed |\n|---|---|---|---|\n")
	for i, size := range []int{0, 1024, 4096, 16384, 65536} {
		fmt.Fprintf(b, "| %d |", size)
		for _, s := range stores {
			done := unitRecord(size)
			used, err := storedSize(c, s, strconv.Itoa(i), done)
			if err != nil {
				return err
			}
			fmt.Fprintf(b, " %d |", used)
		}
		b.WriteByte('\n')
	}
	return jsonRecordSizes(b, c)
}

// storedSize claims a key of s named by name, completes it with done and
// returns the key's MEMORY USAGE.
func storedSize(c redis.UniversalClient, s *redisstore.Store, name string, done *claim.Record) (int64, error) {
	ctx := context.Background()
	k := s.Codec().Key("units", "size", name)
	rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
	rand.Read(rec.Token[:])
	if _, err := s.Claim(ctx, k, rec, 10*time.Second, claim.Quota{}); err != nil {
		return 0, err
	}
	done.Token = rec.Token
	if _, err := s.Complete(ctx, k, done, time.Hour); err != nil {
		return 0, err
	}
	used, err := c.MemoryUsage(ctx, k, 0).Result()
	if err == nil && used == 0 {
		err = fmt.Errorf("no MEMORY USAGE for %s", k)
	}
	return used, err
}

// jsonRecordSizes is recordSizes for realistic JSON answers (a payment
// object of about 3 KB, and 1 KiB and 16 KiB lists of them, every id,
// amount and time its own): as they come, and compressed
// (store.compression: zstd, under store.record_format 3).
func jsonRecordSizes(b *strings.Builder, c redis.UniversalClient) error {
	stores := []*redisstore.Store{
		redisstore.New(c, "js1p:"),
		redisstore.New(c, "js3p:", claim.WithCompactRecords()),
		redisstore.New(c, "js3z:", claim.WithCompactRecords(), claim.WithCompression()),
	}
	fmt.Fprintf(b, "\nBytes per completed record with a JSON answer (`MEMORY USAGE`, SAMPLES 0), 4 headers, 32-byte request id:\n\n| answer body | record_format 1 or 2 | record_format 3 | record_format 3, compression zstd | ratio to format 1 |\n|---|---|---|---|---|\n")
	for i, size := range []int{1024, 3 * 1024, 16 * 1024} {
		body := jsonBody(size, int64(i))
		var used [3]int64
		for j, s := range stores {
			done := unitRecord(0)
			done.Body = body
			done.Header.Set("Content-Length", strconv.Itoa(len(body)))
			var err error
			if used[j], err = storedSize(c, s, "json"+strconv.Itoa(i), done); err != nil {
				return err
			}
		}
		fmt.Fprintf(b, "| %d B JSON | %d | %d | %d | %.2f |\n", len(body), used[0], used[1], used[2], float64(used[2])/float64(used[0]))
	}
	return nil
}

// jsonBody is about size bytes of payment objects as a legacy API
// answers them: the same members, every value its own.
func jsonBody(size int, seed int64) []byte {
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[`)
	for i := 0; b.Len() < size-2; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		r := make([]byte, 12)
		rand.Read(r)
		id := fmt.Sprintf("%x", r)
		fmt.Fprintf(&b, `{"id":"pi_%s","object":"payment_intent","amount":%d,"amount_received":%d,"currency":"eur","status":"succeeded","created":%d,"customer":"cus_%s","description":"Order #%d","metadata":{"order_id":"%d","channel":"web"},"payment_method_types":["card"],"latest_charge":"ch_%s","receipt_email":"buyer%d@example.com"}`,
			id, 1000+i*37+int(seed), 1000+i*37+int(seed), 1764566400+i*61, id[:14], 10000+i, 10000+i, id[4:20], i)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

func redisVersion(c redis.UniversalClient) string {
	info, _ := c.Info(context.Background(), "server").Result()
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return v
		}
	}
	return "?"
}

// usedMemoryPerRecord stores n completed records made by mk (given the
// record's index) through s, and returns how much Redis' used_memory grew
// per record: what MEMORY USAGE leaves out (the main and expires tables'
// buckets and entries) included. The keys are deleted again.
func usedMemoryPerRecord(c redis.UniversalClient, s *redisstore.Store, name string, n int, mk func(i int) *claim.Record) (float64, error) {
	ctx := context.Background()
	used := func() (float64, error) {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				return strconv.ParseFloat(v, 64)
			}
		}
		return 0, errors.New("no used_memory in INFO memory")
	}
	before, err := used()
	if err != nil {
		return 0, err
	}
	keys := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				keys[i] = s.Codec().Key("units", "mem:"+name, strconv.Itoa(i))
				rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
				rand.Read(rec.Token[:])
				if _, err := s.Claim(ctx, keys[i], rec, 10*time.Second, claim.Quota{}); err != nil {
					errs <- err
					return
				}
				done := mk(i)
				done.Token = rec.Token
				if _, err := s.Complete(ctx, keys[i], done, time.Hour); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	after, err := used()
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i += 1000 {
		c.Unlink(ctx, keys[i:min(i+1000, n)]...)
	}
	return (after - before) / float64(n), nil
}

// modelCheck stores records of several answer sizes in each stored form
// and sets Redis' used_memory growth per record beside what the sizing
// model (internal/sizing) says for them.
func modelCheck(b *strings.Builder, c redis.UniversalClient, n int) error {
	key := make([]byte, 32)
	rand.Read(key)
	sealing, err := claim.WithSealing([][]byte{key}, true, nil)
	if err != nil {
		return err
	}
	forms := []struct {
		name  string
		store *redisstore.Store
		load  func(l *sizing.Load)
		json  bool
	}{
		{"record_format 1", redisstore.New(c, "mm1p:"), func(*sizing.Load) {}, false},
		{"record_format 3", redisstore.New(c, "mm3p:", claim.WithCompactRecords()), func(l *sizing.Load) { l.Format = 3 }, false},
		{"sealed", redisstore.New(c, "mmsl:", sealing), func(l *sizing.Load) { l.Sealed = true }, false},
		{"record_format 3, zstd, JSON", redisstore.New(c, "mm3z:", claim.WithCompactRecords(), claim.WithCompression()), func(l *sizing.Load) { l.Format, l.Compression = 3, true }, true},
	}
	fmt.Fprintf(b, "\nThe sizing model against Redis: used_memory growth per record, %d records per row, 4 headers, 32-byte request id:\n\n| stored form | answer body | used_memory per record | the model | model error |\n|---|---|---|---|---|\n", n)
	for _, f := range forms {
		for _, size := range []int{0, 512, 1024, 2048, 3072, 4096, 16384} {
			if f.json && size < 1024 {
				continue
			}
			body := []byte(strings.Repeat("x", size))
			if f.json {
				body = jsonBody(size, int64(size))
			}
			got, err := usedMemoryPerRecord(c, f.store, f.name+strconv.Itoa(size), n, func(int) *claim.Record {
				r := unitRecord(0)
				r.Body = body
				r.Header.Set("Content-Length", strconv.Itoa(len(body)))
				return r
			})
			if err != nil {
				return err
			}
			l := sizing.Load{NewKeysPerSecond: 1, Retention: time.Hour, ResponseBytes: len(body)}
			f.load(&l)
			model := sizing.Size(l).BytesPerRecord
			fmt.Fprintf(b, "| %s | %d | %.0f | %.0f | %+.1f%% |\n", f.name, len(body), got, model, 100*(model-got)/got)
		}
	}
	return nil
}
