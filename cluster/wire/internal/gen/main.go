// Command gen writes the cluster wire codec, cluster/wire/codec_gen.go:
// an AppendTo and a Decode method for every struct of package wire whose
// doc comment ends in a //wire:message line. Run it with go generate
// (the directive is in codec.go); gen_test.go fails while the checked-in
// file differs from what it writes.
//
// A message is a msgpack array of its fields in the order the struct
// declares them; a field's Go type picks its form (the tables below, and
// the helpers of codec.go that they name). The field list is the struct:
//
//	//wire:message [typed] [check]
//
// typed: integers keep their Go type's width and a nil slice or pointer is
// msgpack's nil, as msgpack's reflection wrote a struct encoded as an
// array (the forwarded record); otherwise integers and lengths take their
// shortest form, a bool is 0 or 1, and an empty list is an empty array.
// check: Decode calls the type's check() error once every field is read,
// for a rule between fields.
//
// A field tagged `wire:"opt"` starts the message's optional trailing
// fields, added after its first release: AppendTo writes them only when
// that field is not empty, and Decode takes either the shorter array (the
// older form) or the whole, refusing a whole one whose first optional
// field is empty.
package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"go/types"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// output is the file gen writes, in the package's folder.
const output = "codec_gen.go"

func main() {
	src, err := generate(".")
	if err != nil {
		log.Fatalf("gen: %v", err)
	}
	if err := os.WriteFile(output, src, 0o644); err != nil {
		log.Fatalf("gen: %v", err)
	}
}

// form is how a field of one Go type is written and read: enc is the
// helper that appends a value of type arg (the field converted, when its
// type is another) to b, dec the expression that reads it from the
// decoder d, and present formats the test that a value (%s) is not empty,
// for the first of a message's optional fields.
type form struct{ enc, arg, dec, present string }

var (
	str    = form{"appendStr", "string", "d.str()", `%s != ""`}
	length = "len(%s) > 0"
)

// compact is the form of a //wire:message field, by its Go type.
var compact = map[string]form{
	"string":   str,
	"uint64":   {"appendUint", "uint64", "d.uint(math.MaxUint64)", ""},
	"uint32":   {"appendUint", "uint64", "uint32(d.uint(math.MaxUint32))", ""},
	"uint8":    {"appendUint", "uint64", "uint8(d.uint(math.MaxUint8))", ""},
	"bool":     {"appendBool01", "bool", "d.bool01()", ""},
	"[]byte":   {"appendBin", "[]byte", "d.bin()", length},
	"[][]byte": {"appendBins", "[][]byte", "d.bins()", length},
	"[]string": {"appendStrs", "[]string", "d.strs()", length},
	"[]uint64": {"appendUints", "[]uint64", "d.uints()", length},
	"[]KV":     {"appendKVs", "[]KV", "d.kvs()", length},
}

// typed is the form of a //wire:message typed field, by its Go type.
var typed = map[string]form{
	"string":   str,
	"int64":    {"appendInt64", "int64", "d.int64()", ""},
	"uint32":   {"appendUint32", "uint32", "uint32(d.uint(math.MaxUint32))", ""},
	"uint8":    {"appendUint8", "uint8", "uint8(d.uint(math.MaxUint8))", ""},
	"bool":     {"appendBool", "bool", "d.boolean()", ""},
	"[]byte":   {"appendNilBin", "[]byte", "d.nilBin()", ""},
	"*uint8":   {"appendNilUint8", "*uint8", "d.nilUint8()", ""},
	"[]string": {"appendNilStrs", "[]string", "d.nilStrs()", ""},
}

type field struct {
	name  string
	typ   string // the Go type that picks the form (a named type's underlying one)
	named string // the field's declared type when it is a named one (Code)
	form  form
	opt   bool
}

type message struct {
	name         string
	typed, check bool
	fields       []field
	opt          int // index of the first optional field, or len(fields)
}

// generate reads the package in dir and returns codec_gen.go's source.
func generate(dir string) ([]byte, error) {
	files, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	basic := map[string]string{} // named type -> its basic underlying type
	var specs []*ast.TypeSpec
	docs := map[*ast.TypeSpec]*ast.CommentGroup{}
	for _, f := range files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				if id, ok := ts.Type.(*ast.Ident); ok {
					basic[ts.Name.Name] = id.Name
				}
				docs[ts] = ts.Doc
				if ts.Doc == nil && len(gd.Specs) == 1 {
					docs[ts] = gd.Doc
				}
				specs = append(specs, ts)
			}
		}
	}
	var msgs []message
	for _, ts := range specs {
		flags, ok := directive(docs[ts])
		if !ok {
			continue
		}
		m, err := parseMessage(ts, flags, basic)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ts.Name.Name, err)
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("no //wire:message struct in %s", dir)
	}
	var out bytes.Buffer
	out.WriteString("// Code generated by go run ./internal/gen; DO NOT EDIT.\n\npackage wire\n\nimport (\n\t\"fmt\"\n\t\"math\"\n)\n")
	for _, m := range msgs {
		m.writeTo(&out)
	}
	src, err := format.Source(out.Bytes())
	if err != nil {
		return nil, fmt.Errorf("gofmt the output: %w\n%s", err, out.Bytes())
	}
	return src, nil
}

