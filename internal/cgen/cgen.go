// Command cgen writes the C declarations of Go packages that define a
// binary wire or shared-memory layout: every exported struct type whose
// encoding/binary form has a fixed size becomes a C struct with
// _Static_asserts on its size and the offset of every field, and every
// exported integer or string constant becomes a #define. The C library
// includes the output instead of restating the protocol, and a test fails
// when the checked-in header differs from what cgen makes of the Go
// declarations, so the two cannot drift.
//
// Usage (from go:generate in the protocol package):
//
//	cgen -o FILE PKG[=PREFIX]...
//
// PKG is a package pattern (a directory such as "." or "../../shmring");
// PREFIX is inserted into the C names of that package's declarations
// (shmring=RING: SOFTRNIC_RING_HEADER_MAGIC, struct softrnic_ring_header).
//
// Layouts are those of encoding/binary (little-endian, no implicit
// padding), which the protocol uses on the wire. A struct whose binary
// layout differs from C's natural one is emitted packed; one of fields
// encoding/binary cannot encode (slices, strings, int) is left out.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

func main() {
	out := flag.String("o", "", "output file (default: stdout)")
	flag.Parse()
	b, err := Generate(".", flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgen:", err)
		os.Exit(1)
	}
	if *out == "" {
		if _, err := os.Stdout.Write(b); err != nil {
			fmt.Fprintln(os.Stderr, "cgen:", err)
			os.Exit(1)
		}
		return
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "cgen:", err)
		os.Exit(1)
	}
}

// listed is what `go list -json` says of one package.
type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	DepOnly    bool
}

// Generate returns the header for the package arguments (PKG[=PREFIX]),
// resolved relative to dir.
func Generate(dir string, args []string) ([]byte, error) {
	if len(args) == 0 {
		return nil, errors.New("no packages")
	}
	var patterns []string
	prefixes := map[string]string{} // pattern → prefix
	for _, a := range args {
		pat, pre, _ := strings.Cut(a, "=")
		patterns = append(patterns, pat)
		prefixes[pat] = pre
	}
	pkgs, err := goList(dir, patterns)
	if err != nil {
		return nil, err
	}
	exports := map[string]string{}
	var targets []listed
	for _, p := range pkgs {
		exports[p.ImportPath] = p.Export
		if !p.DepOnly {
			targets = append(targets, p)
		}
	}
	// Map each target back to its pattern's prefix: patterns are
	// directories, so compare absolute paths.
	prefixOf := map[string]string{}
	for _, pat := range patterns {
		abs, err := filepath.Abs(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		for _, t := range targets {
			if t.Dir == abs {
				prefixOf[t.ImportPath] = prefixes[pat]
			}
		}
	}
	g := &gen{structs: map[string]string{}, names: map[string]string{}, fieldDocs: map[types.Object][]string{}}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	// Emit in the order of the arguments, so that a package whose structs
	// others embed can be listed first.
	sort.SliceStable(targets, func(i, j int) bool { return argIndex(patterns, dir, targets[i]) < argIndex(patterns, dir, targets[j]) })
	for _, t := range targets {
		pre, ok := prefixOf[t.ImportPath]
		if !ok {
			return nil, fmt.Errorf("package %s matches no directory argument", t.ImportPath)
		}
		if err := g.pkg(fset, imp, t, pre); err != nil {
			return nil, err
		}
	}
	if err := g.emitStructs(); err != nil {
		return nil, err
	}
	return g.finish(), nil
}

func argIndex(patterns []string, dir string, p listed) int {
	for i, pat := range patterns {
		if abs, _ := filepath.Abs(filepath.Join(dir, pat)); abs == p.Dir {
			return i
		}
	}
	return len(patterns)
}

func goList(dir string, patterns []string) ([]listed, error) {
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json"}, patterns...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w\n%s", err, stderr.String())
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

type gen struct {
	out       bytes.Buffer
	structs   map[string]string         // "importpath.Name" → C struct name
	fieldDocs map[types.Object][]string // a struct's field comments, by field index
	pending   []decl                    // the structs of every package, in argument and source order
	names     map[string]string         // C name → the Go declaration that took it
}

const head = `// Code generated by internal/cgen from the Go declarations of the softrnic
// daemon protocol. DO NOT EDIT: change the Go package and run go generate.

#ifndef SOFTRNIC_PROTO_H
#define SOFTRNIC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the softrnic protocol is little-endian; this host is not"
#endif
`

func (g *gen) finish() []byte {
	var b bytes.Buffer
	b.WriteString(head)
	b.Write(g.out.Bytes())
	b.WriteString("\n#endif /* SOFTRNIC_PROTO_H */\n")
	return b.Bytes()
}

func (g *gen) claim(cname, goname string) error {
	if prev, ok := g.names[cname]; ok {
		return fmt.Errorf("%s and %s both map to the C name %s", prev, goname, cname)
	}
	g.names[cname] = goname
	return nil
}

// decl is one exported declaration with its doc comment, in source order.
type decl struct {
	pos  token.Pos
	obj  types.Object
	doc  string // the declaration's doc comment (or its group's)
	line string // a trailing line comment

	lower, path string // structs: the C name prefix and the package
}

func (g *gen) pkg(fset *token.FileSet, imp types.Importer, p listed, prefix string) error {
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ParseComments)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: imp}
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}}
	tp, err := conf.Check(p.ImportPath, fset, files, info)
	if err != nil {
		return fmt.Errorf("type-checking %s: %w", p.ImportPath, err)
	}
	docs := map[types.Object][2]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range gd.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					doc := s.Doc
					if doc == nil {
						doc = gd.Doc
					}
					docs[info.Defs[s.Name]] = [2]string{doc.Text(), s.Comment.Text()}
					if st, ok := s.Type.(*ast.StructType); ok {
						g.fieldDocs[info.Defs[s.Name]] = structFieldDocs(st)
					}
				case *ast.ValueSpec:
					doc := s.Doc
					if doc == nil && len(gd.Specs) == 1 {
						doc = gd.Doc
					}
					for _, n := range s.Names {
						docs[info.Defs[n]] = [2]string{doc.Text(), s.Comment.Text()}
					}
				}
			}
		}
	}
	var decls []decl
	scope := tp.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		d := docs[obj]
		decls = append(decls, decl{pos: obj.Pos(), obj: obj, doc: d[0], line: d[1]})
	}
	sort.Slice(decls, func(i, j int) bool {
		pi, pj := fset.Position(decls[i].pos), fset.Position(decls[j].pos)
		if pi.Filename != pj.Filename {
			return pi.Filename < pj.Filename
		}
		return pi.Offset < pj.Offset
	})

	upper := "SOFTRNIC"
	if prefix != "" {
		upper += "_" + strings.ToUpper(prefix)
	}
	fmt.Fprintf(&g.out, "\n/* ---- package %s ---- */\n", p.ImportPath)
	// Constants here; the structs of all packages come after all
	// constants (emitStructs).
	for _, d := range decls {
		c, ok := d.obj.(*types.Const)
		if !ok {
			continue
		}
		if err := g.constant(c, upper, d); err != nil {
			return err
		}
	}
	for _, d := range decls {
		if tn, ok := d.obj.(*types.TypeName); ok {
			if _, ok := tn.Type().Underlying().(*types.Struct); ok {
				d.lower, d.path = strings.ToLower(upper), p.ImportPath
				g.pending = append(g.pending, d)
			}
		}
	}
	return nil
}

