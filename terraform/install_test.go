package terraform_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	"go.yaml.in/yaml/v3"

	"github.com/elasticd/elasticd/driver/agents"
)

// renderInstall renders the shared module's install script with HCL's own template engine
// (what templatefile uses), so that it runs here without the terraform binary.
func renderInstall(t *testing.T, vars map[string]string) string {
	t.Helper()
	path := filepath.Join(sharedModule, "templates", "install-elasticd.sh.tftpl")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	expr, diags := hclsyntax.ParseTemplate(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	values := map[string]cty.Value{}
	for k, v := range vars {
		values[k] = cty.StringVal(v)
	}
	out, diags := expr.Value(&hcl.EvalContext{Variables: values})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return out.AsString()
}

// releaseTarball is a tarball shaped like make release's: a directory holding elasticd.
func releaseTarball(t *testing.T, binary string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, body string }{
		{"elasticd-v9.9.9-linux-amd64/README.md", "readme\n"},
		{"elasticd-v9.9.9-linux-amd64/elasticd", binary},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o755, Size: int64(len(f.body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
}

// runInstall runs the rendered script with sh, the metadata service at metadata and
// elasticd going to a temporary directory; it returns that directory and the script's error.
func runInstall(t *testing.T, script, metadata string) (string, []byte, error) {
	t.Helper()
	bindir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.Env = append(os.Environ(), "ELASTICD_METADATA_URL="+metadata, "ELASTICD_BIN_DIR="+bindir, "ELASTICD_RETRY_SLEEP=0")
	out, err := cmd.CombinedOutput()
	return bindir, out, err
}

// The fake cloud's secrets.
const (
	fakeKeyID   = "ASIAFAKEKEYID"
	fakeSecret  = "fakeSecretAccessKey/with+signs"
	fakeSession = "FwoGZXIvYXdzEFAKE//session=="
	fakeToken   = "ya29.fake-access-token"
)

// fakeCloud serves the metadata services and the object stores of the three clouds the install
// script fetches from with an instance's identity, checking each request as the cloud would:
// IMDSv2's session token, SigV4 (verified with the AWS SDK's own signer), the metadata
// servers' headers, the bearer tokens. s3Secret is the secret S3 verifies with.
func fakeCloud(t *testing.T, tarball []byte, s3Secret string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	const imdsToken = "imds-session-token"
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
			http.Error(w, "no ttl", http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, imdsToken)
	})
	imds := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-aws-ec2-metadata-token") != imdsToken {
				http.Error(w, "IMDSv2 token required", http.StatusUnauthorized)
				return
			}
			fmt.Fprint(w, body)
		}
	}
	mux.HandleFunc("GET /latest/meta-data/iam/security-credentials/", imds("demo-gpu\n"))
	// As IMDS formats it: indented, several lines.
	mux.HandleFunc("GET /latest/meta-data/iam/security-credentials/demo-gpu", imds(fmt.Sprintf(`{
  "Code" : "Success",
  "LastUpdated" : "2026-11-26T01:00:00Z",
  "Type" : "AWS-HMAC",
  "AccessKeyId" : %q,
  "SecretAccessKey" : %q,
  "Token" : %q,
  "Expiration" : "2026-11-26T07:00:00Z"
}`, fakeKeyID, fakeSecret, fakeSession)))
	mux.HandleFunc("GET /bucket/releases/elasticd.tar.gz", func(w http.ResponseWriter, r *http.Request) {
		if err := verifySigV4(r, s3Secret); err != nil {
			http.Error(w, "SignatureDoesNotMatch: "+err.Error(), http.StatusForbidden)
			return
		}
		w.Write(tarball)
	})

	mux.HandleFunc("GET /computeMetadata/v1/instance/service-accounts/default/token", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "Metadata-Flavor: Google required", http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, `{"access_token":%q,"expires_in":3599,"token_type":"Bearer"}`, fakeToken)
	})
	mux.HandleFunc("GET /storage/v1/b/bucket/o/elasticd.tar.gz", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+fakeToken || r.URL.Query().Get("alt") != "media" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Write(tarball)
	})

	mux.HandleFunc("GET /metadata/identity/oauth2/token", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.Header.Get("Metadata") != "true" || q.Get("resource") != "https://storage.azure.com/" || q.Get("client_id") != "reader-client-id" {
			http.Error(w, "bad token request", http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, `{"access_token":%q,"client_id":"reader-client-id","expires_in":"86399","resource":"https://storage.azure.com/","token_type":"Bearer"}`, fakeToken)
	})
	mux.HandleFunc("GET /container/elasticd.tar.gz", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+fakeToken || r.Header.Get("x-ms-version") == "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Write(tarball)
	})

	mux.HandleFunc("GET /public/elasticd.tar.gz", func(w http.ResponseWriter, r *http.Request) { w.Write(tarball) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

var authHeader = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, ?SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})$`)

// verifySigV4 checks the request's signature as S3 would: it signs the same request (the
// headers the client signed) with the AWS SDK's signer and compares. S3 needs the session
// token and the payload hash among the signed headers.
func verifySigV4(r *http.Request, secret string) error {
	m := authHeader.FindStringSubmatch(r.Header.Get("Authorization"))
	if m == nil {
		return fmt.Errorf("authorization %q", r.Header.Get("Authorization"))
	}
	keyID, region, signed := m[1], m[3], strings.Split(m[4], ";")
	if keyID != fakeKeyID || region != "eu-west-1" {
		return fmt.Errorf("credential %s for %s", keyID, region)
	}
	for _, h := range []string{"host", "x-amz-content-sha256", "x-amz-date", "x-amz-security-token"} {
		if !strings.Contains(";"+m[4]+";", ";"+h+";") {
			return fmt.Errorf("%s is not signed (%s)", h, m[4])
		}
	}
	if r.Header.Get("X-Amz-Security-Token") != fakeSession {
		return fmt.Errorf("session token %q", r.Header.Get("X-Amz-Security-Token"))
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return err
	}
	again, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), nil)
	if err != nil {
		return err
	}
	for _, h := range signed {
		switch h {
		case "host", "x-amz-date", "x-amz-security-token":
		default:
			again.Header.Set(h, r.Header.Get(h))
		}
	}
	creds := aws.Credentials{AccessKeyID: keyID, SecretAccessKey: secret, SessionToken: fakeSession}
	err = v4.NewSigner().SignHTTP(context.Background(), creds, again, r.Header.Get("X-Amz-Content-Sha256"), "s3", region, when,
		func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	if err != nil {
		return err
	}
	if got, want := r.Header.Get("Authorization"), again.Header.Get("Authorization"); got != want {
		return fmt.Errorf("signature\n  %s\nwant\n  %s", got, want)
	}
	return nil
}

// needCurl skips a test without curl, except in CI, where scripts/install-test-deps.sh
// installs it and its absence is a failure, not a reason to test less.
func needCurl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not on PATH: scripts/install-test-deps.sh installs it")
		}
		t.Skip("curl is not on PATH (scripts/install-test-deps.sh installs it)")
	}
}

// TestInstallScript runs the install script with sh and curl against a fake of each way it
// fetches a release: an https URL, and the object the cloud module uploaded from
// elasticd_release_path, read with the instance's identity on AWS, GCP and Azure.
func TestInstallScript(t *testing.T) {
	needCurl(t)
	const binary = "#!/bin/sh\necho elasticd v9.9.9\n"
	tarball, sum := releaseTarball(t, binary)
	srv := fakeCloud(t, tarball, fakeSecret)
	cases := map[string]map[string]string{
		"https":      {"fetch": "https", "url": srv.URL + "/public/elasticd.tar.gz"},
		"s3":         {"fetch": "s3", "url": srv.URL + "/bucket/releases/elasticd.tar.gz", "region": "eu-west-1"},
		"gcs":        {"fetch": "gcs", "url": srv.URL + "/storage/v1/b/bucket/o/elasticd.tar.gz?alt=media"},
		"azure-blob": {"fetch": "azure-blob", "url": srv.URL + "/container/elasticd.tar.gz", "client_id": "reader-client-id"},
	}
	for name, vars := range cases {
		t.Run(name, func(t *testing.T) {
			full := map[string]string{"sha256": sum, "region": "", "client_id": ""}
			for k, v := range vars {
				full[k] = v
			}
			bindir, out, err := runInstall(t, renderInstall(t, full), srv.URL)
			if err != nil {
				t.Fatalf("install-elasticd: %v\n%s", err, out)
			}
			got, err := os.ReadFile(filepath.Join(bindir, "elasticd"))
			if err != nil || string(got) != binary {
				t.Errorf("installed elasticd %q (%v), want the tarball's", got, err)
			}
			if st, err := os.Stat(filepath.Join(bindir, "elasticd")); err != nil || st.Mode().Perm() != 0o755 {
				t.Errorf("installed elasticd's mode: %v %v", st.Mode(), err)
			}
		})
	}
}

// TestInstallScriptCanFail: a download that does not match the checksum, a signature S3
// would refuse, and a missing token are each refused, and nothing is installed.
func TestInstallScriptCanFail(t *testing.T) {
	needCurl(t)
	tarball, sum := releaseTarball(t, "#!/bin/sh\n")
	good := fakeCloud(t, tarball, fakeSecret)
	otherKey := fakeCloud(t, tarball, "another secret")
	cases := map[string]struct {
		srv  *httptest.Server
		vars map[string]string
		want string
	}{
		"checksum":  {good, map[string]string{"fetch": "https", "url": good.URL + "/public/elasticd.tar.gz", "sha256": strings.Repeat("0", 64)}, "FAILED"},
		"signature": {otherKey, map[string]string{"fetch": "s3", "url": otherKey.URL + "/bucket/releases/elasticd.tar.gz", "region": "eu-west-1"}, "cannot download"},
		"identity":  {good, map[string]string{"fetch": "azure-blob", "url": good.URL + "/container/elasticd.tar.gz", "client_id": "someone-else"}, "cannot download"},
		"method":    {good, map[string]string{"fetch": "ftp", "url": good.URL + "/public/elasticd.tar.gz"}, "unknown fetch method 'ftp'"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			full := map[string]string{"sha256": sum, "region": "", "client_id": ""}
			for k, v := range c.vars {
				full[k] = v
			}
			bindir, out, err := runInstall(t, renderInstall(t, full), c.srv.URL)
			if err == nil {
				t.Fatalf("install-elasticd succeeded:\n%s", out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("install-elasticd failed without %q:\n%s", c.want, out)
			}
			if _, err := os.Stat(filepath.Join(bindir, "elasticd")); err == nil {
				t.Error("elasticd was installed anyway")
			}
		})
	}
}

// agentFlags evaluates the agent's flags as the shared module's outputs.tf passes them to the
// agent's cloud-config (agent_flags), for a driver at ip:port and a metadata service.
func agentFlags(t *testing.T, ip string, port int, metadata string) string {
	t.Helper()
	path := filepath.Join(sharedModule, "outputs.tf")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{
		"var":   cty.ObjectVal(map[string]cty.Value{"driver_ip": cty.StringVal(ip), "agent_metadata": cty.StringVal(metadata)}),
		"local": cty.ObjectVal(map[string]cty.Value{"driver_port": cty.NumberIntVal(int64(port))}),
	}}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		if b.Type != "output" || len(b.Labels) != 1 || b.Labels[0] != "agent_user_data" {
			continue
		}
		call, ok := b.Body.Attributes["value"].Expr.(*hclsyntax.FunctionCallExpr)
		if !ok || call.Name != "templatefile" || len(call.Args) != 2 {
			t.Fatalf("%s: agent_user_data is not templatefile(PATH, {...})", path)
		}
		obj, ok := call.Args[1].(*hclsyntax.ObjectConsExpr)
		if !ok {
			t.Fatalf("%s: agent_user_data's template variables are not an object", path)
		}
		for _, item := range obj.Items {
			if hcl.ExprAsKeyword(item.KeyExpr) != "agent_flags" {
				continue
			}
			v, diags := item.ValueExpr.Value(ctx)
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			return v.AsString()
		}
	}
	t.Fatalf("%s: no agent_flags passed to the agent's cloud-config", path)
	return ""
}

// renderAgent renders the shared module's agent cloud-config with HCL's template engine and
// the functions it calls, as templatefile would.
func renderAgent(t *testing.T, flags string) string {
	t.Helper()
	path := filepath.Join(sharedModule, "templates", "agent.yaml.tftpl")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	expr, diags := hclsyntax.ParseTemplate(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	base64encode := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "s", Type: cty.String}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			return cty.StringVal(base64.StdEncoding.EncodeToString([]byte(args[0].AsString()))), nil
		},
	})
	out, diags := expr.Value(&hcl.EvalContext{
		Variables: map[string]cty.Value{
			"name":           cty.StringVal("demo"),
			"agent_secret":   cty.StringVal("0123456789abcdef0123456789abcdef"),
			"install_script": cty.StringVal("#!/bin/sh\ntrue\n"),
			"setup_commands": cty.ListVal([]cty.Value{cty.StringVal("echo setup")}),
			"agent_flags":    cty.StringVal(flags),
		},
		Functions: map[string]function.Function{"base64encode": base64encode, "join": stdlib.JoinFunc, "concat": stdlib.ConcatFunc},
	})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return out.AsString()
}

// runAgentCheck runs the rendered check script with sh, elasticd taken from bindir and its log
// going to a temporary file; it returns the log, the script's output and its error.
func runAgentCheck(t *testing.T, script, bindir string, env ...string) (string, []byte, error) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "elasticd-agent-check.log")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.Env = append(append(os.Environ(), "ELASTICD_BIN_DIR="+bindir, "ELASTICD_AGENT_CHECK_LOG="+log), env...)
	out, err := cmd.CombinedOutput()
	got, rerr := os.ReadFile(log)
	if rerr != nil {
		t.Errorf("no log at %s: %v\noutput:\n%s", log, rerr, out)
	}
	return string(got), out, err
}

// fakeElasticd writes an elasticd to dir that runs body (sh), and returns dir.
func fakeElasticd(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "elasticd"), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestAgentCheckAtInstall: a GPU host's cloud-config runs `elasticd agent --check` with the
// agent's own flags once, after installing elasticd and the worker setup and before the agent
// starts, and logs what it says; it never fails and never holds the boot up: a failed check,
// a check that hangs and an elasticd that was never installed all let the agent start.
func TestAgentCheckAtInstall(t *testing.T) {
	flags := agentFlags(t, "10.0.0.5", 29400, "aws")
	if want := "--driver http://10.0.0.5:29400 --agent-secret-file /etc/elasticd/agent-secret --metadata aws"; flags != want {
		t.Fatalf("agent_flags %q, want %q", flags, want)
	}
	doc := renderAgent(t, flags)
	files := cloudConfigFiles(t, doc)
	var cc struct{ Runcmd [][]string }
	if err := yaml.Unmarshal([]byte(doc), &cc); err != nil {
		t.Fatal(err)
	}
	at := func(prog string) int {
		for i, c := range cc.Runcmd {
			if len(c) > 0 && c[0] == prog || slices.Contains(c, prog) {
				return i
			}
		}
		t.Fatalf("runcmd does not run %s: %q", prog, cc.Runcmd)
		return -1
	}
	if !(at("/usr/local/sbin/install-elasticd") < at("/usr/local/sbin/elasticd-worker-setup") &&
		at("/usr/local/sbin/elasticd-worker-setup") < at("/usr/local/sbin/elasticd-agent-check") &&
		at("/usr/local/sbin/elasticd-agent-check") < at("elasticd-agent.service")) {
		t.Errorf("runcmd %q: want the install, the setup, the check, then the agent", cc.Runcmd)
	}
	unit := files["/etc/systemd/system/elasticd-agent.service"]
	if !strings.Contains(unit, "ExecStart=/usr/local/bin/elasticd agent "+flags+"\n") {
		t.Errorf("elasticd-agent.service does not run the agent with %q:\n%s", flags, unit)
	}
	script := files["/usr/local/sbin/elasticd-agent-check"]
	if !strings.HasPrefix(script, "#!/bin/sh\n") || !strings.Contains(script, `"$bin/elasticd" agent --check `+flags+" ") {
		t.Fatalf("elasticd-agent-check does not run elasticd agent --check with the agent's flags:\n%s", script)
	}
	if !strings.Contains(script, "/var/log/elasticd-agent-check.log") {
		t.Errorf("elasticd-agent-check does not log to /var/log/elasticd-agent-check.log:\n%s", script)
	}

	t.Run("check fails", func(t *testing.T) {
		bin := fakeElasticd(t, `echo "args: $*"; echo "✘ driver: 10.0.0.5:29400 unreachable"; echo "  fix: start the driver"; exit 1`)
		log, out, err := runAgentCheck(t, script, bin)
		if err != nil {
			t.Fatalf("the check script failed: %v\n%s", err, out)
		}
		for _, want := range []string{"args: agent --check " + flags + "\n", "✘ driver: 10.0.0.5:29400 unreachable\n  fix: start the driver\n", "a check failed", "the agent starts anyway"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q:\n%s", want, log)
			}
		}
		if !strings.Contains(string(out), "✘ driver") {
			t.Errorf("the check's lines are not in the script's output (cloud-init's log):\n%s", out)
		}
	})
	t.Run("check hangs", func(t *testing.T) {
		bin := fakeElasticd(t, "exec sleep 30")
		start := time.Now()
		log, out, err := runAgentCheck(t, script, bin, "ELASTICD_AGENT_CHECK_LIMIT=1")
		if err != nil {
			t.Fatalf("the check script failed: %v\n%s", err, out)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("a hanging check held the boot %v", took)
		}
		if !strings.Contains(log, "stopped after 1 s") {
			t.Errorf("log does not say the check was stopped:\n%s", log)
		}
	})
	t.Run("no elasticd", func(t *testing.T) {
		log, out, err := runAgentCheck(t, script, t.TempDir())
		if err != nil {
			t.Fatalf("the check script failed without elasticd: %v\n%s", err, out)
		}
		if !strings.Contains(log, "exit 127") {
			t.Errorf("log does not say elasticd could not run:\n%s", log)
		}
	})
	t.Run("elasticd", func(t *testing.T) {
		// The real binary reads the rendered flags: a driver registry on loopback answers.
		secret := []byte("0123456789abcdef0123456789abcdef")
		reg, err := agents.New(agents.Config{Secret: secret, JobID: "job-tf", Version: "v9.9.9"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Close)
		srv := httptest.NewServer(reg)
		t.Cleanup(srv.Close)
		_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
		p, _ := strconv.Atoi(port)
		script := cloudConfigFiles(t, renderAgent(t, agentFlags(t, "127.0.0.1", p, "none")))["/usr/local/sbin/elasticd-agent-check"]
		log, out, err := runAgentCheck(t, script, buildElasticd(t))
		if err != nil {
			t.Fatalf("the check script failed: %v\n%s", err, out)
		}
		for _, want := range []string{"✔ driver: 127.0.0.1:" + port + " answers", "- metadata service: skipped: --metadata none", "the agent starts anyway"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q:\n%s", want, log)
			}
		}
		if n := len(reg.Agents()); n != 0 {
			t.Errorf("the check registered %d agents", n)
		}
	})
}

// buildElasticd builds cmd/elasticd into a directory it returns (ELASTICD_TEST_BIN names a
// prebuilt one instead).
func buildElasticd(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("ELASTICD_TEST_BIN"); bin != "" {
		dir := t.TempDir()
		if err := os.Symlink(bin, filepath.Join(dir, "elasticd")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "elasticd"), "../cmd/elasticd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}
