package browsertest_test

import (
	"bytes"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/elasticd/elasticd/internal/browsertest"
)

const page = `<!doctype html><title>t</title>
<body><p id="greeting">hello</p><div id="tall"></div>
<script>
document.getElementById('tall').setAttribute('style', 'height:2000px');
setTimeout(function () { document.getElementById('greeting').textContent = 'later'; }, 300);
</script>`

// broken is a page with every kind of problem that Problems reports.
const broken = `<!doctype html><title>broken</title>
<body><img src="missing.png">
<script>window.inlineRan = true;</script>
<p style="color: red">styled</p>
<script src="throws.js"></script>`

func serve(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page))
	})
	mux.HandleFunc("/broken", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'")
		_, _ = w.Write([]byte(broken))
	})
	mux.HandleFunc("/throws.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		_, _ = w.Write([]byte(`Promise.reject(new Error("nobody catches me")); null.boom;`))
	})
	mux.HandleFunc("/missing.png", http.NotFound)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestProblems(t *testing.T) {
	srv := serve(t)
	ctx := browsertest.New(t)

	if err := browsertest.Navigate(ctx, srv.URL); err != nil {
		t.Fatal(err)
	}
	if got, err := browsertest.Problems(ctx); err != nil || len(got) != 0 {
		t.Errorf("a clean page: Problems = %q, %v; want none", got, err)
	}

	if err := browsertest.Navigate(ctx, srv.URL+"/broken"); err != nil {
		t.Fatal(err)
	}
	if err := browsertest.Wait(ctx, `window.__browsertestProblems.length >= 5`); err != nil {
		got, _ := browsertest.Problems(ctx)
		t.Fatalf("%v; problems so far: %q", err, got)
	}
	got, err := browsertest.Problems(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		"failed to load <img> " + srv.URL + "/missing.png",
		"CSP script-src-elem blocked inline",
		"CSP style-src-attr blocked inline",
		"uncaught Uncaught TypeError",
		"unhandled rejection: Error: nobody catches me",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("problems do not mention %q:\n%s", want, all)
		}
	}
}

func TestBrowser(t *testing.T) {
	srv := serve(t)
	var pids []int
	t.Run("page", func(t *testing.T) {
		ctx := browsertest.New(t)
		if err := browsertest.Navigate(ctx, srv.URL); err != nil {
			t.Fatal(err)
		}
		if err := browsertest.Wait(ctx, `document.getElementById('greeting').textContent === 'later'`); err != nil {
			t.Fatal(err)
		}
		got, err := browsertest.Text(ctx, "#greeting")
		if err != nil || got != "later" {
			t.Fatalf("Text(#greeting) = %q, %v; want \"later\"", got, err)
		}
		n, err := browsertest.Eval[int](ctx, `document.querySelectorAll('p').length`)
		if err != nil || n != 1 {
			t.Fatalf("Eval = %d, %v; want 1", n, err)
		}

		path := filepath.Join(t.TempDir(), "page.png")
		if err := browsertest.Screenshot(ctx, path); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("screenshot is not a PNG: %v", err)
		}
		// Full page: the 2000 px div is beyond the 900 px window.
		if s := img.Bounds().Size(); s.X < 1000 || s.Y < 2000 {
			t.Errorf("screenshot is %v, want the whole page (at least 1000x2000)", s)
		}

		if runtime.GOOS == "linux" {
			p := chromedp.FromContext(ctx).Browser.Process()
			if p == nil {
				t.Fatal("no browser process")
			}
			pids = append([]int{p.Pid}, descendants(t, p.Pid)...)
			if len(pids) < 2 {
				t.Fatalf("found no child processes of Chromium (pid %d): the check below would prove nothing", p.Pid)
			}
		}
	})
	// The subtest's cleanups have run: Chromium and every process it started must be gone.
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d of the browser is still running after the test", pid)
		}
	}
}

// descendants lists the processes below pid, from /proc.
func descendants(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := parent(p); ok {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	for todo := []int{pid}; len(todo) > 0; {
		p := todo[0]
		todo = todo[1:]
		out = append(out, children[p]...)
		todo = append(todo, children[p]...)
	}
	return out
}

// parent reads a process's parent ID from /proc/PID/stat (after the command's closing paren,
// which may itself hold spaces and parens).
func parent(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 {
		return 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return pp, err == nil
}

// alive says whether pid runs: a zombie (exited, not reaped yet by its new parent) does not.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// recorder is a testing.TB that records Skipf and Fatalf and stops the goroutine as they do.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestNoChromium(t *testing.T) {
	t.Setenv(browsertest.EnvChromium, filepath.Join(t.TempDir(), "no-such-chromium"))
	for _, tc := range []struct {
		ci       string
		wantSkip bool
	}{
		{ci: "", wantSkip: true},
		{ci: "true", wantSkip: false},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				browsertest.New(r)
				t.Error("New returned without a browser")
			}()
			<-done
			got := r.failed
			if tc.wantSkip {
				got = r.skipped
			}
			if !strings.Contains(got, "make test-deps") {
				t.Errorf("skipped %q, failed %q; want the advice (make test-deps) in the %s",
					r.skipped, r.failed, map[bool]string{true: "skip", false: "failure"}[tc.wantSkip])
			}
		})
	}
}
