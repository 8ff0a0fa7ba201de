// Package webui is the driver's live page: a self-contained HTML page, embedded in the
// binary, that polls the driver's GET /v1/status and draws the job, its hosts, events and cost.
package webui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// The assets are plain files (no build step), embedded so that the page works on clusters
// with no way out to a CDN.
//
//go:embed assets
var files embed.FS

// csp allows only the page's own files (no inline script or style) and its own origin for
// the status polls; data: images for the icon.
const csp = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'"

type asset struct {
	body  []byte
	ctype string
	etag  string
}

// routes maps a request path to its embedded file and content type.
var routes = map[string]struct{ file, ctype string }{
	"/":            {"assets/index.html", "text/html; charset=utf-8"},
	"/app.js":      {"assets/app.js", "text/javascript; charset=utf-8"},
	"/app.css":     {"assets/app.css", "text/css; charset=utf-8"},
	"/favicon.svg": {"assets/favicon.svg", "image/svg+xml"},
}

// reportCSP keeps the report to itself: it fetches nothing and loads nothing from elsewhere
// (its script and style are inline, its icon a data: URL).
const reportCSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

// Report writes the page as one self-contained HTML file with status (the job's final
// /v1/status, as JSON) embedded in a <script type="application/json" id="final-status">: the
// same page, script and style as the live one, which draws that status once instead of
// polling. It opens from file:// with no driver running: the job's post-mortem.
func Report(w io.Writer, status any) error {
	asset := map[string]string{}
	for _, name := range []string{"index.html", "app.css", "app.js", "favicon.svg"} {
		b, err := files.ReadFile("assets/" + name)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		asset[name] = string(b)
	}
	page, css, js, icon := asset["index.html"], asset["app.css"], asset["app.js"], asset["favicon.svg"]
	// json.Marshal escapes <, > and & in strings, so no status string can end the script.
	data, err := json.Marshal(status)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	for name, body := range map[string]string{"app.css": css, "app.js": js} {
		if strings.Contains(strings.ToLower(body), "</s") {
			return fmt.Errorf("report: %s contains \"</s\", which would end its inline element", name)
		}
	}
	// The links to the driver's views go: a file has no driver beside it.
	nav := regexp.MustCompile(`(?s)\n *<nav class="links".*?</nav>`)
	if len(nav.FindAllStringIndex(page, -1)) != 1 {
		return errors.New("report: index.html has no single <nav class=\"links\"> to drop")
	}
	page = nav.ReplaceAllString(page, "")
	for _, r := range []struct{ old, new string }{
		{`<link rel="icon" href="favicon.svg" type="image/svg+xml">`,
			`<meta http-equiv="Content-Security-Policy" content="` + reportCSP + `">` + "\n" +
				`<link rel="icon" href="data:image/svg+xml;base64,` + base64.StdEncoding.EncodeToString([]byte(icon)) + `" type="image/svg+xml">`},
		{`<link rel="stylesheet" href="app.css">`, "<style>\n" + css + "</style>"},
		{`<script src="app.js" defer></script>` + "\n", ""},
		{"</body>", `<script type="application/json" id="final-status">` + string(data) + "</script>\n<script>\n" + js + "</script>\n</body>"},
	} {
		if strings.Count(page, r.old) != 1 {
			return fmt.Errorf("report: index.html has no single %q to replace", r.old)
		}
		page = strings.Replace(page, r.old, r.new, 1)
	}
	_, err = io.WriteString(w, page)
	return err
}

// Handler serves the page at "/" and its assets next to it; any other path is 404 (the
// driver mounts it at "/" beside its own /v1/ and /metrics routes, which it must not
// shadow), and any method other than GET and HEAD is 405.
func Handler() http.Handler {
	assets := make(map[string]asset, len(routes))
	for path, r := range routes {
		body, err := files.ReadFile(r.file)
		if err != nil {
			panic("webui: embedded asset missing: " + r.file) // a build error, not a runtime one
		}
		sum := sha256.Sum256(body)
		assets[path] = asset{body: body, ctype: r.ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := assets[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", a.ctype)
		// no-cache: revalidate on every load (the ETag makes that a 304), so a driver
		// upgraded in place never serves a page with a stale script.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", a.etag)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", csp)
		h.Set("Referrer-Policy", "no-referrer")
		// ServeContent answers HEAD, If-None-Match and ranges; the zero time sends no
		// Last-Modified (the ETag stands in for it).
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
	})
}
