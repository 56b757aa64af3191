package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/config"
)

// runStore is idemproxy store: what an operator does to the store itself.
// migrate installs or updates the PostgreSQL schema (store.postgres) and
// exits: for a deployment that runs with create_schema: false and
// migrates as a step of its own. copy -from-redis carries a Redis fleet's
// records into it: the copy step of a switch (docs/production.md).
func runStore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "migrate" && args[0] != "copy" && args[0] != "new-epoch" {
		return errors.New("idemproxy store: the subcommands are migrate (install or update the PostgreSQL schema of store.postgres), copy -from-redis OLD.yaml [-wait D] (every record of a drained Redis fleet into store.postgres) and new-epoch (begin a new epoch after a loss no running sidecar saw: requests first sent before it get 412)")
	}
	if args[0] == "new-epoch" {
		return newEpoch(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("idemproxy store "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "path of the YAML config file (store.postgres)")
	from := fs.String("from-redis", "", "copy: the config of the Redis fleet to copy from (its store.redis and store.key_prefix)")
	wait := fs.Duration("wait", 0, "copy: how long to wait for claims whose lease still runs (the drain not over) before refusing")
	grant := fs.String("grant", "", "migrate: the runtime role to grant what the sidecars need (USAGE on the schema, its tables' rows, EXECUTE on this version's functions)")
	if help, err := parseFlags(fs, args[1:], "store takes -config, migrate -grant, and copy -from-redis and -wait"); help || err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return configError(*path, err)
	}
	if cfg.Store.Postgres.URL == "" {
		return fmt.Errorf("%s: store.postgres.url is not set: the store commands work on the PostgreSQL store", *path)
	}
	sec, err := readSecrets(cfg)
	if err != nil {
		return configError(*path, err)
	}
	pool, err := openPool(ctx, cfg.Store.Postgres, sec, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	schema := cfg.Store.Postgres.Schema
	in, err := pgstore.Install(mctx, pool, schema, serviceVersion())
	if err != nil {
		return err
	}
	if args[0] == "migrate" {
		left := "no other version"
		if len(in.Left) > 0 {
			left = "version " + strings.Join(in.Left, ", ") + " (their functions serve pods of other releases during a rollout; drop them once none runs)"
		}
		fmt.Fprintf(stdout, "store.postgres: schema %q installed: tables, indexes and version %d of the functions (idem_v%d_*); left in place: %s\n", schema, in.Version, in.Version, left)
		if *grant != "" {
			if err := pgstore.Grant(mctx, pool, schema, *grant); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "store.postgres: role %q may use schema %q (USAGE, its tables' rows, EXECUTE on version %d's functions) and owns nothing in it\n", *grant, schema, in.Version)
		}
		return nil
	}
	if *from == "" {
		return errors.New("idemproxy store copy: -from-redis names the Redis fleet's config")
	}
	return copyFromRedis(ctx, *from, cfg, sec, pool, *wait, stdout)
}

// openPool is a pool of at most max connections on store.postgres, with
// the password file's password.
func openPool(ctx context.Context, pg config.Postgres, sec *secrets, max int32) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		return nil, fmt.Errorf("store.postgres.url: %w", err)
	}
	if sec.postgresPassword != "" {
		pcfg.ConnConfig.Password = sec.postgresPassword
	}
	// Behind a transaction pooler (PgBouncer, RDS Proxy) the next
	// statement may run on another server connection: pgx's own
	// statements prepare nothing by name; their descriptions are cached
	// per connection, and each is parsed unnamed in the same round trip.
	// The store's calls are named until such a pooler refuses one
	// (claim/pgstore/named.go).
	pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	nameConnection(pcfg.ConnConfig)
	pcfg.MaxConns = max
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("store.postgres.url: %w", err)
	}
	return pool, nil
}

// connConfig is a connection's config for a URL of store.postgres, with
// the password file's password.
func connConfig(url string, sec *secrets) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if sec.postgresPassword != "" {
		cfg.Password = sec.postgresPassword
	}
	nameConnection(cfg)
	return cfg, nil
}

