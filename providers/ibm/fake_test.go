package ibm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/ibm"
)

// The fake speaks the VPC API's wire format for the three calls the provider makes: JSON
// bodies rendered from the templates in testdata/ (shaped like real replies, every field the
// SDK knows about filled), pages with first/next hrefs and opaque start tokens, the API's
// error bodies, its query parameters (version, generation=2, limit 1…100) checked.

const (
	groupID   = "r006-ig-gpu-spot"
	groupName = "gpu-spot"
	// apiMaxPage is the VPC API's largest page (limit=100).
	apiMaxPage = 100
)

// Endpoints of the fake, as counted.
const (
	epGroups      = "groups"
	epMemberships = "memberships"
	epInstances   = "instances"
)

var (
	tmplFuncs = template.FuncMap{"js": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	}}
	instanceTmpl   = template.Must(template.New("instance.json.tmpl").Funcs(tmplFuncs).ParseFiles("testdata/instance.json.tmpl"))
	leanTmpl       = template.Must(template.New("instance_lean.json.tmpl").Funcs(tmplFuncs).ParseFiles("testdata/instance_lean.json.tmpl"))
	leanMemberTmpl = template.Must(template.New("membership_lean.json.tmpl").Funcs(tmplFuncs).ParseFiles("testdata/membership_lean.json.tmpl"))
	membershipTmpl = template.Must(template.New("membership.json.tmpl").Funcs(tmplFuncs).ParseFiles("testdata/membership.json.tmpl"))
	groupTmpl      = template.Must(template.New("instance_group.json.tmpl").Funcs(tmplFuncs).ParseFiles("testdata/instance_group.json.tmpl"))
	versionRE      = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)
)

// fakeInstance is one instance of the fake region.
type fakeInstance struct {
	ID, Name, Status, Reason, Lifecycle, Zone, Profile, Class, IP string
	Created                                                       time.Time
	GPUs                                                          int
	// Attachment: the IP is on a primary network attachment (newer instances); otherwise on
	// the primary network interface only, and the attachment is absent.
	Attachment bool
	// Group is the instance group the instance says it belongs to; "" none.
	Group string
	// Membership is the status of its membership in Group's listing; "" lists none.
	Membership string
}

type fakeGroup struct{ ID, Name string }

// reply is a canned answer to one request.
type reply struct {
	status      int
	retryAfter  string
	file        string // under testdata/; {{BASE}} becomes the API base URL
	contentType string // default application/json
}

type request struct {
	endpoint string
	at       time.Time
	path     string
	query    string
}

type fakeVPC struct {
	t    testing.TB
	srv  *httptest.Server
	base string // the API base URL, with /v1 as the real one has
	done chan struct{}

	mu           sync.Mutex
	groups       []fakeGroup
	instances    []fakeInstance
	pageMax      int
	ignoreFilter bool
	stalled      bool
	// lean serves instances with only the fields the provider reads (a partial reply, as
	// an older API version might send), a tenth of the bytes: for tests that count requests
	// of large groups under the race detector.
	lean     bool
	queued   map[string][]reply
	sticky   map[string]*reply
	calls    map[string]int
	reqs     []request
	rendered map[fakeInstance][2][]byte // instance JSON, membership JSON
}

func newFake(t testing.TB, instances ...fakeInstance) *fakeVPC {
	t.Helper()
	f := &fakeVPC{
		t:         t,
		done:      make(chan struct{}),
		groups:    []fakeGroup{{"r006-ig-other", "cpu-pool"}, {groupID, groupName}},
		instances: instances,
		pageMax:   apiMaxPage,
		queued:    make(map[string][]reply),
		sticky:    make(map[string]*reply),
		calls:     make(map[string]int),
		rendered:  make(map[fakeInstance][2][]byte),
	}
	f.srv = httptest.NewServer(f)
	f.base = f.srv.URL + "/v1"
	t.Cleanup(func() {
		close(f.done) // lets stalled handlers go, so that Close does not wait for them
		f.srv.Close()
	})
	return f
}