// emitStructs emits the structs of every package, each after the structs
// it embeds (which may be another package's), and leaves out those that
// embed something encoding/binary cannot encode.
func (g *gen) emitStructs() error {
	fmt.Fprintf(&g.out, "\n/* ---- structs ---- */\n")
	pending := g.pending
	for len(pending) > 0 {
		var later []decl
		progress := false
		for _, d := range pending {
			done, err := g.structure(d, d.lower, d.path)
			if err != nil {
				return err
			}
			if done {
				progress = true
			} else {
				later = append(later, d)
			}
		}
		if !progress {
			break
		}
		pending = later
	}
	return nil
}

func comment(w *bytes.Buffer, text, indent string) {
	text = strings.TrimSpace(text)
	if text == "" {
		return
	}
	for _, l := range strings.Split(text, "\n") {
		l = strings.ReplaceAll(l, "*/", "* /")
		if l == "" {
			fmt.Fprintf(w, "%s//\n", indent)
		} else {
			fmt.Fprintf(w, "%s// %s\n", indent, l)
		}
	}
}

func (g *gen) constant(c *types.Const, upper string, d decl) error {
	name := c.Name()
	if n, ok := c.Type().(*types.Named); ok && n.Obj().Pkg() == c.Pkg() {
		name = joinNames(n.Obj().Name(), name)
	}
	cname := upper + "_" + strings.ToUpper(snake(name))
	var val string
	switch c.Val().Kind() {
	case constant.Int:
		v, exact := constant.Int64Val(c.Val())
		if !exact {
			u, _ := constant.Uint64Val(c.Val())
			val = fmt.Sprintf("UINT64_C(%#x)", u)
		} else if v < 0 {
			val = fmt.Sprintf("(%d)", v)
		} else if v > 0x7fffffff {
			val = fmt.Sprintf("UINT64_C(%#x)", v)
		} else {
			val = strconv.FormatInt(v, 10)
		}
	case constant.String:
		val = strconv.Quote(constant.StringVal(c.Val()))
	default:
		return nil
	}
	if err := g.claim(cname, c.Pkg().Path()+"."+c.Name()); err != nil {
		return err
	}
	comment(&g.out, d.doc, "")
	line := strings.TrimSpace(d.line)
	if line != "" {
		line = " // " + strings.ReplaceAll(line, "\n", " ")
	}
	fmt.Fprintf(&g.out, "#define %s %s%s\n", cname, val, line)
	return nil
}

