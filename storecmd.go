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
	"github.com/idemproxy/idemproxy/config"
)

// runStore is idemproxy store: what an operator does to the store itself.
// migrate installs or updates the PostgreSQL schema (store.postgres) and
// exits: for a deployment that runs with create_schema: false and
// migrates as a step of its own.
func runStore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "migrate" {
		return errors.New("idemproxy store: the subcommand is migrate (install or update the PostgreSQL schema of store.postgres)")
	}
	fs := flag.NewFlagSet("idemproxy store migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "path of the YAML config file")
	if help, err := parseFlags(fs, args[1:], "store migrate takes -config only"); help || err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return configError(*path, err)
	}
	pg := cfg.Store.Postgres
	if pg.URL == "" {
		return fmt.Errorf("%s: store.postgres.url is not set: only the PostgreSQL store has a schema to migrate", *path)
	}
	sec, err := readSecrets(cfg)
	if err != nil {
		return configError(*path, err)
	}
	pcfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		return fmt.Errorf("store.postgres.url: %w", err)
	}
	if sec.postgresPassword != "" {
		pcfg.ConnConfig.Password = sec.postgresPassword
	}
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("store.postgres.url: %w", err)
	}
	defer pool.Close()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pgstore.Migrate(mctx, pool, pg.Schema); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "store.postgres: schema %q installed (tables, index, functions)\n", pg.Schema)
	return nil
}
