package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, seen from this package's directory (go test runs
// a package's tests there).
const root = ".."

// skipDirs are directories of the tree that hold no sources: the .git
// store, built tools and binaries (bin/ links to the envtest binaries),
// and run output.
var skipDirs = map[string]bool{".git": true, "bin": true, "out": true}

// textFile is one text file of the tree, by its slash path from root.
type textFile struct {
	path string
	data []byte
}

// textFiles walks the tree and returns every text file: regular files
// outside skipDirs and hidden directories that hold no NUL byte. Walking
// rather than asking git keeps the test working on a tree without .git.
func textFiles(t *testing.T) []textFile {
	t.Helper()
	var out []textFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (skipDirs[rel] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil // symlinks and the like: what they point to is elsewhere
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data, 0) >= 0 {
			return nil // binary (images, fuzz corpora of bytes)
		}
		out = append(out, textFile{path: rel, data: data})
		return nil
	})
	if err != nil {
		t.Fatalf("walking the tree: %v", err)
	}
	return out
}

// citationRE matches one citation: "SPEC", then (possibly across a line
// break and a comment marker) a section, then more sections joined by
// commas, "and" or "or", or a range dash ("§3–§5", "§3-5").
var citationRE = regexp.MustCompile(`SPEC(?:\s|//|#|\*)*§\d+(?:\s*(?:,|and|or)\s*§\d+|\s*(?:–|—|-)\s*§?\d+)*`)

// citation is one "SPEC §N" reference: the sections it names and where.
type citation struct {
	file     string
	line     int
	text     string
	sections []int
	// bad says why the citation cannot be read (a reversed or huge range).
	bad string
}

// parseCitations returns the citations in data, ranges expanded.
func parseCitations(file string, data []byte) []citation {
	var out []citation
	for _, m := range citationRE.FindAllIndex(data, -1) {
		text := string(data[m[0]:m[1]])
		c := citation{file: file, line: 1 + bytes.Count(data[:m[0]], []byte("\n")), text: strings.Join(strings.Fields(text), " ")}
		c.sections, c.bad = sectionsOf(text)
		out = append(out, c)
	}
	return out
}

// numberRE finds each section number of a citation and the separator
// before it.
var numberRE = regexp.MustCompile(`(,|and|or|–|—|-)?\s*§?(\d+)`)

// sectionsOf lists the sections one citation names, in order.
func sectionsOf(text string) ([]int, string) {
	var secs []int
	for _, m := range numberRE.FindAllStringSubmatch(text[strings.Index(text, "§"):], -1) {
		n, err := strconv.Atoi(m[2])
		if err != nil {
			return nil, "section number " + m[2] + " does not parse"
		}
		isRange := m[1] == "–" || m[1] == "—" || m[1] == "-"
		if !isRange || len(secs) == 0 {
			secs = append(secs, n)
			continue
		}
		from := secs[len(secs)-1]
		if n <= from || n-from > 20 {
			return nil, "range " + strconv.Itoa(from) + " to " + strconv.Itoa(n) + " is reversed or too long"
		}
		for s := from + 1; s <= n; s++ {
			secs = append(secs, s)
		}
	}
	return secs, ""
}

