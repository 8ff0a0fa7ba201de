// Package browsertest starts a headless Chromium for tests that drive a real page (the
// driver's live page), with every wait bounded so that a broken page fails instead of hanging.
package browsertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// EnvChromium names the Chromium binary to use, ahead of the usual places.
const EnvChromium = "ELASTICD_CHROMIUM"

// Install is the advice given when no Chromium is found.
const Install = "run `make test-deps` (it apt-get installs chromium), " +
	"or point $" + EnvChromium + " at a Chromium or Chrome binary"

// Bounds on the waits, so that a test fails within them rather than at the test timeout.
const (
	startTimeout = 30 * time.Second // launching Chromium on a busy CI machine
	waitTimeout  = 20 * time.Second // any one wait on the page
	pollEvery    = 50 * time.Millisecond
)

// flags keep Chromium off the network: without them it tries to reach Google's services
// and, on a machine with no route out, hangs on the refused connections.
var flags = []chromedp.ExecAllocatorOption{
	chromedp.Headless,
	chromedp.NoSandbox,
	chromedp.DisableGPU,
	chromedp.NoFirstRun,
	chromedp.Flag("disable-quic", true),
	chromedp.Flag("disable-background-networking", true),
	chromedp.Flag("disable-component-update", true),
	chromedp.Flag("disable-sync", true),
	chromedp.Flag("disable-dev-shm-usage", true),
	chromedp.WindowSize(1280, 900),
}

// Find returns the Chromium binary: $ELASTICD_CHROMIUM, else /usr/bin/chromium, else
// chromium or chromium-browser in $PATH.
func Find() (string, error) {
	if p := os.Getenv(EnvChromium); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w; %s", EnvChromium, err, Install)
		}
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium", nil
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium in /usr/bin or $PATH; " + Install)
}

// New starts a headless Chromium with a fresh profile in t.TempDir() and returns a context
// of its first tab for chromedp actions. The browser is stopped, and its processes waited
// for, when the test ends. Without a Chromium the test is skipped, unless $CI is set: CI
// must not pass by skipping, so there it fails.
func New(t testing.TB) context.Context {
	t.Helper()
	path, err := Find()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("browsertest: %v", err)
		}
		t.Skipf("browsertest: %v", err)
	}
	// Not t.Context(): that ends before the cleanups run, and the browser must outlive
	// the test's own cleanups (a server it still polls is closed by one of them).
	ctx, stop, err := Start(context.WithoutCancel(t.Context()), path, t.TempDir(), t.Logf)
	if err != nil {
		t.Fatalf("browsertest: %v", err)
	}
	// stop kills Chromium and waits for its processes. Cleanups run last-in first-out:
	// start the servers the page talks to before New, so that the browser is gone first.
	t.Cleanup(stop)
	return ctx
}

// Start starts the headless Chromium at path (Find) with its profile in dir, outside a test
// (the scale benchmark times the live page with it), and returns the context of its first
// tab; stop kills it and waits for its processes.
func Start(parent context.Context, path, dir string, logf func(string, ...any)) (ctx context.Context, stop func(), err error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], flags...)
	opts = append(opts, chromedp.ExecPath(path), chromedp.UserDataDir(dir))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(logf))
	stop = func() {
		cancel()
		cancelAlloc()
	}

	// The first action starts the browser and binds it to the context it is given, so it
	// runs on ctx itself; the timer bounds it by cancelling ctx.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case err := <-started:
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("start %s: %w", path, err)
		}
	case <-timer.C:
		cancel()
		<-started
		stop()
		return nil, nil, fmt.Errorf("start %s: no answer in %v", path, startTimeout)
	}
	if err := chromedp.Do(ctx, func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument,
			page.AddScriptToEvaluateOnNewDocumentParams{Source: recordProblems})
		return chromedp.Void{}, err
	}); err != nil {
		stop()
		return nil, nil, fmt.Errorf("install the problem recorder: %w", err)
	}
	return ctx, stop, nil
}

// recordProblems runs before every page's own scripts (the CSP does not apply to it) and
// keeps what a test would otherwise only see in a console: uncaught errors, rejected
// promises, files that failed to load, and whatever the Content-Security-Policy blocked.
const recordProblems = `(() => {
  const problems = [];
  Object.defineProperty(window, '__browsertestProblems', { value: problems });
  addEventListener('error', (e) => {
    if (e.target && e.target !== window) {
      problems.push('failed to load <' + e.target.localName + '> ' + (e.target.src || e.target.href || ''));
    } else {
      problems.push('uncaught ' + e.message + ' at ' + e.filename + ':' + e.lineno);
    }
  }, true);
  addEventListener('unhandledrejection', (e) => problems.push('unhandled rejection: ' + e.reason));
  document.addEventListener('securitypolicyviolation', (e) =>
    problems.push('CSP ' + e.effectiveDirective + ' blocked ' + (e.blockedURI || 'inline code') +
      ' at ' + e.sourceFile + ':' + e.lineNumber));
})();`

// Problems returns what went wrong in the page so far: uncaught errors, unhandled promise
// rejections, elements whose file failed to load, and Content-Security-Policy violations.
func Problems(ctx context.Context) ([]string, error) {
	return Eval[[]string](ctx, `Array.from(window.__browsertestProblems || [])`)
}

// Navigate loads url in the tab.
func Navigate(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		return fmt.Errorf("navigate to %s: %w", url, err)
	}
	return nil
}

// Wait waits until the JavaScript expression is truthy in the page, for at most 20 s.
func Wait(ctx context.Context, expr string) error {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout+time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(pollEvery), chromedp.WithPollingTimeout(waitTimeout)))
	if err != nil {
		return fmt.Errorf("wait for %s: %w", expr, err)
	}
	return nil
}

// Eval evaluates a JavaScript expression in the page and decodes its value into T.
func Eval[T any](ctx context.Context, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		return v, fmt.Errorf("evaluate %s: %w", expr, err)
	}
	return v, nil
}

// Text returns the textContent of the first element that the CSS selector matches, waiting
// (at most 20 s) for one to exist.
func Text(ctx context.Context, sel string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		return "", fmt.Errorf("text of %s: %w", sel, err)
	}
	return s, nil
}

// Screenshot writes a PNG of the whole page, beyond the viewport, to path.
func Screenshot(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, func(ctx context.Context, t *chromedp.Target) ([]byte, error) {
		m, err := cdp.Call(ctx, t, page.GetLayoutMetrics, cdp.Empty{})
		if err != nil {
			return nil, err
		}
		if m.CSSContentSize == nil {
			return nil, errors.New("no content size in the layout metrics")
		}
		yes := true
		r, err := cdp.Call(ctx, t, page.CaptureScreenshot, page.CaptureScreenshotParams{
			Format:                page.CaptureScreenshotFormatPng,
			CaptureBeyondViewport: &yes,
			FromSurface:           &yes,
			Clip: &page.Viewport{
				Width: m.CSSContentSize.Width, Height: m.CSSContentSize.Height, Scale: 1,
			},
		})
		if err != nil {
			return nil, err
		}
		return r.Data, nil
	})
	if err != nil {
		return fmt.Errorf("screenshot: %w", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		return fmt.Errorf("screenshot: %w", err)
	}
	return nil
}
