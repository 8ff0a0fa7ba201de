package webui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/elasticd/elasticd/driver/webui"
	"github.com/elasticd/elasticd/internal/browsertest"
)

// ---- the handler, without a browser ----

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(webui.Handler())
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		method, path string
		code         int
		ctype        string // for 200s
		contains     string // in the body of a GET
	}{
		{"GET", "/", 200, "text/html; charset=utf-8", `<script src="app.js"`},
		{"HEAD", "/", 200, "text/html; charset=utf-8", ""},
		{"GET", "/app.js", 200, "text/javascript; charset=utf-8", "v1/status"},
		{"GET", "/app.css", 200, "text/css; charset=utf-8", "font"},
		{"GET", "/favicon.svg", 200, "image/svg+xml", "<svg"},
		// The driver's own routes, next to which the handler is mounted: never claimed.
		{"GET", "/v1/status", 404, "", ""},
		{"GET", "/v1/", 404, "", ""},
		{"GET", "/metrics", 404, "", ""},
		{"GET", "/index.html", 404, "", ""},
		{"GET", "/app.js/x", 404, "", ""},
		{"GET", "/assets/app.js", 404, "", ""},
		{"POST", "/v1/status", 404, "", ""},
		{"POST", "/", 405, "", ""},
		{"PUT", "/app.js", 405, "", ""},
		{"DELETE", "/app.css", 405, "", ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.code)
			}
			switch tc.code {
			case 405:
				if got := res.Header.Get("Allow"); got != "GET, HEAD" {
					t.Errorf("Allow = %q, want \"GET, HEAD\"", got)
				}
				return
			case 404:
				return
			}
			for k, want := range map[string]string{
				"Content-Type":            tc.ctype,
				"Cache-Control":           "no-cache",
				"X-Content-Type-Options":  "nosniff",
				"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'",
			} {
				if got := res.Header.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			if tc.method == "HEAD" {
				if len(body) != 0 || res.ContentLength <= 0 {
					t.Errorf("HEAD: body %d bytes, Content-Length %d; want none and the GET's length", len(body), res.ContentLength)
				}
				return
			}
			if !strings.Contains(string(body), tc.contains) {
				t.Errorf("body does not contain %q", tc.contains)
			}
			// A reload revalidates: the ETag turns it into a 304 with no body.
			req.Header.Set("If-None-Match", res.Header.Get("ETag"))
			res2, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res2.Body.Close()
			if res2.StatusCode != http.StatusNotModified {
				t.Errorf("with If-None-Match its ETag %q: status %d, want 304", res.Header.Get("ETag"), res2.StatusCode)
			}
		})
	}
}

// get returns the body the handler serves at path, failing on anything but a 200.
func get(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	if rec.Code != 200 {
		t.Fatalf("GET %s: %d", path, rec.Code)
	}
	return rec.Body.String()
}

