package gcp_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/elasticd/elasticd/providers/gcp"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// fakeCompute is an in-process Compute Engine REST API for one MIG: listManagedInstances
// (zonal or regional) and the zonal instances list, in the real JSON wire format, paginated,
// with the list filter `name eq "RE2"`, and with replies that a test can script. For the
// capacity calls it also serves the MIG itself (get, resize, recreateInstances, listErrors),
// its autoscaler, and the zone or region operations that resize and recreateInstances return.
type fakeCompute struct {
	t   testing.TB
	srv *httptest.Server

	mu        sync.Mutex
	project   string
	zone      string // a zonal MIG's zone, or ""
	region    string // a regional MIG's region, or ""
	mig       string
	managed   []*computepb.ManagedInstance
	instances map[string][]*computepb.Instance // by zone
	pageSize  int                              // most items per page (the smaller of it and maxResults); 0: maxResults
	paginated bool                             // listManagedInstancesResults=PAGINATED; else PAGELESS: one page
	scripted  map[string][]reply               // endpoint → replies served before the model's
	broken    bool                             // every request fails with 500
	stalled   bool                             // every request waits until the client gives up
	requests  []request                        // every API request, in order
	onRequest func(*http.Request)              // called under the lock with each API request
	tokens    int                              // OAuth 2.0 token requests
	encoded   map[string][]byte                // cache of encoded pages by request URL, dropped on a change
	stop      chan struct{}

	// The capacity side.
	targetSize  int32
	autoscaler  *computepb.Autoscaler                  // attached (status.autoscaler) when not nil
	igmErrors   []*computepb.InstanceManagedByIgmError // what listErrors lists, in this order
	denied      bool                                   // resize and recreateInstances answer 403
	recreated   []string                               // the IDs of the instances recreated, in order
	operations  map[string]*fakeOperation              // by name
	byRequestID map[string]string                      // requestId → operation name
	opPending   int                                    // operations stay RUNNING until their opPending-th poll (0: DONE at once)
	opFailure   *opFailure                             // the next operation ends with this error

	// What the check reads (check.go): the group's instance template, and the permissions
	// that Cloud Resource Manager's projects.testIamPermissions answers with. The compute
	// endpoints that discovery and the check call answer 403 for a permission not granted.
	template   *computepb.InstanceTemplate // what instanceTemplates.get serves; nil: 404
	granted    map[string]bool             // the permissions held on the project (all of allPermissions by default)
	iamRefusal string                      // testIamPermissions answers 403: "denied", or "disabled" (the API not enabled)
	tokenError bool                        // the token endpoint answers invalid_grant
}

// allPermissions are the project's permissions that the fake knows and grants by default.
var allPermissions = []string{
	"compute.instanceGroupManagers.get", "compute.instanceGroupManagers.update", "compute.instances.list",
	"compute.autoscalers.get", "compute.zoneOperations.get", "compute.regionOperations.get",
	"compute.instanceTemplates.get",
}

// fakeOperation is an operation the fake returned, and how many polls it stays RUNNING.
type fakeOperation struct {
	op      *computepb.Operation
	pending int
	failure *opFailure
	apply   func() // the change, made when the operation ends DONE without an error
}

// opFailure is how an operation fails: Operation.error and httpErrorStatusCode/Message.
type opFailure struct {
	status  int32
	message string // httpErrorMessage, e.g. "FORBIDDEN"
	code    string // error.errors[0].code
	text    string // error.errors[0].message
}

// Endpoints of the fake, for scripting and counting.
const (
	epManaged   = "managed"
	epInstances = "instances"
	// The capacity calls.
	epGroup      = "get"
	epResize     = "resize"
	epRecreate   = "recreateInstances"
	epErrors     = "listErrors"
	epAutoscaler = "autoscaler"
	epOperation  = "operation"
	// The check's.
	epTemplate = "template"
	epTestIAM  = "testIamPermissions"
)

type reply struct {
	status int
	header http.Header
	body   []byte
	model  bool // answer from the model, as if nothing were scripted
}

type request struct {
	endpoint  string
	zone      string
	at        time.Time
	method    string
	path      string
	query     url.Values
	fieldMask string
	body      []byte
}

const (
	testProject = "test-project"
	testZone    = "us-central1-a"
	testRegion  = "us-central1"
	testMIG     = "gpu-mig"
)

