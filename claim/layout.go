package claim

import (
	"fmt"
	"regexp"
	"strconv"
)

// The record's byte layout has one source: Fields, from the offsets the
// codec writes by. Every other copy of it (the Lua scripts, the PL/pgSQL
// functions, the SQL a backend builds in Go) names the fields it reads
// with placeholders that LuaLayout or SQLLayout render from Fields, and
// writes no offset of its own: contract.CheckNoOffsets fails a copy
// that spells one out.
//
// A placeholder is {{rec.NAME}} or {{rec.NAME.PART}}, NAME a field's name
// in Fields (token, streamEnd) and PART one of
//
//	at    its first byte, 1-based (Lua's string.byte and string.sub, SQL's substring)
//	last  its last byte, 1-based
//	off      its first byte, 0-based (SQL's get_byte and set_byte, Redis' SETRANGE)
//	offlast  its last byte, 0-based (Redis' GETRANGE)
//	end      the byte after it, 0-based: a value's least length that holds it
//	len      its length
//
// and without PART the field's whole range in the copy's language: Lua's
// "at" (one byte) or "at, last", SQL's "FROM at FOR len".

// layoutRef matches a placeholder; group 1 is the field, group 2 the part.
var layoutRef = regexp.MustCompile(`\{\{rec\.([A-Za-z]+)(?:\.([a-z]+))?\}\}`)

// LuaLayout is src, a Lua script, with its placeholders rendered. It
// panics on a placeholder that names no field or part: the scripts are
// the package's own text, rendered once when the program starts.
func LuaLayout(src string) string {
	return renderLayout(src, func(f Field) string {
		if f.Len == 1 {
			return strconv.Itoa(f.Off + 1)
		}
		return fmt.Sprintf("%d, %d", f.Off+1, f.Off+f.Len)
	})
}

// SQLLayout is src, SQL, with its placeholders rendered; it panics as
// LuaLayout does.
func SQLLayout(src string) string {
	return renderLayout(src, func(f Field) string { return fmt.Sprintf("FROM %d FOR %d", f.Off+1, f.Len) })
}

// renderLayout renders src's placeholders, a whole field's range by whole.
func renderLayout(src string, whole func(Field) string) string {
	byName := map[string]Field{}
	for _, f := range Fields() {
		byName[f.Name] = f
	}
	return layoutRef.ReplaceAllStringFunc(src, func(ref string) string {
		m := layoutRef.FindStringSubmatch(ref)
		f, ok := byName[m[1]]
		if !ok {
			panic(fmt.Sprintf("claim: layout placeholder %s names no field of Fields", ref))
		}
		switch m[2] {
		case "":
			return whole(f)
		case "at":
			return strconv.Itoa(f.Off + 1)
		case "last":
			return strconv.Itoa(f.Off + f.Len)
		case "off":
			return strconv.Itoa(f.Off)
		case "offlast":
			return strconv.Itoa(f.Off + f.Len - 1)
		case "end":
			return strconv.Itoa(f.Off + f.Len)
		case "len":
			return strconv.Itoa(f.Len)
		}
		panic(fmt.Sprintf("claim: layout placeholder %s names no part (at, last, off, offlast, end, len)", ref))
	})
}

// FieldNamed is the field of Fields called name; false when none is.
func FieldNamed(name string) (Field, bool) {
	for _, f := range Fields() {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}
