package aws

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// spotWarning is how long EC2 gives a spot instance after its interruption warning.
const spotWarning = 2 * time.Minute

// parsed is what one queue message says.
type parsed struct {
	notices []providers.Notice
	// asg is the group named by a lifecycle action; "" for EC2 and Health events, which name
	// instances only.
	asg string
	// ignore says why a well-formed message carries nothing to act on.
	ignore string
}

// lifecycleToken is Notice.Token of a terminate lifecycle action: what CompleteNotice needs.
type lifecycleToken struct {
	ASG      string `json:"asg"`
	Hook     string `json:"hook"`
	Token    string `json:"token"`
	Instance string `json:"instance"`
}

// lifecycleAction is the detail of an EventBridge lifecycle action event, and the body of a
// lifecycle hook's own notification: they share these field names.
type lifecycleAction struct {
	LifecycleActionToken string `json:"LifecycleActionToken"`
	AutoScalingGroupName string `json:"AutoScalingGroupName"`
	LifecycleHookName    string `json:"LifecycleHookName"`
	EC2InstanceID        string `json:"EC2InstanceId"`
	LifecycleTransition  string `json:"LifecycleTransition"`
}

// event is an EventBridge event.
type event struct {
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Time       string          `json:"time"`
	Detail     json.RawMessage `json:"detail"`
}

// parseMessage reads one SQS message body: an EventBridge event, a lifecycle hook's
// notification, or either inside an SNS notification. msgID stands in for a missing event ID;
// now for a missing event time.
func parseMessage(body, msgID string, now time.Time) (parsed, error) {
	return parseBody([]byte(body), msgID, now, true)
}

