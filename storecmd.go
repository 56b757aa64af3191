package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/config"
)

// runStore is idemproxy store: what an operator does to the store itself.
// migrate installs or updates the PostgreSQL schema (store.postgres) and
// exits: for a deployment that runs with create_schema: false and
// migrates as a step of its own. copy -from-redis moves a Redis fleet's
// settled records into it: the copy step of a switch (docs/production.md).
func runStore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "migrate" && args[0] != "copy" {
		return errors.New("idemproxy store: the subcommands are migrate (install or update the PostgreSQL schema of store.postgres) and copy -from-redis OLD.yaml (the settled records of a Redis fleet into store.postgres)")
	}
	fs := flag.NewFlagSet("idemproxy store "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "path of the YAML config file (store.postgres)")
	from := fs.String("from-redis", "", "copy: the config of the Redis fleet to copy from (its store.redis and store.key_prefix)")
	if help, err := parseFlags(fs, args[1:], "store takes -config, and copy -from-redis"); help || err != nil {
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
	if err := pgstore.Migrate(mctx, pool, cfg.Store.Postgres.Schema); err != nil {
		return err
	}
	if args[0] == "migrate" {
		fmt.Fprintf(stdout, "store.postgres: schema %q installed (tables, index, functions)\n", cfg.Store.Postgres.Schema)
		return nil
	}
	if *from == "" {
		return errors.New("idemproxy store copy: -from-redis names the Redis fleet's config")
	}
	return copyFromRedis(ctx, *from, cfg, pool, stdout)
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
	pcfg.MaxConns = max
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("store.postgres.url: %w", err)
	}
	return pool, nil
}

// copyFromRedis copies the settled records of the Redis fleet configured
// in from into the PostgreSQL store of cfg, with what is left of their
// retention, keeping any live record the PostgreSQL store holds already.
// Both configs must derive keys alike: the same store.key_prefix (the
// record's key is copied as it is), and the same key secret and sealing
// keys (a sealed record opens only under its own key).
func copyFromRedis(ctx context.Context, from string, cfg *config.Config, pool *pgxpool.Pool, stdout io.Writer) error {
	old, err := config.Load(from)
	if err != nil {
		return configError(from, err)
	}
	if len(old.Store.Redis.Addrs) == 0 {
		return fmt.Errorf("%s: store.redis.addrs is empty: nothing to copy from (the embedded store lives in its process)", from)
	}
	if old.Store.KeyPrefix != cfg.Store.KeyPrefix {
		return fmt.Errorf("store.key_prefix differs (%q in %s, %q in the PostgreSQL config): a copied record would live under a key no sidecar derives", old.Store.KeyPrefix, from, cfg.Store.KeyPrefix)
	}
	osec, err := readSecrets(old)
	if err != nil {
		return configError(from, err)
	}
	client, err := redisstore.NewClient(clientOptions(osec.redis))
	if err != nil {
		return fmt.Errorf("store.redis.tls_ca_file: %w", err)
	}
	defer client.Close()
	src := redisstore.New(client, old.Store.KeyPrefix)
	defer src.Close()
	dst := pgstore.New(pool, cfg.Store.Postgres.Schema, cfg.Store.KeyPrefix)
	defer dst.Close()
	var copied, kept int
	err = src.Settled(ctx, func(key string, value []byte, ttl time.Duration) error {
		wrote, err := dst.Import(ctx, key, value, ttl)
		if wrote {
			copied++
		} else if err == nil {
			kept++
		}
		return err
	})
	fmt.Fprintf(stdout, "store copy: %d settled records copied from Redis with what is left of their retention, %d kept (PostgreSQL held the key already)\n", copied, kept)
	return err
}
