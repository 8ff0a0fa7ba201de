package aws_test

import (
	"cmp"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
)

// drain polls Notices until the queue is empty (bounded), and returns the notices
// de-duplicated by ID across polls, as the driver's watcher does.
func drain(t *testing.T, p *aws.Provider, f *fakeAWS) []providers.Notice {
	t.Helper()
	var all []providers.Notice
	for i := 0; f.queued() > 0; i++ {
		if i == 10 {
			t.Fatalf("%d messages still queued after 10 polls", f.queued())
		}
		ns, err := p.Notices(pollCtx(t))
		if err != nil {
			t.Fatalf("Notices: %v", err)
		}
		for _, n := range ns {
			if !slices.ContainsFunc(all, func(m providers.Notice) bool { return m.ID == n.ID }) {
				all = append(all, n)
			}
		}
	}
	slices.SortFunc(all, func(a, b providers.Notice) int { return cmp.Compare(a.ID, b.ID) })
	return all
}

// TestNotices: every kind of message the queue may carry, from EventBridge, a lifecycle hook
// directly and through SNS, becomes the right notice or is dropped; all are deleted.
func TestNotices(t *testing.T) {
	a, b, c, d := inst(1), inst(2), inst(3), inst(4)
	f := newFake(t, a, b, c, d)
	p := newProvider(t, f, aws.Config{SQSQueueURL: f.queueURL})
	mustHosts(t, p) // the group's members: notices about other instances are dropped

	warned := time.Date(2026, 11, 3, 4, 5, 6, 0, time.UTC)
	stamp := warned.Format(time.RFC3339)
	f.send("spot_interruption.json", eventData{ID: "ev-spot", Instance: a.ID, Time: stamp})
	f.send("spot_interruption.json", eventData{ID: "ev-spot", Instance: a.ID, Time: stamp}) // delivered twice
	f.send("spot_interruption.json", eventData{ID: "ev-stranger", Instance: "i-0ffffffffffffffff", Time: stamp})
	f.send("rebalance.json", eventData{ID: "ev-rebalance", Instance: b.ID, Time: stamp})
	f.send("state_change.json", eventData{ID: "ev-stopping", Instance: c.ID, State: "stopping", Time: stamp})
	f.send("state_change.json", eventData{ID: "ev-running", Instance: c.ID, State: "running", Time: stamp})
	f.send("lifecycle_terminate.json", eventData{ID: "ev-scalein", Instance: d.ID, Token: "tok-d", Time: stamp})
	f.send("lifecycle_terminate.json", eventData{ID: "ev-other-group", Instance: d.ID, Token: "tok-x", ASG: "someone-elses", Time: stamp})
	f.send("lifecycle_launch.json", eventData{ID: "ev-launch", Instance: "i-0eeeeeeeeeeeeeeee", Token: "tok-l", Time: stamp})
	// The same action through the hook's own notification, bare and inside SNS: one notice.
	f.send("lifecycle_direct.json", eventData{Instance: d.ID, Token: "tok-d", Time: stamp})
	f.send("sns.json", eventData{ID: "sns-1", Instance: d.ID, Time: stamp,
		Inner: render(t, "lifecycle_direct.json", eventData{Instance: d.ID, Token: "tok-d", Time: stamp})})
	f.send("test_notification.json", eventData{Time: stamp})
	f.send("sns.json", eventData{ID: "sns-2", Time: stamp, Inner: render(t, "test_notification.json", eventData{Time: stamp})})
	f.send("health_scheduled_change.json", eventData{ID: "ev-health", Instance: b.ID, Time: stamp, Start: "Sat, 05 Jun 2027 01:00:00 GMT"})
	f.send("health_issue.json", eventData{ID: "ev-issue", Time: stamp})
	f.send("garbage.txt", eventData{})
	f.send("no_instance.json", eventData{ID: "ev-broken", Time: stamp})
	f.sendRaw(`{"Type":"Notification","Message":"{\"Type\":\"Notification\",\"Message\":\"{}\"}"}`) // SNS in SNS

	got := drain(t, p, f)
	token, _ := json.Marshal(map[string]string{"asg": fakeGroup, "hook": "elasticd-drain", "token": "tok-d", "instance": d.ID})
	want := []providers.Notice{
		{ID: "ev-health/" + b.ID, HostID: b.ID, Kind: providers.Maintenance, Deadline: time.Date(2027, 6, 5, 1, 0, 0, 0, time.UTC)},
		{ID: "ev-rebalance", HostID: b.ID, Kind: providers.Rebalance},
		{ID: "ev-spot", HostID: a.ID, Kind: providers.Interruption, Deadline: warned.Add(2 * time.Minute)},
		{ID: "ev-stopping", HostID: c.ID, Kind: providers.Interruption, Deadline: warned},
		{ID: "lifecycle/tok-d", HostID: d.ID, Kind: providers.ScaleIn, Token: string(token)},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d notices, want %d:\n got  %+v\n want %+v", len(got), len(want), got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.ID != w.ID || g.HostID != w.HostID || g.Kind != w.Kind || !g.Deadline.Equal(w.Deadline) || g.Detail == "" {
			t.Errorf("notice %d:\n got  %+v\n want %+v (and a Detail)", i, g, w)
		}
		if w.Token != "" && !jsonEqual(g.Token, w.Token) {
			t.Errorf("notice %s token %s; want %s", g.ID, g.Token, w.Token)
		}
		t.Logf("%s %s %s deadline %v: %s", g.ID, g.HostID, g.Kind, g.Deadline, g.Detail)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.deleted) != 18 || len(f.queue) != 0 {
		t.Errorf("deleted %d of 18 messages; %d left in the queue", len(f.deleted), len(f.queue))
	}
	for _, r := range f.received {
		if r.Max != 10 || r.Wait > 1 || r.Visibility != 30 {
			t.Errorf("ReceiveMessage %+v; want 10 messages, a wait of at most 1 s, visibility 30 s", r)
		}
	}
}

