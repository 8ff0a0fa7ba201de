// Package webui is the driver's live page: a self-contained HTML page, embedded in the
// binary, that polls the driver's GET /v1/status and draws the job, its hosts, events and cost.
package webui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"net/http"
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