// TestParseCitations pins the citation reader on the forms the tree uses.
// The inputs are assembled from parts so this file holds no citation of
// its own for TestSpecCitationsResolve to check.
func TestParseCitations(t *testing.T) {
	const spec, sec = "SPEC", "§"
	for _, tc := range []struct {
		name, in string
		want     [][]int
	}{
		{"one", "the busy test (" + spec + " " + sec + "5).", [][]int{{5}}},
		{"two digits", spec + " " + sec + "13, open loop", [][]int{{13}}},
		{"list", "(" + spec + " " + sec + "1, " + sec + "2)", [][]int{{1, 2}}},
		{"en dash range", "(" + spec + " " + sec + "3–" + sec + "5)", [][]int{{3, 4, 5}}},
		{"hyphen range without second sign", spec + " " + sec + "3-5", [][]int{{3, 4, 5}}},
		{"across a comment line", "series (" + spec + "\n// " + sec + "10): the", [][]int{{10}}},
		{"across a YAML comment", spec + "\n# " + sec + "7 describes", [][]int{{7}}},
		{"two citations", spec + " " + sec + "2 and later " + spec + " " + sec + "9.", [][]int{{2}, {9}}},
		{"no sign", spec + " 5", nil},
		{"sign without SPEC", "RFC 9110 " + sec + "7.6.1", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [][]int
			for _, c := range parseCitations("x", []byte(tc.in)) {
				if c.bad != "" {
					t.Fatalf("%q: %s", c.text, c.bad)
				}
				got = append(got, c.sections)
			}
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("sections of %q = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

// specHeadingRE is a numbered section heading of docs/spec.md.
var specHeadingRE = regexp.MustCompile(`(?m)^## (\d+)\. \S`)

// specSections returns the section numbers of docs/spec.md, in order.
func specSections(t *testing.T) []int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs", "spec.md"))
	if err != nil {
		t.Fatalf("read the spec: %v", err)
	}
	var secs []int
	for _, m := range specHeadingRE.FindAllSubmatch(data, -1) {
		n, _ := strconv.Atoi(string(m[1]))
		secs = append(secs, n)
	}
	return secs
}

// TestSpecCitationsResolve fails when a text file of the tree cites a
// section ("SPEC §N", a list or a range of them) that docs/spec.md has no
// "## N." heading for. The spec's sections must run 1, 2, 3... without gaps
// so that a citation's number says where to look.
func TestSpecCitationsResolve(t *testing.T) {
	secs := specSections(t)
	for i, n := range secs {
		if n != i+1 {
			t.Fatalf("docs/spec.md sections are numbered %v; want 1, 2, 3... in order", secs)
		}
	}
	if len(secs) == 0 {
		t.Fatal(`docs/spec.md has no "## N." section heading`)
	}
	have := make(map[int]bool, len(secs))
	for _, n := range secs {
		have[n] = true
	}
	found := 0
	for _, f := range textFiles(t) {
		for _, c := range parseCitations(f.path, f.data) {
			found++
			if c.bad != "" {
				t.Errorf("%s:%d: %q: %s", c.file, c.line, c.text, c.bad)
				continue
			}
			for _, n := range c.sections {
				if !have[n] {
					t.Errorf(`%s:%d: %q cites section %d, which docs/spec.md does not have (its sections are 1 to %d)`, c.file, c.line, c.text, n, len(secs))
				}
			}
		}
	}
	// The tree cites the spec over a hundred times; finding almost none
	// means the scan broke, not that the citations went away.
	t.Logf("%d citations checked against sections 1 to %d", found, len(secs))
	if found < 20 {
		t.Errorf("found only %d spec citations in the tree; the scan is probably broken", found)
	}
}

// headingRE is an ATX Markdown heading.
var headingRE = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*#*\s*$`)

// inlineLinkRE is a Markdown link or image inside a heading's text.
var inlineLinkRE = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// anchors returns the fragment identifiers GitHub gives the headings of a
// Markdown page: the heading's text, lower-cased, with everything but
// letters, digits, marks, '_', '-' and spaces removed and each space made
// a '-'; a repeated slug gets "-1", "-2"... Headings inside fenced code
// blocks do not count.
func anchors(md []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(md), "\n") {
		if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := slugify(inlineLinkRE.ReplaceAllString(m[1], "$1"))
		if n := seen[slug]; n > 0 {
			seen[slug] = n + 1
			slug += "-" + strconv.Itoa(n)
		} else {
			seen[slug] = 1
		}
		out[slug] = true
	}
	return out
}

// slugify is GitHub's heading-to-anchor rule on plain heading text.
func slugify(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-', r == '_', unicode.IsLetter(r), unicode.IsDigit(r), unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestAnchors pins slugify on headings whose anchors the docs link to.
func TestAnchors(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"## 5. Admission, busy test, limits", "5-admission-busy-test-limits"},
		{"## 14. Identity, tenants and hint caps", "14-identity-tenants-and-hint-caps"},
		{"### Resolving a request's class", "resolving-a-requests-class"},
		{"## Picker CPU and latency", "picker-cpu-and-latency"},
		{"## The `max_queue_wait` key", "the-max_queue_wait-key"},
		{"## Symptom → cause", "symptom--cause"},
	} {
		if got := anchors([]byte(tc.heading)); !got[tc.want] {
			t.Errorf("anchors of %q = %v, want %q", tc.heading, got, tc.want)
		}
	}
	got := anchors([]byte("## Notes\n\n```\n## not a heading\n```\n\n## Notes\n"))
	if want := map[string]bool{"notes": true, "notes-1": true}; !equalSets(got, want) {
		t.Errorf("anchors with a repeat and a fence = %v, want %v", got, want)
	}
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// mdLinkRE is a Markdown link's target: [text](target).
var mdLinkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocAnchorsResolve fails when a Markdown page links to a heading
// (page.md#anchor or #anchor) that the target page does not have, so a
// "SPEC §N" link into docs/spec.md cannot point at a renamed section.
func TestDocAnchorsResolve(t *testing.T) {
	files := textFiles(t)
	pages := map[string][]byte{}
	for _, f := range files {
		if strings.HasSuffix(f.path, ".md") {
			pages[f.path] = f.data
		}
	}
	cache := map[string]map[string]bool{}
	checked := 0
	for path, data := range pages {
		for _, m := range mdLinkRE.FindAllSubmatchIndex(data, -1) {
			target := string(data[m[2]:m[3]])
			page, frag, ok := strings.Cut(target, "#")
			if !ok || strings.Contains(page, "://") || strings.HasPrefix(page, "mailto:") {
				continue
			}
			dest := path
			if page != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(path), page))
			}
			if _, ok := pages[dest]; !ok {
				continue // not a page of this tree (or not Markdown)
			}
			if cache[dest] == nil {
				cache[dest] = anchors(pages[dest])
			}
			checked++
			if !cache[dest][frag] {
				line := 1 + bytes.Count(data[:m[0]], []byte("\n"))
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", path, line, target, dest, frag)
			}
		}
	}
	t.Logf("%d links to headings checked", checked)
	if checked == 0 {
		t.Error("found no link to a heading; the scan is probably broken")
	}
}