// newFake serves the group in testdata/<dir>: managed.json (a listManagedInstances answer)
// and instances-<zone>.json (instances list answers). A zonal group is in testZone; dir
// "regional" makes a regional MIG in testRegion.
func newFake(t testing.TB, dir string) *fakeCompute {
	t.Helper()
	f := &fakeCompute{t: t, project: testProject, mig: testMIG, instances: map[string][]*computepb.Instance{},
		scripted: map[string][]reply{}, encoded: map[string][]byte{}, stop: make(chan struct{}),
		operations: map[string]*fakeOperation{}, byRequestID: map[string]string{}, granted: map[string]bool{},
		template: &computepb.InstanceTemplate{
			Name: proto.String("gpu-tmpl"),
			Properties: &computepb.InstanceProperties{
				MachineType: proto.String("a3-highgpu-8g"),
				Scheduling:  &computepb.Scheduling{ProvisioningModel: proto.String("SPOT")},
			},
		}}
	for _, perm := range allPermissions {
		f.granted[perm] = true
	}
	if dir == "regional" {
		f.region = testRegion
	} else {
		f.zone = testZone
	}
	if dir != "" {
		var m computepb.InstanceGroupManagersListManagedInstancesResponse
		decodeFile(t, filepath.Join("testdata", dir, "managed.json"), &m)
		f.managed = m.GetManagedInstances()
		files, err := filepath.Glob(filepath.Join("testdata", dir, "instances-*.json"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no instances-*.json in testdata/%s: %v", dir, err)
		}
		for _, file := range files {
			var l computepb.InstanceList
			decodeFile(t, file, &l)
			zone := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(file), "instances-"), ".json")
			f.instances[zone] = l.GetItems()
		}
	}
	for _, mi := range f.managed {
		if a := mi.GetCurrentAction(); a != "DELETING" && a != "ABANDONING" {
			f.targetSize++ // the instances being taken away are no longer counted in it
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /compute/v1/projects/{project}/zones/{loc}/instanceGroupManagers/{mig}/listManagedInstances", f.serveManaged)
	mux.HandleFunc("POST /compute/v1/projects/{project}/regions/{loc}/instanceGroupManagers/{mig}/listManagedInstances", f.serveManaged)
	mux.HandleFunc("GET /compute/v1/projects/{project}/zones/{zone}/instances", f.serveInstances)
	for _, loc := range []string{"zones", "regions"} {
		igm := "/compute/v1/projects/{project}/" + loc + "/{loc}/instanceGroupManagers/{mig}"
		mux.HandleFunc("GET "+igm, f.serveGroup)
		mux.HandleFunc("POST "+igm+"/resize", f.serveResize)
		mux.HandleFunc("POST "+igm+"/recreateInstances", f.serveRecreate)
		mux.HandleFunc("GET "+igm+"/listErrors", f.serveErrors)
		mux.HandleFunc("GET /compute/v1/projects/{project}/"+loc+"/{loc}/autoscalers/{name}", f.serveAutoscaler)
		mux.HandleFunc("GET /compute/v1/projects/{project}/"+loc+"/{loc}/operations/{op}", f.serveOperation)
	}
	mux.HandleFunc("GET /compute/v1/projects/{project}/global/instanceTemplates/{name}", f.serveTemplate)
	mux.HandleFunc("GET /compute/v1/projects/{project}/regions/{loc}/instanceTemplates/{name}", f.serveTemplate)
	mux.HandleFunc("POST /v1/projects/{resource}", f.serveTestIAM) // {resource}:testIamPermissions
	mux.HandleFunc("POST /token", f.serveToken)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("fake compute: unexpected request %s %s", r.Method, r.URL)
		f.writeError(w, 404, "errors/404.json")
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	t.Cleanup(func() { close(f.stop) }) // before srv.Close: let stalled handlers go
	return f
}

func decodeFile(t testing.TB, path string, m proto.Message) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(b, m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// config is a provider configuration for this fake's group, with the real SDK pointed at it.
func (f *fakeCompute) config() gcp.Config {
	return gcp.Config{
		Project: f.project, Zone: f.zone, Region: f.region, MIG: f.mig,
		Endpoint:      f.srv.URL,
		MinInterval:   time.Nanosecond, // every poll asks the API unless a test says otherwise
		Logger:        testLogger(f.t),
		ClientOptions: []option.ClientOption{option.WithoutAuthentication()},
	}
}

func (f *fakeCompute) provider(t testing.TB, edit func(*gcp.Config)) *gcp.Provider {
	t.Helper()
	cfg := f.config()
	if edit != nil {
		edit(&cfg)
	}
	p, err := gcp.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func testLogger(t testing.TB) *slog.Logger {
	if _, ok := t.(*testing.B); ok {
		return nil
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// script queues replies for endpoint, served (one per request) before the model's answers.
func (f *fakeCompute) script(endpoint string, rs ...reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scripted[endpoint] = append(f.scripted[endpoint], rs...)
}

// errorReply is an API error with the body testdata/<file> and Retry-After when not "".
func errorReply(t testing.TB, status int, file, retryAfter string) reply {
	h := http.Header{"Content-Type": {"application/json; charset=UTF-8"}}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	return reply{status: status, header: h, body: readFile(t, file)}
}

// change runs edit on the model under the lock.
func (f *fakeCompute) change(edit func(f *fakeCompute)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	edit(f)
	clear(f.encoded)
}

// calls counts the requests to endpoint ("" for all).
func (f *fakeCompute) calls(endpoint string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.requests {
		if endpoint == "" || r.endpoint == endpoint {
			n++
		}
	}
	return n
}

func (f *fakeCompute) log() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.requests...)
}

// begin records the request and returns the scripted reply to send, if any; it waits first
// when the fake is stalled, and reports false when the request is over.
func (f *fakeCompute) begin(w http.ResponseWriter, r *http.Request, endpoint, zone string) (handled bool) {
	body, _ := io.ReadAll(r.Body) // small; served again to the handler
	r.Body = io.NopCloser(bytes.NewReader(body))
	f.mu.Lock()
	if f.onRequest != nil {
		f.onRequest(r)
	}
	f.requests = append(f.requests, request{endpoint: endpoint, zone: zone, at: time.Now(), method: r.Method,
		path: r.URL.Path, query: r.URL.Query(), fieldMask: r.Header.Get("X-Goog-FieldMask"), body: body})
	stalled, broken := f.stalled, f.broken
	var rep *reply
	if q := f.scripted[endpoint]; len(q) > 0 {
		if !q[0].model {
			rep = &q[0]
		}
		f.scripted[endpoint] = q[1:]
	}
	f.mu.Unlock()
	switch {
	case stalled:
		select {
		case <-r.Context().Done():
		case <-f.stop:
		}
		return true
	case broken:
		f.writeError(w, 500, "errors/500.json")
		return true
	case rep != nil:
		for k, v := range rep.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rep.status)
		w.Write(rep.body)
		return true
	}
	return false
}

// serveToken answers as Google's OAuth 2.0 token endpoint does (the token_uri of a
// service-account key).
func (f *fakeCompute) serveToken(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.tokens++
	refuse := f.tokenError
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if refuse { // RFC 6749 section 5.2, as Google's token endpoint answers a key it no longer knows
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`))
		return
	}
	w.Write(readFile(f.t, "token.json"))
}

func (f *fakeCompute) writeError(w http.ResponseWriter, status int, file string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	w.Write(readFile(f.t, file))
}

func (f *fakeCompute) serveManaged(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epManaged, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	loc := f.zone
	if strings.Contains(r.URL.Path, "/regions/") {
		loc = f.region
	}
	if !f.allowed(w, "compute.instanceGroupManagers.get", strings.TrimPrefix(r.URL.Path, "/compute/v1/")) {
		return
	}
	if r.PathValue("project") != f.project || r.PathValue("mig") != f.mig || r.PathValue("loc") != loc || loc == "" {
		f.writeError(w, 404, "errors/404.json")
		return
	}
	items := f.managed
	next := ""
	if f.paginated {
		var ok bool
		if items, next, ok = page(f, w, r, f.managed); !ok {
			return
		}
	}
	f.write(w, r, func() proto.Message {
		return &computepb.InstanceGroupManagersListManagedInstancesResponse{ManagedInstances: items, NextPageToken: optional(next)}
	})
}

func (f *fakeCompute) serveInstances(w http.ResponseWriter, r *http.Request) {
	zone := r.PathValue("zone")
	if f.begin(w, r, epInstances, zone) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.allowed(w, "compute.instances.list", "projects/"+r.PathValue("project")) {
		return
	}
	if r.PathValue("project") != f.project {
		f.writeError(w, 404, "errors/404.json")
		return
	}
	all := f.instances[zone]
	if filter := r.URL.Query().Get("filter"); filter != "" {
		m := regexp.MustCompile(`^name eq "([^"]*)"$`).FindStringSubmatch(filter)
		if m == nil {
			http.Error(w, `{"error":{"code":400,"message":"Invalid value for field 'filter'"}}`, 400)
			return
		}
		re, err := regexp.Compile("^(?:" + m[1] + ")$")
		if err != nil {
			http.Error(w, `{"error":{"code":400,"message":"Invalid regular expression in 'filter'"}}`, 400)
			return
		}
		var matched []*computepb.Instance
		for _, in := range all {
			if re.MatchString(in.GetName()) {
				matched = append(matched, in)
			}
		}
		all = matched
	}
	items, next, ok := page(f, w, r, all)
	if !ok {
		return
	}
	f.write(w, r, func() proto.Message {
		return &computepb.InstanceList{Items: items, NextPageToken: optional(next)}
	})
}

