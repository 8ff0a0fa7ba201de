package aws_test

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/aws"
)

// TestMain gives the SDK's default chain dummy credentials and nothing else: no shared config
// or credentials files, no profile, no instance metadata, no endpoint from the environment.
func TestMain(m *testing.M) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AWS_") {
			os.Unsetenv(k)
		}
	}
	dir, err := os.MkdirTemp("", "elasticd-aws-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           "AKIDELASTICDTEST",
		"AWS_SECRET_ACCESS_KEY":       "elasticd-test-secret",
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_CONFIG_FILE":             dir + "/config",
		"AWS_SHARED_CREDENTIALS_FILE": dir + "/credentials",
	} {
		os.Setenv(k, v)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newProvider is a provider of the fake's group in us-east-1, polling the APIs on every call
// unless cfg says otherwise; its log goes to t.Log.
func newProvider(t testing.TB, f *fakeAWS, cfg aws.Config) *aws.Provider {
	t.Helper()
	if cfg.ASG == "" {
		cfg.ASG = fakeGroup
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = f.srv.URL
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = time.Nanosecond
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	p, err := aws.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func testLogger(t testing.TB) *slog.Logger {
	if _, ok := t.(*testing.B); ok {
		return nil
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
