package yamlfield

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

var errTest = errors.New("test: invalid")

type testInvalid struct{}

func (testInvalid) Sentinel() error { return errTest }

// check runs fn over the root of doc and returns the problems, one per
// line.
func check(t *testing.T, doc string, d Document, fn func(c *Checker[testInvalid], root *yaml.Node)) string {
	t.Helper()
	c := &Checker[testInvalid]{File: "t.yaml"}
	if root := c.Root([]byte(doc), d); root != nil && fn != nil {
		fn(c, root)
	}
	err := c.Err()
	if err == nil {
		return ""
	}
	if !errors.Is(err, errTest) {
		t.Errorf("errors.Is(%v, sentinel): got false, want true", err)
	}
	return err.Error()
}

func TestRoot(t *testing.T) {
	strict := Document{Empty: "empty", Single: true, SyntaxLine: true}
	lax := Document{Empty: "empty"}
	tests := []struct {
		name, doc string
		d         Document
		want      string
	}{
		{"empty", "", strict, "t.yaml: empty"},
		{"comments only", "# x\n", lax, "t.yaml: empty"},
		{"syntax with line", "a: [x\n", strict, "t.yaml:1: YAML syntax error: did not find expected ',' or ']'"},
		{"syntax without line", "a: [x\n", lax, "t.yaml: YAML syntax error: line 1: did not find expected ',' or ']'"},
		{"second document", "a: 1\n---\nb: 2\n", strict, "t.yaml:3: only one YAML document is allowed"},
		{"second document not read", "a: 1\n---\nb: [\n", lax, ""},
		{"empty second documents", "a: 1\n---\n---\n", strict, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, check(t, tc.doc, tc.d, nil)); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFields(t *testing.T) {
	doc := "x: &x 0\na: 1\nb: *x\n\"c d\": 2\na: 3\n5: 4\n<<: {a: 1}\n"
	var names []string
	got := check(t, doc, Document{}, func(c *Checker[testInvalid], root *yaml.Node) {
		fs := c.Fields(root, "m", "x", "a", "b")
		for _, f := range fs {
			names = append(names, f.Name)
		}
		if f, ok := fs.Get("a"); !ok || f.Val.Value != "1" {
			t.Errorf(`Get("a"): got %+v, %v; want the first a`, f, ok)
		}
	})
	want := strings.Join([]string{
		"t.yaml:3: m.b: aliases are not supported",
		`t.yaml:4: m."c d": unknown field (known: x, a, b)`,
		"t.yaml:5: m.a: duplicate key (first at line 2)",
		"t.yaml:6: m: keys must be strings (got integer 5)",
		"t.yaml:7: m: merge keys (<<) are not supported",
	}, "\n")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"x", "a"}, names); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

func TestAnyFields(t *testing.T) {
	var names []string
	got := check(t, "z: 1\n\"c d\": 2\n", Document{}, func(c *Checker[testInvalid], root *yaml.Node) {
		for _, f := range c.AnyFields(root, "") {
			names = append(names, f.Name)
		}
		c.Fields(root, "none") // no known names: every key is unknown
	})
	want := "t.yaml:1: none.z: unknown field (known: )\nt.yaml:2: none.\"c d\": unknown field (known: )"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"z", "c d"}, names); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

