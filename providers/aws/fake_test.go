package aws_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
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
	"text/template"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// fakeAWS is one in-process server for Auto Scaling, EC2, STS and IAM (query protocol, XML),
// SQS (JSON 1.0) and EventBridge (JSON 1.1), at one URL, as --endpoint gives it to all of
// them. It holds one group, one queue, the rules of the default event bus that feed it, and the
// caller's identity and grants. Response bodies come from testdata/; rendered pages are kept until the group
// changes, so that a benchmark measures the client rather than the templates.
type fakeAWS struct {
	t        testing.TB
	srv      *httptest.Server
	quit     chan struct{}
	queueURL string

	mu        sync.Mutex
	group     string
	exists    bool
	status    string // the group's Status ("Delete in progress")
	insts     []*fakeInst
	emptyPage bool // DescribeAutoScalingGroups: an empty first page, then the group
	version   int  // bumped when the group changes; pages is keyed by it
	pages     map[string][]byte
	calls     map[string]int      // by operation
	signed    map[string][]string // operation → the region/service scopes it was signed for
	inputs    map[string][]url.Values
	faults    map[string][]fault // answered before the real thing, one per call
	always    map[string]fault   // answered to every call
	stall     bool
	prices    []fakePrice // DescribeSpotPriceHistory's entries, in the order it sends them
	pricePage int         // DescribeSpotPriceHistory's page size; 0: the request's MaxResults
	queue     []*fakeMsg
	arrived   chan struct{} // closed and replaced when a message is sent
	received  []receiveCall
	deleted   []string // message IDs
	completed []url.Values
	nextID    int

	// The group's size, kept once a capacity call or setSize sets it (sized); before, the
	// group's desired capacity is its instance count, its minimum 0, its maximum 10 more.
	sized             bool
	min, desired, max int
	terminated        []string        // TerminateInstanceInAutoScalingGroup's instances, in order
	activities        []*fakeActivity // the group's scaling activities, newest first
	denied            map[string]bool // operations answered AccessDenied
	nextActivity      int
	tags              []fakeTag // the group's tags, in the order they were made
	afterTagWrite     func()    // when set, called after each CreateOrUpdateTags is applied (as another driver's write)

	// Who calls and what they may do (Check): STS, IAM, the queue's attributes, EventBridge.
	caller      string               // GetCallerIdentity's Arn
	roles       map[string]string    // the account's roles: name → path
	users       []string             // the account's users, by name
	grants      map[string]fakeGrant // IAM action → its simulated decision; absent: allowed
	simPage     int                  // SimulatePrincipalPolicy's page size; 0: the request's MaxItems
	rejectKey   string               // an access key ID every service rejects as invalid
	queuePolicy string               // the queue's Policy attribute; empty: none
	queueKMS    string               // the queue's KmsMasterKeyId attribute; empty: none
	rules       []fakeRule           // the default event bus's rules
	rulePage    int                  // ListRuleNamesByTarget's page size; 0: the request's Limit
	keys        []string             // the distinct access key IDs calls were signed with
}

// fakeGrant is what IAM decides about one action. A decision other than allowed also refuses
// the call itself, as IAM would (AccessDenied, UnauthorizedOperation, AccessDeniedException).
type fakeGrant struct {
	Decision string   // allowed (""), implicitDeny or explicitDeny
	Policy   string   // the policy whose statement an explicitDeny matched
	By       string   // an implicitDeny's cause beyond the role's policies: "boundary" or "organization"
	Missing  []string // MissingContextValues: condition keys the simulation cannot know
}

// fakeRule is one EventBridge rule of the default bus.
type fakeRule struct {
	Name, State, Pattern string
	Targets              []string // target ARNs
}

// fakeTag is one of the group's tags.
type fakeTag struct {
	Key, Value string
	Propagate  bool // PropagateAtLaunch
}

// fakeActivity is one scaling activity, as DescribeScalingActivities answers it.
type fakeActivity struct {
	ID, Description, Cause, StatusCode, StatusMessage, Details string
	Start, End                                                 time.Time
	Progress                                                   int
}

type fakeInst struct {
	ID, IP, Zone, Type string
	Lifecycle          string // Auto Scaling's LifecycleState
	State              string // EC2's instance state
	Spot               bool
	Launched           time.Time
	Hidden             bool // not (yet) visible to DescribeInstances
}

// fault is an error response: status and code, or a raw body from testdata/.
type fault struct {
	status     int
	code, msg  string
	retryAfter string
	file       string // testdata file sent instead (with status, 200 if zero)
}

// fakePrice is one entry of the spot price history. Price is a string, as on the wire, so that
// a test can send one that is not a number.
type fakePrice struct {
	Type, Zone, Product, Price string
	Time                       time.Time
}

type fakeMsg struct {
	id, body, handle string
	invisibleUntil   time.Time
	receives         int
}

type receiveCall struct {
	Max, Wait, Visibility int
}

const (
	fakeGroup   = "gpu-workers"
	fakeAccount = "123456789012"
	// fakeCaller is who the dummy credentials are, by default: the driver's role, assumed by an
	// instance; the role has a path, which only iam:GetRole tells.
	fakeCaller   = "arn:aws:sts::" + fakeAccount + ":assumed-role/elasticd-driver/i-0123456789abcdef0"
	fakeRole     = "elasticd-driver"
	fakeRolePath = "/elasticd/"
	fakeRoleARN  = "arn:aws:iam::" + fakeAccount + ":role" + fakeRolePath + fakeRole
	fakeQueueARN = "arn:aws:sqs:us-east-1:" + fakeAccount + ":elasticd-notices"
	// fakeSpotRule sends spot interruption warnings and rebalance recommendations to the queue.
	fakeSpotRule    = "elasticd-gpu-workers-spot"
	fakeSpotPattern = `{"source":["aws.ec2"],"detail-type":["EC2 Spot Instance Interruption Warning","EC2 Instance Rebalance Recommendation"]}`
	// fakeQueuePolicy lets EventBridge send to the queue from the job's rules, as
	// docs/providers/aws.md gives it.
	fakeQueuePolicy = `{"Version":"2012-10-17","Statement":[{"Sid":"EventBridge","Effect":"Allow",` +
		`"Principal":{"Service":"events.amazonaws.com"},"Action":"sqs:SendMessage","Resource":"` + fakeQueueARN + `",` +
		`"Condition":{"ArnLike":{"aws:SourceArn":"arn:aws:events:us-east-1:` + fakeAccount + `:rule/elasticd-gpu-workers-*"}}}]}`
)

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"json": func(s string) string { b, _ := json.Marshal(s); return string(b) },
	"xml":  func(s string) string { var b strings.Builder; xml.EscapeText(&b, []byte(s)); return b.String() },
	"time": func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") },
}).ParseGlob(filepath.Join("testdata", "*.tmpl")))

var eventTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"json": func(s string) string { b, _ := json.Marshal(s); return string(b) },
}).ParseGlob(filepath.Join("testdata", "events", "*")))

// newFake starts a server with the group fakeGroup holding insts (nil: empty).
func newFake(t testing.TB, insts ...*fakeInst) *fakeAWS { return startFake(t, false, insts) }

// newFakeTLS is newFake over HTTPS, with a certificate of its own (srv.Certificate()).
func newFakeTLS(t testing.TB, insts ...*fakeInst) *fakeAWS { return startFake(t, true, insts) }

