package problemfmt

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestHostileValues (issue 31): a template that writes a client-controlled
// string into JSON without the json function is refused, whatever field
// it is: "request_id":"{{.RequestID}}" passed the check against a benign
// sample before, and a client's X-Request-Id then added members (a second
// "code") to error bodies, the stored and replayed 502 included. Through
// json every field is safe, and so are non-JSON bodies.
func TestHostileValues(t *testing.T) {
	for _, field := range []string{"Type", "Code", "Title", "Detail", "RequestID"} {
		body := `{"error":{"code":{{json .Code}},"field":"{{.` + field + `}}"}}`
		// (The sample's own Detail has quotes: a raw .Detail was refused
		// before too, as invalid JSON.)
		if _, err := Parse(body, ""); err == nil || (field != "Detail" && !strings.Contains(err.Error(), "json ."+field)) {
			t.Errorf(".%s written raw into a JSON string: %v, want refused naming {{json .%s}}", field, err, field)
		}
		safe := `{"error":{"code":{{json .Code}},"field":{{json .` + field + `}}}}`
		f, err := Parse(safe, "")
		if err != nil {
			t.Errorf(".%s through json: %v", field, err)
			continue
		}
		for _, h := range hostile {
			d := sample
			switch field {
			case "RequestID":
				d.RequestID = h
			case "Detail":
				d.Detail = h
			}
			out, _ := f.Render(d)
			var v map[string]map[string]any
			if err := json.Unmarshal(out, &v); err != nil || len(v["error"]) != 2 {
				t.Errorf("%s with %q: %s", safe, h, out)
			}
		}
	}
	if _, err := Parse(`request {{.RequestID}} failed: {{.Detail}}`, "text/plain"); err != nil {
		t.Errorf("a text/plain body: %v", err)
	}
}
