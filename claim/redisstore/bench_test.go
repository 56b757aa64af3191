package redisstore_test

import (
	"context"
	"encoding/binary"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

func benchRecord() *claim.Record {
	return &claim.Record{
		State: claim.Completed, Created: time.Now(), Completed: time.Now(), RequestID: "0123456789abcdef0123456789abcdef",
		Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Date": {"Sun, 29 Nov 2026 14:00:00 GMT"}, "Content-Length": {"1024"}},
		Body: []byte(strings.Repeat("x", 1024)),
	}
}

func BenchmarkRecordEncode(b *testing.B) {
	r := benchRecord()
	b.ReportAllocs()
	for b.Loop() {
		r.Encode()
	}
}

func BenchmarkRecordDecode(b *testing.B) {
	v := benchRecord().Encode()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := claim.Decode(v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKey(b *testing.B) {
	s := redisstore.New(nil, "idem:")
	b.ReportAllocs()
	for b.Loop() {
		s.Codec().Key("user-12345", "route\x00create-payment", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	}
}

// BenchmarkClaimComplete is the store's share of a first attempt against a
// real redis-server: one claim and one completion.
func BenchmarkClaimComplete(b *testing.B) {
	s := benchStore(b)
	b.ReportAllocs()
	claimComplete(b, s)
}

// claimComplete claims and completes a fresh key per iteration.
func claimComplete(b *testing.B, s *redisstore.Store) {
	ctx := context.Background()
	done := benchRecord()
	i := 0
	for b.Loop() {
		i++
		key := s.Codec().Key("bench", "route", strconv.Itoa(i))
		rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
		rec.Token[0] = byte(i)
		if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
			b.Fatal(res, err)
		}
		done.Token = rec.Token
		if _, err := s.Complete(ctx, key, done, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimCompleteWait is BenchmarkClaimComplete with WAIT 1 after
// each write, on a master with one replica: the price of wait_replicas.
func BenchmarkClaimCompleteWait(b *testing.B) {
	for _, wait := range []int{0, 1} {
		b.Run("wait_replicas="+strconv.Itoa(wait), func(b *testing.B) {
			topo := redistest.StartSentinel(b, 1)
			c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{topo.Master.Addr}})
			defer c.Close()
			var opts []claim.Option
			if wait > 0 {
				opts = append(opts, claim.WithWait(wait, 100*time.Millisecond, func(string) { b.Error("WAIT short") }))
			}
			s := redisstore.New(c, "bench:", opts...)
			if err := s.Preload(context.Background()); err != nil {
				b.Fatal(err)
			}
			claimComplete(b, s)
		})
	}
}

// BenchmarkParallelClaim is claim throughput against a real redis-server
// under concurrency, for new keys (a first attempt) and for a key that
// holds a completed record (a replay). With client and server on the same
// cores, ns/op is CPU per claim, the client's and Redis' together.
func BenchmarkParallelClaim(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	b.Run("new", func(b *testing.B) {
		var seq atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := s.Codec().Key("bench", "route", strconv.FormatInt(seq.Add(1), 36))
				rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
				if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
					b.Fatal(res, err)
				}
			}
		})
	})
	b.Run("completed", func(b *testing.B) {
		key := s.Codec().Key("bench", "route", "done")
		done := benchRecord()
		if _, err := s.Claim(ctx, key, &claim.Record{State: claim.InProgress, Token: done.Token}, 10*time.Second, claim.Quota{}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Complete(ctx, key, done, time.Hour); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
			rec.Token[0] = 1
			for pb.Next() {
				if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || res.Claimed || res.Existing.State != claim.Completed {
					b.Fatal(res, err)
				}
			}
		})
	})
}