func startFake(t testing.TB, tls bool, insts []*fakeInst) *fakeAWS {
	f := &fakeAWS{
		t: t, quit: make(chan struct{}), group: fakeGroup, exists: true, insts: insts,
		pages: map[string][]byte{}, calls: map[string]int{}, signed: map[string][]string{},
		inputs: map[string][]url.Values{}, faults: map[string][]fault{}, always: map[string]fault{},
		arrived: make(chan struct{}), denied: map[string]bool{},
		caller: fakeCaller, roles: map[string]string{fakeRole: fakeRolePath}, grants: map[string]fakeGrant{},
		queuePolicy: fakeQueuePolicy,
		rules:       []fakeRule{{Name: fakeSpotRule, State: "ENABLED", Pattern: fakeSpotPattern, Targets: []string{fakeQueueARN}}},
	}
	if tls {
		f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	} else {
		f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	}
	f.mu.Lock() // the handlers read it under the lock
	f.queueURL = f.srv.URL + "/" + fakeAccount + "/elasticd-notices"
	f.mu.Unlock()
	t.Cleanup(func() {
		close(f.quit) // releases stalled handlers before Close waits for them
		f.srv.Close()
	})
	return f
}

// inst makes the n-th instance of a group: in service, running, on-demand p4d.24xlarge.
func inst(n int) *fakeInst {
	return &fakeInst{
		ID: fmt.Sprintf("i-%017x", n), IP: fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff),
		Zone: []string{"us-east-1a", "us-east-1b", "us-east-1c"}[n%3], Type: "p4d.24xlarge",
		Lifecycle: "InService", State: "running",
		Launched: time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Second),
	}
}

// host is what the provider must make of i (slots from the GPU table).
func (i *fakeInst) host(slots int) providers.Host {
	return providers.Host{ID: i.ID, Addr: i.IP, Slots: slots, Zone: i.Zone, Spot: i.Spot, Type: i.Type, Launched: i.Launched}
}

// change runs fn on the group under the lock and drops the rendered pages.
func (f *fakeAWS) change(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
	f.version++
	clear(f.pages)
}

// fail queues faults for the next calls of op.
func (f *fakeAWS) fail(op string, fs ...fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[op] = append(f.faults[op], fs...)
}

// failAlways makes every later call of op answer flt.
func (f *fakeAWS) failAlways(op string, flt fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.always[op] = flt
}

func (f *fakeAWS) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *fakeAWS) resetCounts() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.calls)
}

// send puts an event, rendered from testdata/events/name with data, into the queue.
func (f *fakeAWS) send(name string, data eventData) string {
	f.t.Helper()
	var b bytes.Buffer
	if err := eventTemplates.ExecuteTemplate(&b, name, data.withDefaults()); err != nil {
		f.t.Fatalf("render %s: %v", name, err)
	}
	return f.sendRaw(b.String())
}

func (f *fakeAWS) sendRaw(body string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := fmt.Sprintf("5fea7756-0ea4-451a-a703-%012d", f.nextID)
	f.queue = append(f.queue, &fakeMsg{id: id, body: body})
	close(f.arrived)
	f.arrived = make(chan struct{})
	return id
}

// queued is how many messages are still in the queue, visible or not.
func (f *fakeAWS) queued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.queue)
}

type eventData struct {
	ID, Instance, ASG, Time, Start, State, Token, Hook, Inner string
}

func (d eventData) withDefaults() eventData {
	if d.ID == "" {
		d.ID = "1e5527d7-bb36-4607-3370-4164db56a40e"
	}
	if d.ASG == "" {
		d.ASG = fakeGroup
	}
	if d.Time == "" {
		d.Time = time.Now().UTC().Format(time.RFC3339)
	}
	if d.Hook == "" {
		d.Hook = "elasticd-drain"
	}
	if d.Start == "" {
		d.Start = "Sat, 05 Jun 2027 01:00:00 GMT"
	}
	return d
}

// render renders an event to a string (for nesting one in an SNS notification).
func render(t testing.TB, name string, data eventData) string {
	t.Helper()
	var b bytes.Buffer
	if err := eventTemplates.ExecuteTemplate(&b, name, data.withDefaults()); err != nil {
		t.Fatalf("render %s: %v", name, err)
	}
	return b.String()
}

var scope = regexp.MustCompile(`Credential=[^/]+/\d{8}/([^/]+)/([^/]+)/aws4_request`)

func (f *fakeAWS) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var op string
	var form url.Values
	sqsCall := r.Header.Get("X-Amz-Target") != "" // a JSON protocol: SQS's, or EventBridge's
	if sqsCall {
		op = r.Header.Get("X-Amz-Target")
		op = strings.TrimPrefix(strings.TrimPrefix(op, "AmazonSQS."), "AWSEvents.")
		form = jsonFields(body)
	} else {
		if form, err = url.ParseQuery(string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		op = form.Get("Action")
	}

	f.mu.Lock()
	f.calls[op]++
	if m := scope.FindStringSubmatch(r.Header.Get("Authorization")); m != nil {
		f.signed[op] = append(f.signed[op], m[1]+"/"+m[2])
	} else {
		f.signed[op] = append(f.signed[op], "unsigned")
	}
	if form != nil {
		f.inputs[op] = append(f.inputs[op], form)
	}
	if k := accessKey(r); k != "" && !slices.Contains(f.keys, k) {
		f.keys = append(f.keys, k)
	}
	stall := f.stall
	flt, faulty := f.always[op]
	if !faulty && len(f.faults[op]) > 0 {
		flt, faulty = f.faults[op][0], true
		f.faults[op] = f.faults[op][1:]
	}
	if !faulty && f.rejectKey != "" && accessKey(r) == f.rejectKey {
		flt, faulty = rejection(op), true
	}
	if !faulty && f.denied[op] {
		flt, faulty = f.denial(op), true
	}
	if action := fakeAction(op); !faulty && action != "" && cmp.Or(f.grants[action].Decision, "allowed") != "allowed" {
		flt, faulty = f.refusalLocked(op, action), true
	}
	f.mu.Unlock()

	if stall {
		select {
		case <-r.Context().Done():
		case <-f.quit:
		}
		return
	}
	if faulty {
		f.writeFault(w, op, sqsCall, flt)
		return
	}
	if ec2Ops[op] && form.Get("DryRun") == "true" {
		// Authorized (above), so it would have succeeded.
		f.writeFault(w, op, false, fault{status: http.StatusPreconditionFailed, code: "DryRunOperation",
			msg: "Request would have succeeded, but DryRun flag is set."})
		return
	}
	switch op {
	case "DescribeAutoScalingGroups":
		f.describeGroups(w, form)
	case "DescribeInstances":
		f.describeInstances(w, form)
	case "DescribeSpotPriceHistory":
		f.describeSpotPrices(w, form)
	case "CompleteLifecycleAction":
		// As Auto Scaling does, an action completed once is no longer pending.
		f.mu.Lock()
		tok := form.Get("LifecycleActionToken")
		done := slices.ContainsFunc(f.completed, func(c url.Values) bool { return c.Get("LifecycleActionToken") == tok })
		if !done {
			f.completed = append(f.completed, form)
		}
		f.mu.Unlock()
		if done {
			f.writeFault(w, op, sqsCall, fault{status: 400, code: "ValidationError",
				msg: "No active Lifecycle Action found with token " + tok})
			return
		}
		f.writeFile(w, http.StatusOK, "text/xml", "complete_lifecycle_action.xml")
	case "SetDesiredCapacity":
		f.setDesiredCapacity(w, form)
	case "UpdateAutoScalingGroup":
		f.updateGroup(w, form)
	case "TerminateInstanceInAutoScalingGroup":
		f.terminate(w, form)
	case "DescribeScalingActivities":
		f.describeActivities(w, form)
	case "CreateOrUpdateTags":
		f.createOrUpdateTags(w, form)
	case "DeleteTags":
		f.deleteTags(w, form)
	case "ReceiveMessage":
		f.receive(w, r, body)
	case "DeleteMessageBatch":
		f.deleteBatch(w, body)
	case "GetQueueAttributes":
		f.getQueueAttributes(w, body)
	case "GetCallerIdentity":
		f.getCallerIdentity(w)
	case "GetRole":
		f.getRole(w, form)
	case "SimulatePrincipalPolicy":
		f.simulatePrincipalPolicy(w, form)
	case "ListRuleNamesByTarget":
		f.listRuleNamesByTarget(w, body)
	case "DescribeRule":
		f.describeRule(w, body)
	default:
		f.writeFault(w, op, sqsCall, fault{status: 400, code: "InvalidAction", msg: "The action " + op + " is not valid for this web service."})
	}
}

