package claim

import (
	"crypto/rand"
	"encoding/binary"
)

// Sealed streams. On a sealing store a streamed record seals its head and
// each chunk on its own, as it is stored, so that readers open every chunk
// as soon as it lands (the record is never sealed whole). The fixed header
// stays readable, as for every sealed record: the scripts fence on its
// token, length, end byte and lease.
//
// The head (flagSealed set, the status slot zero): bytes 70..73 hold the
// length of key id (4), nonce (12) and the ciphertext of the status (2
// bytes) and the head's fields, with GCM's tag. Its additional data is
// the Redis key and the parts of the fixed header that never change
// (version, state, flags, token, fingerprint, created, status slot): the
// completed slot and the end byte change while the stream runs.
//
// Each chunk is a frame: kind (1: frameData, or frameEnd), the length of
// the ciphertext (4), key id (4), nonce (12), then the ciphertext with
// its tag; 37 bytes more than the chunk. Its additional data is the Redis
// key, the owner's token, the frame's offset in the value (its index:
// a frame moved, dropped or replayed elsewhere does not open) and its
// kind. A normal end appends an empty frameEnd in the same script that
// records the end, so an end byte set by hand over an aborted stream does
// not make a truncated stream a whole one: a reader that finds the stream
// ended without its end frame takes the record for tampered.

const (
	frameData byte = 1
	frameEnd  byte = 2
	// frameHeader is a frame's length before its ciphertext.
	frameHeader = 1 + 4 + keyIDLen + nonceLen
)

// sealStreamHead seals a plain stream head (encodeStreamHead's value).
func (s *sealer) sealStreamHead(key string, head []byte) []byte {
	k := s.keys[0]
	fields := head[streamPrefix:]
	out := make([]byte, streamPrefix, streamPrefix+keyIDLen+nonceLen+2+len(fields)+k.aead.Overhead())
	copy(out, head[:streamPrefix])
	out, nonce := k.sealedPrefix(out)
	plain := make([]byte, 2, 2+len(fields))
	copy(plain, head[offStatus:offStatus+2])
	plain = append(plain, fields...)
	out = k.aead.Seal(out, nonce, plain, streamHeadAAD(key, out))
	binary.BigEndian.PutUint32(out[offStreamHead:], uint32(len(out)-streamPrefix))
	return out
}

// streamHeadAAD is a sealed stream head's additional data: key and the
// fixed header's parts that never change.
func streamHeadAAD(key string, b []byte) []byte {
	a := make([]byte, 0, len(key)+1+headerLen)
	a = append(a, key...)
	a = append(a, 0)
	a = append(a, b[:offCompleted]...)
	return append(a, b[offStatus:headerLen]...)
}

// sealFrame seals data as the frame of kind stored at offset at of key's
// value, written by token's owner.
func (s *sealer) sealFrame(key string, token Token, at int, kind byte, data []byte) []byte {
	k := s.keys[0]
	out := make([]byte, frameHeader, frameHeader+len(data)+k.aead.Overhead())
	out[0] = kind
	binary.BigEndian.PutUint32(out[1:], uint32(len(data)+k.aead.Overhead()))
	copy(out[5:], k.id[:])
	nonce := out[5+keyIDLen : frameHeader]
	_, _ = rand.Read(nonce) // crypto/rand does not fail
	return k.aead.Seal(out, nonce, data, frameAAD(key, token, at, kind))
}

func frameAAD(key string, token Token, at int, kind byte) []byte {
	a := make([]byte, 0, len(key)+1+len(token)+9)
	a = append(a, key...)
	a = append(a, 0)
	a = append(a, token[:]...)
	a = binary.BigEndian.AppendUint64(a, uint64(at))
	return append(a, kind)
}

// openFrames opens the whole frames of b, the value's bytes from offset
// from on: it returns their chunks, how many bytes of b they took, and
// whether the end frame was among them (always the last). A partial frame
// at the end is left for the next read; need is then its whole length.
func (s *sealer) openFrames(key string, token Token, from int, b []byte) (plain []byte, used, need int, end bool, err error) {
	for used < len(b) {
		rest := b[used:]
		if len(rest) < frameHeader {
			return plain, used, frameHeader, end, nil
		}
		kind, n := rest[0], int(binary.BigEndian.Uint32(rest[1:]))
		if end || kind != frameData && kind != frameEnd {
			return nil, 0, 0, false, &RecordError{ReasonTampered}
		}
		if len(rest) < frameHeader+n {
			return plain, used, frameHeader + n, end, nil
		}
		chunk, err := s.openFrame(key, token, from+used, rest[:frameHeader+n])
		if err != nil {
			return nil, 0, 0, false, err
		}
		plain = append(plain, chunk...)
		used += frameHeader + n
		end = kind == frameEnd
	}
	return plain, used, 0, end, nil
}

// openFrame opens one whole frame stored at offset at.
func (s *sealer) openFrame(key string, token Token, at int, f []byte) ([]byte, error) {
	chunk, err := s.openWith(f[5:5+keyIDLen], f[5+keyIDLen:frameHeader], f[frameHeader:], frameAAD(key, token, at, f[0]))
	if err == nil && f[0] == frameEnd && len(chunk) != 0 {
		return nil, &RecordError{ReasonTampered}
	}
	return chunk, err
}

// openStream decodes a sealed streamed record stored under key: its head
// and every chunk, opened. Its StreamLen is the stored value's length.
func (s *sealer) openStream(key string, b []byte) (*Record, error) {
	if len(b) < streamPrefix {
		return nil, &RecordError{ReasonCorrupt}
	}
	n := int(binary.BigEndian.Uint32(b[offStreamHead:]))
	if n < keyIDLen+nonceLen || n > len(b)-streamPrefix {
		return nil, &RecordError{ReasonCorrupt}
	}
	blob := b[streamPrefix : streamPrefix+n]
	id, nonce, ct := blob[:keyIDLen], blob[keyIDLen:keyIDLen+nonceLen], blob[keyIDLen+nonceLen:]
	fields, err := s.openWith(id, nonce, ct, streamHeadAAD(key, b))
	if err != nil {
		return nil, err
	}
	if len(fields) < 2 {
		return nil, &RecordError{ReasonTampered}
	}
	var token Token
	copy(token[:], b[offToken:])
	chunks, used, _, end, err := s.openFrames(key, token, streamPrefix+n, b[streamPrefix+n:])
	if err != nil {
		return nil, err
	}
	if streamPrefix+n+used != len(b) {
		return nil, &RecordError{ReasonCorrupt} // appends are whole: a partial frame was written by hand
	}
	// The value as an unsealed stream would hold it, decoded as one.
	plain := make([]byte, streamPrefix, streamPrefix+len(fields)-2+len(chunks))
	copy(plain, b[:streamPrefix])
	plain[offFlags] &^= flagSealed
	copy(plain[offStatus:], fields[:2])
	binary.BigEndian.PutUint32(plain[offStreamHead:], uint32(len(fields)-2))
	plain = append(plain, fields[2:]...)
	plain = append(plain, chunks...)
	r := &Record{State: Streamed, KeyedFingerprint: b[offFlags]&flagKeyedFingerprint != 0, Token: token}
	if _, err := decodeStream(r, plain); err != nil {
		return nil, err
	}
	if (r.StreamEnd == StreamEnded) != end {
		return nil, &RecordError{ReasonTampered}
	}
	r.StreamLen = len(b)
	return r, nil
}