// BenchmarkParallelPairs is the store's share of first attempts under
// concurrency: 32 goroutines each claim and complete fresh keys against a
// real redis-server, with store.pipeline on and off. ns/op is per pair;
// redis-µs/pair is the CPU Redis spent per pair (INFO cpu), and ops/batch
// how many operations each pipeline carried.
func BenchmarkParallelPairs(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run("pipeline="+strconv.FormatBool(on), func(b *testing.B) {
			srv := redistest.Start(b)
			c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}})
			defer c.Close()
			var batches, ops atomic.Int64
			s := redisstore.New(c, "bench:", claim.WithPipeline(on), claim.WithBatchObserver(func(n int) {
				batches.Add(1)
				ops.Add(int64(n))
			}))
			ctx := context.Background()
			if err := s.Preload(ctx); err != nil {
				b.Fatal(err)
			}
			done := benchRecord()
			var seq atomic.Int64
			cpu0 := redisCPU(b, c)
			b.ReportAllocs()
			b.SetParallelism(32 / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					key := s.Codec().Key("bench", "route", strconv.FormatInt(i, 36))
					rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
					binary.LittleEndian.PutUint64(rec.Token[:], uint64(i))
					if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
						b.Fatal(res, err)
					}
					c := *done
					c.Token = rec.Token
					if how, err := s.Complete(ctx, key, &c, time.Hour); err != nil || how != claim.Stored {
						b.Fatal(how, err)
					}
				}
			})
			b.ReportMetric(float64((redisCPU(b, c)-cpu0).Microseconds())/float64(b.N), "redis-µs/pair")
			if n := batches.Load(); n > 0 {
				b.ReportMetric(float64(ops.Load())/float64(n), "ops/batch")
			}
		})
	}
}

// redisCPU is the CPU time Redis has used (INFO cpu: user + system).
func redisCPU(b *testing.B, c redis.UniversalClient) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// benchStore is a Store on a fresh redis-server, scripts preloaded.
func benchStore(b *testing.B) *redisstore.Store {
	srv := redistest.Start(b)
	c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}})
	b.Cleanup(func() { c.Close() })
	s := redisstore.New(c, "bench:")
	if err := s.Preload(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkWatchWake is how soon a waiter has the answer: from the start
// of the completion to the waiter holding the completed record (woken by
// the completion's message, then one Get), against a real redis-server.
// p50-µs and p99-µs are over all iterations.
func BenchmarkWatchWake(b *testing.B) {
	s := benchStore(b)
	defer s.Close()
	ctx := context.Background()
	done := benchRecord()
	var lat []time.Duration
	i := 0
	for b.Loop() {
		i++
		key := s.Codec().Key("bench", "watch", strconv.Itoa(i))
		rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
		rec.Token[0] = byte(i)
		if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
			b.Fatal(err)
		}
		w := s.Watch(ctx, key)
		<-w.C() // live
		got := make(chan time.Time)
		go func() {
			<-w.C()
			if r, _, err := s.Get(ctx, key); err != nil || r == nil || r.State != claim.Completed {
				b.Error("woken before the record was completed", r, err)
			}
			got <- time.Now()
		}()
		start := time.Now()
		done.Token = rec.Token
		if _, err := s.Complete(ctx, key, done, time.Hour); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-got).Sub(start))
		w.Stop()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkPing is one go-redis round trip to a real redis-server: what a