func (f *fakeAWS) writeFault(w http.ResponseWriter, op string, sqsCall bool, flt fault) {
	if flt.retryAfter != "" {
		w.Header().Set("Retry-After", flt.retryAfter)
	}
	if flt.file != "" {
		ctype := "text/xml"
		if strings.HasSuffix(flt.file, ".html") {
			ctype = "text/html"
		}
		f.writeFile(w, cmp.Or(flt.status, 200), ctype, flt.file)
		return
	}
	data := map[string]string{"Code": flt.code, "Message": flt.msg, "RequestID": "b2c5c8a4-96f5-4d3c-a3f7-5d0b9c1f2e01"}
	switch {
	case sqsCall && fakeServices[op] == "events":
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("x-amzn-RequestId", data["RequestID"])
		w.WriteHeader(flt.status)
		json.NewEncoder(w).Encode(map[string]string{"__type": flt.code, "message": flt.msg})
	case fakeServices[op] == "iam" || fakeServices[op] == "sts":
		data["Namespace"] = queryNamespaces[fakeServices[op]]
		f.writeTemplate(w, flt.status, "error_query.xml.tmpl", data)
	case sqsCall:
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("x-amzn-query-error", flt.code+";Sender")
		w.WriteHeader(flt.status)
		json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + flt.code, "message": flt.msg})
	case ec2Ops[op]:
		f.writeTemplate(w, flt.status, "error_ec2.xml.tmpl", data)
	default:
		f.writeTemplate(w, flt.status, "error_autoscaling.xml.tmpl", data)
	}
}

// ec2Ops are the operations answered in EC2's dialect of the query protocol, whose errors
// differ from Auto Scaling's.
var ec2Ops = map[string]bool{"DescribeInstances": true, "DescribeSpotPriceHistory": true}

func (f *fakeAWS) writeFile(w http.ResponseWriter, status int, ctype, name string) {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		f.t.Errorf("fake: %v", err)
		http.Error(w, err.Error(), 500)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(status)
	w.Write(b)
}

func (f *fakeAWS) writeTemplate(w http.ResponseWriter, status int, name string, data any) {
	var b bytes.Buffer
	if err := templates.ExecuteTemplate(&b, name, data); err != nil {
		f.t.Errorf("fake: render %s: %v", name, err)
		http.Error(w, err.Error(), 500)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// page serves a rendered page from the cache, or renders and keeps it.
func (f *fakeAWS) page(w http.ResponseWriter, key string, render func() (string, any)) {
	f.mu.Lock()
	b, ok := f.pages[key]
	var name string
	var data any
	if !ok {
		name, data = render() // under the lock: it reads the group
	}
	f.mu.Unlock()
	if !ok {
		var buf bytes.Buffer
		if err := templates.ExecuteTemplate(&buf, name, data); err != nil {
			f.t.Errorf("fake: render %s: %v", name, err)
			http.Error(w, err.Error(), 500)
			return
		}
		b = buf.Bytes()
		f.mu.Lock()
		f.pages[key] = b
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "text/xml")
	w.Write(b)
}

type groupData struct {
	Name, Status      string
	Min, Desired, Max int
	Instances         []*fakeInst
	Tags              []fakeTag
}

func (f *fakeAWS) describeGroups(w http.ResponseWriter, form url.Values) {
	names := []string{}
	for i := 1; form.Has(fmt.Sprintf("AutoScalingGroupNames.member.%d", i)); i++ {
		names = append(names, form.Get(fmt.Sprintf("AutoScalingGroupNames.member.%d", i)))
	}
	token := form.Get("NextToken")
	f.page(w, fmt.Sprintf("asg/%s/%s", strings.Join(names, ","), token), func() (string, any) {
		data := struct {
			Group     *groupData
			NextToken string
			RequestID string
		}{RequestID: "a8f3a3a6-52a5-4a2b-8f5d-2bd0c6b0e1aa"}
		// emptyPage: the group comes on a second page, after an empty first one.
		onThisPage := token == "" && !f.emptyPage || token == "page-2" && f.emptyPage
		if f.exists && slices.Contains(names, f.group) && onThisPage {
			min, desired, max := f.sizeLocked()
			data.Group = &groupData{Name: f.group, Status: f.status, Min: min, Desired: desired, Max: max, Instances: f.insts,
				Tags: slices.Clone(f.tags)}
		}
		if f.emptyPage && token == "" {
			data.NextToken = "page-2"
		}
		return "describe_asg.xml.tmpl", data
	})
}

type instanceData struct {
	*fakeInst
	Suffix     string
	StateCode  int
	LaunchTime string
}

var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func (f *fakeAWS) describeInstances(w http.ResponseWriter, form url.Values) {
	// Filters: tag:<key> and instance-state-name; InstanceId.N; MaxResults; NextToken = offset.
	var tagKey, tagValue string
	states := map[string]bool{}
	for i := 1; form.Has(fmt.Sprintf("Filter.%d.Name", i)); i++ {
		name := form.Get(fmt.Sprintf("Filter.%d.Name", i))
		var values []string
		for j := 1; form.Has(fmt.Sprintf("Filter.%d.Value.%d", i, j)); j++ {
			values = append(values, form.Get(fmt.Sprintf("Filter.%d.Value.%d", i, j)))
		}
		switch {
		case strings.HasPrefix(name, "tag:") && len(values) == 1:
			tagKey, tagValue = strings.TrimPrefix(name, "tag:"), values[0]
		case name == "instance-state-name":
			for _, v := range values {
				states[v] = true
			}
		default:
			f.writeFault(w, "DescribeInstances", false, fault{status: 400, code: "InvalidParameterValue", msg: "The filter '" + name + "' is invalid"})
			return
		}
	}
	max := 1000
	if v := form.Get("MaxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 5 || n > 1000 {
			f.writeFault(w, "DescribeInstances", false, fault{status: 400, code: "InvalidParameterValue", msg: "Value ( " + v + " ) for parameter maxResults is invalid. Expecting a value between 5 and 1000."})
			return
		}
		max = n
	}
	offset := 0
	if tok := form.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "offset-"))
		if err != nil {
			f.writeFault(w, "DescribeInstances", false, fault{status: 400, code: "InvalidParameterValue", msg: "The specified token is invalid"})
			return
		}
		offset = n
	}
	key := fmt.Sprintf("ec2/%s=%s/%v/%d/%d", tagKey, tagValue, states, max, offset)
	f.page(w, key, func() (string, any) {
		var match []instanceData
		for i, in := range f.insts {
			if in.Hidden || (tagKey != "" && (tagKey != "aws:autoscaling:groupName" || tagValue != f.group)) ||
				(len(states) > 0 && !states[in.State]) {
				continue
			}
			match = append(match, instanceData{fakeInst: in, Suffix: fmt.Sprintf("%017x", i),
				StateCode: stateCodes[in.State], LaunchTime: in.Launched.UTC().Format("2006-01-02T15:04:05.000Z")})
		}
		data := struct {
			Group, RequestID, NextToken string
			Instances                   []instanceData
		}{Group: f.group, RequestID: "59dbff89-35bd-4eac-99ed-be587EXAMPLE"}
		if offset < len(match) {
			end := min(offset+max, len(match))
			data.Instances = match[offset:end]
			if end < len(match) {
				data.NextToken = "offset-" + strconv.Itoa(end)
			}
		}
		return "describe_instances.xml.tmpl", data
	})
}

