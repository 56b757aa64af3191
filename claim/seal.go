package claim

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Sealing: with keys configured, the part of a record that holds what the
// upstream answered (status, request id, headers, body) is encrypted with
// AES-256-GCM. The associated data is the Redis key and the record's fixed
// header (version, state, flags, token, fingerprint, times), so a sealed
// record moved to another key, or with an edited header, does not open.
// The fixed header stays readable: the Lua scripts fence on it.
//
// Layout after the fixed header of a sealed record (flagSealed set, the
// status slot zero): key id (4 bytes), nonce (12 bytes), then the
// ciphertext of the variable part as Encode writes it, preceded by the
// status (2 bytes), with GCM's 16-byte tag.

// KeySize is the size of a sealing key: AES-256.
const KeySize = 32

const (
	keyIDLen = 4
	nonceLen = 12
)

// Reasons a stored record could not be read, the values of
// RecordError.Reason.
const (
	ReasonCorrupt    = "corrupt"     // not a record of any version this build reads
	ReasonTampered   = "tampered"    // sealed, and does not open under its key id: edited, or moved to another key
	ReasonUnknownKey = "unknown_key" // sealed under a key that is no longer configured
	ReasonUnsealed   = "unsealed"    // not sealed, and store.encryption.required is set
	ReasonNoKeys     = "no_keys"     // sealed, and no key is configured
	ReasonTooLarge   = "too_large"   // a streamed answer longer than its route stores (planted, or edited)
)

// RecordError says why a stored record could not be read. It matches
// ErrCorrupt with errors.Is.
type RecordError struct {
	Reason string
}

func (e *RecordError) Error() string { return "claim: stored record unreadable: " + e.Reason }

// Is makes every RecordError an ErrCorrupt.
func (e *RecordError) Is(target error) bool { return target == ErrCorrupt }

// sealer seals with the first of its keys and opens with any of them.
type sealer struct {
	keys []sealKey
	// required refuses records that are not sealed.
	required bool
}

type sealKey struct {
	id   [keyIDLen]byte
	aead cipher.AEAD
}

func newSealer(keys [][]byte, required bool) (*sealer, error) {
	s := &sealer{required: required}
	for i, k := range keys {
		if len(k) != KeySize {
			return nil, fmt.Errorf("key %d: %d bytes, want %d", i, len(k), KeySize)
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		var sk sealKey
		sum := sha256.Sum256(append([]byte("idemproxy key id\x00"), k...))
		copy(sk.id[:], sum[:])
		sk.aead = aead
		s.keys = append(s.keys, sk)
	}
	if len(s.keys) == 0 {
		return nil, errors.New("no key")
	}
	return s, nil
}

// derivationKey is the HMAC key for Redis key derivation taken from a
// sealing key, a subkey so that the sealing key itself is never used twice.
func derivationKey(key []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("idemproxy redis key derivation v1"))
	return m.Sum(nil)
}

// seal returns the sealed encoding of r stored under key.
func (s *sealer) seal(key string, r *Record) []byte {
	if r.Compact {
		c := *r // a sealed record keeps the fixed layout: its header is the additional data
		c.Compact = false
		r = &c
	}
	plain := r.Encode()
	k := s.keys[0]
	header := plain[:headerLen:headerLen]
	out := make([]byte, headerLen, headerLen+keyIDLen+nonceLen+2+len(plain)-headerLen+k.aead.Overhead())
	copy(out, header)
	out, nonce := k.sealedPrefix(out)
	var body []byte
	body = binary.BigEndian.AppendUint16(body, uint16(r.Status))
	body = append(body, plain[headerLen:]...)
	return k.aead.Seal(out, nonce, body, aad(key, out[:headerLen]))
}

// sealedPrefix marks out's fixed header sealed (its status slot zero:
// the status is sealed) and appends the key id and a fresh nonce.
func (k sealKey) sealedPrefix(out []byte) (_, nonce []byte) {
	out[offFlags] |= flagSealed
	binary.BigEndian.PutUint16(out[offStatus:], 0)
	out = append(out, k.id[:]...)
	n := len(out)
	out = append(out, make([]byte, nonceLen)...)
	_, _ = rand.Read(out[n:]) // crypto/rand does not fail
	return out, out[n:]
}

func aad(key string, header []byte) []byte {
	a := make([]byte, 0, len(key)+1+len(header))
	a = append(a, key...)
	a = append(a, 0)
	return append(a, header...)
}

// open decodes a value stored under key, opening it when sealed.
func (s *sealer) open(key string, b []byte) (*Record, error) {
	if len(b) < compactPrefix || b[offVersion] != version {
		return nil, &RecordError{ReasonCorrupt}
	}
	if b[offFlags]&flagSealed == 0 {
		if s != nil && s.required {
			return nil, &RecordError{ReasonUnsealed}
		}
		return decode(b)
	}
	if s == nil {
		return nil, &RecordError{ReasonNoKeys}
	}
	if len(b) > offState && State(b[offState]) == Streamed {
		return s.openStream(key, b)
	}
	if len(b) < headerLen {
		return nil, &RecordError{ReasonCorrupt}
	}
	rest := b[headerLen:]
	if len(rest) < keyIDLen+nonceLen {
		return nil, &RecordError{ReasonCorrupt}
	}
	id, nonce, ct := rest[:keyIDLen], rest[keyIDLen:keyIDLen+nonceLen], rest[keyIDLen+nonceLen:]
	body, err := s.openWith(id, nonce, ct, aad(key, b[:headerLen]))
	if err != nil {
		return nil, err
	}
	if len(body) < 2 {
		return nil, &RecordError{ReasonTampered}
	}
	plain := make([]byte, headerLen, headerLen+len(body)-2)
	copy(plain, b[:headerLen])
	plain[offFlags] &^= flagSealed
	copy(plain[offStatus:], body[:2])
	return decode(append(plain, body[2:]...))
}

// openWith opens ct under the key whose id it was sealed with: tampered
// when it does not open, unknown_key when no configured key has that id.
func (s *sealer) openWith(id, nonce, ct, additional []byte) ([]byte, error) {
	for _, k := range s.keys {
		if string(k.id[:]) != string(id) {
			continue
		}
		plain, err := k.aead.Open(nil, nonce, ct, additional)
		if err != nil {
			return nil, &RecordError{ReasonTampered}
		}
		return plain, nil
	}
	return nil, &RecordError{ReasonUnknownKey}
}
