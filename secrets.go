package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/config"
)

// secrets are the contents of every file the config names (mounted
// Secrets), read once before anything starts, so that a missing or short
// file is a start-up error naming its YAML path, and -check finds it too.
type secrets struct {
	// redis is store.redis with the passwords read from their files.
	redis config.Redis
	// postgresPassword is store.postgres.password_file's.
	postgresPassword string
	// store are the sealing and key derivation options.
	store []claim.Option
	// keySecret is store.key_secret_file's content; nil without one.
	keySecret []byte
	// adminToken enables the key API when not nil.
	adminToken []byte
	// webhooks are the webhook routes' signing secrets.
	webhooks webhookSecrets
}

// webhookSecrets are the contents of each webhook route's secret_files,
// by route name (unique: validated); kept out of the config, which is
// logged, compared at a reload and printed by tests.
type webhookSecrets map[string][][]byte

// minAdminToken is the shortest admin.token_file accepted.
const minAdminToken = 16

// readSecrets reads every file cfg names and reports every problem at
// once, each by its YAML path.
func readSecrets(cfg *config.Config) (*secrets, error) {
	sec := &secrets{redis: cfg.Store.Redis}
	var errs []error
	if err := readPasswords(&sec.redis); err != nil {
		errs = append(errs, err)
	}
	sec.postgresPassword = cfg.Store.Postgres.Password
	if f := cfg.Store.Postgres.PasswordFile; f != "" {
		if b, err := os.ReadFile(f); err != nil {
			errs = append(errs, fmt.Errorf("store.postgres.password_file: %w", err))
		} else {
			sec.postgresPassword = strings.TrimSpace(string(b))
		}
	}
	if err := cfg.Store.Postgres.ReadFiles(); err != nil {
		errs = append(errs, err)
	}
	if cfg.Store.Redis.TLSCAFile != "" {
		c, err := redisstore.NewClient(clientOptions(cfg.Store.Redis))
		if err != nil {
			errs = append(errs, fmt.Errorf("store.redis.tls_ca_file: %w", err))
		} else {
			c.Close() // built only to read the CA file; it never dialled
		}
	}
	opts, secret, err := sealingOptions(cfg.Store)
	if err != nil {
		errs = append(errs, err)
	}
	sec.store, sec.keySecret = opts, secret
	if f := cfg.Admin.TokenFile; f != "" {
		b, err := os.ReadFile(f)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("admin.token_file: %w", err))
		case len(strings.TrimSpace(string(b))) < minAdminToken:
			errs = append(errs, fmt.Errorf("admin.token_file: %s holds %d characters, want at least %d", f, len(strings.TrimSpace(string(b))), minAdminToken))
		default:
			sec.adminToken = []byte(strings.TrimSpace(string(b)))
		}
	}
	if sec.webhooks, err = readWebhookSecrets(cfg); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sec, nil
}

// sealingOptions reads the encryption key files and the key derivation
// secret (mounted Secrets, base64) into the store's options; secret is
// the key derivation secret, nil without store.key_secret_file.
func sealingOptions(st config.Store) (opts []claim.Option, secret []byte, err error) {
	if st.KeySecretFile != "" {
		if secret, err = readBase64(st.KeySecretFile, 16); err != nil {
			return nil, nil, fmt.Errorf("store.key_secret_file: %w", err)
		}
	}
	if len(st.Encryption.KeyFiles) == 0 {
		if secret != nil {
			return []claim.Option{claim.WithKeySecret(secret)}, secret, nil
		}
		return nil, nil, nil
	}
	var keys [][]byte
	for i, f := range st.Encryption.KeyFiles {
		k, err := readBase64(f, claim.KeySize)
		if err == nil && len(k) != claim.KeySize {
			err = fmt.Errorf("%s holds %d bytes, want %d (head -c 32 /dev/urandom | base64)", f, len(k), claim.KeySize)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("store.encryption.key_files[%d]: %w", i, err)
		}
		keys = append(keys, k)
	}
	opt, err := claim.WithSealing(keys, st.Encryption.Required, secret)
	if err != nil {
		return nil, nil, fmt.Errorf("store.encryption.key_files: %w", err)
	}
	return []claim.Option{opt}, secret, nil
}

// readBase64 reads a file holding base64 (surrounding space ignored) of at
// least min bytes.
func readBase64(path string, min int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%s is not base64: %w", path, err)
	}
	if len(out) < min {
		return nil, fmt.Errorf("%s holds %d bytes, want at least %d", path, len(out), min)
	}
	return out, nil
}

// readPasswords reads the passwords configured as files.
func readPasswords(r *config.Redis) error {
	var errs []error
	for _, secret := range []struct {
		key, file string
		dst       *string
	}{
		{"store.redis.password_file", r.PasswordFile, &r.Password},
		{"store.redis.sentinel_password_file", r.SentinelPasswordFile, &r.SentinelPassword},
	} {
		if secret.file == "" {
			continue
		}
		b, err := os.ReadFile(secret.file)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", secret.key, err))
			continue
		}
		*secret.dst = strings.TrimSpace(string(b))
	}
	return errors.Join(errs...)
}

// readWebhookSecrets reads every webhook route's secret files: at start,
// by -check and at a reload. Each problem names the file's YAML path.
func readWebhookSecrets(cfg *config.Config) (webhookSecrets, error) {
	var errs []error
	out := webhookSecrets{}
	for i, r := range cfg.Routes {
		for j, f := range r.Webhook.SecretFiles {
			b, err := os.ReadFile(f)
			s := strings.TrimSpace(string(b))
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("routes[%d].webhook.secret_files[%d]: %w", i, j, err))
			case len(s) < 8:
				errs = append(errs, fmt.Errorf("routes[%d].webhook.secret_files[%d]: %s holds %d characters, want the provider's signing secret", i, j, f, len(s)))
			default:
				out[r.Name] = append(out[r.Name], []byte(s))
			}
		}
	}
	return out, errors.Join(errs...)
}