type priceData struct {
	fakePrice
	Timestamp string
}

// describeSpotPrices answers the entries of f.prices whose type and product description the
// request names (all when it names none), a page at a time; NextToken is an offset.
func (f *fakeAWS) describeSpotPrices(w http.ResponseWriter, form url.Values) {
	list := func(prefix string) map[string]bool {
		m := map[string]bool{}
		for i := 1; form.Has(fmt.Sprintf("%s.%d", prefix, i)); i++ {
			m[form.Get(fmt.Sprintf("%s.%d", prefix, i))] = true
		}
		return m
	}
	types, products := list("InstanceType"), list("ProductDescription")
	invalid := func(msg string) {
		f.writeFault(w, "DescribeSpotPriceHistory", false, fault{status: 400, code: "InvalidParameterValue", msg: msg})
	}
	if v := form.Get("StartTime"); v != "" {
		if _, err := time.Parse(time.RFC3339, v); err != nil {
			invalid("Invalid value '" + v + "' for startTime")
			return
		}
	}
	max := 1000
	if v := form.Get("MaxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1000 {
			invalid("Value ( " + v + " ) for parameter maxResults is invalid. Expecting a value between 0 and 1000.")
			return
		}
		max = cmp.Or(n, 1000)
	}
	offset := 0
	if tok := form.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "offset-"))
		if err != nil {
			invalid("The specified token is invalid")
			return
		}
		offset = n
	}
	f.mu.Lock()
	size := cmp.Or(f.pricePage, max)
	var match []priceData
	for _, pr := range f.prices {
		if (len(types) == 0 || types[pr.Type]) && (len(products) == 0 || products[pr.Product]) {
			match = append(match, priceData{fakePrice: pr, Timestamp: pr.Time.UTC().Format("2006-01-02T15:04:05.000Z")})
		}
	}
	f.mu.Unlock()
	data := struct {
		RequestID, NextToken string
		Prices               []priceData
	}{RequestID: "7c8a1d4e-2f3b-4c5d-9e6f-0a1b2c3d4e5f"}
	if offset < len(match) {
		end := min(offset+size, len(match))
		data.Prices = match[offset:end]
		if end < len(match) {
			data.NextToken = "offset-" + strconv.Itoa(end)
		}
	}
	f.writeTemplate(w, http.StatusOK, "describe_spot_price_history.xml.tmpl", data)
}

func (f *fakeAWS) sqsReply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("x-amzn-RequestId", "c5d6e7f8-0000-4000-8000-000000000001")
	json.NewEncoder(w).Encode(v)
}

func (f *fakeAWS) receive(w http.ResponseWriter, r *http.Request, body []byte) {
	var in struct {
		QueueUrl            string
		MaxNumberOfMessages int
		WaitTimeSeconds     int
		VisibilityTimeout   int
	}
	if err := json.Unmarshal(body, &in); err != nil {
		f.writeFault(w, "ReceiveMessage", true, fault{status: 400, code: "InvalidParameterValue", msg: err.Error()})
		return
	}
	f.mu.Lock()
	if in.QueueUrl != f.queueURL {
		f.mu.Unlock()
		f.writeFault(w, "ReceiveMessage", true, fault{status: 400, code: "QueueDoesNotExist", msg: "The specified queue does not exist."})
		return
	}
	f.received = append(f.received, receiveCall{in.MaxNumberOfMessages, in.WaitTimeSeconds, in.VisibilityTimeout})
	f.mu.Unlock()
	max := cmp.Or(in.MaxNumberOfMessages, 1)
	deadline := time.NewTimer(time.Duration(in.WaitTimeSeconds) * time.Second)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		now := time.Now()
		var out []map[string]string
		for _, m := range f.queue {
			if len(out) == max || now.Before(m.invisibleUntil) {
				continue
			}
			m.receives++
			m.handle = fmt.Sprintf("AQEB%s-%d", m.id, m.receives)
			m.invisibleUntil = now.Add(time.Duration(cmp.Or(in.VisibilityTimeout, 30)) * time.Second)
			sum := md5.Sum([]byte(m.body))
			out = append(out, map[string]string{"MessageId": m.id, "ReceiptHandle": m.handle,
				"MD5OfBody": hex.EncodeToString(sum[:]), "Body": m.body})
		}
		arrived := f.arrived
		f.mu.Unlock()
		if len(out) > 0 {
			f.sqsReply(w, map[string]any{"Messages": out})
			return
		}
		select {
		case <-arrived:
		case <-deadline.C:
			f.sqsReply(w, map[string]any{})
			return
		case <-r.Context().Done():
			return
		case <-f.quit:
			return
		}
	}
}

func (f *fakeAWS) deleteBatch(w http.ResponseWriter, body []byte) {
	var in struct {
		QueueUrl string
		Entries  []struct{ Id, ReceiptHandle string }
	}
	f.mu.Lock()
	queueURL := f.queueURL
	f.mu.Unlock()
	if err := json.Unmarshal(body, &in); err != nil || in.QueueUrl != queueURL {
		f.writeFault(w, "DeleteMessageBatch", true, fault{status: 400, code: "QueueDoesNotExist", msg: "The specified queue does not exist."})
		return
	}
	type entry struct{ Id string }
	type failed struct {
		Id, Code, Message string
		SenderFault       bool
	}
	ok, bad := []entry{}, []failed{}
	f.mu.Lock()
	for _, e := range in.Entries {
		i := slices.IndexFunc(f.queue, func(m *fakeMsg) bool { return m.handle == e.ReceiptHandle })
		if i < 0 {
			bad = append(bad, failed{e.Id, "ReceiptHandleIsInvalid", "The input receipt handle is invalid.", true})
			continue
		}
		f.deleted = append(f.deleted, f.queue[i].id)
		f.queue = slices.Delete(f.queue, i, i+1)
		ok = append(ok, entry{e.Id})
	}
	f.mu.Unlock()
	f.sqsReply(w, map[string]any{"Successful": ok, "Failed": bad})
}

// pollCtx is a context for one poll: a guard against a hang, not a speed test. The driver
// gives a poll --discovery-timeout (10 s); whether a 10,000-instance group fits in it is
// measured by BenchmarkHosts10k, since a busy CI runner under -race may take longer here.
func pollCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func contextWithTimeout(t testing.TB, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}

// The group's size and the capacity calls, as Auto Scaling's query API (2011-01-01) answers
// them: bodies from testdata/, errors in its ErrorResponse shape, its validation messages.

const fakeGroupARN = "arn:aws:autoscaling:us-east-1:" + fakeAccount +
	":autoScalingGroup:7d9d3f4e-1b2c-4a5d-9e8f-0a1b2c3d4e5f:autoScalingGroupName/"

// sizeLocked is the group's minimum, desired and maximum size; f.mu held.
func (f *fakeAWS) sizeLocked() (min, desired, max int) {
	if f.sized {
		return f.min, f.desired, f.max
	}
	return 0, len(f.insts), len(f.insts) + 10
}

// setSize sets the group's size, as its owner would in the console.
func (f *fakeAWS) setSize(min, desired, max int) {
	f.change(func() { f.sized, f.min, f.desired, f.max = true, min, desired, max })
}

// size is the group's size as the fake holds it.
func (f *fakeAWS) size() (min, desired, max int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sizeLocked()
}

// resizeLocked keeps a new size and drops the rendered pages; f.mu held.
func (f *fakeAWS) resizeLocked(min, desired, max int) {
	f.sized, f.min, f.desired, f.max = true, min, desired, max
	f.touchLocked()
}

func (f *fakeAWS) touchLocked() {
	f.version++
	clear(f.pages)
}

