package gcp_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
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
// with the list filter `name eq "RE2"`, and with replies that a test can script.
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
	requests  []request
	onRequest func(*http.Request) // called under the lock with each API request
	tokens    int                 // OAuth 2.0 token requests
	encoded   map[string][]byte   // cache of encoded pages by request URL, dropped on a change
	stop      chan struct{}
}

// Endpoints of the fake, for scripting and counting.
const (
	epManaged   = "managed"
	epInstances = "instances"
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
	query     url.Values
	fieldMask string
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
		scripted: map[string][]reply{}, encoded: map[string][]byte{}, stop: make(chan struct{})}
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
	mux := http.NewServeMux()
	mux.HandleFunc("POST /compute/v1/projects/{project}/zones/{loc}/instanceGroupManagers/{mig}/listManagedInstances", f.serveManaged)
	mux.HandleFunc("POST /compute/v1/projects/{project}/regions/{loc}/instanceGroupManagers/{mig}/listManagedInstances", f.serveManaged)
	mux.HandleFunc("GET /compute/v1/projects/{project}/zones/{zone}/instances", f.serveInstances)
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
	f.mu.Lock()
	if f.onRequest != nil {
		f.onRequest(r)
	}
	f.requests = append(f.requests, request{endpoint: endpoint, zone: zone, at: time.Now(), query: r.URL.Query(),
		fieldMask: r.Header.Get("X-Goog-FieldMask")})
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
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
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
