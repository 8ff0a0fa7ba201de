package aws

import (
	"testing"
	"time"
)

// FuzzParseMessage: an SQS message body (EventBridge event, lifecycle hook notification,
// either inside SNS) as the notice queue delivers it. Never a panic; what is accepted names
// an instance for every notice.
func FuzzParseMessage(f *testing.F) {
	for _, s := range []string{
		`{"id":"e1","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","time":"2026-11-22T01:00:00Z","detail":{"instance-id":"i-0abc","instance-action":"terminate"}}`,
		`{"id":"e2","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","detail":{"instance-id":"i-0abc"}}`,
		`{"detail-type":"EC2 Instance-terminate Lifecycle Action","source":"aws.autoscaling","detail":{"LifecycleActionToken":"t","AutoScalingGroupName":"g","LifecycleHookName":"h","EC2InstanceId":"i-1","LifecycleTransition":"autoscaling:EC2_INSTANCE_TERMINATING"}}`,
		`{"LifecycleActionToken":"t","AutoScalingGroupName":"g","LifecycleHookName":"h","EC2InstanceId":"i-1","LifecycleTransition":"autoscaling:EC2_INSTANCE_TERMINATING"}`,
		`{"Type":"Notification","Message":"{\"Event\":\"autoscaling:TEST_NOTIFICATION\"}"}`,
		`{"detail-type":"AWS Health Event","source":"aws.health","detail":{"eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","affectedEntities":[{"entityValue":"i-2"}]}}`,
		`{"detail":null}`, `[]`, `"x"`, ``,
	} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body string) {
		p, err := parseMessage(body, "m-1", now)
		if err != nil {
			return
		}
		for _, n := range p.notices {
			if n.HostID == "" || n.Kind == "" {
				t.Fatalf("%q gave a notice without host or kind: %+v", body, n)
			}
		}
	})
}