// nameConnection sets application_name to idemproxy/<version>, so that
// pg_stat_activity and the server's logs say whose connection it is,
// unless the URL names it.
func nameConnection(cfg *pgx.ConnConfig) {
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "idemproxy/" + serviceVersion()
	}
}

// copyFromRedis carries every record of the Redis fleet configured in
// from into the PostgreSQL store of cfg, with what is left of its key's
// life, keeping any live record the PostgreSQL store holds already:
// settled records as they are, orphans and streams whose owner died as a
// retry of the old store would have found them (claim.CarryValue). It
// writes nothing until both configs derive the same key for the same
// request, every record opens under cfg's keys, and no claim's lease
// still runs (the drain is over; wait says how long to wait for that).
func copyFromRedis(ctx context.Context, from string, cfg *config.Config, sec *secrets, pool *pgxpool.Pool, wait time.Duration, stdout io.Writer) error {
	old, err := config.Load(from)
	if err != nil {
		return configError(from, err)
	}
	if len(old.Store.Redis.Addrs) == 0 {
		return fmt.Errorf("%s: store.redis.addrs is empty: nothing to copy from (the embedded store lives in its process)", from)
	}
	osec, err := readSecrets(old)
	if err != nil {
		return configError(from, err)
	}
	dstCodec := claim.NewCodec(cfg.Store.KeyPrefix, sec.store...)
	if err := sameKeys(claim.NewCodec(old.Store.KeyPrefix, osec.store...), dstCodec); err != nil {
		return fmt.Errorf("store copy: %s and the PostgreSQL config %w: nothing was copied", from, err)
	}
	client, err := redisstore.NewClient(clientOptions(osec.redis))
	if err != nil {
		return fmt.Errorf("store.redis.tls_ca_file: %w", err)
	}
	defer client.Close()
	src := redisstore.New(client, old.Store.KeyPrefix)
	defer src.Close()
	if err := drained(ctx, src, dstCodec, wait, stdout); err != nil {
		return err
	}
	dst := pgstore.New(pool, cfg.Store.Postgres.Schema, cfg.Store.KeyPrefix)
	defer dst.Close()
	counts := map[claim.Carry]int{}
	var kept int
	var live []string
	err = src.Records(ctx, func(key string, value []byte, ttl time.Duration, nowMS int64) error {
		how, out := claim.CarryValue(value, ttl, nowMS)
		switch how {
		case claim.CarryForeign:
			return nil
		case claim.CarryLive:
			live = append(live, key) // claimed after the check: the drain was not over
			return nil
		}
		wrote, err := dst.Import(ctx, key, out, ttl)
		if wrote {
			counts[how]++
		} else if err == nil {
			kept++
		}
		return err
	})
	fmt.Fprintf(stdout, "store copy: %d records copied from Redis with what is left of their retention (%d settled, %d orphaned claims a retry settles as outcome-unknown or reconciles, %d streams whose owner died, as aborted), %d kept (PostgreSQL held the key already)\n",
		counts[claim.CarrySettled]+counts[claim.CarryOrphan]+counts[claim.CarryAbortedStream], counts[claim.CarrySettled], counts[claim.CarryOrphan], counts[claim.CarryAbortedStream], kept)
	if err == nil && len(live) > 0 {
		err = liveError(live, "were claimed while the copy ran (the old fleet still serves?): they were not copied; drain it and copy again")
	}
	return err
}

// sameKeys proves that two codecs derive the same store key for the same
// request: the same store.key_prefix and the same key secret (or sealing
// keys, when they derive the keys).
func sameKeys(a, b *claim.Codec) error {
	if a.Prefix() != b.Prefix() {
		return fmt.Errorf("have different store.key_prefix values (%q, %q): a copied record would live under a key no sidecar derives", a.Prefix(), b.Prefix())
	}
	const principal, scope, key = "idemproxy store copy", "route:check", "known-key"
	if a.Key(principal, scope, key) != b.Key(principal, scope, key) {
		return errors.New("derive different keys for the same request (store.key_secret_file, or store.encryption.key_files when there is no key secret, differ): every copied record would be unseen and its retry would execute again")
	}
	return nil
}