// field is one field of a struct as laid out by encoding/binary.
type field struct {
	name   string // C name
	decl   string // C declaration (type, name and array bounds)
	off    int    // binary offset
	size   int
	align  int // C natural alignment
	blank  bool
	suffix string // trailing comment
}

// structure emits d's struct and reports true, or reports false when it
// embeds a struct not emitted yet (or never: one that is not fixed-size).
func (g *gen) structure(d decl, lower, path string) (bool, error) {
	tn := d.obj.(*types.TypeName)
	st := tn.Type().Underlying().(*types.Struct)
	key := path + "." + tn.Name()
	cname := lower + "_" + snake(tn.Name())
	var fields []field
	off, pads, maxAlign := 0, 0, 1
	fieldDocs := g.fieldDocs[d.obj]
	for i := range st.NumFields() {
		f := st.Field(i)
		ctype, dims, size, align, ok, err := g.ctype(f.Type())
		if err != nil {
			return false, fmt.Errorf("%s.%s: %w", key, f.Name(), err)
		}
		if !ok {
			return false, nil
		}
		name := snake(f.Name())
		if cReserved[name] {
			name += "_"
		}
		blank := f.Name() == "_"
		if blank {
			name = fmt.Sprintf("_pad%d", pads)
			pads++
		}
		fields = append(fields, field{name: name, decl: ctype + " " + name + dims, off: off, size: size, align: align,
			blank: blank, suffix: fieldDocs[i]})
		off += size
		maxAlign = max(maxAlign, align)
	}
	// Does C's natural layout put every field where encoding/binary does?
	natural, noff := true, 0
	for _, f := range fields {
		noff = (noff + f.align - 1) / f.align * f.align
		if noff != f.off {
			natural = false
		}
		noff += f.size
	}
	if (noff+maxAlign-1)/maxAlign*maxAlign != off {
		natural = false
	}
	if err := g.claim("struct "+cname, key); err != nil {
		return false, err
	}
	g.structs[key] = "struct " + cname
	fmt.Fprintln(&g.out)
	comment(&g.out, d.doc, "")
	fmt.Fprintf(&g.out, "struct %s {\n", cname)
	for _, f := range fields {
		line := ""
		if f.suffix != "" {
			line = " // " + f.suffix
		}
		fmt.Fprintf(&g.out, "\t%s;%s\n", f.decl, line)
	}
	if natural {
		fmt.Fprintf(&g.out, "};\n")
	} else {
		fmt.Fprintf(&g.out, "} __attribute__((packed));\n")
	}
	fmt.Fprintf(&g.out, "_Static_assert(sizeof(struct %s) == %d, \"struct %s: size\");\n", cname, off, cname)
	for _, f := range fields {
		if f.blank {
			continue
		}
		fmt.Fprintf(&g.out, "_Static_assert(offsetof(struct %s, %s) == %d, \"struct %s: %s\");\n", cname, f.name, f.off, cname, f.name)
	}
	return true, nil
}

// structFieldDocs returns the comment of each field (the trailing one, else
// the first line of the leading one), by field index.
func structFieldDocs(st *ast.StructType) []string {
	var out []string
	for _, f := range st.Fields.List {
		c := strings.TrimSpace(f.Comment.Text())
		if c == "" {
			c, _, _ = strings.Cut(strings.TrimSpace(f.Doc.Text()), "\n")
		}
		c = strings.ReplaceAll(c, "\n", " ")
		n := max(len(f.Names), 1)
		for range n {
			out = append(out, c)
		}
	}
	return out
}