// provider makes a provider for the fake's group; zero fields of cfg get test defaults.
func (f *fakeVPC) provider(t testing.TB, cfg ibm.Config) *ibm.Provider {
	t.Helper()
	if cfg.InstanceGroup == "" {
		cfg.InstanceGroup = groupName
	}
	if cfg.Region == "" {
		cfg.Region = "us-south"
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = f.base
	}
	if cfg.Authenticator == nil {
		cfg.Authenticator = &core.NoAuthAuthenticator{}
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = time.Nanosecond // every poll reaches the fake unless a test says otherwise
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		if tt, ok := t.(*testing.T); ok {
			cfg.Logger = slog.New(slog.NewTextHandler(testWriter{tt}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	}
	p, err := ibm.New(cfg)
	if err != nil {
		t.Fatalf("ibm.New: %v", err)
	}
	return p
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// update changes the fake under its lock.
func (f *fakeVPC) update(fn func(f *fakeVPC)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// queue makes the next requests of endpoint get these replies, one each.
func (f *fakeVPC) queue(endpoint string, rs ...reply) {
	f.update(func(f *fakeVPC) { f.queued[endpoint] = append(f.queued[endpoint], rs...) })
}

// stick makes every request of endpoint get r (nil: answer normally again).
func (f *fakeVPC) stick(endpoint string, r *reply) {
	f.update(func(f *fakeVPC) { f.sticky[endpoint] = r })
}

func (f *fakeVPC) count(endpoint string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[endpoint]
}

func (f *fakeVPC) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func (f *fakeVPC) requests(endpoint string) []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []request
	for _, r := range f.reqs {
		if endpoint == "" || r.endpoint == endpoint {
			out = append(out, r)
		}
	}
	return out
}

var membershipsPath = regexp.MustCompile(`^/v1/instance_groups/([^/]+)/memberships$`)

func (f *fakeVPC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var endpoint, group string
	switch m := membershipsPath.FindStringSubmatch(r.URL.Path); {
	case r.URL.Path == "/v1/instance_groups":
		endpoint = epGroups
	case m != nil:
		endpoint, group = epMemberships, m[1]
	case r.URL.Path == "/v1/instances":
		endpoint = epInstances
	default:
		f.write(w, reply{status: http.StatusNotFound, file: "error_not_found.json"})
		return
	}
	f.mu.Lock()
	f.calls[endpoint]++
	f.reqs = append(f.reqs, request{endpoint, time.Now(), r.URL.Path, r.URL.RawQuery})
	if f.stalled {
		f.mu.Unlock()
		select {
		case <-r.Context().Done():
		case <-f.done:
		}
		return
	}
	if q := f.queued[endpoint]; len(q) > 0 {
		f.queued[endpoint] = q[1:]
		f.mu.Unlock()
		f.write(w, q[0])
		return
	}
	if s := f.sticky[endpoint]; s != nil {
		f.mu.Unlock()
		f.write(w, *s)
		return
	}
	defer f.mu.Unlock()

	q := r.URL.Query()
	if r.Method != http.MethodGet || !versionRE.MatchString(q.Get("version")) || q.Get("generation") != "2" {
		f.badRequest(w, fmt.Sprintf("%s %s: want GET with version=YYYY-MM-DD and generation=2", r.Method, r.URL))
		return
	}
	limit := 50
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > apiMaxPage {
			f.badRequest(w, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	offset := 0
	if s := q.Get("start"); s != "" {
		n, err := strconv.ParseInt(strings.TrimPrefix(s, "r006-page-"), 16, 32)
		if !strings.HasPrefix(s, "r006-page-") || err != nil || n < 0 {
			f.badRequest(w, "start token "+s+" is not valid")
			return
		}
		offset = int(n)
	}

	page := min(limit, f.pageMax)
	self := *r.URL
	self.RawQuery = ""
	link := func(start int) string {
		v := maps.Clone(q)
		v.Del("version")
		v.Del("generation")
		v.Del("start")
		v.Set("limit", strconv.Itoa(limit))
		if start > 0 {
			v.Set("start", fmt.Sprintf("r006-page-%x", start))
		}
		return f.srv.URL + self.Path + "?" + v.Encode()
	}

	// Only the items of the page served are rendered: a fake that did work per instance on
	// every page would weigh on the benchmark's numbers.
	var items bytes.Buffer
	total := 0
	add := func(render func() []byte) {
		if total >= offset && total < offset+page {
			if total > offset {
				items.WriteByte(',')
			}
			items.Write(render())
		}
		total++
	}
	var key string
	switch endpoint {
	case epGroups:
		key = "instance_groups"
		for _, g := range f.groups {
			add(func() []byte { return f.renderGroup(g) })
		}
	case epMemberships:
		key = "memberships"
		known := false
		for _, g := range f.groups {
			known = known || g.ID == group
		}
		if !known {
			f.write(w, reply{status: http.StatusNotFound, file: "error_not_found.json"})
			return
		}
		for i := range f.instances {
			if in := &f.instances[i]; in.Group == group && in.Membership != "" {
				add(func() []byte { return f.render(*in)[1] })
			}
		}
	case epInstances:
		key = "instances"
		want, filtered := q["instance_group_membership.instance_group.id"]
		for i := range f.instances {
			if in := &f.instances[i]; !filtered || f.ignoreFilter || in.Group == want[0] {
				add(func() []byte { return f.render(*in)[0] })
			}
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"first":{"href":%q},"limit":%d,"total_count":%d`, link(0), page, total)
	if offset+page < total {
		fmt.Fprintf(&b, `,"next":{"href":%q}`, link(offset+page))
	}
	fmt.Fprintf(&b, `,%q:[`, key)
	b.Write(items.Bytes())
	b.WriteString("]}")
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Write(b.Bytes())
}

func (f *fakeVPC) renderGroup(g fakeGroup) []byte {
	n := 0
	for _, in := range f.instances {
		if in.Group == g.ID && in.Membership != "" {
			n++
		}
	}
	var b bytes.Buffer
	if err := groupTmpl.Execute(&b, map[string]any{"ID": g.ID, "Name": g.Name, "Base": f.base, "Count": n}); err != nil {
		f.t.Errorf("render group: %v", err)
	}
	return compact(f.t, b.Bytes())
}

// render is an instance's JSON and its membership's, cached while the instance is unchanged.
func (f *fakeVPC) render(in fakeInstance) [2][]byte {
	if r, ok := f.rendered[in]; ok {
		return r
	}
	data := map[string]any{
		"ID": in.ID, "Name": in.Name, "Status": in.Status, "Reason": in.Reason, "Lifecycle": in.Lifecycle,
		"Zone": in.Zone, "Profile": in.Profile, "Class": in.Class, "IP": in.IP, "GPUs": in.GPUs,
		"Attachment": in.Attachment, "Group": in.Group, "Membership": in.Membership,
		"Created": in.Created.UTC().Format(time.RFC3339), "Base": f.base,
	}
	var a, m bytes.Buffer
	tmpl, mtmpl := instanceTmpl, membershipTmpl
	if f.lean {
		tmpl, mtmpl = leanTmpl, leanMemberTmpl
	}
	if err := tmpl.Execute(&a, data); err != nil {
		f.t.Errorf("render instance: %v", err)
	}
	if err := mtmpl.Execute(&m, data); err != nil {
		f.t.Errorf("render membership: %v", err)
	}
	r := [2][]byte{compact(f.t, a.Bytes()), compact(f.t, m.Bytes())}
	f.rendered[in] = r
	return r
}

func compact(t testing.TB, b []byte) []byte {
	var c bytes.Buffer
	if err := json.Compact(&c, b); err != nil {
		t.Errorf("a template in testdata renders invalid JSON: %v\n%s", err, b)
	}
	return c.Bytes()
}

func (f *fakeVPC) badRequest(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	fmt.Fprintf(w, `{"errors":[{"code":"bad_request","message":%q}],"status_code":400,"trace":"t"}`, msg)
}

func (f *fakeVPC) write(w http.ResponseWriter, r reply) {
	var body []byte
	if r.file != "" {
		b, err := os.ReadFile(filepath.Join("testdata", r.file))
		if err != nil {
			f.t.Errorf("fake reply: %v", err)
		}
		body = bytes.ReplaceAll(b, []byte("{{BASE}}"), []byte(f.base))
	}
	ct := r.contentType
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	if r.retryAfter != "" {
		w.Header().Set("Retry-After", r.retryAfter)
	}
	w.WriteHeader(cmpOr(r.status, http.StatusOK))
	w.Write(body)
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// instances makes n running members of the group: spot and standard, three zones, a few
// GPU profiles.
func instances(n int) []fakeInstance {
	profiles := []string{"gx3-24x120x1l40s", "gx3-48x240x2l40s", "gx3d-160x1792x8h100", "gx2-16x128x2v100"}
	base := time.Date(2026, 10, 1, 8, 0, 0, 0, time.UTC)
	out := make([]fakeInstance, n)
	for i := range out {
		class := "spot"
		if i%3 == 2 {
			class = "standard"
		}
		out[i] = fakeInstance{
			ID:         fmt.Sprintf("0717_%08x-1c2d-4e5f-8a9b-%012d", i, i),
			Name:       fmt.Sprintf("gpu-spot-%05d", i),
			Status:     "running",
			Lifecycle:  "stable",
			Zone:       fmt.Sprintf("us-south-%d", i%3+1),
			Profile:    profiles[i%len(profiles)],
			Class:      class,
			IP:         fmt.Sprintf("10.240.%d.%d", i/250, i%250+4),
			Created:    base.Add(time.Duration(i) * time.Second),
			Attachment: i%2 == 0,
			Group:      groupID,
			Membership: "healthy",
		}
	}
	return out
}

var slotsByProfile = map[string]int{"gx3-24x120x1l40s": 1, "gx3-48x240x2l40s": 2, "gx3d-160x1792x8h100": 8, "gx2-16x128x2v100": 2}

// hostOf is the host the provider must list for a running member in.
func hostOf(in fakeInstance, slots int) providers.Host {
	return providers.Host{
		ID: in.ID, Addr: in.IP, Slots: slots, Zone: in.Zone, Spot: in.Class == "spot",
		Type: in.Profile, Launched: in.Created,
	}
}

func hostsOf(ins []fakeInstance) []providers.Host {
	out := make([]providers.Host, len(ins))
	for i, in := range ins {
		out[i] = hostOf(in, slotsByProfile[in.Profile])
	}
	return out
}
