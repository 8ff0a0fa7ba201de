package ibm_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	"text/template"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/ibm"
)

// The fake speaks the VPC API's wire format for the calls the provider makes: JSON bodies
// rendered from the templates in testdata/ (shaped like real replies, every field the SDK
// knows about filled), pages with first/next hrefs and opaque start tokens, the API's error
// bodies, its query parameters (version, generation=2, limit 1…100) checked. Beside the
// three listings of a poll, it serves the capacity calls on the group groupID (capacity
// fake below): GET and PATCH of the group and of its managers, DELETE of a membership.

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
	// The capacity calls.
	epGroup            = "group"             // GET /instance_groups/{id}
	epUpdateGroup      = "update_group"      // PATCH /instance_groups/{id}
	epManagers         = "managers"          // GET /instance_groups/{id}/managers
	epUpdateManager    = "update_manager"    // PATCH /instance_groups/{id}/managers/{id}
	epDeleteMembership = "delete_membership" // DELETE /instance_groups/{id}/memberships/{id}
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
	method   string
	path     string
	query    string
	body     string // as sent, for PATCH
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

	// The capacity state of the group groupID.
	memberCount int    // membership_count; -1: the memberships listed, as before any PATCH
	status      string // the group's status; "" is healthy
	managers    []fakeManager
	deleted     []deletion // the memberships deleted, in order
	denied      bool       // every change is refused for want of a permission (403)
}