// ctype maps a Go type to its C declaration parts: type name, array
// dimensions, binary size and C alignment. ok is false for a type
// encoding/binary cannot encode or a struct not yet emitted.
func (g *gen) ctype(t types.Type) (ctype, dims string, size, align int, ok bool, err error) {
	switch u := t.(type) {
	case *types.Named:
		if _, isStruct := u.Underlying().(*types.Struct); isStruct {
			key := u.Obj().Pkg().Path() + "." + u.Obj().Name()
			name, emitted := g.structs[key]
			if !emitted {
				return "", "", 0, 0, false, nil
			}
			s, a := g.structSize(u.Underlying().(*types.Struct))
			return name, "", s, a, true, nil
		}
		return g.ctype(u.Underlying())
	case *types.Alias:
		return g.ctype(types.Unalias(u))
	case *types.Basic:
		switch u.Kind() {
		case types.Bool, types.Uint8:
			return "uint8_t", "", 1, 1, true, nil
		case types.Int8:
			return "int8_t", "", 1, 1, true, nil
		case types.Uint16:
			return "uint16_t", "", 2, 2, true, nil
		case types.Int16:
			return "int16_t", "", 2, 2, true, nil
		case types.Uint32:
			return "uint32_t", "", 4, 4, true, nil
		case types.Int32:
			return "int32_t", "", 4, 4, true, nil
		case types.Uint64:
			return "uint64_t", "", 8, 8, true, nil
		case types.Int64:
			return "int64_t", "", 8, 8, true, nil
		case types.Float32:
			return "float", "", 4, 4, true, nil
		case types.Float64:
			return "double", "", 8, 8, true, nil
		}
		return "", "", 0, 0, false, nil
	case *types.Array:
		ct, d, s, a, ok, err := g.ctype(u.Elem())
		if !ok || err != nil {
			return "", "", 0, 0, ok, err
		}
		return ct, "[" + strconv.FormatInt(u.Len(), 10) + "]" + d, s * int(u.Len()), a, true, nil
	}
	return "", "", 0, 0, false, nil
}

func (g *gen) structSize(st *types.Struct) (size, align int) {
	align = 1
	for i := range st.NumFields() {
		_, _, s, a, _, _ := g.ctype(st.Field(i).Type())
		size += s
		align = max(align, a)
	}
	return size, align
}

// joinNames names a typed constant after its type, without repeating the
// type's words that the constant's name starts with (Op + OpOpen: OpOpen;
// WCOpcode + WCRDMAWrite: WCOpcodeRDMAWrite; QPAttrMask + AttrState:
// QPAttrMaskState; QPState + Reset: QPStateReset).
func joinNames(typ, name string) string {
	tw := words(typ)
	best := 0
	for i := range tw {
		run := ""
		for j := i; j < len(tw); j++ {
			run += tw[j]
			rest := name[min(len(run), len(name)):]
			if strings.HasPrefix(name, run) && rest != "" && unicode.IsUpper([]rune(rest)[0]) && len(run) > best {
				best = len(run)
			}
		}
	}
	return typ + name[best:]
}

// words splits a Go identifier at its camel-case boundaries, keeping
// acronyms whole (QPAttrMask: QP Attr Mask; GIDs: GIDs).
func words(s string) []string {
	r := []rune(s)
	var out []string
	start := 0
	for i := 1; i < len(r); i++ {
		prev, cur := r[i-1], r[i]
		var next rune
		if i+1 < len(r) {
			next = r[i+1]
		}
		split := false
		switch {
		case unicode.IsUpper(cur) && (unicode.IsLower(prev) || unicode.IsDigit(prev)):
			split = true
		case unicode.IsUpper(cur) && unicode.IsUpper(prev) && unicode.IsLower(next):
			// The end of an acronym, unless the lower-case letter is a
			// plural s ending the word (GIDs).
			plural := next == 's' && (i+2 >= len(r) || !unicode.IsLower(r[i+2]))
			split = !plural
		}
		if split {
			out = append(out, string(r[start:i]))
			start = i
		}
	}
	return append(out, string(r[start:]))
}

// cReserved are C keywords and standard macros a field may not be named.
var cReserved = map[string]bool{
	"auto": true, "break": true, "case": true, "char": true, "const": true, "continue": true, "default": true,
	"do": true, "double": true, "else": true, "enum": true, "extern": true, "float": true, "for": true, "goto": true,
	"if": true, "inline": true, "int": true, "long": true, "register": true, "restrict": true, "return": true,
	"short": true, "signed": true, "sizeof": true, "static": true, "struct": true, "switch": true, "typedef": true,
	"union": true, "unsigned": true, "void": true, "volatile": true, "while": true, "bool": true, "errno": true,
	"assert": true, "stdin": true, "stdout": true, "stderr": true, "unix": true, "linux": true,
}

func snake(s string) string {
	return strings.ToLower(strings.Join(words(s), "_"))
}
