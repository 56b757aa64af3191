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
	"slices"
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
	if isJSON(contentType) {
		if err := f.checkHostile(out); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// hostile are values a client can put into a problem's strings (its
// X-Request-Id becomes RequestID; details quote what it sent): each breaks
// out of a JSON string written without the json function.
var hostile = []string{
	`x","code":"ok","y":"`,
	`x\`,
	"x\u0000\n\t\u001f",
	`x"}]},{"a":"`,
}

// checkHostile renders the template with each hostile value in each
// string field and requires valid JSON of the same shape as the sample's
// (benign is its rendering), with the value inside one string: so a
// client's value can never add, remove or replace a member. Strings reach
// the body safely through the json function ({{json .RequestID}}).
func (f *Format) checkHostile(benign []byte) error {
	var want any
	if err := json.Unmarshal(benign, &want); err != nil {
		return err
	}
	fields := []struct {
		name string
		set  func(*Data, string)
	}{
		{"Type", func(d *Data, v string) { d.Type = v }},
		{"Code", func(d *Data, v string) { d.Code = v }},
		{"Title", func(d *Data, v string) { d.Title = v }},
		{"Detail", func(d *Data, v string) { d.Detail = v }},
		{"RequestID", func(d *Data, v string) { d.RequestID = v }},
	}
	for _, fl := range fields {
		for _, h := range hostile {
			d := sample
			fl.set(&d, h)
			out, err := f.Render(d)
			if err != nil {
				return err
			}
			var got any
			if err := json.Unmarshal(out, &got); err != nil || shape(got) != shape(want) {
				return fmt.Errorf("a client's value in .%s changes the JSON it renders (%s): write strings through the json function, e.g. {{json .%s}}", fl.name, out, fl.name)
			}
		}
	}
	return nil
}

// shape is v's structure: its members' names and nesting, without values.
func shape(v any) string {
	switch v := v.(type) {
	case map[string]any:
		var b strings.Builder
		b.WriteString("{")
		for _, k := range sortedKeys(v) {
			fmt.Fprintf(&b, "%q:%s,", k, shape(v[k]))
		}
		return b.String() + "}"
	case []any:
		var b strings.Builder
		b.WriteString("[")
		for _, e := range v {
			b.WriteString(shape(e) + ",")
		}
		return b.String() + "]"
	case string:
		return "s"
	case float64:
		return "n"
	case bool:
		return "b"
	}
	return "null"
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
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
