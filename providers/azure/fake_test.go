package azure_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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
// ARM's wire format (paths, api-version, $expand, nextLink paging, error bodies, Retry-After,
// and the long-running operations of a capacity PATCH and of POST …/delete) with bodies
// rendered from testdata/, so the provider runs the real SDK clients against it.
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

	// The scale set's capacity and what changes it.
	capacity int
	nextID   int                 // the instance ID of the next VM the set creates
	deleted  []string            // instance IDs handed back through POST …/delete, in order
	reqs     map[string][]string // endpoint → the bodies of its PATCH and POST requests
	deny     bool                // PATCH and POST are refused: AuthorizationFailed
	runOut   string              // when set, VMs the set creates fail to allocate with this code
	ops      map[string]*fakeOp  // long-running operations by name
	opPolls  int                 // status reads that answer InProgress before the end

	tags       map[string]string // the scale set's tags
	afterPatch func()            // when set, called after each PATCH of the tags is taken (as another driver's)

	// perms are the caller's RBAC permissions on the scale set, as "Permissions - List For
	// Resource" answers them: one page each, linked by nextLink.
	perms [][]fakePerm
}

// fakePerm is one entry of a permissions listing: the actions and notActions of one role
// assignment's role. The data actions are always empty: elasticd needs none.
type fakePerm struct {
	Actions    []string `json:"actions"`
	NotActions []string `json:"notActions"`
}

// fakeOp is one long-running operation: its status resource answers InProgress polls times,
// then Succeeded, or Failed with code.
type fakeOp struct {
	polls int
	code  string
	start time.Time
}

// Endpoints, as counted in fakeARM.calls.
const (
	epSet    = "scaleset"
	epVMs    = "vms"
	epNICs   = "nics"
	epUpdate = "update" // PATCH of the scale set
	epDelete = "delete" // POST …/delete
	epOps    = "operations"
	epPerms  = "permissions" // GET …/virtualMachineScaleSets/{vmss}/providers/Microsoft.Authorization/permissions
)

// failMessages are ARM's messages for the failures the fake can make.
var failMessages = map[string]string{
	"ZonalAllocationFailed":                 "Allocation failed. We do not have sufficient capacity for the requested VM size in this zone. Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance",
	"AllocationFailed":                      "Allocation failed. If you are trying to add a new VM to a Virtual Machine Scale Set with a single placement group or update/resize an existing VM in a Virtual Machine Scale Set with a single placement group, please note that such allocation is scoped to a single cluster, and it is possible that the cluster is out of capacity. Please read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance.",
	"OverconstrainedAllocationRequest":      "Allocation failed. VM(s) with the following constraints cannot be allocated, because the condition is too restrictive. Please remove some constraints and try again. Constraints applied are: - Differencing (Ephemeral) Disks - Networking Constraints (such as Accelerated Networking or IPv6) - VM Size",
	"OverconstrainedZonalAllocationRequest": "Allocation failed. VM(s) with the following constraints cannot be allocated in zone 2, because the condition is too restrictive. Please remove some constraints and try again. Constraints applied are: - Networking Constraints (such as Accelerated Networking or IPv6) - VM Size",
	"SkuNotAvailable":                       "The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: Standard_ND96asr_v4' is currently not available in location 'eastus' zones '2' for subscription '0b1f6471-1bf0-4dda-aec3-cb9272f09590'. Please try another size or deploy to a different location or zones. See https://aka.ms/azureskunotavailable for details.",
	"OperationNotAllowed":                   "Operation could not be completed as it results in exceeding approved standardNDASv4_A100Family Cores quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 96, Current Usage: 96, Additional Required: 96, (Minimum) New Limit Required: 192.",
	"InternalExecutionError":                "An internal execution error occurred. Please retry later.",
}