func parseBody(body []byte, msgID string, now time.Time, unwrap bool) (parsed, error) {
	var probe struct {
		Type       string  `json:"Type"`
		Message    *string `json:"Message"`
		DetailType *string `json:"detail-type"`
		Event      string  `json:"Event"`
		Transition string  `json:"LifecycleTransition"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return parsed{}, fmt.Errorf("not JSON: %w", err)
	}
	switch {
	case probe.Type == "Notification" && probe.Message != nil && unwrap:
		return parseBody([]byte(*probe.Message), msgID, now, false) // SNS, once
	case probe.DetailType != nil:
		var e event
		if err := json.Unmarshal(body, &e); err != nil {
			return parsed{}, fmt.Errorf("EventBridge event: %w", err)
		}
		return parseEvent(e, msgID, now)
	case probe.Event == "autoscaling:TEST_NOTIFICATION":
		return parsed{ignore: "Auto Scaling test notification"}, nil
	case probe.Transition != "":
		var a lifecycleAction
		if err := json.Unmarshal(body, &a); err != nil {
			return parsed{}, fmt.Errorf("lifecycle notification: %w", err)
		}
		return parseLifecycle(a, msgID)
	}
	return parsed{}, errors.New("neither an EventBridge event, an Auto Scaling lifecycle notification, nor an SNS notification of one")
}

func parseEvent(e event, msgID string, now time.Time) (parsed, error) {
	id := cmp.Or(e.ID, msgID)
	at := parseTime(e.Time, now)
	switch e.Source + "/" + e.DetailType {
	case "aws.ec2/EC2 Spot Instance Interruption Warning":
		inst, err := instanceDetail(e.Detail)
		if err != nil {
			return parsed{}, err
		}
		return one(providers.Notice{ID: id, HostID: inst.ID, Kind: providers.Interruption, Deadline: at.Add(spotWarning),
			Detail: fmt.Sprintf("EC2 spot interruption warning (%s in 2 min)", cmp.Or(inst.Action, "terminate"))}), nil
	case "aws.ec2/EC2 Instance Rebalance Recommendation":
		inst, err := instanceDetail(e.Detail)
		if err != nil {
			return parsed{}, err
		}
		return one(providers.Notice{ID: id, HostID: inst.ID, Kind: providers.Rebalance,
			Detail: "EC2 rebalance recommendation (elevated risk of spot interruption)"}), nil
	case "aws.ec2/EC2 Instance State-change Notification":
		inst, err := instanceDetail(e.Detail)
		if err != nil {
			return parsed{}, err
		}
		switch inst.State {
		case "stopping", "stopped", "shutting-down", "terminated":
			return one(providers.Notice{ID: id, HostID: inst.ID, Kind: providers.Interruption, Deadline: at,
				Detail: "EC2 instance state " + inst.State}), nil
		}
		return parsed{ignore: fmt.Sprintf("EC2 state change to %q", inst.State)}, nil
	case "aws.autoscaling/EC2 Instance-terminate Lifecycle Action":
		var a lifecycleAction
		if err := json.Unmarshal(e.Detail, &a); err != nil {
			return parsed{}, fmt.Errorf("lifecycle action detail: %w", err)
		}
		return parseLifecycle(a, msgID)
	case "aws.health/AWS Health Event":
		return parseHealth(e.Detail, id)
	}
	return parsed{ignore: fmt.Sprintf("%s event %q", cmp.Or(e.Source, "unknown"), e.DetailType)}, nil
}

// parseLifecycle reads a terminate lifecycle action. Its notice ID is the action's token, the
// same whether it came through EventBridge or the hook's own notification, so that one action
// delivered both ways is one notice.
func parseLifecycle(a lifecycleAction, msgID string) (parsed, error) {
	if a.LifecycleTransition != "autoscaling:EC2_INSTANCE_TERMINATING" {
		return parsed{ignore: fmt.Sprintf("lifecycle transition %q", a.LifecycleTransition)}, nil
	}
	if a.EC2InstanceID == "" || a.AutoScalingGroupName == "" {
		return parsed{}, errors.New("terminate lifecycle action without EC2InstanceId or AutoScalingGroupName")
	}
	id := msgID
	var token string
	if a.LifecycleActionToken != "" {
		id = "lifecycle/" + a.LifecycleActionToken
		b, _ := json.Marshal(lifecycleToken{ASG: a.AutoScalingGroupName, Hook: a.LifecycleHookName,
			Token: a.LifecycleActionToken, Instance: a.EC2InstanceID})
		token = string(b)
	}
	return parsed{asg: a.AutoScalingGroupName, notices: []providers.Notice{{
		ID: id, HostID: a.EC2InstanceID, Kind: providers.ScaleIn, Token: token,
		Detail: fmt.Sprintf("Auto Scaling terminate lifecycle action (hook %s)", cmp.Or(a.LifecycleHookName, "?")),
	}}}, nil
}

// parseHealth reads an AWS Health event: an EC2 scheduled change (a retirement, a reboot, a
// maintenance) names the instances it affects, each a Maintenance notice due at startTime.
func parseHealth(detail json.RawMessage, id string) (parsed, error) {
	var d struct {
		Service           string `json:"service"`
		EventTypeCode     string `json:"eventTypeCode"`
		EventTypeCategory string `json:"eventTypeCategory"`
		StartTime         string `json:"startTime"`
		AffectedEntities  []struct {
			EntityValue string `json:"entityValue"`
		} `json:"affectedEntities"`
	}
	if err := json.Unmarshal(detail, &d); err != nil {
		return parsed{}, fmt.Errorf("health event detail: %w", err)
	}
	if d.Service != "EC2" || d.EventTypeCategory != "scheduledChange" {
		return parsed{ignore: fmt.Sprintf("health event %s/%s", d.Service, d.EventTypeCategory)}, nil
	}
	var start time.Time
	if d.StartTime != "" {
		start = parseTime(d.StartTime, time.Time{})
	}
	var r parsed
	for _, e := range d.AffectedEntities {
		if !strings.HasPrefix(e.EntityValue, "i-") {
			continue
		}
		r.notices = append(r.notices, providers.Notice{ID: id + "/" + e.EntityValue, HostID: e.EntityValue,
			Kind: providers.Maintenance, Deadline: start, Detail: "AWS Health scheduled change " + d.EventTypeCode})
	}
	if len(r.notices) == 0 {
		return parsed{ignore: "health event names no instance"}, nil
	}
	return r, nil
}

type instanceInfo struct {
	ID     string `json:"instance-id"`
	Action string `json:"instance-action"`
	State  string `json:"state"`
}

func instanceDetail(detail json.RawMessage) (instanceInfo, error) {
	var d instanceInfo
	if len(detail) == 0 {
		return d, errors.New("event has no detail")
	}
	if err := json.Unmarshal(detail, &d); err != nil {
		return d, fmt.Errorf("event detail: %w", err)
	}
	if d.ID == "" {
		return d, errors.New("event detail has no instance-id")
	}
	return d, nil
}

func one(n providers.Notice) parsed { return parsed{notices: []providers.Notice{n}} }

// parseTime reads the times these messages carry (RFC 3339; Health's RFC 1123), else def.
func parseTime(s string, def time.Time) time.Time {
	for _, layout := range []string{time.RFC3339Nano, time.RFC1123, time.RFC1123Z, "Mon, 2 Jan 2006 15:04:05 MST"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t
		}
	}
	return def
}