func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return string(ja) == string(jb)
}

// TestNoticesBeforeHosts: before the group is known, notices about any instance are given.
func TestNoticesBeforeHosts(t *testing.T) {
	f := newFake(t, inst(1))
	p := newProvider(t, f, aws.Config{SQSQueueURL: f.queueURL})
	f.send("spot_interruption.json", eventData{ID: "ev-1", Instance: "i-0123456789abcdef0"})
	got := drain(t, p, f)
	if len(got) != 1 || got[0].HostID != "i-0123456789abcdef0" {
		t.Errorf("got %+v; want the one notice", got)
	}
}

// TestNoticesWait: the receive waits at most a second, and not at all when the poll's
// deadline is near; an empty queue is no notices and no error.
func TestNoticesWait(t *testing.T) {
	t.Parallel()
	f := newFake(t, inst(1))
	p := newProvider(t, f, aws.Config{SQSQueueURL: f.queueURL})
	start := time.Now()
	ns, err := p.Notices(pollCtx(t))
	if err != nil || len(ns) != 0 {
		t.Fatalf("empty queue: %v, %v", ns, err)
	}
	if took := time.Since(start); took < 900*time.Millisecond || took > 3*time.Second {
		t.Errorf("an empty queue's long poll took %v; want about 1 s", took)
	}
	ctx, cancel := contextWithTimeout(t, 1500*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := p.Notices(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("with 1.5 s left the receive took %v; want no wait", took)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.received) != 2 || f.received[0].Wait != 1 || f.received[1].Wait != 0 {
		t.Errorf("receives %+v; want waits of 1 s then 0", f.received)
	}
}

// TestNoticeErrors: a missing queue names the queue and what to check; a failed delete loses
// no notice (the message comes back after the visibility timeout).
func TestNoticeErrors(t *testing.T) {
	f := newFake(t, inst(1))
	p := newProvider(t, f, aws.Config{SQSQueueURL: f.srv.URL + "/" + fakeAccount + "/no-such-queue"})
	_, err := p.Notices(pollCtx(t))
	if err == nil || !containsAll(err.Error(), "no-such-queue", "QueueDoesNotExist", "--sqs-queue-url", fakeGroup) {
		t.Errorf("missing queue: %v", err)
	}
	t.Logf("the error reads: %v", err)

	p = newProvider(t, f, aws.Config{SQSQueueURL: f.queueURL})
	f.send("spot_interruption.json", eventData{ID: "ev-1", Instance: inst(1).ID})
	f.fail("DeleteMessageBatch", fault{status: 500, code: "InternalError", msg: "We encountered an internal error."})
	ns, err := p.Notices(pollCtx(t))
	if err != nil || len(ns) != 1 {
		t.Fatalf("with a failing delete: %v, %v; want the notice all the same", ns, err)
	}
	if f.queued() != 1 {
		t.Errorf("%d messages queued; want the undeleted one", f.queued())
	}
}

// TestCompleteNotice: a scale-in notice completes its lifecycle action with CONTINUE; other
// notices need nothing; an action no longer pending counts as done.
func TestCompleteNotice(t *testing.T) {
	d := inst(4)
	f := newFake(t, d)
	p := newProvider(t, f, aws.Config{SQSQueueURL: f.queueURL})
	f.send("lifecycle_terminate.json", eventData{ID: "ev-scalein", Instance: d.ID, Token: "3c3b8d8e-tok", Hook: "drain-hook"})
	f.send("spot_interruption.json", eventData{ID: "ev-spot", Instance: d.ID})
	ns := drain(t, p, f)
	if len(ns) != 2 {
		t.Fatalf("notices %+v; want 2", ns)
	}
	for _, n := range ns {
		if err := p.CompleteNotice(pollCtx(t), n); err != nil {
			t.Errorf("CompleteNotice(%s): %v", n.ID, err)
		}
	}
	f.mu.Lock()
	calls := slices.Clone(f.completed)
	f.mu.Unlock()
	if len(calls) != 1 {
		t.Fatalf("CompleteLifecycleAction called %d times; want once, for the scale-in", len(calls))
	}
	for k, v := range map[string]string{
		"AutoScalingGroupName": fakeGroup, "LifecycleHookName": "drain-hook", "LifecycleActionToken": "3c3b8d8e-tok",
		"InstanceId": d.ID, "LifecycleActionResult": "CONTINUE",
	} {
		if got := calls[0].Get(k); got != v {
			t.Errorf("CompleteLifecycleAction %s=%q; want %q", k, got, v)
		}
	}

	scaleIn := ns[slices.IndexFunc(ns, func(n providers.Notice) bool { return n.Kind == providers.ScaleIn })]
	f.fail("CompleteLifecycleAction", fault{status: 400, code: "ValidationError",
		msg: "No active Lifecycle Action found with token 3c3b8d8e-tok"})
	if err := p.CompleteNotice(pollCtx(t), scaleIn); err != nil {
		t.Errorf("completing an action no longer pending: %v; want nil", err)
	}
	f.fail("CompleteLifecycleAction", fault{status: 403, code: "AccessDenied", msg: "not authorized to perform: autoscaling:CompleteLifecycleAction"})
	err := p.CompleteNotice(pollCtx(t), scaleIn)
	if err == nil || !containsAll(err.Error(), d.ID, "drain-hook", "autoscaling:CompleteLifecycleAction") {
		t.Errorf("denied: %v", err)
	}
	bad := scaleIn
	bad.Token = "not json"
	if err := p.CompleteNotice(pollCtx(t), bad); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("a token not of this provider: %v", err)
	}
}
