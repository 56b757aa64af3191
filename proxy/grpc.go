package proxy

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// gRPC and Connect: the fronts of protocol: grpc and protocol: connect
// routes. A unary gRPC call is an HTTP/2 POST whose body is one
// length-prefixed message and whose answer ends in trailers
// (grpc-status); idemproxy admits it as an HTTP request, fingerprints the
// message instead of the body's bytes, stores the answer's trailers with
// its headers (under http.TrailerPrefix) and frames its own answers as
// Trailers-Only statuses. A Connect unary call is a plain POST; only
// idemproxy's own answers differ (Connect's error JSON).

// The values of Route.Protocol.
const (
	ProtocolHTTP    = "http"
	ProtocolGRPC    = "grpc"
	ProtocolConnect = "connect"
)

// gRPC status codes idemproxy answers with.
const (
	grpcUnknown            = 2
	grpcInvalidArgument    = 3
	grpcNotFound           = 5
	grpcPermissionDenied   = 7
	grpcResourceExhausted  = 8
	grpcFailedPrecondition = 9
	grpcUnimplemented      = 12
	grpcInternal           = 13
	grpcUnavailable        = 14
	grpcUnauthenticated    = 16
)

// grpcCodeOf is the gRPC status of one of idemproxy's own answers, by its
// HTTP status (and for two, its type): a client's mistake is INVALID_ARGUMENT, a key reused for
// another call or a lost record FAILED_PRECONDITION, anything a retry
// later may get past (in progress, store unavailable, overload, the
// upstream's time run out while the call goes on) UNAVAILABLE, quotas and
// sizes RESOURCE_EXHAUSTED, and an outcome idemproxy cannot know UNKNOWN.
func grpcCodeOf(p problem) int {
	switch p.Type {
	case probUpstreamDown.Type: // not sent: a retry may go through
		return grpcUnavailable
	case probNotReplayable.Type: // no retry ever gets past it
		return grpcFailedPrecondition
	}
	switch p.Status {
	case http.StatusBadRequest:
		return grpcInvalidArgument
	case http.StatusUnauthorized:
		return grpcUnauthenticated
	case http.StatusForbidden:
		return grpcPermissionDenied
	case http.StatusNotFound:
		return grpcNotFound
	case http.StatusPreconditionFailed, http.StatusUnprocessableEntity:
		return grpcFailedPrecondition
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return grpcResourceExhausted
	case http.StatusConflict, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return grpcUnavailable
	case http.StatusNotImplemented:
		return grpcUnimplemented
	case http.StatusBadGateway:
		return grpcUnknown
	case http.StatusInternalServerError:
		return grpcInternal
	}
	return grpcUnknown
}

// problemHeader names an answer's problem type (its last word) beside
// its status, on gRPC and Connect answers.
const problemHeader = "Idemproxy-Problem"

// grpcFramer frames idemproxy's answers on a grpc route as Trailers-Only
// responses: HTTP 200, no message, the status in the one HEADERS frame,
// with grpc-retry-pushback-ms where the problem says when to come back.
type grpcFramer struct{}

func (grpcFramer) frame(p problem, _ string) framed {
	h := http.Header{
		"Content-Type":  {"application/grpc"},
		"Grpc-Status":   {strconv.Itoa(grpcCodeOf(p))},
		"Grpc-Message":  {grpcEncodeMessage(p.Title + ": " + p.Detail)},
		problemHeader:   {p.Type},
		"Cache-Control": {"no-store"},
	}
	if p.retryAfter > 0 {
		h["Grpc-Retry-Pushback-Ms"] = []string{strconv.FormatInt(p.retryAfter.Milliseconds(), 10)}
	}
	return framed{status: http.StatusOK, header: h, noLength: true}
}

// grpcEncodeMessage percent-encodes a grpc-message as gRPC's HTTP/2
// protocol asks: every byte outside printable ASCII, and %.
func grpcEncodeMessage(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// connectFramer frames idemproxy's answers on a connect route as Connect
// unary errors: the HTTP status Connect gives the code, and
// {"code": …, "message": …}.
type connectFramer struct{}

func (connectFramer) frame(p problem, _ string) framed {
	code := connectCodes[grpcCodeOf(p)]
	body, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code.name, p.Title + ": " + p.Detail})
	h := http.Header{"Content-Type": {"application/json"}, problemHeader: {p.Type}, "Cache-Control": {"no-store"}}
	if p.retryAfter > 0 {
		h["Retry-After"] = []string{retryAfterSeconds(p.retryAfter)}
	}
	return framed{status: code.status, header: h, body: body}
}

