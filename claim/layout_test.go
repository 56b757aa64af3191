package claim

import "testing"

// TestLayoutRendersFromFields (issue 77): a copy of the layout gets its
// offsets from Fields, in its language's terms; a placeholder that names
// no field or no part is refused.
func TestLayoutRendersFromFields(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{LuaLayout("string.sub(cur, {{rec.token}})"), "string.sub(cur, 4, 19)"},
		{LuaLayout("string.byte(cur, {{rec.state}})"), "string.byte(cur, 2)"},
		{LuaLayout("GETRANGE 0, {{rec.streamHead.offlast}}"), "GETRANGE 0, 73"},
		{LuaLayout("{{rec.completed.at}} {{rec.completed.last}} {{rec.completed.off}} {{rec.completed.end}} {{rec.completed.len}}"), "60 67 59 67 8"},
		{SQLLayout("substring(v {{rec.token}})"), "substring(v FROM 4 FOR 16)"},
		{SQLLayout("get_byte(v, {{rec.streamEnd.off}})"), "get_byte(v, 69)"},
		{SQLLayout("{{schema}}.idem_x {{version}}"), "{{schema}}.idem_x {{version}}"},
	} {
		if c.got != c.want {
			t.Errorf("rendered %q, want %q", c.got, c.want)
		}
	}
	for _, bad := range []string{"{{rec.tokn}}", "{{rec.token.start}}"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s rendered, want it refused", bad)
				}
			}()
			LuaLayout(bad)
		}()
	}
}
