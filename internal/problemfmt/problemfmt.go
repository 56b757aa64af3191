// Package problemfmt renders idemproxy's own error answers in a shape of
// the operator's choosing (defaults.problem_body): a Go text/template over
// the problem's fields, so that clients that detect errors by the body's
// shape (most SDKs of legacy APIs: stripe-node raises only on an "error"
// member) see idemproxy's answers as errors. Envoy's local_reply_config
// body format is the model. config validates templates with it, proxy
// renders them.
package problemfmt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/template"
)

// Data is what a template sees of a problem.
type Data struct {
	// Status is the HTTP status.
	Status int
	// Type is the problem's full type URI; Code its short name, e.g.
	// key-reused.
	Type, Code string
	// Title is the problem's fixed title, Detail what was wrong with this
	// request.
	Title, Detail string
	// RetryAfter is Retry-After in seconds, 0 when none is sent.
	RetryAfter int
	// RequestID traces the answer to its log line.
	RequestID string
	// OriginalStatus is the stored response's status
	// (response-not-replayable), 0 otherwise.
	OriginalStatus int
}

// Format is a parsed problem_body with its content type.
type Format struct {
	tmpl        *template.Template
	contentType string
}

// DefaultContentType is the content type of a problem_body without
// problem_content_type.
const DefaultContentType = "application/json"

// sample is the problem a template is checked against.
var sample = Data{Status: 422, Type: "urn:idemproxy:problem:key-reused", Code: "key-reused",
	Title: "Idempotency key reused with a different request", Detail: `a "quoted" detail with a \ backslash`,
	RetryAfter: 1, RequestID: "0123456789abcdef", OriginalStatus: 201}

// Parse compiles body; an empty body is nil (problem+json). A template
// that does not parse, or that renders invalid JSON for a JSON content
// type on a sample problem, is an error.
func Parse(body, contentType string) (*Format, error) {
	if body == "" {
		return nil, nil
	}
	if contentType == "" {
		contentType = DefaultContentType
	}
	t, err := template.New("problem_body").Option("missingkey=error").Funcs(template.FuncMap{"json": jsonString}).Parse(body)
	if err != nil {
		return nil, err
	}
	f := &Format{tmpl: t, contentType: contentType}
	out, err := f.Render(sample)
	if err != nil {
		return nil, err
	}
	if isJSON(contentType) && !json.Valid(out) {
		return nil, fmt.Errorf("renders invalid JSON for %s on a sample problem: %s", contentType, out)
	}
	return f, nil
}

// Render executes the template for d.
func (f *Format) Render(d Data) ([]byte, error) {
	var b bytes.Buffer
	if err := f.tmpl.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ContentType is the media type of what Render writes.
func (f *Format) ContentType() string { return f.contentType }

// jsonString is s as a JSON string literal, quotes included.
func jsonString(s any) (string, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return "", errors.New("json: cannot encode")
	}
	return string(b), nil
}

func isJSON(contentType string) bool {
	ct := strings.ToLower(strings.TrimSpace(strings.SplitN(contentType, ";", 2)[0]))
	return ct == "application/json" || strings.HasSuffix(ct, "+json")
}