// connectCodes are Connect's names and HTTP statuses of the gRPC codes
// idemproxy answers with.
var connectCodes = map[int]struct {
	name   string
	status int
}{
	grpcUnknown:            {"unknown", http.StatusInternalServerError},
	grpcInvalidArgument:    {"invalid_argument", http.StatusBadRequest},
	grpcNotFound:           {"not_found", http.StatusNotFound},
	grpcPermissionDenied:   {"permission_denied", http.StatusForbidden},
	grpcResourceExhausted:  {"resource_exhausted", http.StatusTooManyRequests},
	grpcFailedPrecondition: {"failed_precondition", http.StatusBadRequest},
	grpcUnimplemented:      {"unimplemented", http.StatusNotImplemented},
	grpcInternal:           {"internal", http.StatusInternalServerError},
	grpcUnavailable:        {"unavailable", http.StatusServiceUnavailable},
	grpcUnauthenticated:    {"unauthenticated", http.StatusUnauthorized},
}

// isGRPC reports whether a request's content type is gRPC's (not
// gRPC-Web's).
func isGRPC(contentType string) bool {
	return contentType == "application/grpc" || strings.HasPrefix(contentType, "application/grpc+") || strings.HasPrefix(contentType, "application/grpc;")
}

var (
	errGRPCFrames      = errors.New("a unary call's body is one length-prefixed message: this one holds more than one, or is cut short (streaming methods are not protected)")
	errGRPCEncoding    = errors.New("the message is compressed with an encoding idemproxy cannot read (identity and gzip are read)")
	errGRPCCompression = errors.New("the compressed message does not decompress")
)

// grpcMessage is the one message of a unary call's body, decompressed
// (grpc-encoding identity or gzip) to at most limit bytes.
func grpcMessage(body []byte, encoding string, limit int64) ([]byte, error) {
	if len(body) < 5 || body[0] > 1 || uint64(len(body)-5) != uint64(binary.BigEndian.Uint32(body[1:5])) {
		return nil, errGRPCFrames
	}
	msg := body[5:]
	if body[0] == 0 {
		return msg, nil
	}
	if encoding != "gzip" {
		return nil, errGRPCEncoding
	}
	zr, err := gzip.NewReader(bytes.NewReader(msg))
	if err != nil {
		return nil, errGRPCCompression
	}
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, errGRPCCompression
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("the decompressed message is larger than max_request_body (%d bytes)", limit)
	}
	return out, nil
}

// protoStringField is the last value of the top-level field number n of
// a protobuf message (proto3's "last one wins"), which must be a UTF-8
// string; found is false when the message has none.
func protoStringField(msg []byte, n int) (value string, found bool, err error) {
	for len(msg) > 0 {
		tag, l := binary.Uvarint(msg)
		if l <= 0 {
			return "", false, errors.New("the message is not protobuf (a bad tag)")
		}
		msg = msg[l:]
		num, wire := int(tag>>3), int(tag&7)
		var size int
		switch wire {
		case 0:
			_, l := binary.Uvarint(msg)
			if l <= 0 {
				return "", false, errors.New("the message is not protobuf (a bad varint)")
			}
			size = l
		case 1:
			size = 8
		case 5:
			size = 4
		case 2:
			v, l := binary.Uvarint(msg)
			if l <= 0 || v > uint64(len(msg)-l) {
				return "", false, errors.New("the message is not protobuf (a bad length)")
			}
			msg, size = msg[l:], int(v)
		default:
			return "", false, fmt.Errorf("the message is not protobuf this reader takes (wire type %d)", wire)
		}
		if size > len(msg) {
			return "", false, errors.New("the message is not protobuf (cut short)")
		}
		if num == n {
			if wire != 2 {
				return "", false, fmt.Errorf("field %d is not a string", n)
			}
			if !utf8.Valid(msg[:size]) {
				return "", false, fmt.Errorf("field %d is not UTF-8", n)
			}
			value, found = string(msg[:size]), true
		}
		msg = msg[size:]
	}
	return value, found, nil
}

// grpcStatus is the gRPC status an upstream's answer carries: in its
// trailers, or in its headers (Trailers-Only); -1 without one.
func grpcStatus(header, trailer http.Header) int {
	v := trailer.Get("Grpc-Status")
	if v == "" {
		v = header.Get("Grpc-Status")
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
}

// withTrailers is the header to store for an answer with trailers: h and
// each trailer under http.TrailerPrefix, as net/http writes undeclared
// trailers.
func withTrailers(h, trailer http.Header) http.Header {
	for k, vs := range trailer {
		h[http.TrailerPrefix+k] = vs
	}
	return h
}