// terminatedIDs lists the instances TerminateInstanceInAutoScalingGroup took, in order.
func (f *fakeAWS) terminatedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.terminated)
}

// deny makes every later call of ops answer AccessDenied, as IAM does without a permission.
func (f *fakeAWS) deny(ops ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, op := range ops {
		f.denied[op] = true
	}
}

// denial is IAM's answer to op without the permission; f.mu held.
func (f *fakeAWS) denial(op string) fault {
	resource := fakeGroupARN + f.group
	if strings.HasPrefix(op, "Describe") {
		resource = "*" // the Describe actions have no resource-level permissions
	}
	return fault{status: 403, code: "AccessDenied", msg: fmt.Sprintf("User: arn:aws:sts::%s:assumed-role/elasticd-driver/i-0123456789abcdef0 "+
		"is not authorized to perform: autoscaling:%s on resource: %s because no identity-based policy allows the autoscaling:%s action",
		fakeAccount, op, resource, op)}
}

// addActivity records a scaling activity of the group (an ID and a start time are made up
// when a has none) and returns its ID.
func (f *fakeAWS) addActivity(a fakeActivity) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addActivityLocked(a).ID
}

func (f *fakeAWS) addActivityLocked(a fakeActivity) *fakeActivity {
	f.nextActivity++
	if a.ID == "" {
		a.ID = fmt.Sprintf("5e2b8f1c-0a1b-4c2d-8e3f-%012d", f.nextActivity)
	}
	if a.Start.IsZero() {
		a.Start = time.Now()
	}
	f.activities = slices.Insert(f.activities, 0, &a)
	return &a
}

// runOut makes the group fail a spot launch in zone for want of capacity, as Auto Scaling
// reports it, and returns the activity's ID.
func (f *fakeAWS) runOut(zone string) string { return f.addActivity(stockout(zone, time.Now())) }

// stockout is the activity of a spot launch that found no capacity (kubernetes/autoscaler#3241).
func stockout(zone string, at time.Time) fakeActivity {
	msg := "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available that matches your request. Launching EC2 instance failed."
	return fakeActivity{
		Description:   "Launching a new EC2 instance.  Status Reason: " + msg,
		Cause:         fmt.Sprintf("At %s an instance was started in response to a difference between desired and actual capacity, increasing the capacity from 3 to 4.", at.UTC().Format(time.RFC3339)),
		StatusCode:    "Failed",
		StatusMessage: msg,
		Details:       `{"Subnet ID":"subnet-0123456789abcdef0","Availability Zone":"` + zone + `"}`,
		Start:         at, End: at.Add(2 * time.Second), Progress: 100,
	}
}

// invalid answers Auto Scaling's ValidationError.
func (f *fakeAWS) invalid(w http.ResponseWriter, op, msg string) {
	f.writeFault(w, op, false, fault{status: 400, code: "ValidationError", msg: msg})
}

// intParam reads an integer parameter. ok is false, and the error answered, when a required
// one is missing or one is not an integer.
func (f *fakeAWS) intParam(w http.ResponseWriter, op string, form url.Values, name string, required bool) (n int, set, ok bool) {
	if !form.Has(name) {
		if required {
			f.invalid(w, op, fmt.Sprintf("1 validation error detected: Value null at '%s%s' failed to satisfy constraint: Member must not be null",
				strings.ToLower(name[:1]), name[1:]))
			return 0, false, false
		}
		return 0, false, true
	}
	n, err := strconv.Atoi(form.Get(name))
	if err != nil {
		f.writeFault(w, op, false, fault{status: 400, code: "MalformedInput", msg: fmt.Sprintf("Value %q for %s is not an integer", form.Get(name), name)})
		return 0, false, false
	}
	return n, true, true
}

// groupMissingLocked is the error message for a request naming another group; f.mu held.
func (f *fakeAWS) groupMissingLocked(name string) string {
	if f.exists && name == f.group {
		return ""
	}
	return "AutoScalingGroup name not found - AutoScalingGroup " + name + " not found"
}

func (f *fakeAWS) setDesiredCapacity(w http.ResponseWriter, form url.Values) {
	const op = "SetDesiredCapacity"
	n, _, ok := f.intParam(w, op, form, "DesiredCapacity", true)
	if !ok {
		return
	}
	f.mu.Lock()
	msg := f.groupMissingLocked(form.Get("AutoScalingGroupName"))
	if msg == "" {
		min, _, max := f.sizeLocked()
		switch {
		case n > max:
			msg = fmt.Sprintf("New SetDesiredCapacity value %d is above max value %d for the AutoScalingGroup.", n, max)
		case n < min:
			msg = fmt.Sprintf("New SetDesiredCapacity value %d is below min value %d for the AutoScalingGroup.", n, min)
		default:
			f.resizeLocked(min, n, max)
		}
	}
	f.mu.Unlock()
	if msg != "" {
		f.invalid(w, op, msg)
		return
	}
	f.writeFile(w, http.StatusOK, "text/xml", "set_desired_capacity.xml")
}

// updateGroup takes MinSize, MaxSize and DesiredCapacity. As Auto Scaling does, a new minimum
// above the desired capacity (or maximum below it) drags the desired capacity along when the
// request does not set it, and the result must keep min <= desired <= max.
func (f *fakeAWS) updateGroup(w http.ResponseWriter, form url.Values) {
	const op = "UpdateAutoScalingGroup"
	newMin, minSet, ok := f.intParam(w, op, form, "MinSize", false)
	if !ok {
		return
	}
	newMax, maxSet, ok := f.intParam(w, op, form, "MaxSize", false)
	if !ok {
		return
	}
	newDesired, desiredSet, ok := f.intParam(w, op, form, "DesiredCapacity", false)
	if !ok {
		return
	}
	f.mu.Lock()
	msg := f.groupMissingLocked(form.Get("AutoScalingGroupName"))
	if msg == "" {
		min, desired, max := f.sizeLocked()
		if minSet {
			min = newMin
		}
		if maxSet {
			max = newMax
		}
		switch {
		case desiredSet:
			desired = newDesired
		case minSet && min > desired:
			desired = min
		case maxSet && max < desired:
			desired = max
		}
		switch {
		case min > max:
			msg = fmt.Sprintf("Max bound, %d, must be greater than or equal to min bound, %d", max, min)
		case desired < min || desired > max:
			msg = fmt.Sprintf("Desired capacity:%d must be between the specified min size:%d and max size:%d", desired, min, max)
		default:
			f.resizeLocked(min, desired, max)
		}
	}
	f.mu.Unlock()
	if msg != "" {
		f.invalid(w, op, msg)
		return
	}
	f.writeFile(w, http.StatusOK, "text/xml", "update_auto_scaling_group.xml")
}

// activityData is an activity as the templates render it.
type activityData struct {
	fakeActivity
	Group, GroupARN string
}