// pathRE is a repository path as docs/architecture.md names packages and
// files: a top-level source or configuration directory and what follows,
// not preceded by a character that would make it part of a longer path or
// an import path (github.com/.../pkg/x).
var pathRE = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:pkg|internal|cmd|api|test|config|charts|hack|build|docs)/[A-Za-z0-9_./-]*)`)

// architecturePaths returns the repository paths a page names, trimmed of
// sentence punctuation and Go's "/..." pattern suffix.
func architecturePaths(md []byte) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range pathRE.FindAllSubmatch(md, -1) {
		p := string(m[1])
		p = strings.TrimSuffix(p, "/...")
		p = strings.TrimRight(p, "./")
		if p == "" || seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, p)
	}
	return out
}

// TestArchitecturePaths pins the path reader.
func TestArchitecturePaths(t *testing.T) {
	in := "`pkg/drr` and `internal/testbed/load/h2client`; see pkg/extproc. Not github.com/laneway-dev/laneway/pkg/x nor cmd/... twice: `pkg/drr`."
	want := []string{"pkg/drr", "internal/testbed/load/h2client", "pkg/extproc", "cmd"}
	if got := architecturePaths([]byte(in)); !slices.Equal(got, want) {
		t.Errorf("paths = %q, want %q", got, want)
	}
}

// TestArchitecturePathsExist fails when docs/architecture.md names a
// package or file path that does not exist in the tree, so the page cannot
// go on describing a package after it moved or disappeared.
func TestArchitecturePathsExist(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatalf("read the architecture page: %v", err)
	}
	paths := architecturePaths(data)
	if len(paths) < 20 {
		t.Fatalf("found only %d paths in docs/architecture.md (%q); the scan is probably broken", len(paths), paths)
	}
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil {
			t.Errorf("docs/architecture.md names %s, which is not in the tree: %v", p, err)
		}
	}
}
