package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/viper"
)

// EnvPrefix is the prefix of every environment override.
const EnvPrefix = "IDEMPROXY"

// MaxFileSize bounds the config file: the largest real one is a few
// hundred routes, a few tens of KiB; a path to a device or a runaway file
// must fail with a message, not fill memory.
const MaxFileSize = 4 << 20

// defaultsFromOthers sets the defaults that follow other keys, where the
// file (or the environment) does not set them: with key files, sealing is
// required (unless set: a migration window, warned about); on PostgreSQL a
// stream is stored at most every 20ms, each store being a commit.
func (c *Config) defaultsFromOthers(src viperSource) {
	if _, set := src.lookup("store.encryption.required"); !set && len(c.Store.Encryption.KeyFiles) > 0 {
		c.Store.Encryption.Required = true
	}
	if _, set := src.lookup("defaults.stream_flush_interval"); !set && c.Store.Postgres.URL != "" {
		c.Defaults.StreamFlushInterval = DefaultPostgresStreamFlushInterval
	}
}

// Load reads the YAML file at path, applies IDEMPROXY_* environment
// overrides and validates the result. The returned error lists every problem
// found, each prefixed with its YAML path.
func Load(path string) (*Config, error) {
	v := viper.New()
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	for _, k := range configKeyPaths {
		_ = v.BindEnv(k) // only fails without a key name
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	f.Close()
	switch {
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", path, err)
	case len(b) > MaxFileSize:
		return nil, fmt.Errorf("read %s: larger than the %d MiB a config file may be", path, MaxFileSize>>20)
	}
	if err := v.ReadConfig(bytes.NewReader(b)); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}

	d := &decoder{}
	c := Default()
	d.caseTwins(b)
	d.unknown(v.AllKeys())
	c.strayEnv = strayEnv(os.Environ())
	src := viperSource{v}
	for _, k := range keysOf(c, "") {
		d.decode(src, k, k.path)
	}
	c.defaultsFromOthers(src)

	if raw := v.Get("routes"); raw != nil {
		list, ok := raw.([]any)
		if !ok {
			d.errorf("routes", "must be a list of routes, got %s", describe(raw))
		}
		for i, item := range list {
			path := fmt.Sprintf("routes[%d]", i)
			m, ok := item.(map[string]any)
			if !ok {
				d.errorf(path, "must be a mapping with name and match, got %s", describe(item))
				continue
			}
			c.Routes = append(c.Routes, d.route(m, path, c.Defaults))
		}
	}
	return c, errors.Join(d.err(), c.validate(d.failed))
}
