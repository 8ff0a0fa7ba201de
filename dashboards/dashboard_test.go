package dashboards_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/driver"
)

const dashboardFile = "elasticd.json"

// query is one PromQL expression of the dashboard and where it sits.
type query struct {
	where string // `panel ID "TITLE"` or `variable "NAME"`
	expr  string
	panel bool // false for a template variable's query
}

func load(t *testing.T) (raw []byte, doc map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return raw, doc
}

// panels returns every panel of doc in order, a row before the panels it holds when collapsed.
func panels(doc map[string]any) []map[string]any {
	var out []map[string]any
	var walk func(list any)
	walk = func(list any) {
		ps, _ := list.([]any)
		for _, p := range ps {
			m, ok := p.(map[string]any)
			if !ok {
				continue
			}
			out = append(out, m)
			walk(m["panels"]) // a collapsed row keeps its panels here
		}
	}
	walk(doc["panels"])
	return out
}

func isRow(p map[string]any) bool { return p["type"] == "row" }

// str returns v if it is a string, else "".
func str(v any) string {
	s, _ := v.(string)
	return s
}

func variables(doc map[string]any) []map[string]any {
	tmpl, _ := doc["templating"].(map[string]any)
	list, _ := tmpl["list"].([]any)
	var out []map[string]any
	for _, v := range list {
		if m, ok := v.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// queries returns every panel target's expr and every query variable's query. Grafana keeps
// a variable's query either as a string or, since 10, as {"query": "..."}, beside its
// "definition"; each distinct one is checked.
func queries(doc map[string]any) []query {
	var out []query
	for _, p := range panels(doc) {
		targets, _ := p["targets"].([]any)
		for _, tg := range targets {
			m, _ := tg.(map[string]any)
			if e := str(m["expr"]); e != "" {
				out = append(out, query{where: fmt.Sprintf("panel %v %q", p["id"], str(p["title"])), expr: e, panel: true})
			}
		}
	}
	for _, v := range variables(doc) {
		if v["type"] != "query" {
			continue
		}
		q := str(v["query"])
		if m, ok := v["query"].(map[string]any); ok {
			q = str(m["query"])
		}
		seen := map[string]bool{}
		for _, e := range []string{q, str(v["definition"])} {
			if e != "" && !seen[e] {
				seen[e] = true
				out = append(out, query{where: fmt.Sprintf("variable %q", str(v["name"])), expr: e})
			}
		}
	}
	return out
}

func knownMetrics() map[string]bool {
	known := map[string]bool{}
	for _, n := range driver.NewMetrics(&driver.StatusBoard{}).Names() {
		known[n] = true
	}
	return known
}

// unknown returns the metrics expr names that known lacks, sorted.
func unknown(expr string, known map[string]bool) ([]string, error) {
	names, err := metricNames(expr)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if !known[n] {
			out = append(out, n)
		}
	}
	return out, nil
}

func TestQueriesUseKnownMetrics(t *testing.T) {
	_, doc := load(t)
	known := knownMetrics()
	qs := queries(doc)
	if len(qs) == 0 {
		t.Fatal("no queries found: the walk is broken")
	}
	for _, q := range qs {
		bad, err := unknown(q.expr, known)
		if err != nil {
			t.Errorf("%s: %s: %v", q.where, q.expr, err)
			continue
		}
		for _, n := range bad {
			t.Errorf("%s: %s: unknown metric %s (not in driver.Metrics.Names())", q.where, q.expr, n)
		}
	}
}

func TestEveryMetricHasAPanel(t *testing.T) {
	_, doc := load(t)
	used := map[string]bool{}
	for _, q := range queries(doc) {
		if !q.panel {
			continue
		}
		names, err := metricNames(q.expr)
		if err != nil {
			continue // TestQueriesUseKnownMetrics reports it
		}
		for _, n := range names {
			used[n] = true
		}
	}
	for _, n := range driver.NewMetrics(&driver.StatusBoard{}).Names() {
		if strings.HasPrefix(n, "elasticd_") && !used[n] {
			t.Errorf("metric %s has no panel in %s: add one (and say what it shows in README.md)", n, dashboardFile)
		}
	}
}

func TestQueriesSelectTheInstance(t *testing.T) {
	_, doc := load(t)
	for _, q := range queries(doc) {
		if !q.panel {
			continue // the instance variable lists them all
		}
		sels, err := scan(q.expr)
		if err != nil {
			continue // TestQueriesUseKnownMetrics reports it
		}
		for _, s := range sels {
			if !strings.Contains(s.matchers, `instance=~"$instance"`) {
				t.Errorf(`%s: %s: %s lacks {instance=~"$instance"}`, q.where, q.expr, s.name)
			}
		}
	}
}

func TestPanels(t *testing.T) {
	_, doc := load(t)
	ps := panels(doc)
	if len(ps) == 0 {
		t.Fatal("no panels")
	}
	t.Run("content", func(t *testing.T) {
		for i, p := range ps {
			title := str(p["title"])
			if title == "" {
				t.Errorf("panel %d (id %v): no title", i, p["id"])
			}
			if isRow(p) {
				continue
			}
			if str(p["description"]) == "" {
				t.Errorf("panel %q: no description", title)
			}
			fc, _ := p["fieldConfig"].(map[string]any)
			defaults, _ := fc["defaults"].(map[string]any)
			if str(defaults["unit"]) == "" {
				t.Errorf("panel %q: no unit in fieldConfig.defaults", title)
			}
			targets, _ := p["targets"].([]any)
			if len(targets) == 0 {
				t.Errorf("panel %q: no targets", title)
			}
			for j, tg := range targets {
				m, _ := tg.(map[string]any)
				if strings.TrimSpace(str(m["expr"])) == "" {
					t.Errorf("panel %q: target %d has no expr", title, j)
				}
			}
		}
	})
	t.Run("ids", func(t *testing.T) {
		seen := map[float64]string{}
		for _, p := range ps {
			id, ok := p["id"].(float64)
			if !ok {
				t.Errorf("panel %q: id %v is not a number", str(p["title"]), p["id"])
				continue
			}
			if other, dup := seen[id]; dup {
				t.Errorf("panels %q and %q share id %v", other, str(p["title"]), id)
			}
			seen[id] = str(p["title"])
		}
	})
	t.Run("layout", func(t *testing.T) { checkLayout(t, doc["panels"]) })
	t.Run("datasource", func(t *testing.T) {
		ok := func(v any) bool {
			m, _ := v.(map[string]any)
			switch str(m["uid"]) {
			case "${DS_PROMETHEUS}", "${datasource}", "$datasource":
				return m["type"] == "prometheus"
			}
			return false
		}
		for _, p := range ps {
			if isRow(p) {
				continue
			}
			if !ok(p["datasource"]) {
				t.Errorf("panel %q: datasource %v, want the $datasource variable", str(p["title"]), p["datasource"])
			}
			targets, _ := p["targets"].([]any)
			for _, tg := range targets {
				m, _ := tg.(map[string]any)
				if d, set := m["datasource"]; set && !ok(d) {
					t.Errorf("panel %q: target %v: datasource %v, want the $datasource variable", str(p["title"]), m["refId"], d)
				}
			}
		}
		for _, v := range variables(doc) {
			if v["type"] == "query" && !ok(v["datasource"]) {
				t.Errorf("variable %q: datasource %v, want the $datasource variable", str(v["name"]), v["datasource"])
			}
		}
	})
}

// checkLayout checks that every panel of list has a gridPos on the 24-column grid and that
// none overlaps another. A collapsed row's panels keep the places they have when it opens,
// so they are checked among themselves.
func checkLayout(t *testing.T, list any) {
	t.Helper()
	type rect struct {
		title      string
		x, y, w, h int
	}
	var rs []rect
	ps, _ := list.([]any)
	for _, p := range ps {
		p, _ := p.(map[string]any)
		r := rect{title: str(p["title"])}
		if nested, _ := p["panels"].([]any); len(nested) > 0 {
			checkLayout(t, nested)
		}
		g, ok := p["gridPos"].(map[string]any)
		if !ok {
			t.Errorf("panel %q: no gridPos", r.title)
			continue
		}
		for k, v := range map[string]*int{"x": &r.x, "y": &r.y, "w": &r.w, "h": &r.h} {
			f, ok := g[k].(float64)
			if !ok {
				t.Errorf("panel %q: gridPos.%s is %v", r.title, k, g[k])
			}
			*v = int(f)
		}
		if r.w < 1 || r.h < 1 || r.x < 0 || r.y < 0 || r.x+r.w > 24 {
			t.Errorf("panel %q: gridPos %+v is off the 24-column grid", r.title, g)
		}
		for _, o := range rs {
			if r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h {
				t.Errorf("panels %q and %q overlap", o.title, r.title)
			}
		}
		rs = append(rs, r)
	}
}

func TestDashboard(t *testing.T) {
	_, doc := load(t)
	for k, want := range map[string]any{"uid": "elasticd", "title": "elasticd — elastic training on spot", "schemaVersion": float64(39)} {
		if doc[k] != want {
			t.Errorf("%s = %v, want %v", k, doc[k], want)
		}
	}
	inputs, _ := doc["__inputs"].([]any)
	var ds bool
	for _, in := range inputs {
		m, _ := in.(map[string]any)
		ds = ds || (m["name"] == "DS_PROMETHEUS" && m["type"] == "datasource" && m["pluginId"] == "prometheus")
	}
	if !ds {
		t.Errorf("__inputs = %v, want a DS_PROMETHEUS prometheus datasource", inputs)
	}
	vars := map[string]map[string]any{}
	for _, v := range variables(doc) {
		vars[str(v["name"])] = v
	}
	if v := vars["datasource"]; v == nil || v["type"] != "datasource" || v["query"] != "prometheus" {
		t.Errorf("variable datasource = %v, want a prometheus datasource variable", v)
	}
	if v := vars["instance"]; v == nil || v["type"] != "query" || str(v["definition"]) != "label_values(elasticd_job_info, instance)" {
		t.Errorf("variable instance = %v, want label_values(elasticd_job_info, instance)", v)
	}
}

// TestFormatted keeps the file as encoding/json indents it (two spaces), so diffs stay small.
func TestFormatted(t *testing.T) {
	raw, _ := load(t)
	var want bytes.Buffer
	if err := json.Indent(&want, bytes.TrimSpace(raw), "", "  "); err != nil {
		t.Fatal(err)
	}
	want.WriteByte('\n')
	if !bytes.Equal(raw, want.Bytes()) {
		got, exp := strings.Split(string(raw), "\n"), strings.Split(want.String(), "\n")
		for i := range min(len(got), len(exp)) {
			if got[i] != exp[i] {
				t.Fatalf("%s is not indented as json.Indent(\"\", \"  \") would: line %d is\n%q\nwant\n%q", dashboardFile, i+1, got[i], exp[i])
			}
		}
		t.Fatalf("%s is not indented as json.Indent(\"\", \"  \") would: %d lines, want %d", dashboardFile, len(got), len(exp))
	}
}

func TestScan(t *testing.T) {
	known := knownMetrics()
	for _, tc := range []struct {
		name    string
		expr    string
		want    []string // metric names, sorted
		unknown []string // of want, those the driver does not export
	}{
		{"bare", "elasticd_world_size", []string{"elasticd_world_size"}, nil},
		{"unknown counter", "rate(elasticd_nope_total[5m])", []string{"elasticd_nope_total"}, []string{"elasticd_nope_total"}},
		{"aggregation by before the parenthesis",
			`sum by (cause) (increase(elasticd_resets_total{instance=~"$instance"}[$__rate_interval]))`,
			[]string{"elasticd_resets_total"}, nil},
		{"aggregation by after the parenthesis", `sum(rate(elasticd_resets_total[5m])) by (cause, instance)`,
			[]string{"elasticd_resets_total"}, nil},
		{"histogram quantile",
			`histogram_quantile(0.95, sum by (le) (rate(elasticd_rendezvous_seconds_bucket[5m])))`,
			[]string{"elasticd_rendezvous_seconds_bucket"}, nil},
		{"histogram base name is not a series", `rate(elasticd_rendezvous_seconds[5m])`,
			[]string{"elasticd_rendezvous_seconds"}, []string{"elasticd_rendezvous_seconds"}},
		{"label value that looks like a metric",
			`elasticd_hosts{state="elasticd_bogus_total", instance=~"elasticd_.*"}`,
			[]string{"elasticd_hosts"}, nil},
		{"label names inside braces", `elasticd_cost_total{lifecycle="spot",type!~"g5.*"}`,
			[]string{"elasticd_cost_total"}, nil},
		{"matching with group_left and no list", "a / on(instance) group_left b", []string{"a", "b"}, []string{"a", "b"}},
		{"matching with group_right and a list",
			"elasticd_world_size * ignoring(limit, job) group_right(job_id) elasticd_job_info",
			[]string{"elasticd_job_info", "elasticd_world_size"}, nil},
		{"without", "sum without (state) (elasticd_hosts)", []string{"elasticd_hosts"}, nil},
		{"upper-case keywords", "SUM BY (le) (elasticd_rendezvous_seconds_bucket) AND ON (le) elasticd_nope",
			[]string{"elasticd_nope", "elasticd_rendezvous_seconds_bucket"}, []string{"elasticd_nope"}},
		{"set operators and bool", "elasticd_step > bool 0 and elasticd_committed_step or vector(0) unless elasticd_nope",
			[]string{"elasticd_committed_step", "elasticd_nope", "elasticd_step"}, []string{"elasticd_nope"}},
		{"offset and @", "elasticd_step offset 1h30m - elasticd_step @ end()", []string{"elasticd_step"}, nil},
		{"subquery", "max_over_time(rate(elasticd_steps_rolled_back_total[5m])[1h:1m])",
			[]string{"elasticd_steps_rolled_back_total"}, nil},
		{"numbers", "elasticd_instance_seconds_total / 3600 > 1e3 * 0x1F + .5 - Inf + NaN",
			[]string{"elasticd_instance_seconds_total"}, nil},
		{"grafana variables", "elasticd_savings / $scale * ${scale} + elasticd_step[$__interval] + [[old]]",
			[]string{"elasticd_savings", "elasticd_step"}, nil},
		{"string arguments", `label_replace(elasticd_job_info, "dst", "elasticd_fake", "job_id", "(.*)")`,
			[]string{"elasticd_job_info"}, nil},
		{"escaped quote in a string", `count_values("a\"elasticd_fake", elasticd_generation)`,
			[]string{"elasticd_generation"}, nil},
		{"any identifier before ( is a function", "clamp_min(time() - elasticd_job_start_time_seconds, 0) + my_func (x)",
			[]string{"elasticd_job_start_time_seconds", "x"}, []string{"x"}},
		{"recording rule name", "job:elasticd_step:rate5m", []string{"job:elasticd_step:rate5m"}, []string{"job:elasticd_step:rate5m"}},
		{"comment", "elasticd_step # elasticd_nope\n+ elasticd_generation",
			[]string{"elasticd_generation", "elasticd_step"}, nil},
		{"variable query", "label_values(elasticd_job_info, instance)", []string{"elasticd_job_info"}, nil},
		{"variable query of a label only", "label_values(instance)", nil, nil},
		{"variable query with a selector", `label_values(elasticd_hosts{state="idle"}, instance)`, []string{"elasticd_hosts"}, nil},
		{"repeats reported once", "elasticd_step - elasticd_step", []string{"elasticd_step"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := metricNames(tc.expr)
			if err != nil {
				t.Fatalf("metricNames(%q): %v", tc.expr, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
			}
			bad, _ := unknown(tc.expr, known)
			if !slices.Equal(bad, tc.unknown) {
				t.Errorf("unknown(%q) = %q, want %q", tc.expr, bad, tc.unknown)
			}
		})
	}
}

func TestScanMatchers(t *testing.T) {
	got, err := scan(`sum(rate(elasticd_cost_total{instance=~"$instance", type="a}b"}[5m])) / elasticd_savings`)
	if err != nil {
		t.Fatal(err)
	}
	want := []selector{{"elasticd_cost_total", `instance=~"$instance", type="a}b"`}, {"elasticd_savings", ""}}
	if !slices.Equal(got, want) {
		t.Errorf("scan = %q, want %q", got, want)
	}
}

func TestScanErrors(t *testing.T) {
	for _, expr := range []string{
		"rate(elasticd_step[5m]",
		"elasticd_step)",
		`elasticd_step{state="idle"`,
		`elasticd_step{state="idle}`,
		"rate(elasticd_step[5m)",
		"label_values(elasticd_job_info, instance",
		"${scale",
		"sum by (le elasticd_step",
	} {
		if names, err := metricNames(expr); err == nil {
			t.Errorf("metricNames(%q) = %q, want an error", expr, names)
		}
	}
}

// A PromQL scanner just good enough to find the metrics a query names: it does not parse,
// it drops everything that cannot be a metric name (strings, label matchers, range and
// subquery brackets, label lists, numbers, durations, Grafana variables, functions,
// aggregation operators and keywords) and reports the identifiers left. It errs on
// unbalanced brackets and unterminated strings, which Prometheus would reject too.

// selector is a metric a query names, with the text between its braces ("" without).
type selector struct {
	name, matchers string
}

var (
	// aggregations may be followed by by/without (...) before their own parenthesis, so the
	// "followed by (" rule cannot tell them apart from metrics.
	aggregations = set("sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile",
		"stddev", "stdvar", "count_values", "group", "limitk", "limit_ratio")
	// labelLists take a parenthesised list of label names; the group modifiers' is optional.
	labelLists = set("by", "without", "on", "ignoring", "group_left", "group_right")
	keywords   = set("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan")
)

func set(words ...string) map[string]bool {
	m := map[string]bool{}
	for _, w := range words {
		m[w] = true
	}
	return m
}

// metricNames returns the distinct metric names expr selects, sorted.
func metricNames(expr string) ([]string, error) {
	sels, err := scan(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range sels {
		names = append(names, s.name)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// scan returns the metric selectors of expr in order.
func scan(expr string) ([]selector, error) {
	var out []selector
	s := expr
	depth := 0
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case isSpace(c):
			i++
		case c == '#': // a comment, to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{': // matchers with no metric name before them: nothing to report
			end, err := closing(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '[': // a range, a subquery's range and step, or Grafana's old [[var]]
			end, err := closing(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '(':
			depth++
			i++
		case c == ')':
			if depth--; depth < 0 {
				return nil, fmt.Errorf("offset %d: ) without (", i)
			}
			i++
		case c == '}' || c == ']':
			return nil, fmt.Errorf("offset %d: %c without its opening", i, c)
		case c == '$':
			end, err := skipVariable(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case isDigit(c) || c == '.' && i+1 < len(s) && isDigit(s[i+1]):
			// numbers (1e3, 0x1f, .5) and durations (5m, 1h30m); "1e-3" leaves "-" and "3"
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word, lower := s[i:j], strings.ToLower(s[i:j])
			next := j
			for next < len(s) && isSpace(s[next]) {
				next++
			}
			paren := next < len(s) && s[next] == '('
			switch {
			case labelLists[lower]:
				i = j
				if paren {
					end, err := closing(s, next)
					if err != nil {
						return nil, err
					}
					i = end
				}
			case aggregations[lower] || keywords[lower]:
				i = j
			case paren && word == "label_values":
				// Grafana's label_values(label) or label_values(selector, label): the
				// label is a name, not a metric.
				end, err := closing(s, next)
				if err != nil {
					return nil, err
				}
				if args := splitArgs(s[next+1 : end-1]); len(args) == 2 {
					sels, err := scan(args[0])
					if err != nil {
						return nil, err
					}
					out = append(out, sels...)
				}
				i = end
			case paren: // a function: its arguments are scanned as they come
				i = j
			default:
				sel := selector{name: word}
				i = j
				if next < len(s) && s[next] == '{' {
					end, err := closing(s, next)
					if err != nil {
						return nil, err
					}
					sel.matchers = s[next+1 : end-1]
					i = end
				}
				out = append(out, sel)
			}
		default: // operators, commas, @
			i++
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("%d unclosed (", depth)
	}
	return out, nil
}

// closing returns the offset just past the bracket that closes s[open], skipping strings
// and nested brackets of the same kind.
func closing(s string, open int) (int, error) {
	o := s[open]
	c := map[byte]byte{'(': ')', '[': ']', '{': '}'}[o]
	depth := 0
	for i := open; i < len(s); {
		switch s[i] {
		case '"', '\'', '`':
			end, err := skipString(s, i)
			if err != nil {
				return 0, err
			}
			i = end
			continue
		case o:
			depth++
		case c:
			if depth--; depth == 0 {
				return i + 1, nil
			}
		}
		i++
	}
	return 0, fmt.Errorf("offset %d: unclosed %c", open, o)
}

// skipString returns the offset just past the string literal at s[start]; backticks are raw.
func skipString(s string, start int) (int, error) {
	q := s[start]
	for i := start + 1; i < len(s); i++ {
		switch {
		case s[i] == '\\' && q != '`':
			i++
		case s[i] == q:
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("offset %d: unterminated string", start)
}

// skipVariable returns the offset just past the Grafana variable at s[start]: $name or
// ${name} (also ${name:format}).
func skipVariable(s string, start int) (int, error) {
	if start+1 < len(s) && s[start+1] == '{' {
		if end := strings.IndexByte(s[start:], '}'); end >= 0 {
			return start + end + 1, nil
		}
		return 0, fmt.Errorf("offset %d: unclosed ${", start)
	}
	i := start + 1
	for i < len(s) && (isIdent(s[i]) && s[i] != ':') {
		i++
	}
	return i, nil
}

// splitArgs splits a function's arguments at the commas outside brackets and strings.
func splitArgs(s string) []string {
	var args []string
	depth, from := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"', '\'', '`':
			if end, err := skipString(s, i); err == nil {
				i = end - 1
			}
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
		case ',':
			if depth == 0 {
				args = append(args, s[from:i])
				from = i + 1
			}
		}
	}
	return append(args, s[from:])
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isIdentStart(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == ':'
}

func isIdent(c byte) bool { return isIdentStart(c) || isDigit(c) }