// TestSelfContained: clusters are often offline, and the CSP forbids inline code; so the page
// loads nothing from elsewhere, has no inline script, style or handler, and every file it
// refers to is served.
func TestSelfContained(t *testing.T) {
	h := webui.Handler()
	index := get(t, h, "/")
	refs := regexp.MustCompile(`(?:href|src)="([^"]*)"`).FindAllStringSubmatch(index, -1)
	if len(refs) < 3 {
		t.Fatalf("index.html refers to %d files, want the script, the style sheet and the icon", len(refs))
	}
	assets := map[string]string{"/": index}
	// The driver's own views, which the page links to and the driver serves beside it.
	driverRoutes := map[string]bool{"v1/status": false, "metrics": false}
	for _, r := range refs {
		if strings.Contains(r[1], ":") || strings.HasPrefix(r[1], "/") {
			t.Errorf("index.html refers to %q: want a relative path (the page may sit behind a path prefix)", r[1])
			continue
		}
		if _, ok := driverRoutes[r[1]]; ok {
			driverRoutes[r[1]] = true
			continue
		}
		assets["/"+r[1]] = get(t, h, "/"+r[1])
	}
	for route, linked := range driverRoutes {
		if !linked {
			t.Errorf("index.html does not link to the driver's %s", route)
		}
	}

	// The one URL allowed is the SVG namespace, a name that nothing fetches.
	url := regexp.MustCompile(`(?i)https?://[^\s"'<>)]*`)
	for path, body := range assets {
		for _, u := range url.FindAllString(body, -1) {
			if u != "http://www.w3.org/2000/svg" {
				t.Errorf("%s refers to %s: the page must need nothing from outside the driver", path, u)
			}
		}
		if regexp.MustCompile(`(?i)(?:src|href|url)\s*[=(]\s*["']?//`).MatchString(body) {
			t.Errorf("%s has a protocol-relative URL", path)
		}
	}

	for _, tag := range regexp.MustCompile(`(?is)<script[^>]*>.*?</script>`).FindAllString(index, -1) {
		if !regexp.MustCompile(`(?is)^<script[^>]*\ssrc="[^"]+"[^>]*></script>$`).MatchString(tag) {
			t.Errorf("inline script %q: the CSP blocks it; put it in app.js", tag)
		}
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)<style`),
		regexp.MustCompile(`(?i)\sstyle=`),
		regexp.MustCompile(`(?i)\son[a-z]+=`),
	} {
		if m := bad.FindString(index); m != "" {
			t.Errorf("index.html has %q: the CSP blocks inline style and handlers", m)
		}
	}
	if js := assets["/app.js"]; strings.Contains(js, "innerHTML") || strings.Contains(js, "insertAdjacentHTML") {
		t.Errorf("app.js uses innerHTML: status strings are untrusted, use textContent")
	}
}

// ---- the page in a browser ----

// fake is the driver's GET /v1/status, answering what the test sets.
type fake struct {
	mu     sync.Mutex
	status map[string]any
	fail   string // "": answer; "503": Service Unavailable; "close": drop the connection
	polls  int
	// paged: answer the page of hosts asked for (?state=&offset=&limit=), as the driver
	// does, with the counts by state; queries are the queries asked, in order.
	paged   bool
	queries []string
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.polls++
	switch f.fail {
	case "503":
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	case "close":
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	f.queries = append(f.queries, r.URL.RawQuery)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !f.paged {
		_ = json.NewEncoder(w).Encode(f.status)
		return
	}
	q := r.URL.Query()
	offset, _ := strconv.Atoi(q.Get("offset"))
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil {
		limit = 1 << 30
	}
	out := maps.Clone(f.status)
	states := map[string]int{}
	var hosts []any
	listed := map[string]bool{}
	for _, h := range list(f.status, "hosts") {
		st := h.(map[string]any)["state"].(string)
		states[st]++
		if q.Get("state") == "" || q.Get("state") == st {
			hosts = append(hosts, h)
		}
	}
	out["hosts_total"], out["hosts_matching"], out["host_states"] = len(list(f.status, "hosts")), len(hosts), states
	hosts = hosts[min(offset, len(hosts)):]
	hosts = hosts[:min(limit, len(hosts))]
	for _, h := range hosts {
		listed[h.(map[string]any)["id"].(string)] = true
	}
	workers := []any{}
	for _, w := range list(f.status, "workers") {
		if listed[w.(map[string]any)["host"].(string)] {
			workers = append(workers, w)
		}
	}
	out["hosts"], out["workers"] = append([]any{}, hosts...), workers
	_ = json.NewEncoder(w).Encode(out)
}

// lastQuery is the query of the latest poll.
func (f *fake) lastQuery() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.queries[len(f.queries)-1]
}

// update changes the status under the lock; the page sees it at its next poll.
func (f *fake) update(change func(s map[string]any)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f.status)
}

func (f *fake) setFail(mode string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = mode
}

// fixture decodes testdata/NAME.json.
func fixture(t testing.TB, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
	return s
}

// obj and list reach into a decoded status.
func obj(s map[string]any, key string) map[string]any { return s[key].(map[string]any) }

func list(s map[string]any, key string) []any { return s[key].([]any) }

type page struct {
	t    *testing.T
	ctx  context.Context
	fake *fake
	base string // the page's URL
}

// open serves the page and a fake /v1/status on loopback under prefix ("/" or "/a/b/") and
// loads it in a fresh browser, waiting for the first render.
func open(t *testing.T, status map[string]any, prefix string) *page {
	t.Helper()
	return openFake(t, &fake{status: status}, prefix)
}

func openFake(t *testing.T, f *fake, prefix string) *page {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(prefix+"v1/status", f)
	mux.Handle(prefix, http.StripPrefix(strings.TrimSuffix(prefix, "/"), webui.Handler()))
	srv := httptest.NewServer(mux) // 127.0.0.1
	t.Cleanup(srv.Close)

	p := &page{t: t, ctx: browsertest.New(t), fake: f, base: srv.URL + prefix}
	// Registered after New, so it runs while the browser is still up.
	t.Cleanup(func() {
		problems, err := browsertest.Problems(p.ctx)
		if err != nil {
			t.Error(err)
		}
		for _, pr := range problems {
			t.Errorf("in the page: %s", pr)
		}
	})
	if err := browsertest.Navigate(p.ctx, srv.URL+prefix); err != nil {
		t.Fatal(err)
	}
	p.wait("the first render", `document.body.dataset.ready === "1"`)
	return p
}

// wait waits (at most 20 s) for a JavaScript condition; on timeout it shows the page's text.
func (p *page) wait(what, cond string) {
	p.t.Helper()
	if err := browsertest.Wait(p.ctx, cond); err != nil {
		body, _ := browsertest.Eval[string](p.ctx, `document.body.innerText.slice(0, 3000)`)
		p.t.Fatalf("waiting for %s: %v\n--- page text ---\n%s", what, err, body)
	}
}

// text is the textContent of the element with that CSS selector.
func (p *page) text(sel string) string {
	p.t.Helper()
	s, err := browsertest.Text(p.ctx, sel)
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

func eval[T any](p *page, expr string) T {
	p.t.Helper()
	v, err := browsertest.Eval[T](p.ctx, expr)
	if err != nil {
		p.t.Fatal(err)
	}
	return v
}

// hostRows is every host row: its data-host-id, then each cell's text.
const hostRows = `Array.from(document.querySelectorAll('#hosts tr')).map(tr =>
	[tr.dataset.hostId || ''].concat(Array.from(tr.cells).map(c => c.textContent)))`

// eventRows is every event, top to bottom: kind and message.
const eventRows = `Array.from(document.querySelectorAll('#events li')).map(li =>
	li.dataset.kind + ': ' + li.querySelector('.msg').textContent)`

func TestPageRendersStatus(t *testing.T) {
	t.Parallel()
	p := open(t, fixture(t, "running"), "/")

	for sel, want := range map[string]string{
		"#job-id":                                "3f2a9c1b",
		"#phase":                                 "running",
		"#generation":                            "3",
		"#elapsed":                               "12m 03s",
		"#world-size":                            "4",
		"#world-bounds":                          "np 4 · min 2 · max 8",
		"#step":                                  "412",
		"#committed-step":                        "410",
		"#step-rate":                             "87.5",
		"#resets":                                "2",
		"#resets-by-cause [data-cause=failure]":  "failure1",
		"#resets-by-cause [data-cause=scale-up]": "scale-up1",
		"#resets-by-cause [data-cause=notice]":   "notice0",
		"#cost-total":                            "$1.23",
		"#cost-spot":                             "$1.00",
		"#cost-on-demand":                        "$0.2300",
		"#cost-od-equivalent":                    "$3.45",
		"#savings":                               "$2.22 (64.3%)",
		"#rolled-back-cost":                      "$0.0500",
		"#rolled-back-steps":                     "(12 steps, 0.5 GPU·s)",
		"#conn-state":                            "live",
		"#notices":                               "Notices received: aws interruption × 1",
		"#eta":                                   "18s",
		"#step-of":                               "step 412 of 2,000 (20.6%)",
		"#loss":                                  "0.3521",
		"#loss-sub":                              "lowest 0.2791",
		"#cost-chart-unit":                       "USD",
	} {
		if got := p.text(sel); got != want {
			t.Errorf("%s shows %q, want %q", sel, got, want)
		}
	}

	// Uptime, heartbeat (the local host has none: "—") and failures with the last one's
	// cause and age, before the price.
	wantHosts := [][]string{
		{"i-0a1b2c3d4e", "i-0a1b2c3d4e", "10.0.0.5", "active", "spot", "g5.12xlarge", "us-east-1a", "2", "0", "0 1", "12m 03s", "0s ago", "0", "$2.03"},
		{"i-0f9e8d7c6b", "i-0f9e8d7c6b", "10.0.1.17", "leaving", "spot", "g5.12xlarge", "us-east-1b", "2", "0", "2 3", "8m 43s", "1s ago", "0", "$2.11"},
		{"local", "local", "127.0.0.1", "blacklisted", "on-demand", "local", "—", "1", "1", "—", "12m 03s", "—", "1killed by SIGKILL, 8m 54s ago", "—"},
	}
	if got := eval[[][]string](p, hostRows); !slices.EqualFunc(got, wantHosts, slices.Equal) {
		t.Errorf("host rows:\n got %q\nwant %q", got, wantHosts)
	}
	// The states and lifecycles are colour-coded: each badge carries its value for the CSS.
	if got := eval[[]string](p, `Array.from(document.querySelectorAll('#hosts .badge')).map(b =>
		b.className + '=' + b.dataset.value + ':' + getComputedStyle(b).color)`); len(got) != 6 ||
		len(slices.Compact(slices.Sorted(slices.Values(colours(got))))) != 5 {
		t.Errorf("host badges %q: want 6 badges in 5 colours (active, leaving, blacklisted, spot, on-demand)", got)
	}

	var wantEvents []string
	for _, e := range slices.Backward(list(fixture(t, "running"), "events")) {
		e := e.(map[string]any)
		wantEvents = append(wantEvents, e["kind"].(string)+": "+e["message"].(string))
	}
	if got := eval[[]string](p, eventRows); !slices.Equal(got, wantEvents) {
		t.Errorf("events (newest first):\n got %q\nwant %q", got, wantEvents)
	}

	wantInstances := [][]string{{"spot", "g5.12xlarge", "0.55 h", "$1.00"}, {"on-demand", "local", "0.20 h", "—"}}
	if got := eval[[][]string](p, `Array.from(document.querySelectorAll('#instance-seconds tr')).map(tr =>
		Array.from(tr.cells).map(c => c.textContent))`); !slices.EqualFunc(got, wantInstances, slices.Equal) {
		t.Errorf("instance time:\n got %q\nwant %q", got, wantInstances)
	}

	if hidden := eval[bool](p, `document.getElementById('unpriced').hidden`); hidden {
		t.Error("the unpriced warning is hidden")
	}
	if got := p.text("#unpriced"); !strings.Contains(got, "No price for local (on-demand)") || !strings.Contains(got, "--prices") {
		t.Errorf("unpriced warning %q: want it to name local (on-demand) and --prices", got)
	}
	if hidden := eval[bool](p, `document.getElementById('finished').hidden`); !hidden {
		t.Error("a running job shows the finished banner")
	}
	// The driver's other views are one click away, relative to the page.
	if got := eval[[]string](p, `Array.from(document.querySelectorAll('#links a')).map(a =>
		a.getAttribute('href') + '=' + a.href + ':' + (a.offsetParent !== null))`); !slices.Equal(got, []string{
		"v1/status=" + p.base + "v1/status:true", "metrics=" + p.base + "metrics:true",
	}) {
		t.Errorf("links %q: want v1/status and metrics next to the page, visible", got)
	}
	// The style sheet loaded under the CSP (a blocked one leaves the browser's defaults).
	if got := eval[string](p, `getComputedStyle(document.querySelector('.stat')).borderTopLeftRadius`); got != "8px" {
		t.Errorf("a .stat card has border radius %q, want app.css's 8px", got)
	}
}

// colours keeps the colour of each "class=value:colour" entry.
func colours(badges []string) []string {
	var out []string
	for _, b := range badges {
		out = append(out, b[strings.LastIndex(b, ":")+1:])
	}
	return out
}

func TestPageFollowsUpdates(t *testing.T) {
	t.Parallel()
	p := open(t, fixture(t, "running"), "/")
	if got := p.text("#step"); got != "412" {
		t.Fatalf("step %q before the update, want 412", got)
	}
	p.fake.update(func(s map[string]any) {
		s["now"] = "2026-03-01T12:12:04.400Z"
		s["world_size"] = 3
		obj(s, "progress")["step"] = 500
		obj(s, "progress")["steps_per_second"] = 92.25
		s["events"] = append(list(s, "events"), map[string]any{
			"at": "2026-03-01T12:12:04Z", "kind": "leave", "message": "host i-0f9e8d7c6b left (spot interruption)",
		})
	})
	p.wait("step 500, world size 3 and the new event", `
		document.getElementById('step').textContent === '500' &&
		document.getElementById('world-size').textContent === '3' &&
		document.querySelector('#events li .msg').textContent === 'host i-0f9e8d7c6b left (spot interruption)'`)
	if got := p.text("#step-rate"); got != "92.3" {
		t.Errorf("step rate %q, want 92.3", got)
	}
	if got := eval[string](p, `document.body.dataset.updated`); got != "2026-03-01T12:12:04.400Z" {
		t.Errorf("body data-updated = %q, want the status's now", got)
	}
	// Two distinct polls: the sparkline has two points.
	if got := eval[string](p, `document.getElementById('rate-spark').dataset.points`); got != "2" {
		t.Errorf("sparkline has %s points, want 2", got)
	}
}

func TestPageSurvivesUnreachableDriver(t *testing.T) {
	t.Parallel()
	p := open(t, fixture(t, "running"), "/")

	p.fake.setFail("503")
	p.wait("the failure shown", `
		document.getElementById('conn-state').dataset.state === 'down' &&
		document.getElementById('conn-state').textContent.includes('driver unreachable — retrying') &&
		document.getElementById('conn-state').textContent.includes('HTTP 503')`)
	// The last data stays on the page.
	if got := p.text("#step"); got != "412" {
		t.Errorf("step %q while the driver is down, want the last known 412", got)
	}

	p.fake.setFail("close")
	p.wait("a dropped connection shown", `document.getElementById('conn-state').textContent.includes('connection failed')`)

	p.fake.update(func(s map[string]any) {
		s["now"] = "2026-03-01T12:12:30Z"
		obj(s, "progress")["step"] = 600
	})
	p.fake.setFail("")
	p.wait("the recovery", `
		document.getElementById('conn-state').dataset.state === 'ok' &&
		document.getElementById('step').textContent === '600' &&
		!document.body.classList.contains('stale')`)
}

func TestPageShowsFinished(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code      int
		wantTitle string
	}{
		{0, "Finished · exit code 0"},
		{3, "Failed · exit code 3"},
	} {
		t.Run(fmt.Sprint("code ", tc.code), func(t *testing.T) {
			t.Parallel()
			s := fixture(t, "finished")
			obj(s, "finished")["code"] = tc.code
			p := open(t, s, "/")
			if eval[bool](p, `document.getElementById('finished').hidden`) {
				t.Fatal("the finished banner is hidden")
			}
			if got := p.text("#finished-title"); got != tc.wantTitle {
				t.Errorf("banner title %q, want %q", got, tc.wantTitle)
			}
			if got := p.text("#finished-reason"); got != "all 4 workers of generation 3 finished" {
				t.Errorf("banner reason %q", got)
			}
			if got := eval[string](p, `document.getElementById('conn-state').dataset.state`); got != "finished" {
				t.Errorf("conn-state %q, want finished (polling every 5 s)", got)
			}
			if got := p.text("#phase"); got != "done" {
				t.Errorf("phase %q, want done", got)
			}
		})
	}
}

// TestPageShowsMarkupAsText: host IDs, messages and price-list names come from the cluster;
// markup in them must show as text and create no element.
func TestPageShowsMarkupAsText(t *testing.T) {
	t.Parallel()
	const img = `<img src=x onerror="window.pwned=1">`
	s := fixture(t, "running")
	s["job_id"] = `<b class="injected">job</b>`
	list(s, "hosts")[0].(map[string]any)["id"] = `<b class="injected">host</b>`
	list(s, "hosts")[0].(map[string]any)["zone"] = img
	s["events"] = append(list(s, "events"), map[string]any{"at": "2026-03-01T12:12:00Z", "kind": "failure", "message": img})
	obj(s, "cost")["unpriced"] = []any{`<script>window.pwned=2</script>`}
	p := open(t, s, "/")

	if got := p.text("#events li .msg"); got != img {
		t.Errorf("newest event shows %q, want the markup as text %q", got, img)
	}
	if got := p.text(`#hosts tr:first-child td.id`); got != `<b class="injected">host</b>` {
		t.Errorf("host ID shows %q", got)
	}
	if got := p.text("#job-id"); got != `<b class="injected">job</b>` {
		t.Errorf("job ID shows %q", got)
	}
	if n := eval[int](p, `document.querySelectorAll('img, .injected, main script').length`); n != 0 {
		t.Errorf("%d elements made from status strings", n)
	}
	if pwned := eval[bool](p, `window.pwned !== undefined`); pwned {
		t.Error("a status string ran as script")
	}
}