type setSpec struct {
	SKU             string // the model's size
	Priority        string // "Spot", "Regular", "Low" or "" (not set)
	Mode            string // "Uniform" or "Flexible"
	SinglePlacement bool   // singlePlacementGroup: at most 100 VMs
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
	// FailCode, when set, is why the VM failed to provision: its instance view says
	// ProvisioningState/failed/<FailCode> (with Prov "Failed").
	FailCode string
}

// reply is a canned answer: a testdata file rendered as a template, or raw bytes.
type reply struct {
	status int
	header map[string]string
	file   string
	data   map[string]any // beside fakeARM.data, for the file's template
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
		capacity: len(vms),
		reqs:     map[string][]string{},
		ops:      map[string]*fakeOp{},
		opPolls:  1,
		tags:     map[string]string{"elasticd": "gpu-pool"},
		perms:    [][]fakePerm{{{Actions: []string{"*"}}}}, // an Owner or Contributor
	}
	for _, v := range vms {
		f.nextID = max(f.nextID, atoi(v.ID)+1)
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
	azure.SetLROPollInterval(p, time.Millisecond)
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
	f.vms, f.pages, f.capacity = vms, nil, len(vms)
	for _, v := range vms {
		f.nextID = max(f.nextID, atoi(v.ID)+1)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// denyWrites makes every later PATCH and POST fail with 403 AuthorizationFailed.
func (f *fakeARM) denyWrites() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deny = true
}

// runOutOf makes the VMs the set creates from now on fail to allocate with code (""
// ends the stockout): they are listed with provisioning state Failed, and the operation
// that created them fails with code.
func (f *fakeARM) runOutOf(code string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runOut = code
}

// grow raises the capacity by n as something other than the provider would (the portal,
// a spot restore policy), creating VMs as a PATCH does.
func (f *fakeARM) grow(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resize(f.capacity + n)
}

// setOpPolls makes every later operation answer InProgress n times before it ends.
func (f *fakeARM) setOpPolls(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opPolls = n
}

func (f *fakeARM) capacityNow() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.capacity
}

func (f *fakeARM) deletedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deleted)
}

// requestBodies are the request bodies sent to endpoint (epUpdate, epDelete), in order.
func (f *fakeARM) requestBodies(endpoint string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs[endpoint])
}

// instanceIDs lists the set's VMs by instance ID, in order.
func (f *fakeARM) instanceIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, v := range f.vms {
		ids = append(ids, v.ID)
	}
	return ids
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
	switch {
	case ep == epSet && r.Method == http.MethodPatch:
		ep = epUpdate
	case ep == epDelete && r.Method != http.MethodPost, ep != epUpdate && ep != epDelete && r.Method != http.MethodGet:
		ep = ""
	}
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
	}
	f.mu.Lock()
	if ep == epUpdate || ep == epDelete {
		f.reqs[ep] = append(f.reqs[ep], string(body))
	}
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
	case ep == "":
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
	case ep == epOps:
		f.operation(w, r, vmss)
	case (ep == epUpdate || ep == epDelete) && f.denied():
		action := map[string]string{epUpdate: "Microsoft.Compute/virtualMachineScaleSets/write",
			epDelete: "Microsoft.Compute/virtualMachineScaleSets/delete/action"}[ep]
		f.write(w, reply{status: http.StatusForbidden, file: "error_authorization_failed_action.json",
			data: map[string]any{"Action": action}})
	case !strings.EqualFold(rg, f.rg):
		f.write(w, reply{status: http.StatusNotFound, file: "error_resource_group_not_found.json"})
	case !strings.EqualFold(vmss, f.vmss):
		f.write(w, reply{status: http.StatusNotFound, file: "error_resource_not_found.json"})
	case ep == epSet:
		f.mu.Lock()
		data := f.setData("Succeeded")
		f.mu.Unlock()
		f.write(w, reply{raw: f.render("scaleset.json.tmpl", data)})
	case ep == epUpdate:
		f.update(w, r, body)
	case ep == epDelete:
		f.deleteInstances(w, r, body)
	case ep == epPerms:
		f.permissions(w, r)
	default:
		f.page(w, r, ep)
	}
}