func newFake(t testing.TB, instances ...fakeInstance) *fakeVPC {
	t.Helper()
	f := &fakeVPC{
		t:           t,
		done:        make(chan struct{}),
		groups:      []fakeGroup{{"r006-ig-other", "cpu-pool"}, {groupID, groupName}},
		instances:   instances,
		pageMax:     apiMaxPage,
		queued:      make(map[string][]reply),
		sticky:      make(map[string]*reply),
		calls:       make(map[string]int),
		rendered:    make(map[fakeInstance][2][]byte),
		memberCount: -1,
	}
	// The fields the handler reads are set before it starts serving: a request from another
	// process (the end-to-end test's) is no synchronisation the race detector sees.
	f.srv = httptest.NewUnstartedServer(f)
	f.base = "http://" + f.srv.Listener.Addr().String() + "/v1"
	f.srv.Start()
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

var (
	membershipsPath = regexp.MustCompile(`^/v1/instance_groups/([^/]+)/memberships$`)
	// The capacity calls' paths, by endpoint, and the method each takes.
	capacityPaths = []struct {
		endpoint, method string
		path             *regexp.Regexp
	}{
		{epGroup, http.MethodGet, regexp.MustCompile(`^/v1/instance_groups/([^/]+)$`)},
		{epUpdateGroup, http.MethodPatch, regexp.MustCompile(`^/v1/instance_groups/([^/]+)$`)},
		{epManagers, http.MethodGet, regexp.MustCompile(`^/v1/instance_groups/([^/]+)/managers$`)},
		{epUpdateManager, http.MethodPatch, regexp.MustCompile(`^/v1/instance_groups/([^/]+)/managers/([^/]+)$`)},
		{epDeleteMembership, http.MethodDelete, regexp.MustCompile(`^/v1/instance_groups/([^/]+)/memberships/([^/]+)$`)},
	}
)

func (f *fakeVPC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var endpoint, group string
	var ids []string // a capacity call's path IDs: the group's, then the manager's or membership's
	switch m := membershipsPath.FindStringSubmatch(r.URL.Path); {
	case r.URL.Path == "/v1/instance_groups":
		endpoint = epGroups
	case m != nil && r.Method == http.MethodGet:
		endpoint, group = epMemberships, m[1]
	case r.URL.Path == "/v1/instances":
		endpoint = epInstances
	default:
		for _, c := range capacityPaths {
			if m := c.path.FindStringSubmatch(r.URL.Path); m != nil && r.Method == c.method {
				endpoint, ids = c.endpoint, m[1:]
				break
			}
		}
		if endpoint == "" {
			f.write(w, reply{status: http.StatusNotFound, file: "error_not_found.json"})
			return
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		f.t.Errorf("fake: reading the body of %s %s: %v", r.Method, r.URL, err)
	}
	f.mu.Lock()
	f.calls[endpoint]++
	f.reqs = append(f.reqs, request{endpoint: endpoint, at: time.Now(), method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, body: string(body)})
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
	if ids != nil {
		if !versionRE.MatchString(q.Get("version")) || q.Get("generation") != "2" {
			f.badRequest(w, fmt.Sprintf("%s %s: want version=YYYY-MM-DD and generation=2", r.Method, r.URL))
			return
		}
		f.serveCapacity(w, r, endpoint, ids, body)
		return
	}
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
	status := "healthy"
	managers := []map[string]string{}
	if g.ID == groupID {
		if f.memberCount >= 0 {
			n = f.memberCount
		}
		status = cmpOr(f.status, status)
		for _, m := range f.managers {
			managers = append(managers, map[string]string{"href": f.managerHref(m), "id": m.ID, "name": m.Name})
		}
	}
	data := map[string]any{"ID": g.ID, "Name": g.Name, "Base": f.base, "Count": n, "Status": status, "Managers": managers}
	var b bytes.Buffer
	if err := groupTmpl.Execute(&b, data); err != nil {
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
		"ID": in.ID, "Name": in.Name, "Status": in.Status, "Reason": in.Reason, "ReasonMessage": reasonMessages[in.Reason], "Lifecycle": in.Lifecycle,
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

func cmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
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

// The capacity fake: the group groupID's membership_count, its managers and its deleted
// memberships, changed the way IBM documents (replies as the API reference shapes them).
//
// What IBM answers to a membership_count PATCH while an autoscale manager is enabled is not
// in the API reference; its Terraform provider only says the manager "should be in disabled
// state to update the instance_count". The fake answers as the API answers a patch that fails
// validation, in the shape seen in IBM's replies (400, code validation_failed…, "Validation
// Failure for field: …", target {"name":"membership_count","type":"field"}):
// testdata/error_manager_enabled.json. A change while the group is scaling is refused as a
// conflict (409, testdata/error_group_scaling.json), which is also inferred.

// fakeManager is one manager of the group groupID.
type fakeManager struct {
	ID, Name string
	Type     string // autoscale or scheduled
	Enabled  bool
	Min, Max int // autoscale only
}

// deletion is one membership deleted: its ID and its instance's.
type deletion struct{ Membership, Instance string }

// autoscaler is an enabled autoscale manager with these bounds.
func autoscaler(min, max int) fakeManager {
	return fakeManager{ID: "r006-igm-autoscale", Name: "gpu-autoscaler", Type: "autoscale", Enabled: true, Min: min, Max: max}
}

// reasonMessages are the messages of the instance status reasons the fake gives.
var reasonMessages = map[string]string{
	"stopped_by_preemption":             "The instance was stopped by preemption.",
	"cannot_start":                      "The instance cannot start.",
	"cannot_start_capacity":             "Insufficient capacity within the selected zone.",
	"cannot_start_compute":              "The instance cannot start: a compute error in the zone.",
	"cannot_start_ip_address":           "The instance cannot start: no IP address is available in the subnet.",
	"cannot_start_network":              "The instance cannot start: a network error in the zone.",
	"cannot_start_placement_group":      "The instance cannot start within the constraints of its placement group.",
	"cannot_start_reservation_capacity": "The instance cannot start: its reservation has no capacity left.",
	"cannot_start_reservation_expired":  "The instance cannot start: its reservation has expired.",
	"cannot_start_storage":              "The instance cannot start: a storage error in the zone.",
	"encryption_key_deleted":            "The instance cannot start: its encryption key was deleted.",
}

// desired is the group's membership_count.
func (f *fakeVPC) desired() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.countLocked()
}

func (f *fakeVPC) countLocked() int {
	if f.memberCount >= 0 {
		return f.memberCount
	}
	n := 0
	for _, in := range f.instances {
		if in.Group == groupID && in.Membership != "" {
			n++
		}
	}
	return n
}

// minimum is the group's minimum as IBM enforces it: its enabled autoscale manager's
// min_membership_count; none (0) once the manager is disabled.
func (f *fakeVPC) minimum() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.scalerLocked(); m != nil {
		return m.Min
	}
	return 0
}

// scalerLocked is the enabled autoscale manager, nil when none.
func (f *fakeVPC) scalerLocked() *fakeManager {
	for i := range f.managers {
		if m := &f.managers[i]; m.Type == "autoscale" && m.Enabled {
			return m
		}
	}
	return nil
}

// replaced is the instances whose memberships were deleted, in order.
func (f *fakeVPC) replaced() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, d := range f.deleted {
		out = append(out, d.Instance)
	}
	return out
}

// runOut makes the group fail to launch a member for want of capacity, as IBM reports it: a
// failed membership whose instance failed with the status reason cannot_start_capacity.
func (f *fakeVPC) runOut(reason string) fakeInstance {
	in := fakeInstance{
		ID: "0717_" + reason, Name: "gpu-spot-" + strings.ReplaceAll(reason, "_", "-"),
		Status: "failed", Reason: reason, Lifecycle: "failed", Zone: "us-south-2", Profile: "gx3d-160x1792x8h100",
		Class: "spot", IP: "0.0.0.0", Created: time.Date(2026, 10, 2, 9, 0, 0, 0, time.UTC),
		Group: groupID, Membership: "failed",
	}
	f.update(func(f *fakeVPC) { f.instances = append(f.instances, in) })
	return in
}

func (f *fakeVPC) managerHref(m fakeManager) string {
	return f.base + "/instance_groups/" + groupID + "/managers/" + m.ID
}

// renderManager is a manager as the API serves it, by its manager_type.
func (f *fakeVPC) renderManager(m fakeManager) []byte {
	v := map[string]any{
		"created_at": "2026-09-01T08:00:00Z", "updated_at": "2026-09-01T08:00:00Z",
		"href": f.managerHref(m), "id": m.ID, "name": m.Name, "management_enabled": m.Enabled, "manager_type": m.Type,
	}
	if m.Type == "autoscale" {
		v["aggregation_window"], v["cooldown"] = 90, 300
		v["min_membership_count"], v["max_membership_count"] = m.Min, m.Max
		v["policies"] = []any{}
	} else {
		v["actions"] = []any{}
	}
	b, err := json.Marshal(v)
	if err != nil {
		f.t.Errorf("render manager: %v", err)
	}
	return b
}

// serveCapacity answers a capacity call on the group ids[0] (and the manager or membership
// ids[1]), under f.mu. Permissions are checked before the body, as IAM comes first.
func (f *fakeVPC) serveCapacity(w http.ResponseWriter, r *http.Request, endpoint string, ids []string, body []byte) {
	if ids[0] != groupID {
		f.write(w, reply{status: http.StatusNotFound, file: "error_not_found.json"})
		return
	}
	mutating := r.Method != http.MethodGet
	if mutating && f.denied {
		f.write(w, reply{status: http.StatusForbidden, file: "error_forbidden.json"})
		return
	}
	var patch map[string]json.RawMessage
	if r.Method == http.MethodPatch {
		if ct := r.Header.Get("Content-Type"); ct != "application/merge-patch+json" {
			f.badRequest(w, "a PATCH takes Content-Type application/merge-patch+json, not "+ct)
			return
		}
		if err := json.Unmarshal(body, &patch); err != nil {
			f.badRequest(w, "the body is not a JSON object: "+err.Error())
			return
		}
	}
	ok := func(b []byte) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Write(b)
	}
	switch endpoint {
	case epGroup:
		ok(f.renderGroup(fakeGroup{groupID, groupName}))
	case epManagers:
		var items [][]byte
		for _, m := range f.managers {
			items = append(items, f.renderManager(m))
		}
		link := f.base + "/instance_groups/" + groupID + "/managers?limit=50"
		ok(fmt.Appendf(nil, `{"first":{"href":%q},"limit":50,"total_count":%d,"managers":[%s]}`, link, len(items), bytes.Join(items, []byte(","))))
	case epUpdateGroup:
		var n int
		if err := json.Unmarshal(patch["membership_count"], &n); err != nil || len(patch) != 1 {
			f.badRequest(w, "the fake takes a patch of membership_count alone, a number: "+string(body))
			return
		}
		switch {
		case f.scalerLocked() != nil:
			f.write(w, reply{status: http.StatusBadRequest, file: "error_manager_enabled.json"})
			return
		case n < 0 || n > 1000:
			f.write(w, reply{status: http.StatusBadRequest, file: "error_membership_count_range.json"})
			return
		case f.status == "scaling":
			f.write(w, reply{status: http.StatusConflict, file: "error_group_scaling.json"})
			return
		}
		f.memberCount = n
		ok(f.renderGroup(fakeGroup{groupID, groupName}))
	case epUpdateManager:
		i := slices.IndexFunc(f.managers, func(m fakeManager) bool { return m.ID == ids[1] })
		if i < 0 {
			f.write(w, reply{status: http.StatusNotFound, file: "error_not_found.json"})
			return
		}
		var on bool
		if err := json.Unmarshal(patch["management_enabled"], &on); err != nil || len(patch) != 1 {
			f.badRequest(w, "the fake takes a patch of management_enabled alone, a boolean: "+string(body))
			return
		}
		f.managers[i].Enabled = on
		ok(f.renderManager(f.managers[i]))
	case epDeleteMembership:
		i := slices.IndexFunc(f.instances, func(in fakeInstance) bool {
			return in.Group == groupID && in.Membership != "" && in.ID+"-m" == ids[1]
		})
		if i < 0 {
			f.write(w, reply{status: http.StatusNotFound, file: "error_not_found.json"})
			return
		}
		// delete_instance_on_membership_delete is true: the instance goes with it. The
		// group's membership_count is unchanged (the replacement it launches is not modelled).
		in := &f.instances[i]
		if f.memberCount < 0 {
			f.memberCount = f.countLocked()
		}
		f.deleted = append(f.deleted, deletion{ids[1], in.ID})
		in.Membership, in.Status, in.Lifecycle = "deleting", "deleting", "deleting"
		w.WriteHeader(http.StatusNoContent)
	default:
		f.t.Errorf("fake: no capacity endpoint %q", endpoint)
	}
}