func TestDecoders(t *testing.T) {
	doc := "s: 5\ne: c\nb: 1\ni: 1.5\nbig: 99999999999999999999\nn: .nan\nd: 10\nds: soon\ndm: {}\n" +
		"ok_s: x\nok_e: b\nok_b: true\nok_i: -3\nok_n: 1_000.5\nok_d: 0\nok_ds: 1m\n"
	got := check(t, doc, Document{}, func(c *Checker[testInvalid], root *yaml.Node) {
		fs := c.AnyFields(root, "")
		get := func(name string) Field { f, _ := fs.Get(name); return f }
		c.Str(get("s"), "s")
		c.Enum(get("e"), "e", "a", "b")
		c.Bool(get("b"), "b")
		c.Int(get("i"), "i")
		c.Int(get("big"), "big")
		c.Number(get("n"), "n")
		c.Duration(get("d"), "d")
		c.Duration(get("ds"), "ds")
		c.Duration(get("dm"), "dm")
		if v, ok := c.Str(get("ok_s"), "ok_s"); !ok || v != "x" {
			t.Errorf("Str: got %q, %v", v, ok)
		}
		if v, ok := c.Enum(get("ok_e"), "ok_e", "a", "b"); !ok || v != "b" {
			t.Errorf("Enum: got %q, %v", v, ok)
		}
		if v, ok := c.Bool(get("ok_b"), "ok_b"); !ok || !v {
			t.Errorf("Bool: got %v, %v", v, ok)
		}
		if v, ok := c.Int(get("ok_i"), "ok_i"); !ok || v != -3 {
			t.Errorf("Int: got %v, %v", v, ok)
		}
		if v, ok := c.Number(get("ok_n"), "ok_n"); !ok || v != 1000.5 {
			t.Errorf("Number: got %v, %v", v, ok)
		}
		if v, ok := c.Duration(get("ok_d"), "ok_d"); !ok || v != 0 {
			t.Errorf("Duration(0): got %v, %v", v, ok)
		}
		if v, ok := c.Duration(get("ok_ds"), "ok_ds"); !ok || v.String() != "1m0s" {
			t.Errorf("Duration(1m): got %v, %v", v, ok)
		}
	})
	want := strings.Join([]string{
		`t.yaml:1: s: must be a string (got integer 5)`,
		`t.yaml:2: e: must be one of "a", "b" (got string "c")`,
		`t.yaml:3: b: must be true or false (got integer 1)`,
		`t.yaml:4: i: must be an integer (got number 1.5)`,
		`t.yaml:5: big: must be an integer that fits in int64 (got 99999999999999999999)`,
		`t.yaml:6: n: must be a number (got number .nan)`,
		`t.yaml:7: d: must be a Go duration with a unit, such as "1s" or "500ms" (got integer 10)`,
		`t.yaml:8: ds: must be a Go duration such as "1s" or "500ms" (got "soon")`,
		`t.yaml:9: dm: must be a Go duration such as "1s" or "500ms" (got a mapping)`,
	}, "\n")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
}

func TestMaxProblems(t *testing.T) {
	c := &Checker[testInvalid]{File: "t.yaml", MaxProblems: 2}
	for line := 5; line > 0; line-- {
		c.Errorf(line, "f", "problem %d", line)
	}
	want := "t.yaml:4: f: problem 4\nt.yaml:5: f: problem 5\nt.yaml: 3 more problems not shown (at most 2 are reported)"
	for range 2 { // Err may be called again
		if diff := cmp.Diff(want, c.Err().Error()); diff != "" {
			t.Errorf("Err (-want +got):\n%s", diff)
		}
	}
}

func TestErrors(t *testing.T) {
	var err error = Errors[testInvalid]{{File: "a.yaml", Line: 2, Field: "x", Msg: "bad"}, {File: "a.yaml", Msg: "worse"}}
	var fe *Error[testInvalid]
	if !errors.As(err, &fe) || fe.Msg != "bad" {
		t.Errorf("errors.As: got %v, want the first problem", fe)
	}
	if got, want := err.Error(), "a.yaml:2: x: bad\na.yaml: worse"; got != want {
		t.Errorf("Error: got %q, want %q", got, want)
	}
	if !errors.Is(Errors[testInvalid]{}, errTest) || !errors.Is(fe, errTest) {
		t.Error("errors.Is(sentinel): got false, want true for an empty list and for one Error")
	}
	if (&Checker[testInvalid]{}).Err() != nil {
		t.Error("Err without problems: got an error, want nil")
	}
}

func TestDescribeClip(t *testing.T) {
	long := strings.Repeat("é", 30) // 60 bytes
	tests := []struct {
		doc, want string
	}{
		{"x", `string "x"`},
		{"!!binary aGk=", "a value tagged !!binary"},
		{"*a", "an alias; aliases are not supported"},
		{"[1]", "a list"},
		{"~", "null"},
		{"yes", `string "yes"`},
		{"true", "boolean true"},
		{`"` + long + `"`, `string "` + strings.Repeat("é", 20) + `…"`},
	}
	for _, tc := range tests {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte("- &a 1\n- "+tc.doc+"\n"), &doc); err != nil {
			t.Fatal(err)
		}
		if got := Describe(doc.Content[0].Content[1]); got != tc.want {
			t.Errorf("Describe(%s): got %s, want %s", tc.doc, got, tc.want)
		}
	}
	if got, want := Join("a", "b c"), `a."b c"`; got != want {
		t.Errorf("Join: got %s, want %s", got, want)
	}
	if got, want := Join("", "b.c/d:e-f_g"), "b.c/d:e-f_g"; got != want {
		t.Errorf("Join: got %s, want %s", got, want)
	}
}