// route splits an ARM path into its endpoint and names; ARM paths are case-insensitive.
func route(path string) (ep, sub, rg, vmss string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// subscriptions/{s}/providers/Microsoft.Compute/locations/{location}/operations/{name}
	if len(parts) == 8 && strings.EqualFold(parts[0], "subscriptions") && strings.EqualFold(parts[2], "providers") &&
		strings.EqualFold(parts[3], "Microsoft.Compute") && strings.EqualFold(parts[4], "locations") &&
		strings.EqualFold(parts[6], "operations") {
		return epOps, parts[1], "", parts[7]
	}
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
	case len(parts) == 9 && strings.EqualFold(parts[8], "delete"):
		ep = epDelete
	case len(parts) == 11 && strings.EqualFold(parts[8], "providers") &&
		strings.EqualFold(parts[9], "Microsoft.Authorization") && strings.EqualFold(parts[10], "permissions"):
		ep = epPerms
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
	protos := map[[3]bool]string{}
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
		shape := [3]bool{v.Zone != "", power != "", v.FailCode != ""}
		proto, ok := protos[shape]
		if !ok {
			d := f.data()
			for _, k := range []string{"InstanceID", "Zone", "IP", "SKU", "Provisioning", "ProvisioningCode", "Power", "Created", "Mac", "FailCode", "FailMessage"} {
				d[k] = "@@" + k + "@@"
			}
			if !shape[0] {
				d["Zone"] = ""
			}
			if !shape[1] {
				d["Power"] = ""
			}
			if !shape[2] {
				d["FailCode"] = ""
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
			"@@Mac@@", fmt.Sprintf("%02X", i%256),
			"@@FailCode@@", v.FailCode, "@@FailMessage@@", failMessages[v.FailCode])
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
		for k, v := range r.data {
			d[k] = v
		}
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

func (f *fakeARM) denied() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deny
}

// setData is what scaleset.json.tmpl renders; f.mu is held.
func (f *fakeARM) setData(provisioning string) map[string]any {
	d := f.data()
	d["SKU"], d["Priority"], d["Mode"], d["Capacity"] = f.set.SKU, f.set.Priority, f.set.Mode, f.capacity
	d["SinglePlacement"], d["Provisioning"] = f.set.SinglePlacement, provisioning
	tags, _ := json.Marshal(f.tags)
	d["Tags"] = string(tags)
	return d
}

// maxCapacity is what ARM accepts for the set's sku.capacity; f.mu is held.
func (f *fakeARM) maxCapacity() int {
	if f.set.SinglePlacement {
		return 100
	}
	return 1000
}

// resize makes the set hold n VMs as ARM does: a scale-in removes the highest instance IDs
// (the default scale-in policy, zones aside), a scale-out creates VMs with new instance IDs,
// which fail to allocate while the fake has run out. It returns the code the scale-out
// failed with, or "". f.mu is held.
func (f *fakeARM) resize(n int) string {
	f.capacity, f.pages = n, nil
	if n < len(f.vms) {
		f.vms = f.vms[:n]
		return ""
	}
	for len(f.vms) < n {
		id := strconv.Itoa(f.nextID)
		f.nextID++
		v := fakeVM{ID: id, Zone: strconv.Itoa(atoi(id)%3 + 1), Created: t0.Add(time.Duration(atoi(id)) * time.Minute)}
		if f.runOut != "" {
			v.Prov, v.Power, v.FailCode = "Failed", "-", f.runOut
		} else {
			v.IP = fmt.Sprintf("10.0.9.%d", atoi(id)%250+4)
		}
		f.vms = append(f.vms, v)
	}
	return f.runOut
}

// newOp starts a long-running operation that ends Failed with code, or Succeeded when code
// is "", and returns the URL of its status resource; f.mu is held.
func (f *fakeARM) newOp(code string) string {
	name := fmt.Sprintf("5d0f27c4-8e1a-4b7e-9c3d-%012d", len(f.ops)+1)
	f.ops[name] = &fakeOp{polls: f.opPolls, code: code, start: time.Now().UTC()}
	return fmt.Sprintf("%s/subscriptions/%s/providers/Microsoft.Compute/locations/eastus/operations/%s?api-version=2025-04-01", f.srv.URL, f.sub, name)
}

// update is PATCH of the scale set: ARM takes the new capacity into the model at once and
// answers 200 with the set, provisioningState Updating, and an Azure-AsyncOperation header
// naming the operation that creates or removes the VMs.
//
// A PATCH of "tags" replaces the set's tags with those it names (ARM's PATCH of a resource's
// tags is not a merge); ARM refuses more than 50 of them, and names longer than 512 or
// values longer than 256 characters.
func (f *fakeARM) update(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		SKU *struct {
			Capacity *int `json:"capacity"`
		} `json:"sku"`
		Tags *map[string]string `json:"tags"`
	}
	if err := json.Unmarshal(body, &req); err != nil || (req.SKU == nil || req.SKU.Capacity == nil) && req.Tags == nil {
		f.write(w, reply{status: http.StatusBadRequest, raw: []byte(`{"error":{"code":"InvalidRequestContent","message":"The request content was invalid and could not be deserialized."}}`)})
		return
	}
	if req.Tags != nil {
		f.updateTags(w, *req.Tags)
		return
	}
	f.mu.Lock()
	n := *req.SKU.Capacity
	if limit := f.maxCapacity(); n < 0 || n > limit {
		f.mu.Unlock()
		f.write(w, reply{status: http.StatusBadRequest, file: "error_capacity_too_large.json", data: map[string]any{"Capacity": n, "Max": limit}})
		return
	}
	code := f.resize(n)
	op := f.newOp(code)
	data := f.setData("Updating")
	f.mu.Unlock()
	f.write(w, reply{raw: f.render("scaleset.json.tmpl", data),
		header: map[string]string{"Azure-AsyncOperation": op, "Azure-AsyncNotification": "Enabled"}})
}