// newIAMAs is a fake IAM token service like newIAM whose tokens, for the key "good-key",
// carry an identity's claims as IBM's access tokens do (iam_id, sub, account.bss); any other
// key gets IAM's "API key could not be found" reply.
func newIAMAs(t *testing.T, iamID, account string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method != http.MethodPost || r.URL.Path != "/identity/token" || r.ParseForm() != nil || r.PostForm.Get("apikey") != "good-key" {
			body, err := os.ReadFile("testdata/iam_bad_api_key.json")
			if err != nil {
				t.Errorf("fake IAM: %v", err)
			}
			w.WriteHeader(http.StatusBadRequest)
			w.Write(body)
			return
		}
		now := time.Now().Unix()
		seg := func(v any) string {
			b, _ := json.Marshal(v)
			return base64.RawURLEncoding.EncodeToString(b)
		}
		claims := map[string]any{"iam_id": iamID, "id": iamID, "sub": strings.TrimPrefix(iamID, "iam-"), "sub_type": "ServiceId",
			"account": map[string]any{"valid": true, "bss": account}, "iat": now, "exp": now + 3600,
			"iss": "https://iam.cloud.ibm.com/identity", "grant_type": "urn:ibm:params:oauth:grant-type:apikey", "scope": "ibm openid"}
		jwt := seg(map[string]string{"kid": "20260901", "alg": "RS256"}) + "." + seg(claims) + ".c2lnbmF0dXJl"
		fmt.Fprintf(w, `{"access_token":%q,"refresh_token":"not-used","token_type":"Bearer","expires_in":3600,"expiration":%d,"scope":"ibm openid"}`, jwt, now+3600)
	}))
	t.Cleanup(srv.Close)
	return srv
}