// page cuts all by maxResults (at most 500, as the API) and pageToken ("o<offset>").
func page[T any](f *fakeCompute, w http.ResponseWriter, r *http.Request, all []T) (items []T, next string, ok bool) {
	q := r.URL.Query()
	size := 500
	if s := q.Get("maxResults"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 500 {
			http.Error(w, `{"error":{"code":400,"message":"Invalid value for field 'maxResults'"}}`, 400)
			return nil, "", false
		}
		size = n
	}
	if f.pageSize > 0 {
		size = min(size, f.pageSize)
	}
	off := 0
	if tok := q.Get("pageToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "o"))
		if err != nil || !strings.HasPrefix(tok, "o") || n < 0 || n > len(all) {
			http.Error(w, `{"error":{"code":400,"message":"Invalid value for field 'pageToken'"}}`, 400)
			return nil, "", false
		}
		off = n
	}
	end := min(off+size, len(all))
	if end < len(all) {
		next = "o" + strconv.Itoa(end)
	}
	return all[off:end], next, true
}

func (f *fakeCompute) write(w http.ResponseWriter, r *http.Request, msg func() proto.Message) {
	key := r.URL.String()
	b, ok := f.encoded[key]
	if !ok {
		var err error
		if b, err = protojson.Marshal(msg()); err != nil {
			f.t.Errorf("fake compute: encode: %v", err)
			http.Error(w, "encode", 500)
			return
		}
		f.encoded[key] = b
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Write(b)
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// bigGroup makes a group of n running spot a3-highgpu-8g instances over zones.
func bigGroup(project string, zones []string, n int) ([]*computepb.ManagedInstance, map[string][]*computepb.Instance) {
	managed := make([]*computepb.ManagedInstance, 0, n)
	instances := map[string][]*computepb.Instance{}
	base := "https://www.googleapis.com/compute/v1/projects/" + project + "/zones/"
	for i := range n {
		zone := zones[i%len(zones)]
		name := fmt.Sprintf("gpu-mig-%05d", i)
		id := uint64(5_000_000 + i)
		managed = append(managed, &computepb.ManagedInstance{
			Id: proto.Uint64(id), Name: proto.String(name), Instance: proto.String(base + zone + "/instances/" + name),
			CurrentAction: proto.String("NONE"), InstanceStatus: proto.String("RUNNING"),
		})
		instances[zone] = append(instances[zone], &computepb.Instance{
			Id: proto.Uint64(id), Name: proto.String(name), Zone: proto.String(base + zone),
			Status:            proto.String("RUNNING"),
			MachineType:       proto.String(base + zone + "/machineTypes/a3-highgpu-8g"),
			CreationTimestamp: proto.String(time.Date(2026, 3, 1, 0, 0, i%60, 0, time.UTC).Format(time.RFC3339Nano)),
			NetworkInterfaces: []*computepb.NetworkInterface{{NetworkIP: proto.String(fmt.Sprintf("10.%d.%d.%d", 64+i>>16, i>>8&255, i&255))}},
			Scheduling:        &computepb.Scheduling{ProvisioningModel: proto.String("SPOT")},
		})
	}
	return managed, instances
}

// The capacity side of the fake, after the Compute Engine v1 REST reference: the MIG
// (instanceGroupManagers.get, .resize?size=N, .recreateInstances {"instances":[URL]},
// .listErrors), its autoscaler (autoscalers.get), and the operations that resize and
// recreateInstances return (zoneOperations.get, regionOperations.get), for a zonal MIG under
// /zones/{zone}/ and a regional one under /regions/{region}/.

const apiBase = "https://www.googleapis.com/compute/v1/projects/"

// scope is the MIG's location as the API writes it in a path: zones/Z or regions/R.
func (f *fakeCompute) scope() string {
	if f.region != "" {
		return "regions/" + f.region
	}
	return "zones/" + f.zone
}

// ours reports whether the request's project, location (and MIG, where the path has one)
// are the fake's. Called under the lock.
func (f *fakeCompute) ours(r *http.Request) bool {
	loc := f.zone
	if strings.Contains(r.URL.Path, "/regions/") {
		loc = f.region
	}
	mig := r.PathValue("mig")
	return r.PathValue("project") == f.project && loc != "" && r.PathValue("loc") == loc && (mig == "" || mig == f.mig)
}

// googleError writes the API's error shape, {"error":{"code","message","errors":[{"message",
// "domain","reason"}],"status"}}, as testdata/errors/*.json hold it.
func googleError(w http.ResponseWriter, code int, reason, message string) {
	status := map[int]string{400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}[code]
	b, _ := json.MarshalIndent(map[string]any{"error": map[string]any{
		"code": code, "message": message, "status": status,
		"errors": []any{map[string]any{"message": message, "domain": "global", "reason": reason}},
	}}, "", " ")
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	w.Write(b)
}

func (f *fakeCompute) notFound(w http.ResponseWriter, r *http.Request) {
	googleError(w, 404, "notFound", fmt.Sprintf("The resource '%s' was not found", strings.TrimPrefix(r.URL.Path, "/compute/v1/")))
}

// migPath is the MIG as the API names it in messages: projects/P/zones/Z/instanceGroupManagers/M.
func (f *fakeCompute) migPath() string {
	return "projects/" + f.project + "/" + f.scope() + "/instanceGroupManagers/" + f.mig
}

func (f *fakeCompute) deny(w http.ResponseWriter) {
	googleError(w, 403, "forbidden", fmt.Sprintf("Required 'compute.instanceGroupManagers.update' permission for '%s'", f.migPath()))
}

func (f *fakeCompute) serveGroup(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epGroup, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.allowed(w, "compute.instanceGroupManagers.get", strings.TrimPrefix(r.URL.Path, "/compute/v1/")) {
		return
	}
	if !f.ours(r) {
		f.notFound(w, r)
		return
	}
	sum := &computepb.InstanceGroupManagerActionsSummary{}
	counts := map[string]*int32{}
	for _, a := range []struct {
		name string
		n    **int32
	}{
		{"ABANDONING", &sum.Abandoning}, {"CREATING", &sum.Creating}, {"CREATING_WITHOUT_RETRIES", &sum.CreatingWithoutRetries},
		{"DELETING", &sum.Deleting}, {"NONE", &sum.None}, {"RECREATING", &sum.Recreating}, {"REFRESHING", &sum.Refreshing},
		{"RESTARTING", &sum.Restarting}, {"RESUMING", &sum.Resuming}, {"STARTING", &sum.Starting}, {"STOPPING", &sum.Stopping},
		{"SUSPENDING", &sum.Suspending}, {"VERIFYING", &sum.Verifying},
	} {
		*a.n = proto.Int32(0) // the API lists every count, zeros too
		counts[a.name] = *a.n
	}
	stable := true
	for _, mi := range f.managed {
		if n := counts[mi.GetCurrentAction()]; n != nil {
			*n++
		}
		stable = stable && mi.GetCurrentAction() == "NONE"
	}
	base := apiBase + f.project + "/" + f.scope()
	igm := &computepb.InstanceGroupManager{
		Kind: proto.String("compute#instanceGroupManager"), Id: proto.Uint64(7001), Name: proto.String(f.mig),
		CreationTimestamp: proto.String("2026-03-01T09:00:00.000-08:00"),
		BaseInstanceName:  proto.String(f.mig), TargetSize: proto.Int32(f.targetSize),
		InstanceTemplate:            proto.String(apiBase + f.project + "/global/instanceTemplates/gpu-tmpl"),
		InstanceGroup:               proto.String(base + "/instanceGroups/" + f.mig),
		SelfLink:                    proto.String(base + "/instanceGroupManagers/" + f.mig),
		CurrentActions:              sum,
		Status:                      &computepb.InstanceGroupManagerStatus{IsStable: proto.Bool(stable)},
		ListManagedInstancesResults: proto.String(map[bool]string{false: "PAGELESS", true: "PAGINATED"}[f.paginated]),
	}
	if f.region != "" {
		igm.Region = proto.String(apiBase + f.project + "/regions/" + f.region)
	} else {
		igm.Zone = proto.String(apiBase + f.project + "/zones/" + f.zone)
	}
	if f.autoscaler != nil {
		igm.Status.Autoscaler = proto.String(base + "/autoscalers/" + f.autoscaler.GetName())
	}
	f.writeNow(w, igm)
}

func (f *fakeCompute) serveAutoscaler(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epAutoscaler, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.allowed(w, "compute.autoscalers.get", strings.TrimPrefix(r.URL.Path, "/compute/v1/")) {
		return
	}
	if !f.ours(r) || f.autoscaler == nil || r.PathValue("name") != f.autoscaler.GetName() {
		f.notFound(w, r)
		return
	}
	as := proto.CloneOf(f.autoscaler)
	base := apiBase + f.project + "/" + f.scope()
	as.Kind = proto.String("compute#autoscaler")
	as.Target = proto.String(base + "/instanceGroupManagers/" + f.mig)
	as.SelfLink = proto.String(base + "/autoscalers/" + as.GetName())
	as.Status = proto.String("ACTIVE")
	f.writeNow(w, as)
}

func (f *fakeCompute) serveResize(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epResize, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ours(r) {
		f.notFound(w, r)
		return
	}
	q := r.URL.Query()
	size, err := strconv.ParseInt(q.Get("size"), 10, 32)
	switch {
	case !q.Has("size"):
		googleError(w, 400, "required", "Required field 'size' not specified")
		return
	case err != nil || size < 0:
		googleError(w, 400, "invalid", fmt.Sprintf("Invalid value for field 'size': '%s'. Must be greater than or equal to 0.", q.Get("size")))
		return
	case f.denied || !f.granted["compute.instanceGroupManagers.update"]:
		f.deny(w)
		return
	}
	f.writeNow(w, f.operation(q.Get("requestId"), "compute.instanceGroupManagers.resize", func() {
		f.targetSize = int32(size)
	}))
}

// instanceRE is an instance's URL, full or partial: …zones/Z/instances/N.
var instanceRE = regexp.MustCompile(`(?:^|/)zones/([a-z0-9-]+)/instances/([a-z0-9-]+)$`)

func (f *fakeCompute) serveRecreate(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epRecreate, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ours(r) {
		f.notFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req computepb.InstanceGroupManagersRecreateInstancesRequest // the regional request's JSON is the same
	if err := protojson.Unmarshal(body, &req); err != nil {
		googleError(w, 400, "parseError", "Invalid JSON payload received. "+err.Error())
		return
	}
	if len(req.GetInstances()) == 0 || len(req.GetInstances()) > 1000 {
		googleError(w, 400, "invalid", "Invalid value for field 'resource.instances': ''. Between 1 and 1000 instances must be given.")
		return
	}
	if f.denied || !f.granted["compute.instanceGroupManagers.update"] {
		f.deny(w)
		return
	}
	var members []*computepb.ManagedInstance
	for _, inst := range req.GetInstances() {
		m := instanceRE.FindStringSubmatch(inst)
		if m == nil {
			googleError(w, 400, "invalid", fmt.Sprintf("Invalid value for field 'resource.instances[0]': '%s'. The URL is malformed.", inst))
			return
		}
		path := "projects/" + f.project + "/zones/" + m[1] + "/instances/" + m[2]
		i := slices.IndexFunc(f.managed, func(mi *computepb.ManagedInstance) bool {
			return strings.HasSuffix(mi.GetInstance(), "/zones/"+m[1]+"/instances/"+m[2])
		})
		if i < 0 {
			if slices.ContainsFunc(f.instances[m[1]], func(in *computepb.Instance) bool { return in.GetName() == m[2] }) {
				googleError(w, 400, "invalid", fmt.Sprintf("The resource '%s' is not a member of the instance group manager '%s'.", path, f.migPath()))
			} else {
				googleError(w, 404, "notFound", fmt.Sprintf("The resource '%s' was not found", path))
			}
			return
		}
		members = append(members, f.managed[i])
	}
	f.writeNow(w, f.operation(r.URL.Query().Get("requestId"), "compute.instanceGroupManagers.recreateInstances", func() {
		for _, mi := range members {
			f.recreated = append(f.recreated, strconv.FormatUint(mi.GetId(), 10))
			mi.CurrentAction = proto.String("RECREATING")
		}
		clear(f.encoded)
	}))
}

func (f *fakeCompute) serveErrors(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epErrors, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ours(r) {
		f.notFound(w, r)
		return
	}
	if q := r.URL.Query(); q.Has("filter") || q.Has("orderBy") {
		googleError(w, 400, "invalid", "The filter and orderBy query parameters are not supported for this method.")
		return
	}
	items, next, ok := page(f, w, r, f.igmErrors)
	if !ok {
		return
	}
	f.writeNow(w, &computepb.InstanceGroupManagersListErrorsResponse{Items: items, NextPageToken: optional(next)})
}

func (f *fakeCompute) serveOperation(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epOperation, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.operations[r.PathValue("op")]
	if !f.ours(r) || o == nil {
		f.notFound(w, r)
		return
	}
	if o.pending > 0 {
		o.pending--
		if o.pending == 0 {
			f.finish(o)
		}
	}
	f.writeNow(w, o.op)
}

// operation makes the operation a mutating call returns, or returns again the one made under
// the same requestId (the API does such a request once). apply is the call's change, made
// when the operation ends DONE without error: at once unless opPending says otherwise.
func (f *fakeCompute) operation(requestID, typ string, apply func()) *computepb.Operation {
	if name, ok := f.byRequestID[requestID]; ok && requestID != "" {
		return f.operations[name].op
	}
	now := time.Now()
	name := fmt.Sprintf("operation-%d-%x", now.UnixMilli(), len(f.operations)+1)
	base := apiBase + f.project + "/" + f.scope()
	op := &computepb.Operation{
		Kind: proto.String("compute#operation"), Id: proto.Uint64(uint64(8_000_000 + len(f.operations))), Name: proto.String(name),
		OperationType: proto.String(typ), TargetLink: proto.String(base + "/instanceGroupManagers/" + f.mig),
		TargetId: proto.Uint64(7001), Status: computepb.Operation_RUNNING.Enum(), Progress: proto.Int32(0),
		User:       proto.String("elasticd@" + f.project + ".iam.gserviceaccount.com"),
		InsertTime: proto.String(now.Format(time.RFC3339Nano)), StartTime: proto.String(now.Format(time.RFC3339Nano)),
		SelfLink: proto.String(base + "/operations/" + name),
	}
	if f.region != "" {
		op.Region = proto.String(apiBase + f.project + "/regions/" + f.region)
	} else {
		op.Zone = proto.String(apiBase + f.project + "/zones/" + f.zone)
	}
	if requestID != "" {
		op.ClientOperationId = proto.String(requestID)
		f.byRequestID[requestID] = name
	}
	o := &fakeOperation{op: op, pending: f.opPending, failure: f.opFailure, apply: apply}
	f.opFailure = nil
	f.operations[name] = o
	if o.pending == 0 {
		f.finish(o)
	}
	return proto.CloneOf(op)
}

// finish ends o: DONE, with its failure or its change made.
func (f *fakeCompute) finish(o *fakeOperation) {
	o.op.Status = computepb.Operation_DONE.Enum()
	o.op.Progress = proto.Int32(100)
	o.op.EndTime = proto.String(time.Now().Format(time.RFC3339Nano))
	if e := o.failure; e != nil {
		o.op.HttpErrorStatusCode = proto.Int32(e.status)
		o.op.HttpErrorMessage = proto.String(e.message)
		o.op.Error = &computepb.Error{Errors: []*computepb.Errors{{Code: proto.String(e.code), Message: proto.String(e.text)}}}
		return
	}
	o.apply()
}

// writeNow encodes msg, uncached: the capacity answers change with each call.
func (f *fakeCompute) writeNow(w http.ResponseWriter, msg proto.Message) {
	b, err := protojson.Marshal(msg)
	if err != nil {
		f.t.Errorf("fake compute: encode: %v", err)
		http.Error(w, "encode", 500)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Write(b)
}

// igmError is one listErrors item: error{code,message}, instanceActionDetails{action,
// instance}, timestamp (RFC 3339, as the API writes it, with an offset).
func igmError(at time.Time, action, instanceURL, code, message string) *computepb.InstanceManagedByIgmError {
	return &computepb.InstanceManagedByIgmError{
		Error:     &computepb.InstanceManagedByIgmErrorManagedInstanceError{Code: proto.String(code), Message: proto.String(message)},
		Timestamp: proto.String(at.In(time.FixedZone("PST", -8*3600)).Format("2006-01-02T15:04:05.000-07:00")),
		InstanceActionDetails: &computepb.InstanceManagedByIgmErrorInstanceActionDetails{
			Action: proto.String(action), Instance: proto.String(instanceURL),
		},
	}
}

// stockoutMessage is the message GCE gives with ZONE_RESOURCE_POOL_EXHAUSTED.
func stockoutMessage(zone string) string {
	return fmt.Sprintf("The zone 'projects/%s/zones/%s' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.", testProject, zone)
}

// runOut makes the MIG fail to create instances for want of capacity: each instance it is
// creating gets a ZONE_RESOURCE_POOL_EXHAUSTED error, as listErrors reports them; with none
// being created, the group is asked for one more first.
func (f *fakeCompute) runOut() {
	f.change(func(f *fakeCompute) {
		creating := slices.DeleteFunc(slices.Clone(f.managed), func(mi *computepb.ManagedInstance) bool {
			return !strings.HasPrefix(mi.GetCurrentAction(), "CREATING")
		})
		if len(creating) == 0 {
			mi := &computepb.ManagedInstance{Name: proto.String(f.mig + "-x0"), CurrentAction: proto.String("CREATING")}
			f.managed = append(f.managed, mi)
			f.targetSize++
			creating = append(creating, mi)
		}
		zone := f.zone
		if zone == "" {
			zone = f.region + "-a"
		}
		now := time.Now()
		for _, mi := range creating {
			url := mi.GetInstance()
			if url == "" { // the URL is set even before the instance exists
				url = apiBase + f.project + "/zones/" + zone + "/instances/" + mi.GetName()
			}
			z := instanceRE.FindStringSubmatch(url)[1]
			f.igmErrors = append(f.igmErrors, igmError(now, "CREATING", url, "ZONE_RESOURCE_POOL_EXHAUSTED", stockoutMessage(z)))
		}
	})
}

// The check's side of the fake (check.go): permissions that the compute endpoints enforce,
// the group's instance template (instanceTemplates.get, global or regional), Cloud Resource
// Manager's projects.testIamPermissions (POST /v1/projects/{resource}:testIamPermissions,
// {"permissions": [...]} answered with the subset held, its errors in the
// {"error":{"code","message","status"}} shape), and a Compute Engine metadata server.

// allowed reports whether the project grants perm; when not, it answers 403 as Compute
// Engine does, naming the permission and the resource. Called under the lock.
func (f *fakeCompute) allowed(w http.ResponseWriter, perm, resource string) bool {
	if f.granted[perm] {
		return true
	}
	googleError(w, 403, "forbidden", fmt.Sprintf("Required '%s' permission for '%s'", perm, resource))
	return false
}

// grant sets which of allPermissions the project grants: all but those in without.
func (f *fakeCompute) grant(without ...string) {
	f.change(func(f *fakeCompute) {
		for _, perm := range allPermissions {
			f.granted[perm] = !slices.Contains(without, perm)
		}
	})
}

func (f *fakeCompute) serveTemplate(w http.ResponseWriter, r *http.Request) {
	if f.begin(w, r, epTemplate, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.allowed(w, "compute.instanceTemplates.get", strings.TrimPrefix(r.URL.Path, "/compute/v1/")) {
		return
	}
	if r.PathValue("project") != f.project || f.template == nil || r.PathValue("name") != f.template.GetName() {
		f.notFound(w, r)
		return
	}
	t := proto.CloneOf(f.template)
	t.Kind = proto.String("compute#instanceTemplate")
	t.SelfLink = proto.String(apiBase + f.project + "/global/instanceTemplates/" + t.GetName())
	f.writeNow(w, t)
}

// rpcError writes the error shape of Google's newer REST APIs (Cloud Resource Manager
// among them): {"error":{"code","message","status"}}, with details when given.
func rpcError(w http.ResponseWriter, code int, status, message string, details ...any) {
	e := map[string]any{"code": code, "message": message, "status": status}
	if len(details) > 0 {
		e["details"] = details
	}
	b, _ := json.MarshalIndent(map[string]any{"error": e}, "", "  ")
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	w.Write(b)
}

func (f *fakeCompute) serveTestIAM(w http.ResponseWriter, r *http.Request) {
	resource, method, _ := strings.Cut(r.PathValue("resource"), ":")
	if method != "testIamPermissions" {
		f.t.Errorf("fake resource manager: unexpected request %s %s", r.Method, r.URL)
		rpcError(w, 404, "NOT_FOUND", "Method not found.")
		return
	}
	if f.begin(w, r, epTestIAM, "") {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var req struct {
		Permissions []string `json:"permissions"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		rpcError(w, 400, "INVALID_ARGUMENT", "Invalid JSON payload received. "+err.Error())
		return
	}
	switch f.iamRefusal {
	case "denied":
		rpcError(w, 403, "PERMISSION_DENIED", "The caller does not have permission")
		return
	case "disabled":
		rpcError(w, 403, "PERMISSION_DENIED", "Cloud Resource Manager API has not been used in project 123456789012 before "+
			"or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/"+
			"cloudresourcemanager.googleapis.com/overview?project=123456789012 then retry.",
			map[string]any{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
				"domain": "googleapis.com", "metadata": map[string]string{
					"service": "cloudresourcemanager.googleapis.com", "consumer": "projects/123456789012"}})
		return
	}
	if resource != f.project { // a project the caller cannot see, or none: the API does not say which
		rpcError(w, 403, "PERMISSION_DENIED", "The caller does not have permission")
		return
	}
	held := []string{}
	for _, perm := range req.Permissions {
		if strings.Contains(perm, "*") {
			rpcError(w, 400, "INVALID_ARGUMENT", fmt.Sprintf("Permissions with wildcards (such as '*' or 'storage.*') are not allowed: %s", perm))
			return
		}
		if f.granted[perm] {
			held = append(held, perm)
		}
	}
	resp := map[string]any{}
	if len(held) > 0 { // an empty list is left out, as for every empty field
		resp["permissions"] = held
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	json.NewEncoder(w).Encode(resp)
}

// testIAMAsked are the permissions of each testIamPermissions request, in order.
func (f *fakeCompute) testIAMAsked(t testing.TB) [][]string {
	var out [][]string
	for _, r := range f.log() {
		if r.endpoint != epTestIAM {
			continue
		}
		var req struct{ Permissions []string }
		if err := json.Unmarshal(r.body, &req); err != nil {
			t.Fatalf("testIamPermissions body %q: %v", r.body, err)
		}
		out = append(out, req.Permissions)
	}
	return out
}

// serviceAccountKey writes a service-account key whose token_uri is the fake's token
// endpoint into dir and returns its path.
func (f *fakeCompute) serviceAccountKey(t testing.TB, dir string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "sa-project", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": testAccount, "client_id": "1",
		"token_uri": f.srv.URL + "/token",
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "key.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testAccount is the service account of serviceAccountKey's key and of the fake metadata
// server.
const testAccount = "elasticd@sa-project.iam.gserviceaccount.com"

// fakeMetadata is a Compute Engine metadata server for the VM's service account: its token,
// email and access scopes, and the project, under /computeMetadata/v1/, answering only
// requests with the header Metadata-Flavor: Google. newMetadata points GCE_METADATA_HOST at
// it, which also tells the SDK that it runs on a VM.
type fakeMetadata struct {
	mu     sync.Mutex
	scopes []string
	paths  []string // the paths asked, in order
}

func newMetadata(t *testing.T, scopes ...string) *fakeMetadata {
	m := &fakeMetadata{scopes: scopes}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.paths = append(m.paths, r.URL.Path)
		scopes := strings.Join(m.scopes, "\n")
		m.mu.Unlock()
		w.Header().Set("Metadata-Flavor", "Google")
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
			return
		}
		const sa = "/computeMetadata/v1/instance/service-accounts/default/"
		switch r.URL.Path {
		case sa + "token":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"access_token":"ya29.vm-token","expires_in":3599,"token_type":"Bearer"}`))
		case sa + "email":
			w.Header().Set("Content-Type", "application/text")
			w.Write([]byte(testAccount))
		case sa + "scopes":
			w.Header().Set("Content-Type", "application/text")
			w.Write([]byte(scopes + "\n"))
		case "/computeMetadata/v1/project/project-id":
			w.Header().Set("Content-Type", "application/text")
			w.Write([]byte(testProject))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))
	return m
}