func TestPageWorldChart(t *testing.T) {
	t.Parallel()
	p := open(t, fixture(t, "running"), "/")
	type chart struct {
		Points int    `json:"points"`
		D      string `json:"d"`
		Dots   [][2]float64
		Axis   float64
	}
	read := func() chart {
		return eval[chart](p, `(() => {
			const line = document.querySelector('#world-chart path#world-line');
			return {
				points: Number(line.dataset.points), d: line.getAttribute('d'),
				Dots: Array.from(document.querySelectorAll('#world-chart circle.pt')).map(c =>
					[Number(c.getAttribute('cx')), Number(c.getAttribute('cy'))]),
				Axis: Number(document.querySelector('#world-chart line.axis').getAttribute('y1')),
			};
		})()`)
	}
	c := read()
	// 4 points in the fixture: sizes 3, 0 (waiting), 2, 4.
	if c.Points != 4 || len(c.Dots) != 4 {
		t.Fatalf("chart has data-points %d and %d dots, want 4 (the history's length)", c.Points, len(c.Dots))
	}
	if m, v := strings.Count(c.D, "M"), strings.Count(c.D, "V"); m != 1 || v != 3 {
		t.Errorf("path %q: %d moves and %d vertical steps, want 1 and 3 (a step line through 4 points)", c.D, m, v)
	}
	for i := 1; i < len(c.Dots); i++ {
		if c.Dots[i][0] < c.Dots[i-1][0] {
			t.Errorf("dot %d is left of dot %d: %v", i, i-1, c.Dots)
		}
	}
	// Higher world sizes are higher up (smaller y); the waiting point sits on the axis.
	if !(c.Dots[1][1] == c.Axis && c.Dots[3][1] < c.Dots[0][1] && c.Dots[0][1] < c.Dots[2][1]) {
		t.Errorf("dots at %v (axis y %v) do not follow sizes 3, 0, 2, 4", c.Dots, c.Axis)
	}

	p.fake.update(func(s map[string]any) {
		s["now"] = "2026-03-01T12:12:10Z"
		s["world_history"] = append(list(s, "world_history"), map[string]any{
			"at": "2026-03-01T12:12:08Z", "generation": 4, "world_size": 3,
		})
	})
	p.wait("the new history point", `document.getElementById('world-line').dataset.points === '5' &&
		document.querySelectorAll('#world-chart circle.pt').length === 5`)
}