// drained waits up to wait for the Redis store to hold no claim whose
// lease still runs, and checks that every record opens under the
// PostgreSQL config's keys; it lists the keys that are not ready.
func drained(ctx context.Context, src *redisstore.Store, dst *claim.Codec, wait time.Duration, stdout io.Writer) error {
	deadline := time.Now().Add(wait)
	for {
		var live, unreadable []string
		err := src.Records(ctx, func(key string, value []byte, ttl time.Duration, nowMS int64) error {
			switch how, out := claim.CarryValue(value, ttl, nowMS); how {
			case claim.CarryLive:
				live = append(live, key)
			case claim.CarrySettled, claim.CarryOrphan:
				if value[1] != byte(claim.Streamed) {
					if _, err := dst.Open(key, out); err != nil {
						unreadable = append(unreadable, key)
					}
				}
			}
			return nil
		})
		switch {
		case err != nil:
			return fmt.Errorf("store copy: read Redis: %w", err)
		case len(unreadable) > 0:
			return liveError(unreadable, "do not open under the PostgreSQL config's store.encryption.key_files: nothing was copied")
		case len(live) == 0:
			return nil
		case time.Now().After(deadline):
			return liveError(live, "are claims whose lease still runs (the drain is not over): nothing was copied; let them settle, or pass -wait")
		}
		fmt.Fprintf(stdout, "store copy: waiting for %d claims whose lease still runs\n", len(live))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// liveError names up to ten of keys, and how many there are.
func liveError(keys []string, what string) error {
	shown := keys[:min(len(keys), 10)]
	more := ""
	if len(keys) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(keys)-len(shown))
	}
	return fmt.Errorf("store copy: %d keys (%s%s) %s", len(keys), strings.Join(shown, ", "), more, what)
}

// newEpoch is idemproxy store new-epoch: a new epoch after a loss begins
// now on every node of the configured store (Redis or PostgreSQL), for a
// loss that no running sidecar saw, such as a restore while every sidecar
// was stopped (docs/production.md, Restoring the store). Requests first
// sent before it are refused 412 record-lost.
func newEpoch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idemproxy store new-epoch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "path of the YAML config file (its store)")
	if help, err := parseFlags(fs, args, "store new-epoch takes -config"); help || err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return configError(*path, err)
	}
	sec, err := readSecrets(cfg)
	if err != nil {
		return configError(*path, err)
	}
	store, closeStore, err := openOperatorStore(ctx, cfg, sec)
	if err != nil {
		return err
	}
	defer closeStore()
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	began, err := store.NewEpoch(ectx)
	if err != nil {
		return fmt.Errorf("idemproxy store new-epoch: %w", err)
	}
	for _, e := range began {
		fmt.Fprintf(stdout, "store: a new epoch after a loss began on %s at %s: requests first sent before it get 412 record-lost\n", e.Master, e.Start.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// openOperatorStore opens cfg's store for an operator's command: Redis
// (store.redis.addrs) or PostgreSQL (store.postgres.url); not the
// embedded store, which lives only inside a sidecar.
func openOperatorStore(ctx context.Context, cfg *config.Config, sec *secrets) (claim.Backend, func(), error) {
	if cfg.Store.Postgres.URL != "" {
		pool, err := openPool(ctx, cfg.Store.Postgres, sec, 2)
		if err != nil {
			return nil, nil, err
		}
		store := pgstore.New(pool, cfg.Store.Postgres.Schema, cfg.Store.KeyPrefix)
		return store, func() { store.Close(); pool.Close() }, nil
	}
	if len(sec.redis.Addrs) == 0 {
		return nil, nil, errors.New("store.redis.addrs is empty: the embedded store lives only inside a sidecar, and a new sidecar begins it empty")
	}
	client, err := redisstore.NewClient(clientOptions(sec.redis))
	if err != nil {
		return nil, nil, fmt.Errorf("store.redis.tls_ca_file: %w", err)
	}
	store := redisstore.New(client, cfg.Store.KeyPrefix)
	return store, func() { store.Close(); client.Close() }, nil
}