// parseDir parses the package's Go files but its tests and the output,
// in the order of their names.
func parseDir(dir string) ([]*ast.File, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if base := filepath.Base(name); base == output || strings.HasSuffix(base, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// directive returns the words after //wire:message in a doc comment.
func directive(doc *ast.CommentGroup) ([]string, bool) {
	if doc == nil {
		return nil, false
	}
	for _, c := range doc.List {
		if rest, ok := strings.CutPrefix(c.Text, "//wire:message"); ok && (rest == "" || rest[0] == ' ') {
			return strings.Fields(rest), true
		}
	}
	return nil, false
}

func parseMessage(ts *ast.TypeSpec, flags []string, basic map[string]string) (message, error) {
	m := message{name: ts.Name.Name}
	for _, f := range flags {
		switch f {
		case "typed":
			m.typed = true
		case "check":
			m.check = true
		default:
			return m, fmt.Errorf("unknown //wire:message flag %q", f)
		}
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return m, fmt.Errorf("//wire:message on a type that is not a struct")
	}
	forms := compact
	if m.typed {
		forms = typed
	}
	m.opt = -1
	for _, f := range st.Fields.List {
		typ := strings.ReplaceAll(types.ExprString(f.Type), "byte", "uint8")
		typ = strings.ReplaceAll(typ, "[]uint8", "[]byte")
		var named string
		if u, ok := basic[typ]; ok {
			named, typ = typ, strings.ReplaceAll(u, "byte", "uint8")
		}
		fm, ok := forms[typ]
		if !ok {
			return m, fmt.Errorf("field %s: no form for type %s", f.Names[0].Name, types.ExprString(f.Type))
		}
		var tag string
		if f.Tag != nil {
			t, _ := strconv.Unquote(f.Tag.Value)
			tag = reflect.StructTag(t).Get("wire")
		}
		for _, id := range f.Names {
			fd := field{name: id.Name, typ: typ, named: named, form: fm}
			switch tag {
			case "":
			case "opt":
				if m.opt >= 0 {
					return m, fmt.Errorf("field %s: a second wire:\"opt\"", id.Name)
				}
				if fm.present == "" {
					return m, fmt.Errorf("field %s: an optional group must start with a string or a list", id.Name)
				}
				fd.opt, m.opt = true, len(m.fields)
			default:
				return m, fmt.Errorf("field %s: unknown wire tag %q", id.Name, tag)
			}
			m.fields = append(m.fields, fd)
		}
	}
	if m.opt < 0 {
		m.opt = len(m.fields)
	}
	return m, nil
}

// enc is the statement that appends the field of m.
func (f field) enc() string {
	v := "m." + f.name
	if f.named != "" || f.typ != f.form.arg {
		v = fmt.Sprintf("%s(%s)", f.form.arg, v)
	}
	return fmt.Sprintf("b = %s(b, %s)", f.form.enc, v)
}

func (f field) dec() string {
	if f.named != "" {
		return fmt.Sprintf("v.%s = %s(%s)", f.name, f.named, f.form.dec)
	}
	return fmt.Sprintf("v.%s = %s", f.name, f.form.dec)
}

type printer func(format string, args ...any)

func (m message) writeTo(w *bytes.Buffer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	m.writeAppend(p)
	m.writeDecode(p)
}

func (m message) hasOpt() bool { return m.opt < len(m.fields) }

// present is the test that m's optional fields follow, on the value v.
func (m message) present(v string) string {
	first := m.fields[m.opt]
	return fmt.Sprintf(first.form.present, v+"."+first.name)
}

// body writes stmt of each field in order, the optional ones (and then
// last) inside an if opt.
func (m message) body(p printer, stmt func(field) string, last string) {
	for _, f := range m.fields[:m.opt] {
		p("%s", stmt(f))
	}
	if m.hasOpt() {
		p("if opt {")
		for _, f := range m.fields[m.opt:] {
			p("%s", stmt(f))
		}
		if last != "" {
			p("%s", last)
		}
		p("}")
	}
}

func (m message) writeAppend(p printer) {
	p("\n// AppendTo appends m's encoding to b: a msgpack array of its fields.")
	p("func (m *%s) AppendTo(b []byte) []byte {", m.name)
	if m.hasOpt() {
		p("opt := %s", m.present("m"))
		p("if opt {\nb = appendArray(b, %d)\n} else {\nb = appendArray(b, %d)\n}", len(m.fields), m.opt)
	} else {
		p("b = appendArray(b, %d)", len(m.fields))
	}
	m.body(p, field.enc, "")
	p("return b\n}")
}

func (m message) writeDecode(p printer) {
	var aliased []string
	for _, f := range m.fields {
		if f.form.dec == "d.bins()" {
			aliased = append(aliased, f.name)
		}
	}
	p("\n// Decode sets m to what AppendTo wrote in b, or leaves it and returns an error.")
	if len(aliased) > 0 {
		p("// %s are sub-slices of b; the rest is copied.", strings.Join(aliased, ", "))
	} else {
		p("// Nothing of m refers to b.")
	}
	p("func (m *%s) Decode(b []byte) error {", m.name)
	p("d := decoder{src: b}\nvar v %s", m.name)
	var last string
	if m.hasOpt() {
		p("opt := d.arrayOr(%d, %d)", m.opt, len(m.fields))
		last = fmt.Sprintf("d.present(%s, %q)", m.present("v"), m.fields[m.opt].name)
	} else {
		p("d.array(%d)", len(m.fields))
	}
	m.body(p, field.dec, last)
	p("d.end()")
	if m.check {
		p("if d.err == nil {\nd.err = v.check()\n}")
	}
	p("if d.err != nil {\nreturn fmt.Errorf(\"%s: %%w\", d.err)\n}", words(m.name))
	p("*m = v\nreturn nil\n}")
}

// words spells a type's name as lower-case words: FetchRequest is "fetch request".
func words(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}
