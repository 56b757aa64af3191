package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/idemproxy/idemproxy/config"
)

// subcommands are the commands that come first: idemproxy demo, keys,
// size and store.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"demo": runDemo, "keys": runKeys, "size": runSize, "store": runStore,
}

// run is the whole program: it parses args, and either checks a config,
// runs the demo, or serves until ctx is cancelled and in-flight requests
// have settled.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		if sub := subcommands[args[0]]; sub != nil {
			return sub(ctx, args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "path of the YAML config file")
	check := fs.Bool("check", false, "validate the config file and exit")
	version := fs.Bool("version", false, "print build information and exit")
	skipFiles := fs.Bool("skip-files", false, "with -check: do not read the files the config names (secrets mounted only in the pod), so a rendered config can be checked in CI")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if help, err := parseFlags(fs, args, "the subcommands are demo, keys, size and store, and they come first"); help || err != nil {
		return err
	}
	if *version {
		fmt.Fprintln(stdout, buildInfo())
		return nil
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return configError(*path, err)
	}
	if *skipFiles && !*check {
		return errors.New("-skip-files goes with -check: a sidecar that serves reads every file its config names")
	}
	if *check {
		// The files it names are part of the config: a missing or short
		// token, key or password file fails the start, so it fails here,
		// unless the caller has no access to them (-skip-files).
		if !*skipFiles {
			if _, err := readSecrets(cfg); err != nil {
				return configError(*path, err)
			}
		}
		fmt.Fprintf(stdout, "%s: valid, %d routes\n", *path, len(cfg.Routes))
		if *skipFiles {
			fmt.Fprintln(stdout, "note: the files the config names were not read (-skip-files); the sidecar reads them at start and fails on a missing or bad one")
		}
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stdout, "warning: %s\n", w)
		}
		return nil
	}
	// serve filters by log_level; the handler passes everything it is given.
	// Routine lines are buffered off the requests' path; warnings and
	// errors go out at once (logBuffer).
	lines := newLogBuffer(stderr)
	defer lines.stop()
	logger := slog.New(flushing{next: slog.NewJSONHandler(lines, &slog.HandlerOptions{Level: slog.LevelDebug}), lines: lines})
	return serve(ctx, cfg, *path, logger)
}

// parseFlags parses args into fs. help is true when -h asked for the
// usage (printed; that is success); an argument left over is an error
// naming it, never ignored. hint says where such an argument belongs.
func parseFlags(fs *flag.FlagSet, args []string, hint string) (help bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("unexpected argument %q: %s (%s -h)", fs.Arg(0), hint, fs.Name())
	}
	return false, nil
}

// usage is what -h prints before the flags.
const usage = `idemproxy: a sidecar that makes retries of unsafe HTTP requests safe.

Usage:
  idemproxy [-config config.yaml]          serve
  idemproxy -config config.yaml -check     validate the config (and the files it names) and exit
  idemproxy -config f -check -skip-files   validate without reading the files it names (CI, outside the pod)
  idemproxy -version                       print build information and exit
  idemproxy demo                           the sidecar, an embedded store and a sample upstream, with a scripted show
  idemproxy keys get|delete|reconcile ...  look up, clear or reconcile one idempotency key on a running sidecar (idemproxy keys -h)
  idemproxy size ...                       the Redis memory (or, --store postgres, the disk and WAL) a traffic profile needs (idemproxy size -h)
  idemproxy store migrate [-config f] [-grant ROLE]
                                           install or update store.postgres' schema (and give ROLE,
                                           the sidecars' runtime role, what it needs) and exit
  idemproxy store copy -from-redis old.yaml [-config f] [-wait D]
                                           carry a drained Redis fleet's records into store.postgres
  idemproxy store new-epoch [-config f]    begin a new epoch after a loss no running sidecar saw (a
                                           restore while every sidecar was stopped): earlier requests get 412

Flags:
`

// configError names the config file a problem was found in: on the same
// line when there is one problem, one problem a line when there are more.
func configError(path string, err error) error {
	if strings.Contains(err.Error(), "\n") {
		return fmt.Errorf("invalid config %s:\n%w", path, err)
	}
	return fmt.Errorf("invalid config %s: %w", path, err)
}
