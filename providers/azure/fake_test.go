package azure_test

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/azure"
)

// fakeARM is an in-process Azure Resource Manager holding one Uniform scale set. It speaks
// ARM's wire format (paths, api-version, $expand, nextLink paging, error bodies, Retry-After)
// with bodies rendered from testdata/, so the provider runs the real SDK clients against it.
type fakeARM struct {
	t   testing.TB
	srv *httptest.Server
	// Where the scale set lives; a request for another one is answered 404 like ARM does.
	sub, rg, vmss string

	mu       sync.Mutex
	set      setSpec
	vms      []fakeVM
	pageSize int
	lean     bool                // VMs and NICs with only the fields the provider reads (testdata/*_lean.json.tmpl)
	calls    map[string]int      // endpoint → requests, whatever the answer
	queued   map[string][]reply  // endpoint → replies served, in order, before the real one
	failAll  *reply              // when set, every request gets it
	stall    bool                // when set, every request waits until its client gives up
	pages    map[string][][]byte // rendered items, per endpoint and $expand
	bodies   map[string][]byte   // rendered pages, per endpoint, $expand and $skiptoken
	lastURL  map[string]*url.URL // endpoint → the last request's URL
}

// Endpoints, as counted in fakeARM.calls.
const (
	epSet  = "scaleset"
	epVMs  = "vms"
	epNICs = "nics"
)

type setSpec struct {
	SKU      string // the model's size
	Priority string // "Spot", "Regular", "Low" or "" (not set)
	Mode     string // "Uniform" or "Flexible"
}

// fakeVM is one VM of the set. The zero values of Prov and Power mean Succeeded and running.
type fakeVM struct {
	ID      string // instanceId; the VM's name is <vmss>_<ID>
	IP      string // "" : no network interface yet
	SKU     string // "" : the set's
	Zone    string
	Prov    string
	Power   string // "-": the instance view has no power state
	Created time.Time
}

// reply is a canned answer: a testdata file rendered as a template, or raw bytes.
type reply struct {
	status int
	header map[string]string
	file   string
	raw    []byte
}

func newFake(t testing.TB, vms ...fakeVM) *fakeARM {
	t.Helper()
	f := &fakeARM{
		t: t, sub: "0b1f6471-1bf0-4dda-aec3-cb9272f09590", rg: "ml-rg", vmss: "gpus",
		set:      setSpec{SKU: "Standard_ND96asr_v4", Priority: "Spot", Mode: "Uniform"},
		vms:      vms,
		pageSize: 1000,
		calls:    map[string]int{},
		queued:   map[string][]reply{},
		lastURL:  map[string]*url.URL{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// config is a provider config for the fake: its endpoint, a fake token, no caching.
func (f *fakeARM) config(t testing.TB) azure.Config {
	return azure.Config{
		Subscription: f.sub, ResourceGroup: f.rg, VMSS: f.vmss,
		Endpoint:    f.srv.URL,
		Credential:  &azfake.TokenCredential{},
		MinInterval: time.Nanosecond,
		Logger:      testLogger(t),
	}
}

func (f *fakeARM) provider(t testing.TB, edit ...func(*azure.Config)) *azure.Provider {
	t.Helper()
	cfg := f.config(t)
	for _, e := range edit {
		e(&cfg)
	}
	p, err := azure.New(cfg)
	if err != nil {
		t.Fatalf("azure.New: %v", err)
	}
	return p
}

// want is the host the provider must make of v.
func (f *fakeARM) want(v fakeVM) providers.Host {
	f.mu.Lock()
	defer f.mu.Unlock()
	typ := v.SKU
	if typ == "" {
		typ = f.set.SKU
	}
	zone := "eastus"
	if v.Zone != "" {
		zone += "-" + v.Zone
	}
	return providers.Host{
		ID: f.vmss + "_" + v.ID, Addr: v.IP, Slots: gpuSlots(typ), Zone: zone,
		Spot: f.set.Priority == "Spot" || f.set.Priority == "Low", Type: typ, Launched: v.Created,
		Leaving: leavingState(v),
	}
}

func leavingState(v fakeVM) bool {
	switch v.Power {
	case "stopping", "stopped", "deallocating", "deallocated":
		return true
	}
	return v.Prov == "Deleting"
}

func (f *fakeARM) setVMs(vms ...fakeVM) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vms, f.pages = vms, nil
}

func (f *fakeARM) setPageSize(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pageSize, f.pages = n, nil
}

func (f *fakeARM) setLean() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lean, f.pages = true, nil
}

func (f *fakeARM) setScaleSet(s setSpec) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = s
}