// deleteInstances is POST …/delete: 202 Accepted with Azure-AsyncOperation and Location
// headers and no body; the capacity drops by the VMs deleted.
func (f *fakeARM) deleteInstances(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		InstanceIDs []string `json:"instanceIds"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.InstanceIDs) == 0 {
		f.write(w, reply{status: http.StatusBadRequest, raw: []byte(`{"error":{"code":"InvalidRequestContent","message":"The request content was invalid and could not be deserialized."}}`)})
		return
	}
	f.mu.Lock()
	for _, id := range req.InstanceIDs {
		if !slices.ContainsFunc(f.vms, func(v fakeVM) bool { return v.ID == id }) {
			f.mu.Unlock()
			f.write(w, reply{status: http.StatusBadRequest, file: "error_invalid_instance_id.json", data: map[string]any{"InstanceID": id}})
			return
		}
	}
	f.vms = slices.DeleteFunc(f.vms, func(v fakeVM) bool { return slices.Contains(req.InstanceIDs, v.ID) })
	f.deleted = append(f.deleted, req.InstanceIDs...)
	f.capacity -= len(req.InstanceIDs)
	f.pages = nil
	op := f.newOp("")
	f.mu.Unlock()
	f.write(w, reply{status: http.StatusAccepted, raw: []byte{},
		header: map[string]string{"Azure-AsyncOperation": op, "Location": op + "&monitor=true"}})
}

// operation is GET of an operation's status resource, {"status":"InProgress"|"Succeeded"|
// "Failed", …}, or with monitor=true its Location: 202 while it runs, then 200 and no body.
func (f *fakeARM) operation(w http.ResponseWriter, r *http.Request, name string) {
	f.mu.Lock()
	op := f.ops[name]
	if op == nil {
		f.mu.Unlock()
		f.write(w, reply{status: http.StatusNotFound, file: "error_operation_not_found.json"})
		return
	}
	if r.URL.Query().Get("monitor") == "true" {
		running := op.polls > 0
		f.mu.Unlock()
		if running {
			f.write(w, reply{status: http.StatusAccepted, raw: []byte{}, header: map[string]string{"Location": f.srv.URL + r.URL.RequestURI()}})
		} else {
			f.write(w, reply{raw: []byte{}})
		}
		return
	}
	d := map[string]any{"OpID": name, "Start": op.start.Format(time.RFC3339Nano), "End": "", "Status": "InProgress", "Code": "", "Message": ""}
	if op.polls > 0 {
		op.polls--
	} else {
		d["End"], d["Status"] = time.Now().UTC().Format(time.RFC3339Nano), "Succeeded"
		if op.code != "" {
			d["Status"], d["Code"], d["Message"] = "Failed", op.code, failMessages[op.code]
		}
	}
	f.mu.Unlock()
	f.write(w, reply{raw: f.render("operation.json.tmpl", d)})
}

// updateTags takes a PATCH of the set's tags: 200 with the set, and an operation that ends
// Succeeded (the model changes; no VM does).
func (f *fakeARM) updateTags(w http.ResponseWriter, tags map[string]string) {
	bad := ""
	for k, v := range tags {
		if len(k) > 512 || len(v) > 256 || strings.ContainsAny(k, "<>%&\\?/") {
			bad = k
		}
	}
	if len(tags) > 50 || bad != "" {
		f.write(w, reply{status: http.StatusBadRequest, raw: []byte(`{"error":{"code":"InvalidTag","message":"The tag names or values are invalid, or there are more than 50 tags."}}`)})
		return
	}
	f.mu.Lock()
	f.tags = maps.Clone(tags)
	if f.tags == nil {
		f.tags = map[string]string{}
	}
	op := f.newOp("")
	data := f.setData("Updating")
	after := f.afterPatch
	f.mu.Unlock()
	if after != nil {
		after()
	}
	f.write(w, reply{raw: f.render("scaleset.json.tmpl", data),
		header: map[string]string{"Azure-AsyncOperation": op, "Azure-AsyncNotification": "Enabled"}})
}

// setTag sets one of the set's tags, as its owner would in the portal.
func (f *fakeARM) setTag(key, value string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tags[key] = value
}

// tagsNow is a copy of the set's tags.
func (f *fakeARM) tagsNow() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.tags)
}

// setPermissions sets the caller's permissions on the scale set: each argument is one page
// of the listing.
func (f *fakeARM) setPermissions(pages ...[]fakePerm) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.perms = pages
}

// permissions serves one page of "Permissions - List For Resource" (api-version 2022-04-01):
// {"value":[{"actions":[…],"notActions":[…],"dataActions":[],"notDataActions":[]}],
// "nextLink":"…"}, $skiptoken being the page's index.
func (f *fakeARM) permissions(w http.ResponseWriter, r *http.Request) {
	type entry struct {
		fakePerm
		DataActions    []string `json:"dataActions"`
		NotDataActions []string `json:"notDataActions"`
	}
	var page struct {
		Value    []entry `json:"value"`
		NextLink string  `json:"nextLink,omitempty"`
	}
	i, _ := strconv.Atoi(r.URL.Query().Get("$skiptoken"))
	f.mu.Lock()
	page.Value = []entry{}
	if i >= 0 && i < len(f.perms) {
		for _, p := range f.perms[i] {
			e := entry{fakePerm: p, DataActions: []string{}, NotDataActions: []string{}}
			if e.Actions == nil {
				e.Actions = []string{}
			}
			if e.NotActions == nil {
				e.NotActions = []string{}
			}
			page.Value = append(page.Value, e)
		}
	}
	if i+1 < len(f.perms) {
		q := r.URL.Query()
		q.Set("$skiptoken", strconv.Itoa(i+1))
		page.NextLink = f.srv.URL + r.URL.Path + "?" + q.Encode()
	}
	f.mu.Unlock()
	body, _ := json.Marshal(page)
	f.write(w, reply{raw: body})
}