// terminate takes InstanceId and the required ShouldDecrementDesiredCapacity. The instance goes
// Terminating; the desired capacity drops only when asked to, and never below the minimum.
func (f *fakeAWS) terminate(w http.ResponseWriter, form url.Values) {
	const op = "TerminateInstanceInAutoScalingGroup"
	id, decrement := form.Get("InstanceId"), form.Get("ShouldDecrementDesiredCapacity")
	switch {
	case decrement == "":
		f.invalid(w, op, "1 validation error detected: Value null at 'shouldDecrementDesiredCapacity' failed to satisfy constraint: Member must not be null")
		return
	case decrement != "true" && decrement != "false":
		f.writeFault(w, op, false, fault{status: 400, code: "MalformedInput", msg: "Value " + decrement + " for ShouldDecrementDesiredCapacity is not a boolean"})
		return
	}
	f.mu.Lock()
	var msg string
	var data activityData
	i := slices.IndexFunc(f.insts, func(in *fakeInst) bool { return in.ID == id && in.Lifecycle != "Terminated" })
	min, desired, max := f.sizeLocked()
	switch {
	case !f.exists || i < 0:
		msg = "Instance Id not found - No managed instance found for instance ID: " + id
	case decrement == "true" && desired <= min:
		msg = fmt.Sprintf("Currently, desiredSize equals minSize (%d). Terminating instance without replacement will violate group's min size constraint. "+
			"Either set shouldDecrementDesiredCapacity flag to false or lower group's min size.", min)
	default:
		if decrement == "true" {
			f.resizeLocked(min, desired-1, max)
		}
		in := f.insts[i]
		in.Lifecycle = "Terminating"
		f.touchLocked()
		f.terminated = append(f.terminated, id)
		a := f.addActivityLocked(fakeActivity{
			Description: "Terminating EC2 instance: " + id,
			Cause:       fmt.Sprintf("At %s instance %s was taken out of service in response to a user request.", time.Now().UTC().Format(time.RFC3339), id),
			StatusCode:  "InProgress",
			Details:     `{"Subnet ID":"subnet-0123456789abcdef0","Availability Zone":"` + in.Zone + `"}`,
		})
		data = activityData{fakeActivity: *a, Group: f.group, GroupARN: fakeGroupARN + f.group}
	}
	f.mu.Unlock()
	if msg != "" {
		f.invalid(w, op, msg)
		return
	}
	f.writeTemplate(w, http.StatusOK, "terminate_instance_in_auto_scaling_group.xml.tmpl", struct {
		Activity  activityData
		RequestID string
	}{data, "3c2a7b1e-5d4f-4e6a-9b8c-7d6e5f4a3b2c"})
}

// describeActivities answers the group's activities as Auto Scaling sorts them, those in
// progress first, then by start time, newest first; MaxRecords (at most 100) a page, NextToken
// an offset. A request naming another group gets none.
func (f *fakeAWS) describeActivities(w http.ResponseWriter, form url.Values) {
	const op = "DescribeScalingActivities"
	size, set, ok := f.intParam(w, op, form, "MaxRecords", false)
	if !ok {
		return
	}
	switch {
	case !set:
		size = 100
	case size > 100:
		f.invalid(w, op, fmt.Sprintf("1 validation error detected: Value '%d' at 'maxRecords' failed to satisfy constraint: Member must have value less than or equal to 100", size))
		return
	case size < 1:
		f.invalid(w, op, fmt.Sprintf("1 validation error detected: Value '%d' at 'maxRecords' failed to satisfy constraint: Member must have value greater than or equal to 1", size))
		return
	}
	offset := 0
	if tok := form.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "offset-"))
		if err != nil || n < 0 {
			f.writeFault(w, op, false, fault{status: 400, code: "InvalidNextToken", msg: "The token '" + tok + "' is invalid."})
			return
		}
		offset = n
	}
	ids := map[string]bool{}
	for i := 1; form.Has(fmt.Sprintf("ActivityIds.member.%d", i)); i++ {
		ids[form.Get(fmt.Sprintf("ActivityIds.member.%d", i))] = true
	}
	f.mu.Lock()
	var match []activityData
	if name := form.Get("AutoScalingGroupName"); f.exists && (name == "" || name == f.group) {
		for _, a := range f.activities {
			if len(ids) == 0 || ids[a.ID] {
				match = append(match, activityData{fakeActivity: *a, Group: f.group, GroupARN: fakeGroupARN + f.group})
			}
		}
	}
	f.mu.Unlock()
	done := func(a activityData) bool {
		return a.StatusCode == "Successful" || a.StatusCode == "Failed" || a.StatusCode == "Cancelled"
	}
	slices.SortStableFunc(match, func(a, b activityData) int {
		if done(a) != done(b) {
			if done(a) {
				return 1
			}
			return -1
		}
		return b.Start.Compare(a.Start)
	})
	data := struct {
		Activities           []activityData
		NextToken, RequestID string
	}{RequestID: "1f0c9d8e-7b6a-4c5d-8e9f-0a1b2c3d4e5f"}
	if offset < len(match) {
		end := min(offset+size, len(match))
		data.Activities = match[offset:end]
		if end < len(match) {
			data.NextToken = "offset-" + strconv.Itoa(end)
		}
	}
	f.writeTemplate(w, http.StatusOK, "describe_scaling_activities.xml.tmpl", data)
}

// The group's tags, as Auto Scaling's CreateOrUpdateTags and DeleteTags take them: a list
// Tags.member.N of ResourceId (the group's name), ResourceType (auto-scaling-group), Key,
// Value and PropagateAtLaunch; a group holds at most 50 tags.

// maxTags is Auto Scaling's limit of tags per group.
const maxTags = 50

// setTag sets one of the group's tags, as its owner would in the console.
func (f *fakeAWS) setTag(key, value string) {
	f.change(func() { f.putTagLocked(fakeTag{Key: key, Value: value}) })
}

// tag is the group's tag key, if it has one.
func (f *fakeAWS) tag(key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return "", false
}

// tagList is the group's tags, key=value, in order.
func (f *fakeAWS) tagList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, t := range f.tags {
		out = append(out, t.Key+"="+t.Value)
	}
	return out
}

func (f *fakeAWS) putTagLocked(t fakeTag) {
	if i := slices.IndexFunc(f.tags, func(x fakeTag) bool { return x.Key == t.Key }); i >= 0 {
		f.tags[i] = t
		return
	}
	f.tags = append(f.tags, t)
}

// tagParams reads Tags.member.N; the error message is a ValidationError's, "" when none.
func tagParams(form url.Values, needValue bool) ([]fakeTag, []string, string) {
	var tags []fakeTag
	var groups []string
	for i := 1; ; i++ {
		p := fmt.Sprintf("Tags.member.%d.", i)
		if !form.Has(p+"Key") && !form.Has(p+"ResourceId") {
			break
		}
		key, id, typ := form.Get(p+"Key"), form.Get(p+"ResourceId"), form.Get(p+"ResourceType")
		switch {
		case key == "":
			return nil, nil, fmt.Sprintf("1 validation error detected: Value null at 'tags.%d.member.key' failed to satisfy constraint: Member must not be null", i)
		case len(key) > 128 || strings.HasPrefix(key, "aws:"):
			return nil, nil, fmt.Sprintf("Tag key %q is not valid", key)
		case typ != "auto-scaling-group":
			return nil, nil, fmt.Sprintf("Invalid resource type %q; the only valid value is auto-scaling-group", typ)
		case len(form.Get(p+"Value")) > 256:
			return nil, nil, fmt.Sprintf("1 validation error detected: Value at 'tags.%d.member.value' failed to satisfy constraint: Member must have length less than or equal to 256", i)
		}
		propagate := form.Get(p + "PropagateAtLaunch")
		if needValue && propagate != "" && propagate != "true" && propagate != "false" {
			return nil, nil, "Value " + propagate + " for PropagateAtLaunch is not a boolean"
		}
		tags = append(tags, fakeTag{Key: key, Value: form.Get(p + "Value"), Propagate: propagate == "true"})
		groups = append(groups, id)
	}
	if len(tags) == 0 {
		return nil, nil, "1 validation error detected: Value null at 'tags' failed to satisfy constraint: Member must not be null"
	}
	return tags, groups, ""
}