// TestPageBehindPrefix: the page and its poll use relative URLs, so a proxy may put the
// driver under a path.
func TestPageBehindPrefix(t *testing.T) {
	t.Parallel()
	p := open(t, fixture(t, "running"), "/jobs/3f2a9c1b/")
	if got := p.text("#world-size"); got != "4" {
		t.Errorf("world size %q, want 4", got)
	}
}

// TestScreenshot writes docs/live-page-fixture.png-style pictures of the running fixture:
// ELASTICD_SCREENSHOT=$PWD/docs/live-page-fixture.png go test -run TestScreenshot ./driver/webui/
func TestScreenshot(t *testing.T) {
	out := os.Getenv("ELASTICD_SCREENSHOT")
	if out == "" {
		t.Skip("set ELASTICD_SCREENSHOT to a path to write a screenshot of the page there")
	}
	p := open(t, fixture(t, "running"), "/")
	if err := chromedp.Do(p.ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
	// A few polls with a varying rate, so the sparkline has a shape.
	for i, rate := range []float64{84.1, 88.9, 86.2, 90.4, 87.5} {
		p.fake.update(func(s map[string]any) {
			s["now"] = fmt.Sprintf("2026-03-01T12:12:0%d.400Z", 4+i)
			obj(s, "progress")["steps_per_second"] = rate
		})
		p.wait("a poll", fmt.Sprintf(`document.getElementById('rate-spark').dataset.points === '%d'`, i+2))
	}
	p.fake.update(func(s map[string]any) { s["now"] = "2026-03-01T12:12:03.400Z" })
	p.wait("the fixture's own time", `document.body.dataset.updated === "2026-03-01T12:12:03.400Z"`)
	if err := browsertest.Screenshot(p.ctx, out); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", out)
}

// chartRead is what a test reads of one progress chart: its line's points and path, and the
// svg's own count.
const chartRead = `((id) => {
	const svg = document.getElementById(id);
	const line = svg.querySelector('path.line');
	const d = line.getAttribute('d') || '';
	const xy = d ? d.slice(1).split(' L').map(c => c.split(' ').map(Number)) : [];
	return {points: Number(svg.dataset.points), xy: xy, empty: (svg.querySelector('text.empty') || {}).textContent || ''};
})`

type chartData struct {
	Points int          `json:"points"`
	XY     [][2]float64 `json:"xy"`
	Empty  string       `json:"empty"`
}

// The step rate, loss and cost charts draw the progress history: a line through every point
// that has the value, left to right; the loss falls and the cost rises as in the fixture,
// and the rate's dip during the reset reaches the axis.
func TestPageProgressCharts(t *testing.T) {
	t.Parallel()
	s := fixture(t, "running")
	hist := list(s, "progress_history")
	withLoss := 0
	for _, p := range hist {
		if _, ok := p.(map[string]any)["loss"]; ok {
			withLoss++
		}
	}
	if withLoss == 0 || withLoss == len(hist) {
		t.Fatalf("fixture: %d of %d points have a loss; want some without (before the first report)", withLoss, len(hist))
	}
	p := open(t, s, "/")
	for _, tc := range []struct {
		id   string
		want int
	}{{"rate-chart", len(hist)}, {"loss-chart", withLoss}, {"cost-chart", len(hist)}} {
		c := eval[chartData](p, chartRead+`('`+tc.id+`')`)
		if c.Points != tc.want || len(c.XY) != tc.want || c.Empty != "" {
			t.Errorf("%s: %d points, a line through %d, empty text %q; want %d", tc.id, c.Points, len(c.XY), c.Empty, tc.want)
			continue
		}
		for i := 1; i < len(c.XY); i++ {
			if c.XY[i][0] < c.XY[i-1][0] {
				t.Errorf("%s: point %d is left of point %d", tc.id, i, i-1)
				break
			}
		}
		first, last := c.XY[0], c.XY[len(c.XY)-1]
		switch tc.id { // SVG y grows downwards
		case "loss-chart":
			if last[1] <= first[1] {
				t.Errorf("loss line from y %v to %v: want it falling, as the fixture's loss", first[1], last[1])
			}
		case "cost-chart":
			if last[1] >= first[1] {
				t.Errorf("cost line from y %v to %v: want it rising", first[1], last[1])
			}
		case "rate-chart":
			lowest := first[1]
			for _, xy := range c.XY {
				lowest = max(lowest, xy[1])
			}
			axis := eval[float64](p, `Number(document.querySelector('#rate-chart line.axis').getAttribute('y1'))`)
			if lowest != axis {
				t.Errorf("the rate's lowest point is at y %v, the axis at %v: want the reset's 0 on the axis", lowest, axis)
			}
		}
	}
	// The charts span the same time as the world-size chart: the job's start to now.
	if got := eval[[]string](p, `['world-chart', 'rate-chart', 'loss-chart', 'cost-chart'].map(id =>
		Array.from(document.querySelectorAll('#' + id + ' text.tick')).filter(t => t.getAttribute('text-anchor') === 'middle')[0].textContent)`); !slices.Equal(got, []string{"0:00", "0:00", "0:00", "0:00"}) {
		t.Errorf("first time ticks %q: want every chart to start at 0:00", got)
	}

	// A new point shows at the next poll.
	p.fake.update(func(s map[string]any) {
		s["now"] = "2026-03-01T12:12:06Z"
		s["progress_history"] = append(list(s, "progress_history"), map[string]any{
			"t": "2026-03-01T12:12:05Z", "step": 420, "steps_per_second": 80.0, "loss": 0.35, "cost": 1.24,
		})
	})
	p.wait("the new history point", fmt.Sprintf(`document.getElementById('rate-chart').dataset.points === '%d' &&
		document.getElementById('loss-chart').dataset.points === '%d'`, len(hist)+1, withLoss+1))
}

// A program that reports no loss and no total (an old client, or one that does not know):
// the page says so instead of showing numbers, and the time to go is "—".
func TestPageWithoutLossOrTotal(t *testing.T) {
	t.Parallel()
	s := fixture(t, "running")
	pr := obj(s, "progress")
	pr["loss"], pr["total_steps"], pr["eta_seconds"] = nil, 0, nil
	for _, pt := range list(s, "progress_history") {
		delete(pt.(map[string]any), "loss")
	}
	p := open(t, s, "/")
	for sel, want := range map[string]string{
		"#eta":      "—",
		"#step-of":  "step 412 · total steps not reported",
		"#loss":     "—",
		"#loss-sub": "not reported by the program",
	} {
		if got := p.text(sel); got != want {
			t.Errorf("%s shows %q, want %q", sel, got, want)
		}
	}
	if c := eval[chartData](p, chartRead+`('loss-chart')`); c.Points != 0 || !strings.Contains(c.Empty, "no loss reported") {
		t.Errorf("loss chart: %d points, text %q; want none and a note that no loss is reported", c.Points, c.Empty)
	}
	if c := eval[chartData](p, chartRead+`('rate-chart')`); c.Points == 0 {
		t.Error("the rate chart is empty: it needs no loss")
	}
}

// With no price for any of the job's instance time, the page says "unpriced" and how to get
// prices: never a total of $0.00, which would read as a free job.
func TestPageUnpriced(t *testing.T) {
	t.Parallel()
	s := fixture(t, "running")
	s["cost"] = map[string]any{
		"currency": "USD", "total": 0, "spot": 0, "on_demand": 0, "on_demand_equivalent": 0,
		"savings": 0, "savings_percent": 0, "rolled_back": 0,
		"instance_seconds": []any{map[string]any{"lifecycle": "on-demand", "type": "local", "seconds": 723.4, "cost": nil}},
		"unpriced":         []any{"local (on-demand)"},
	}
	for _, h := range list(s, "hosts") {
		h.(map[string]any)["price_per_hour"] = nil
	}
	for _, pt := range list(s, "progress_history") {
		delete(pt.(map[string]any), "cost")
	}
	p := open(t, s, "/")
	if got := p.text("#cost-total"); got != "unpriced" {
		t.Errorf("cost total %q, want unpriced", got)
	}
	panel := eval[string](p, `document.getElementById('cost-total').closest('section').innerText`)
	if strings.Contains(panel, "$0") {
		t.Errorf("the cost panel shows a zero amount:\n%s", panel)
	}
	warn := p.text("#unpriced")
	for _, want := range []string{"Unpriced", "local (on-demand)", "--prices FILE", "examples/prices.yaml"} {
		if !strings.Contains(warn, want) {
			t.Errorf("unpriced note %q lacks %q", warn, want)
		}
	}
	if c := eval[chartData](p, chartRead+`('cost-chart')`); c.Points != 0 || !strings.Contains(c.Empty, "unpriced") || !strings.Contains(c.Empty, "--prices") {
		t.Errorf("cost chart: %d points, text %q; want none and unpriced with --prices", c.Points, c.Empty)
	}
}

// A finished job's driver goes away: the page keeps the final state, says the job finished,
// and does not grey it out as stale.
func TestPageKeepsFinishedJobWhenDriverStops(t *testing.T) {
	t.Parallel()
	p := open(t, fixture(t, "finished"), "/")
	p.fake.setFail("close")
	p.wait("the driver's end noticed", `document.getElementById('conn-state').textContent.includes('job finished')`)
	if stale := eval[bool](p, `document.body.classList.contains('stale')`); stale {
		t.Error("the final state is dimmed as stale")
	}
	for sel, want := range map[string]string{"#step": "2,000", "#finished-title": "Finished · exit code 0", "#eta": "done", "#step-of": "step 2,000 of 2,000 (100.0%)"} {
		if got := p.text(sel); got != want {
			t.Errorf("%s shows %q after the driver stopped, want %q", sel, got, want)
		}
	}
}

// writeReport writes the report of status to a temporary file and returns its path.
func writeReport(t *testing.T, status map[string]any) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := webui.Report(f, status); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// The report is one file: no reference to another file, the status embedded, the page's own
// script and style inline.
func TestReportSelfContained(t *testing.T) {
	b, err := os.ReadFile(writeReport(t, fixture(t, "finished")))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	if m := regexp.MustCompile(`(?:href|src)="(?:app\.js|app\.css|favicon\.svg|v1/status|metrics)"`).FindString(page); m != "" {
		t.Errorf("the report refers to %s, which is not beside it", m)
	}
	for _, want := range []string{`<script type="application/json" id="final-status">{`, `"job_id":"3f2a9c1b"`, "<style>", "'use strict';", "Content-Security-Policy"} {
		if !strings.Contains(page, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

// report.html opened from file:// in Chromium, with no driver anywhere, shows the final
// state: the banner, the figures, the charts, the hosts; it polls nothing, and a status
// string with markup cannot break out of the embedded JSON.
func TestReportRendersFromFile(t *testing.T) {
	t.Parallel()
	const evil = `</script><script>window.pwned=1</script><!--`
	s := fixture(t, "finished")
	s["events"] = append(list(s, "events"), map[string]any{"at": "2026-03-01T12:39:59Z", "kind": "failure", "message": evil})
	path := writeReport(t, s)

	ctx := browsertest.New(t)
	t.Cleanup(func() {
		problems, err := browsertest.Problems(ctx)
		if err != nil {
			t.Error(err)
		}
		for _, pr := range problems {
			t.Errorf("in the report: %s", pr)
		}
	})
	if err := browsertest.Navigate(ctx, "file://"+path); err != nil {
		t.Fatal(err)
	}
	p := &page{t: t, ctx: ctx}
	p.wait("the report drawn", `document.body.dataset.ready === "1" && document.body.dataset.report === "1"`)
	for sel, want := range map[string]string{
		"#finished-title":  "Finished · exit code 0",
		"#phase":           "done",
		"#step":            "2,000",
		"#step-of":         "step 2,000 of 2,000 (100.0%)",
		"#eta":             "done",
		"#loss":            "0.3104",
		"#cost-total":      "$1.23",
		"#events li .msg":  evil,
		"#elapsed":         "40m 00s",
		"#hosts-count":     "(3)",
		"#cost-chart-unit": "USD",
	} {
		if got := p.text(sel); got != want {
			t.Errorf("%s shows %q, want %q", sel, got, want)
		}
	}
	if got := p.text("#conn-state"); !strings.Contains(got, "report") || !strings.Contains(got, "job finished") {
		t.Errorf("conn-state %q: want it to say this is the report of a finished job", got)
	}
	if visible := eval[bool](p, `!!document.querySelector('a[href]')`); visible {
		t.Error("the report shows links to the driver's views, which a file cannot reach")
	}
	n := len(list(s, "progress_history"))
	for _, id := range []string{"rate-chart", "cost-chart"} {
		if c := eval[chartData](p, chartRead+`('`+id+`')`); c.Points != n {
			t.Errorf("%s: %d points, want the history's %d", id, c.Points, n)
		}
	}
	if got := eval[int](p, `document.querySelectorAll('#hosts tr[data-host-id]').length`); got != 3 {
		t.Errorf("%d host rows, want 3", got)
	}
	if pwned := eval[bool](p, `window.pwned !== undefined`); pwned {
		t.Error("a status string ran as script in the report")
	}
	// Drawn once, from the page: no request was made for a status.
	if got := eval[int](p, `performance.getEntriesByType('resource').filter(e => e.name.includes('v1/status')).length`); got != 0 {
		t.Errorf("the report asked for v1/status %d times", got)
	}
	// The style is the live page's.
	if got := eval[string](p, `getComputedStyle(document.querySelector('.stat')).borderTopLeftRadius`); got != "8px" {
		t.Errorf("a .stat card has border radius %q, want app.css's 8px", got)
	}
}

// Under --manage-capacity the page says what was done to the group and what the on-demand
// fallback cost against the time it kept the job going, and marks the fallback hosts.
func TestPageShowsCapacity(t *testing.T) {
	t.Parallel()
	s := fixture(t, "running")
	list(s, "hosts")[1].(map[string]any)["fallback"] = true
	s["capacity"] = map[string]any{
		"group": "aws group spot-g", "desired": 4, "min": 0, "max": 8, "instances": 4,
		"changes": []any{"2 → 4"}, "handed_back": []any{"i-0dead"},
		"fallback": map[string]any{"group": "aws group od-g", "desired": 1, "changes": []any{"0 → 1"}, "hosts": []any{"i-0f9e8d7c6b"},
			"job_seconds": 1500.0, "host_hours": 0.42, "cost": 2.38, "currency": "USD"},
	}
	p := open(t, s, "/")
	want := "Group aws group spot-g: 2 → 4 · handed back for replacement: i-0dead · on-demand fallback aws group od-g: 0 → 1, kept the job going 25m 00s on 0.42 host-hours for $2.38"
	if got := p.text("#capacity"); got != want {
		t.Errorf("#capacity shows %q,\nwant %q", got, want)
	}
	rows := eval[[][]string](p, hostRows)
	if len(rows) < 2 || rows[1][4] != "spot fallback" || rows[0][4] != "spot" {
		t.Errorf("lifecycle cells: %q; want the second host marked fallback", rows)
	}
	// Without --manage-capacity there is nothing to say.
	q := open(t, fixture(t, "running"), "/")
	if hidden := eval[bool](q, `document.getElementById('capacity').hidden`); !hidden {
		t.Error("the capacity line shows for a job without --manage-capacity")
	}
}

// fleet is the running fixture with n hosts h-000, h-001, ..., one worker each (rank = its
// index), the last leaving of them leaving.
func fleet(t *testing.T, n, leaving int) map[string]any {
	s := fixture(t, "running")
	var hosts, workers []any
	for i := range n {
		id, state := fmt.Sprintf("h-%03d", i), "active"
		if i >= n-leaving {
			state = "leaving"
		}
		hosts = append(hosts, map[string]any{"id": id, "addr": "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256),
			"slots": 1, "state": state, "lifecycle": "spot", "type": "g5.xlarge", "zone": "z1", "failures": 0})
		workers = append(workers, map[string]any{"id": id + "/0", "host": id, "slot": 0, "rank": i, "state": "running"})
	}
	s["hosts"], s["workers"] = hosts, workers
	return s
}

// A fleet of hundreds: the page asks the driver for one page of hosts, shows the counts by
// state, steps through the pages and filters by state; the report, which holds every host,
// pages them itself.
func TestPageShowsAPageOfHosts(t *testing.T) {
	t.Parallel()
	f := &fake{status: fleet(t, 250, 10), paged: true}
	p := openFake(t, f, "/")
	firstRow := `(document.querySelector('#hosts tr') || {dataset: {}}).dataset.hostId`
	rows := `document.querySelectorAll('#hosts tr').length`
	if got := eval[int](p, rows); got != 100 {
		t.Errorf("%d host rows, want a page of 100", got)
	}
	if q := f.lastQuery(); q != "limit=100&offset=0" {
		t.Errorf("the page asked v1/status?%s, want limit=100&offset=0", q)
	}
	chips := `Array.from(document.querySelectorAll('#host-states button')).map(b => b.textContent + ':' + b.getAttribute('aria-pressed'))`
	if got := eval[[]string](p, chips); !slices.Equal(got, []string{"all 250:true", "active 240:false", "leaving 10:false"}) {
		t.Errorf("state filters %q", got)
	}
	for sel, want := range map[string]string{"#hosts-count": "(250)", "#hosts-range": "1–100 of 250"} {
		if got := p.text(sel); got != want {
			t.Errorf("%s shows %q, want %q", sel, got, want)
		}
	}

	eval[any](p, `document.getElementById('hosts-next').click()`)
	p.wait("the second page", firstRow+` === 'h-100'`)
	if got, q := p.text("#hosts-range"), f.lastQuery(); got != "101–200 of 250" || q != "limit=100&offset=100" {
		t.Errorf("second page: range %q after v1/status?%s", got, q)
	}
	if got := eval[[]string](p, `Array.from(document.querySelector('#hosts tr').cells).map(c => c.textContent)`); len(got) < 9 || got[8] != "100" {
		t.Errorf("h-100's row %q: want its worker's rank 100", got)
	}

	eval[any](p, `document.querySelector('#host-states button[data-state=leaving]').click()`)
	p.wait("the leaving hosts", firstRow+` === 'h-240' && `+rows+` === 10`)
	if q := f.lastQuery(); q != "limit=100&offset=0&state=leaving" {
		t.Errorf("the leaving hosts asked v1/status?%s", q)
	}
	if hidden := eval[bool](p, `document.getElementById('hosts-pager').hidden`); !hidden {
		t.Error("the pager shows for 10 hosts")
	}

	// The report holds every host and pages them itself.
	path := writeReport(t, fleet(t, 250, 10))
	ctx := browsertest.New(t)
	if err := browsertest.Navigate(ctx, "file://"+path); err != nil {
		t.Fatal(err)
	}
	r := &page{t: t, ctx: ctx}
	r.wait("the report drawn", `document.body.dataset.report === "1"`)
	if got, rng := eval[int](r, rows), r.text("#hosts-range"); got != 100 || rng != "1–100 of 250" {
		t.Errorf("report: %d rows, range %q; want 100, 1–100 of 250", got, rng)
	}
	eval[any](r, `document.getElementById('hosts-next').click(); document.getElementById('hosts-next').click()`)
	r.wait("the report's last page", firstRow+` === 'h-200' && `+rows+` === 50`)
	eval[any](r, `document.querySelector('#host-states button[data-state=leaving]').click()`)
	r.wait("the report's leaving hosts", firstRow+` === 'h-240' && `+rows+` === 10`)
}