func (f *fakeARM) queue(endpoint string, rs ...reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queued[endpoint] = append(f.queued[endpoint], rs...)
}

func (f *fakeARM) failEvery(r reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAll = &r
}

func (f *fakeARM) stallEvery() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stall = true
}

// count is the requests to endpoint so far; total with "".
func (f *fakeARM) count(endpoint string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if endpoint != "" {
		return f.calls[endpoint]
	}
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func (f *fakeARM) last(endpoint string) *url.URL {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastURL[endpoint]
}

func (f *fakeARM) serve(w http.ResponseWriter, r *http.Request) {
	ep, sub, rg, vmss := route(r.URL.Path)
	f.mu.Lock()
	f.calls[ep]++
	f.lastURL[ep] = r.URL
	stall, fail := f.stall, f.failAll
	var q *reply
	if len(f.queued[ep]) > 0 {
		q = &f.queued[ep][0]
		f.queued[ep] = f.queued[ep][1:]
	}
	f.mu.Unlock()

	switch {
	case r.Method != http.MethodGet || ep == "":
		f.write(w, reply{status: http.StatusBadRequest, raw: []byte(`{"error":{"code":"InvalidRequest","message":"unexpected ` + r.Method + ` ` + r.URL.Path + `"}}`)})
	case !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer "):
		f.write(w, reply{status: http.StatusUnauthorized, file: "error_missing_auth.json",
			header: map[string]string{"WWW-Authenticate": `Bearer authorization_uri="https://login.windows.net/", error="invalid_token", error_description="The authentication failed because of missing 'Authorization' header."`}})
	case r.URL.Query().Get("api-version") == "":
		f.write(w, reply{status: http.StatusBadRequest, file: "error_missing_api_version.json"})
	case stall:
		<-r.Context().Done()
	case fail != nil:
		f.write(w, *fail)
	case q != nil:
		f.write(w, *q)
	case !strings.EqualFold(sub, f.sub):
		f.write(w, reply{status: http.StatusNotFound, file: "error_subscription_not_found.json"})
	case !strings.EqualFold(rg, f.rg):
		f.write(w, reply{status: http.StatusNotFound, file: "error_resource_group_not_found.json"})
	case !strings.EqualFold(vmss, f.vmss):
		f.write(w, reply{status: http.StatusNotFound, file: "error_resource_not_found.json"})
	case ep == epSet:
		f.mu.Lock()
		data := f.data()
		data["SKU"], data["Priority"], data["Mode"], data["Capacity"] = f.set.SKU, f.set.Priority, f.set.Mode, len(f.vms)
		f.mu.Unlock()
		f.write(w, reply{raw: f.render("scaleset.json.tmpl", data)})
	default:
		f.page(w, r, ep)
	}
}

// route splits an ARM path into its endpoint and names; ARM paths are case-insensitive.
func route(path string) (ep, sub, rg, vmss string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}[/x]
	if len(parts) < 8 || !strings.EqualFold(parts[0], "subscriptions") || !strings.EqualFold(parts[2], "resourceGroups") ||
		!strings.EqualFold(parts[5], "Microsoft.Compute") || !strings.EqualFold(parts[6], "virtualMachineScaleSets") {
		return "", "", "", ""
	}
	sub, rg, vmss = parts[1], parts[3], parts[7]
	switch {
	case len(parts) == 8:
		ep = epSet
	case len(parts) == 9 && strings.EqualFold(parts[8], "virtualMachines"):
		ep = epVMs
	case len(parts) == 9 && strings.EqualFold(parts[8], "networkInterfaces"):
		ep = epNICs
	}
	return ep, sub, rg, vmss
}

// page serves one page of VMs or NICs, $skiptoken being the index of its first item. Pages
// are built once per state of the set, so that a benchmark measures the client.
func (f *fakeARM) page(w http.ResponseWriter, r *http.Request, ep string) {
	expand := ep == epVMs && r.URL.Query().Get("$expand") == "instanceView"
	start, _ := strconv.Atoi(r.URL.Query().Get("$skiptoken"))
	key := fmt.Sprintf("%s/%v", ep, expand)
	f.mu.Lock()
	if f.pages == nil {
		f.pages, f.bodies = map[string][][]byte{}, map[string][]byte{}
	}
	body, ok := f.bodies[key+"/"+strconv.Itoa(start)]
	if !ok {
		items, ok := f.pages[key]
		if !ok {
			items = f.items(ep, expand)
			f.pages[key] = items
		}
		end := min(start+f.pageSize, len(items))
		var b bytes.Buffer
		b.WriteString(`{"value":[`)
		for i := start; i < end; i++ {
			if i > start {
				b.WriteByte(',')
			}
			b.Write(items[i])
		}
		b.WriteString("]")
		if end < len(items) {
			q := r.URL.Query()
			q.Set("$skiptoken", strconv.Itoa(end))
			fmt.Fprintf(&b, `,"nextLink":%q`, f.srv.URL+r.URL.Path+"?"+q.Encode())
		}
		b.WriteString("}")
		body = b.Bytes()
		f.bodies[key+"/"+strconv.Itoa(start)] = body
	}
	f.mu.Unlock()
	f.write(w, reply{raw: body})
}