func (f *fakeAWS) createOrUpdateTags(w http.ResponseWriter, form url.Values) {
	const op = "CreateOrUpdateTags"
	tags, groups, msg := tagParams(form, true)
	f.mu.Lock()
	for _, g := range groups {
		if msg == "" {
			msg = f.groupMissingLocked(g)
		}
	}
	limit := false
	if msg == "" {
		n := len(f.tags)
		for _, t := range tags {
			if !slices.ContainsFunc(f.tags, func(x fakeTag) bool { return x.Key == t.Key }) {
				n++
			}
		}
		limit = n > maxTags
	}
	after := func() {}
	if msg == "" && !limit {
		for _, t := range tags {
			f.putTagLocked(t)
		}
		f.touchLocked()
		if f.afterTagWrite != nil {
			after = f.afterTagWrite
		}
	}
	f.mu.Unlock()
	after()
	switch {
	case msg != "":
		f.invalid(w, op, msg)
	case limit:
		f.writeFault(w, op, false, fault{status: 400, code: "LimitExceeded", msg: fmt.Sprintf("The quota of %d tags per Auto Scaling group has been reached.", maxTags)})
	default:
		f.writeFile(w, http.StatusOK, "text/xml", "create_or_update_tags.xml")
	}
}

// deleteTags removes the tags named by key (a Value given must match, as Auto Scaling's does);
// a tag the group does not have is not an error.
func (f *fakeAWS) deleteTags(w http.ResponseWriter, form url.Values) {
	tags, groups, msg := tagParams(form, false)
	f.mu.Lock()
	for _, g := range groups {
		if msg == "" {
			msg = f.groupMissingLocked(g)
		}
	}
	if msg == "" {
		for i, t := range tags {
			valued := form.Has(fmt.Sprintf("Tags.member.%d.Value", i+1))
			f.tags = slices.DeleteFunc(f.tags, func(x fakeTag) bool { return x.Key == t.Key && (!valued || x.Value == t.Value) })
		}
		f.touchLocked()
	}
	f.mu.Unlock()
	if msg != "" {
		f.invalid(w, "DeleteTags", msg)
		return
	}
	f.writeFile(w, http.StatusOK, "text/xml", "delete_tags.xml")
}

// Who calls and what they may do, for Check: STS's GetCallerIdentity, IAM's GetRole and
// SimulatePrincipalPolicy (query protocol, as the IAM and STS API references give them), SQS's
// GetQueueAttributes (JSON 1.0) and EventBridge's ListRuleNamesByTarget and DescribeRule
// (JSON 1.1). The grants decide both the simulation and the calls themselves.

// fakeServices is the service of each operation the fake answers.
var fakeServices = map[string]string{
	"DescribeAutoScalingGroups": "autoscaling", "CompleteLifecycleAction": "autoscaling", "SetDesiredCapacity": "autoscaling",
	"UpdateAutoScalingGroup": "autoscaling", "TerminateInstanceInAutoScalingGroup": "autoscaling",
	"DescribeScalingActivities": "autoscaling", "CreateOrUpdateTags": "autoscaling", "DeleteTags": "autoscaling",
	"DescribeInstances": "ec2", "DescribeSpotPriceHistory": "ec2",
	"ReceiveMessage": "sqs", "DeleteMessageBatch": "sqs", "GetQueueAttributes": "sqs",
	"GetCallerIdentity": "sts", "GetRole": "iam", "SimulatePrincipalPolicy": "iam",
	"ListRuleNamesByTarget": "events", "DescribeRule": "events",
}

// queryNamespaces are the XML namespaces of the query services' answers.
var queryNamespaces = map[string]string{
	"iam": "https://iam.amazonaws.com/doc/2010-05-08/",
	"sts": "https://sts.amazonaws.com/doc/2011-06-15/",
}

// fakeAction is the IAM action that authorizes op; empty for GetCallerIdentity, which needs none.
func fakeAction(op string) string {
	switch op {
	case "GetCallerIdentity", "":
		return ""
	case "DeleteMessageBatch":
		return "sqs:DeleteMessage" // IAM has no action of its own for the batch
	}
	if svc := fakeServices[op]; svc != "" {
		return svc + ":" + op
	}
	return ""
}

var accessKeyIn = regexp.MustCompile(`Credential=([^/]+)/`)

// accessKey is the access key ID a request was signed with.
func accessKey(r *http.Request) string {
	if m := accessKeyIn.FindStringSubmatch(r.Header.Get("Authorization")); m != nil {
		return m[1]
	}
	return ""
}

// rejection is each service's answer to credentials it does not know.
func rejection(op string) fault {
	const msg = "The security token included in the request is invalid."
	switch fakeServices[op] {
	case "ec2":
		return fault{status: 401, code: "AuthFailure", msg: "AWS was not able to validate the provided access credentials"}
	case "events":
		return fault{status: 400, code: "UnrecognizedClientException", msg: msg}
	}
	return fault{status: 403, code: "InvalidClientTokenId", msg: msg}
}

// refusalLocked is each service's answer to a call its grants refuse; f.mu held.
func (f *fakeAWS) refusalLocked(op, action string) fault {
	why := "because no identity-based policy allows the " + action + " action"
	if f.grants[action].Decision == "explicitDeny" {
		why = "with an explicit deny in an identity-based policy"
	}
	switch fakeServices[op] {
	case "autoscaling":
		return f.denial(op)
	case "ec2":
		return fault{status: 403, code: "UnauthorizedOperation", msg: "You are not authorized to perform this operation. User: " +
			f.caller + " is not authorized to perform: " + action + " " + why}
	case "events":
		return fault{status: 400, code: "AccessDeniedException", msg: "User: " + f.caller + " is not authorized to perform: " +
			action + " on resource: arn:aws:events:us-east-1:" + fakeAccount + ":rule/* " + why}
	case "sqs":
		return fault{status: 403, code: "AccessDenied", msg: "User: " + f.caller + " is not authorized to perform: " + action +
			" on resource: " + fakeQueueARN + " " + why}
	}
	return fault{status: 403, code: "AccessDenied", msg: "User: " + f.caller + " is not authorized to perform: " + action +
		" on resource: " + fakeRoleARN + " " + why}
}

// grant sets what IAM decides about action.
func (f *fakeAWS) grant(action string, g fakeGrant) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grants[action] = g
}

// set runs fn on the fake's state under the lock (for the fields that are not the group's).
func (f *fakeAWS) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// jsonFields records a JSON request's top-level strings, numbers and lists of strings as
// form values, so that tests read every call's input alike.
func jsonFields(body []byte) url.Values {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	v := url.Values{}
	for k, x := range m {
		switch x := x.(type) {
		case string:
			v.Set(k, x)
		case float64:
			v.Set(k, strconv.FormatFloat(x, 'f', -1, 64))
		case []any:
			for _, e := range x {
				if s, ok := e.(string); ok {
					v.Add(k, s)
				}
			}
		}
	}
	return v
}

func (f *fakeAWS) getCallerIdentity(w http.ResponseWriter) {
	f.mu.Lock()
	caller := f.caller
	f.mu.Unlock()
	f.writeTemplate(w, http.StatusOK, "get_caller_identity.xml.tmpl", map[string]string{
		"Arn": caller, "Account": fakeAccount, "UserID": "AROAELASTICDEXAMPLE01:i-0123456789abcdef0",
	})
}

func (f *fakeAWS) getRole(w http.ResponseWriter, form url.Values) {
	name := form.Get("RoleName")
	f.mu.Lock()
	path, ok := f.roles[name]
	f.mu.Unlock()
	if !ok {
		f.writeFault(w, "GetRole", false, fault{status: 404, code: "NoSuchEntity", msg: "The role with name " + name + " cannot be found."})
		return
	}
	f.writeTemplate(w, http.StatusOK, "get_role.xml.tmpl", map[string]string{
		"Name": name, "Path": path, "Arn": "arn:aws:iam::" + fakeAccount + ":role" + path + name,
	})
}

type simResult struct {
	Action, Resource, Decision                string
	Statements, Missing                       []string
	AllowedByOrganizations, AllowedByBoundary bool
}

