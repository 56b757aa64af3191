package main

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// storeFloor is the stream floor with idemproxy's own store calls in
// place of the plain ones (bench stream -store-floor): ReverseProxy, a
// claim, the stream's head, one fenced append per read and the end, each
// through the Redis store idemproxy runs (claim/redisstore), and nothing
// else of idemproxy's. idemproxy over it is what the proxy itself costs;
// it over the floor is what the store's protocol costs (the fence of
// each append, on Redis' time and the client's).
type storeFloor struct {
	rp    *httputil.ReverseProxy
	store *redisstore.Store
	// native, with -native-append, appends each read with one native
	// command in place of the fenced script (nativeStream).
	native *redis.Client
}

// storeFloorLease is the lease the store floor claims and renews with:
// long enough for any bench stream, so that it never renews by itself.
const storeFloorLease = time.Minute

func newStoreFloor(rp *httputil.ReverseProxy, addr string, native bool) (*storeFloor, error) {
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{addr}})
	if err != nil {
		return nil, err
	}
	f := &storeFloor{rp: rp, store: redisstore.New(c, "storefloor:")}
	if native {
		f.native = redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	}
	rp.ModifyResponse = f.stream
	return f, nil
}

// storeFloorClaim is a claimed key and its owner's record, in the
// request's context.
type storeFloorClaim struct {
	key string
	rec *claim.Record
}

func (f *storeFloor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		f.rp.ServeHTTP(w, r)
		return
	}
	hashed := f.store.Codec().Key("bench", "stream", key)
	rec := &claim.Record{State: claim.InProgress, Created: time.Now(), RequestID: "0123456789abcdef0123456789abcdef"}
	rand.Read(rec.Token[:])
	res, err := f.store.Claim(r.Context(), hashed, rec, storeFloorLease, claim.Quota{})
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	case !res.Claimed:
		http.Error(w, "the key is taken", http.StatusConflict) // bench stream never retries
	default:
		ctx := context.WithValue(r.Context(), storeFloorClaim{}, storeFloorClaim{hashed, rec})
		f.rp.ServeHTTP(w, r.WithContext(ctx))
	}
}

// stream stores a streamed answer's head in place of the claim, and has
// every read of its body appended, fenced, before ReverseProxy writes it,
// and the end recorded at the upstream's end.
func (f *storeFloor) stream(resp *http.Response) error {
	c, ok := resp.Request.Context().Value(storeFloorClaim{}).(storeFloorClaim)
	if !ok {
		return nil
	}
	head := *c.rec
	head.State, head.Status = claim.Streamed, resp.StatusCode
	head.Header = http.Header{"Content-Type": resp.Header.Values("Content-Type")}
	at, err := f.store.StreamStart(resp.Request.Context(), c.key, &head, time.Hour, storeFloorLease)
	if err != nil {
		return err
	}
	if f.native != nil {
		return f.nativeStream(resp, c.key, head.Token, at)
	}
	ctx, token := resp.Request.Context(), head.Token
	resp.Body = &appending{ReadCloser: resp.Body,
		add: func(p []byte) error {
			n, err := f.store.StreamAppend(ctx, c.key, token, at, p, storeFloorLease)
			if err == nil {
				at = n
			}
			return err
		},
		end: func() error { return f.store.StreamFinish(ctx, c.key, token, claim.StreamEnded, at) },
	}
	return nil
}

// nativeStream has every read of a streamed answer appended with one
// native command, in a key of its own beside the record: an experiment
// (issue 65) that prices a stream form whose append needs no script.
// XADD with NOMKSTREAM never recreates a key that expired, and an entry
// ID no higher than the last one is refused, so that a resend after a lost
// reply lands once: the ID is the stream's length after the chunk. The
// key is in its record's slot ({record key}). What the experiment leaves
// out, a real form would need: the owner's token in the key's name, and a
// reader that judges the stream aborted appending the highest ID, which
// refuses the owner's appends after it.
func (f *storeFloor) nativeStream(resp *http.Response, key string, token claim.Token, at int) error {
	ctx := resp.Request.Context()
	chunks := "{" + key + "}:chunks"
	if err := f.native.XAdd(ctx, &redis.XAddArgs{Stream: chunks, ID: "0-1", Values: []any{"head", at}}).Err(); err != nil {
		return err
	}
	if err := f.native.PExpire(ctx, chunks, time.Hour).Err(); err != nil {
		return err
	}
	// The end is fenced on the record's own length: the chunks are not in it.
	head := at
	resp.Body = &appending{ReadCloser: resp.Body,
		add: func(p []byte) error {
			id := strconv.Itoa(at+len(p)) + "-0"
			if err := f.native.XAdd(ctx, &redis.XAddArgs{Stream: chunks, NoMkStream: true, ID: id, Values: []any{"d", p}}).Err(); err != nil {
				return err
			}
			at += len(p)
			return nil
		},
		end: func() error { return f.store.StreamFinish(ctx, key, token, claim.StreamEnded, head) },
	}
	return nil
}