// items renders every VM (or every NIC of a VM that has an address) once; f.mu is held.
// The template is executed once per shape (zone or not, power state or not) with
// placeholders, which are then replaced per VM: text/template is too slow for 10,000.
func (f *fakeARM) items(ep string, expand bool) [][]byte {
	file := map[string]string{epVMs: "vm.json.tmpl", epNICs: "nic.json.tmpl"}[ep]
	if f.lean {
		file = map[string]string{epVMs: "vm_lean.json.tmpl", epNICs: "nic_lean.json.tmpl"}[ep]
	}
	protos := map[[2]bool]string{}
	var out [][]byte
	for i, v := range f.vms {
		if ep == epNICs && v.IP == "" {
			continue
		}
		power := "running"
		if v.Power == "-" {
			power = ""
		} else if v.Power != "" {
			power = v.Power
		}
		shape := [2]bool{v.Zone != "", power != ""}
		proto, ok := protos[shape]
		if !ok {
			d := f.data()
			for _, k := range []string{"InstanceID", "Zone", "IP", "SKU", "Provisioning", "ProvisioningCode", "Power", "Created", "Mac"} {
				d[k] = "@@" + k + "@@"
			}
			if !shape[0] {
				d["Zone"] = ""
			}
			if !shape[1] {
				d["Power"] = ""
			}
			d["InstanceView"] = expand
			proto = string(f.render(file, d))
			protos[shape] = proto
		}
		sku, prov := cmp.Or(v.SKU, f.set.SKU), cmp.Or(v.Prov, "Succeeded")
		r := strings.NewReplacer(
			"@@InstanceID@@", v.ID, "@@Zone@@", v.Zone, "@@IP@@", v.IP, "@@SKU@@", sku,
			"@@Provisioning@@", prov, "@@ProvisioningCode@@", strings.ToLower(prov), "@@Power@@", power,
			"@@Created@@", v.Created.UTC().Format("2006-01-02T15:04:05.0000000Z07:00"),
			"@@Mac@@", fmt.Sprintf("%02X", i%256))
		out = append(out, []byte(r.Replace(proto)))
	}
	return out
}

// data is what every template may use; f.mu is held.
func (f *fakeARM) data() map[string]any {
	return map[string]any{"Sub": f.sub, "RG": f.rg, "RGUpper": strings.ToUpper(f.rg), "VMSS": f.vmss, "Name": f.vmss}
}

var (
	tmplMu    sync.Mutex
	tmplCache = map[string]*template.Template{}
)

func (f *fakeARM) render(file string, data map[string]any) []byte {
	tmplMu.Lock()
	tm, ok := tmplCache[file]
	if !ok {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			tmplMu.Unlock()
			panic(err) // a missing testdata file is a broken test, not a server answer
		}
		tm = template.Must(template.New(file).Option("missingkey=error").Parse(string(b)))
		tmplCache[file] = tm
	}
	tmplMu.Unlock()
	var b bytes.Buffer
	if err := tm.Execute(&b, data); err != nil {
		panic(err)
	}
	return b.Bytes()
}

func (f *fakeARM) write(w http.ResponseWriter, r reply) {
	body := r.raw
	if r.file != "" {
		f.mu.Lock()
		d := f.data()
		f.mu.Unlock()
		body = f.render(r.file, d)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	if strings.HasSuffix(r.file, ".html") {
		w.Header().Set("Content-Type", "text/html")
	}
	w.Header().Set("x-ms-request-id", "a4f1e9e2-6f1d-4c7e-9d55-0e1f2a3b4c5d")
	for k, v := range r.header {
		w.Header().Set(k, v)
	}
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	w.Write(body)
}

// throttled is ARM's 429 with the given Retry-After headers.
func throttled(header ...string) reply {
	r := reply{status: http.StatusTooManyRequests, file: "error_too_many_requests.json", header: map[string]string{}}
	for i := 0; i+1 < len(header); i += 2 {
		r.header[header[i]] = header[i+1]
	}
	return r
}

// testLogger routes the provider's log to t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var _ io.Writer = tlogWriter{}