// simulatePrincipalPolicy decides each action of ActionNames.member.N on each resource of
// ResourceArns.member.N ("*" when none) by the grants, for a principal the account has: a role
// (by name, whatever the path in the ARN) or a user. An STS ARN is not a principal IAM knows.
// MaxItems (or simPage) results a page; Marker is an offset.
func (f *fakeAWS) simulatePrincipalPolicy(w http.ResponseWriter, form url.Values) {
	const op = "SimulatePrincipalPolicy"
	src := form.Get("PolicySourceArn")
	list := func(prefix string) []string {
		var out []string
		for i := 1; form.Has(fmt.Sprintf("%s.member.%d", prefix, i)); i++ {
			out = append(out, form.Get(fmt.Sprintf("%s.member.%d", prefix, i)))
		}
		return out
	}
	actions, resources := list("ActionNames"), list("ResourceArns")
	if len(resources) == 0 {
		resources = []string{"*"}
	}
	invalid := func(msg string) { f.writeFault(w, op, false, fault{status: 400, code: "InvalidInput", msg: msg}) }
	kind, name, ok := strings.Cut(strings.TrimPrefix(src, "arn:aws:iam::"+fakeAccount+":"), "/")
	name = name[strings.LastIndex(name, "/")+1:]
	switch {
	case !strings.HasPrefix(src, "arn:aws:iam::"+fakeAccount+":") || !ok || (kind != "role" && kind != "user"):
		invalid("Invalid ARN: Could not be parsed!")
		return
	case len(actions) == 0:
		invalid("1 validation error detected: Value null at 'actionNames' failed to satisfy constraint: Member must not be null")
		return
	}
	f.mu.Lock()
	_, known := f.roles[name]
	if kind == "user" {
		known = slices.Contains(f.users, name)
	}
	var results []simResult
	for _, a := range actions {
		for _, res := range resources {
			g := f.grants[a]
			r := simResult{Action: a, Resource: res, Decision: cmp.Or(g.Decision, "allowed"), Missing: g.Missing,
				AllowedByOrganizations: g.By != "organization", AllowedByBoundary: g.By != "boundary"}
			if r.Decision == "explicitDeny" {
				r.Statements = []string{cmp.Or(g.Policy, "deny-policy")}
			}
			results = append(results, r)
		}
	}
	page := f.simPage
	f.mu.Unlock()
	if !known {
		f.writeFault(w, op, false, fault{status: 404, code: "NoSuchEntity", msg: fmt.Sprintf("The %s with name %s cannot be found.", kind, name)})
		return
	}
	size, set, ok := f.intParam(w, op, form, "MaxItems", false)
	if !ok {
		return
	}
	if !set {
		size = 100
	}
	size = cmp.Or(page, size)
	offset := 0
	if m := form.Get("Marker"); m != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(m, "m-"))
		if err != nil || n < 0 || n > len(results) {
			invalid("Invalid Marker: " + m)
			return
		}
		offset = n
	}
	data := struct {
		Truncated bool
		Marker    string
		Results   []simResult
	}{}
	end := min(offset+size, len(results))
	data.Results = results[offset:end]
	if end < len(results) {
		data.Truncated, data.Marker = true, "m-"+strconv.Itoa(end)
	}
	f.writeTemplate(w, http.StatusOK, "simulate_principal_policy.xml.tmpl", data)
}

// getQueueAttributes answers the attributes asked for ("All": every one) of the queue.
func (f *fakeAWS) getQueueAttributes(w http.ResponseWriter, body []byte) {
	var in struct {
		QueueUrl       string
		AttributeNames []string
	}
	f.mu.Lock()
	queueURL := f.queueURL
	attrs := map[string]string{"QueueArn": fakeQueueARN, "VisibilityTimeout": "30", "MessageRetentionPeriod": "345600"}
	if f.queuePolicy != "" {
		attrs["Policy"] = f.queuePolicy
	}
	if f.queueKMS != "" {
		attrs["KmsMasterKeyId"] = f.queueKMS
	}
	f.mu.Unlock()
	if err := json.Unmarshal(body, &in); err != nil || in.QueueUrl != queueURL {
		f.writeFault(w, "GetQueueAttributes", true, fault{status: 400, code: "QueueDoesNotExist", msg: "The specified queue does not exist."})
		return
	}
	out := map[string]string{}
	for k, v := range attrs {
		if slices.Contains(in.AttributeNames, k) || slices.Contains(in.AttributeNames, "All") {
			out[k] = v
		}
	}
	f.sqsReply(w, map[string]any{"Attributes": out})
}

// eventsReply answers an EventBridge call.
func (f *fakeAWS) eventsReply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("x-amzn-RequestId", "e8f1c2d3-0000-4000-8000-000000000002")
	json.NewEncoder(w).Encode(v)
}

// defaultBus: EventBusName names the default bus (or is left out).
func defaultBus(name string) bool {
	return name == "" || name == "default" || name == "arn:aws:events:us-east-1:"+fakeAccount+":event-bus/default"
}

// listRuleNamesByTarget pages the names of the default bus's rules that target TargetArn;
// NextToken is an offset.
func (f *fakeAWS) listRuleNamesByTarget(w http.ResponseWriter, body []byte) {
	const op = "ListRuleNamesByTarget"
	var in struct {
		TargetArn, EventBusName, NextToken string
		Limit                              int
	}
	if err := json.Unmarshal(body, &in); err != nil || in.TargetArn == "" {
		f.writeFault(w, op, true, fault{status: 400, code: "ValidationException", msg: "1 validation error detected: Value null at 'targetArn' failed to satisfy constraint: Member must not be null"})
		return
	}
	if !defaultBus(in.EventBusName) {
		f.writeFault(w, op, true, fault{status: 400, code: "ResourceNotFoundException", msg: "Event bus " + in.EventBusName + " does not exist."})
		return
	}
	f.mu.Lock()
	var names []string
	for _, r := range f.rules {
		if slices.Contains(r.Targets, in.TargetArn) {
			names = append(names, r.Name)
		}
	}
	size := cmp.Or(f.rulePage, in.Limit, 100)
	f.mu.Unlock()
	offset := 0
	if in.NextToken != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(in.NextToken, "rules-"))
		if err != nil || n < 0 || n > len(names) {
			f.writeFault(w, op, true, fault{status: 400, code: "ValidationException", msg: "The provided token is invalid"})
			return
		}
		offset = n
	}
	end := min(offset+size, len(names))
	out := map[string]any{"RuleNames": append([]string{}, names[offset:end]...)}
	if end < len(names) {
		out["NextToken"] = "rules-" + strconv.Itoa(end)
	}
	f.eventsReply(w, out)
}

func (f *fakeAWS) describeRule(w http.ResponseWriter, body []byte) {
	const op = "DescribeRule"
	var in struct{ Name, EventBusName string }
	if err := json.Unmarshal(body, &in); err != nil || in.Name == "" {
		f.writeFault(w, op, true, fault{status: 400, code: "ValidationException", msg: "1 validation error detected: Value null at 'name' failed to satisfy constraint: Member must not be null"})
		return
	}
	f.mu.Lock()
	i := slices.IndexFunc(f.rules, func(r fakeRule) bool { return r.Name == in.Name })
	var r fakeRule
	if i >= 0 {
		r = f.rules[i]
	}
	f.mu.Unlock()
	if i < 0 || !defaultBus(in.EventBusName) {
		f.writeFault(w, op, true, fault{status: 400, code: "ResourceNotFoundException", msg: "Rule " + in.Name + " does not exist on EventBus default."})
		return
	}
	out := map[string]any{
		"Name": r.Name, "Arn": "arn:aws:events:us-east-1:" + fakeAccount + ":rule/" + r.Name, "State": r.State,
		"EventBusName": "default", "CreatedBy": fakeAccount, "Description": "elasticd notices",
	}
	if r.Pattern != "" {
		out["EventPattern"] = r.Pattern
	}
	f.eventsReply(w, out)
}