// store operation cannot go below.
func BenchmarkPing(b *testing.B) {
	s := benchStore(b)
	for b.Loop() {
		if err := s.Ping(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// apClient sends every single command through go-redis' autopipeliner:
// what the store would be with go-redis' own automatic pipelining in
// place of its batcher (a claim and a completion are one command each).
type apClient struct {
	*redis.Client
	ap *redis.AutoPipeliner
}

func (c apClient) Process(ctx context.Context, cmd redis.Cmder) error { return c.ap.Process(ctx, cmd) }

// BenchmarkPipelines compares the store's own group commit (batch.go)
// with go-redis' autopipelining (half-duplex, its default, and
// full-duplex) and with no pipelining, at 1, 32 and 256 concurrent
// first attempts (a claim and a completion each) against a real
// redis-server. Besides ns/op it reports the CPU per operation of this
// process (client-µs) and of Redis (redis-µs), read from getrusage and
// INFO cpu: on a shared machine the CPU is what to compare.
func BenchmarkPipelines(b *testing.B) {
	srv := redistest.Start(b)
	modes := []struct {
		name string
		make func(b *testing.B) *redisstore.Store
	}{
		{"own", func(b *testing.B) *redisstore.Store {
			c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}})
			b.Cleanup(func() { c.Close() })
			return redisstore.New(c, "bench:", claim.WithPipeline(true))
		}},
		{"none", func(b *testing.B) *redisstore.Store {
			c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}})
			b.Cleanup(func() { c.Close() })
			return redisstore.New(c, "bench:", claim.WithPipeline(false))
		}},
		{"autopipeline", func(b *testing.B) *redisstore.Store { return apStore(b, srv.Addr, false) }},
		{"autopipeline-fullduplex", func(b *testing.B) *redisstore.Store { return apStore(b, srv.Addr, true) }},
	}
	var seq atomic.Int64 // keys are never reused, across runs
	for _, conc := range []int{1, 32, 256} {
		for _, m := range modes {
			b.Run(m.name+"/c="+strconv.Itoa(conc), func(b *testing.B) {
				s := m.make(b)
				if err := s.Preload(context.Background()); err != nil {
					b.Fatal(err)
				}
				done := benchRecord()
				op := func() {
					ctx := context.Background()
					key := s.Codec().Key("bench", "pipelines", strconv.FormatInt(seq.Add(1), 36))
					rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
					if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
						b.Fatal(res, err)
					}
					d := *done
					d.Token = rec.Token
					if _, err := s.Complete(ctx, key, &d, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
				cpu, redis0 := processCPU(b), redisCPU(b, srv.Client())
				b.ResetTimer()
				if conc == 1 {
					for range b.N {
						op()
					}
				} else {
					b.SetParallelism(max(1, conc/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							op()
						}
					})
				}
				b.StopTimer()
				b.ReportMetric((processCPU(b)-cpu).Seconds()*1e6/float64(b.N), "client-µs/op")
				b.ReportMetric((redisCPU(b, srv.Client())-redis0).Seconds()*1e6/float64(b.N), "redis-µs/op")
			})
		}
	}
}

func apStore(b *testing.B, addr string, fullDuplex bool) *redisstore.Store {
	opts := redis.DefaultBlockingAutoPipelineOptions()
	opts.FullDuplex = fullDuplex
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, AutoPipelineOptions: opts})
	b.Cleanup(func() { c.Close() })
	ap, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	return redisstore.New(apClient{Client: c, ap: ap}, "bench:", claim.WithPipeline(false))
}

// processCPU is this process' user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStreamAppend is one fenced append of a 200-byte event to a
// running stream (what a streamed event costs the store), against a real
// redis-server: besides ns/op and allocations, the script's own time on
// the server per call (redis-µs, INFO commandstats), which is what a
// streaming sidecar waits for beyond the round trip.
func BenchmarkStreamAppend(b *testing.B) {
	srv := redistest.Start(b)
	c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}})
	b.Cleanup(func() { c.Close() })
	s := redisstore.New(c, "bench:")
	defer s.Close()
	ctx := context.Background()
	key := s.Codec().Key("alice", "chat", "bench")
	owner := &claim.Record{State: claim.InProgress, Created: time.Now(), RequestID: "0123456789abcdef0123456789abcdef"}
	if res, err := s.Claim(ctx, key, owner, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		b.Fatalf("claim = %+v, %v", res, err)
	}
	head := *owner
	head.State, head.Status, head.Header = claim.Streamed, 200, http.Header{"Content-Type": {"text/event-stream"}}
	at, err := s.StreamStart(ctx, key, &head, time.Hour, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	event := []byte("data: " + strings.Repeat("x", 192) + "\n\n")
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if at, err = s.StreamAppend(ctx, key, head.Token, at, event, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	stats := c.Info(ctx, "commandstats").Val()
	for line := range strings.SplitSeq(stats, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for f := range strings.SplitSeq(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					us, _ := strconv.ParseFloat(v, 64)
					b.ReportMetric(us, "redis-µs/op")
				}
			}
		}
	}
}
