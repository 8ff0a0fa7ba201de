package aws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/elasticd/elasticd/providers"
)

const (
	// receiveBatch is ReceiveMessage's largest batch.
	receiveBatch = 10
	// visibility hides a received message from other receives; one whose delete failed comes
	// back after it and is handled again (the watcher de-duplicates by notice ID).
	visibility = 30 * time.Second
	// longPoll is the receive's wait for a message when the queue is empty: a long poll asks
	// every SQS server, where a short one may miss a message. It is used only when the poll's
	// context leaves room for it (the driver polls every second).
	longPoll = time.Second
)

// Notices receives one batch from the queue (at most 10 messages, waiting at most a second)
// and returns the notices about the group's instances. Every message received is deleted:
// those it made notices from, those about other instances or groups and those it ignores
// (logged at debug), and those it cannot read (logged as a warning). Before the first
// successful Hosts the group's members are not known, and notices about any instance are
// returned. With no queue configured, there are none.
func (p *Provider) Notices(ctx context.Context) ([]providers.Notice, error) {
	if p.cfg.SQSQueueURL == "" {
		return nil, nil
	}
	return p.loop.Notices(ctx)
}

// ListNotices is one receive (the loop takes turns, de-duplicates and prefixes).
func (d driver) ListNotices(ctx context.Context) ([]providers.Notice, error) {
	p := d.p
	fail := func(err error) ([]providers.Notice, error) {
		return nil, fmt.Errorf("notices from %s: %w", p.cfg.SQSQueueURL, err)
	}
	if err := p.clients(ctx); err != nil {
		return fail(err)
	}
	wait := int32(0)
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) >= 2*longPoll {
		wait = int32(longPoll / time.Second)
	}
	var out *sqs.ReceiveMessageOutput
	err := p.call(ctx, epSQS, maxAttempts, func(ctx context.Context) (err error) {
		out, err = p.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:            awssdk.String(p.cfg.SQSQueueURL),
			MaxNumberOfMessages: receiveBatch,
			WaitTimeSeconds:     wait,
			VisibilityTimeout:   int32(visibility / time.Second),
		})
		return err
	})
	if err != nil {
		return fail(explain(err, "sqs:ReceiveMessage"))
	}

	p.mu.Lock()
	members := p.members
	p.mu.Unlock()
	now := time.Now()
	var notices []providers.Notice
	seen := map[string]bool{}
	del := make([]sqstypes.DeleteMessageBatchRequestEntry, 0, len(out.Messages))
	for i, m := range out.Messages {
		msgID := awssdk.ToString(m.MessageId)
		if m.ReceiptHandle != nil {
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: awssdk.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
		r, err := parseMessage(awssdk.ToString(m.Body), msgID, now)
		switch {
		case err != nil:
			p.log.Warn("unreadable notice message; deleted", "message", msgID, "error", err, "body", clip(awssdk.ToString(m.Body), 300))
			continue
		case r.ignore != "":
			p.log.Debug("notice message ignored; deleted", "message", msgID, "what", r.ignore)
			continue
		case r.asg != "" && r.asg != p.cfg.ASG:
			p.log.Debug("lifecycle action of another group; deleted", "message", msgID, "group", r.asg)
			continue
		}
		for _, n := range r.notices {
			if r.asg == "" && members != nil && !members[n.HostID] {
				p.log.Debug("notice about an instance not in the group; deleted", "message", msgID, "host", n.HostID, "kind", n.Kind)
				continue
			}
			if !seen[n.ID] {
				seen[n.ID] = true
				notices = append(notices, n)
			}
		}
	}
	p.delete(ctx, del)
	// Notices mean the group is changing: the loop makes the next Hosts ask the APIs.
	return notices, nil
}

// delete deletes received messages, once: a message whose delete fails reappears after the
// visibility timeout and is handled again, which is harmless, and retrying here would only
// hold back the notices.
func (p *Provider) delete(ctx context.Context, entries []sqstypes.DeleteMessageBatchRequestEntry) {
	if len(entries) == 0 {
		return
	}
	var out *sqs.DeleteMessageBatchOutput
	err := p.call(ctx, epSQS, 1, func(ctx context.Context) (err error) {
		out, err = p.sqs.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: awssdk.String(p.cfg.SQSQueueURL), Entries: entries})
		return err
	})
	if err != nil {
		p.log.Warn("could not delete notice messages; they will be received again", "messages", len(entries),
			"error", explain(err, "sqs:DeleteMessage"))
		return
	}
	for _, f := range out.Failed {
		p.log.Warn("could not delete a notice message; it will be received again", "entry", awssdk.ToString(f.Id),
			"code", awssdk.ToString(f.Code), "error", awssdk.ToString(f.Message))
	}
}

// CompleteNotice lets a terminating instance go once its workers are gone: it answers the
// lifecycle action of a ScaleIn notice with CONTINUE. Other notices need no answer. An action
// that is no longer pending (completed elsewhere, or timed out) counts as completed, and so
// does one completed before (the loop remembers it and calls nothing).
func (p *Provider) CompleteNotice(ctx context.Context, n providers.Notice) error {
	return p.loop.CompleteNotice(ctx, n)
}

// AnswerNotice answers one lifecycle action.
func (d driver) AnswerNotice(ctx context.Context, n providers.Notice) error {
	p := d.p
	if n.Kind != providers.ScaleIn || n.Token == "" {
		return nil
	}
	var t lifecycleToken
	if err := json.Unmarshal([]byte(n.Token), &t); err != nil || t.ASG == "" || t.Token == "" {
		return fmt.Errorf("complete notice %s: its token was not made by this provider", n.ID)
	}
	if err := p.clients(ctx); err != nil {
		return fmt.Errorf("complete the lifecycle action of %s: %w", t.Instance, err)
	}
	err := p.call(ctx, epASG, maxAttempts, func(ctx context.Context) error {
		_, err := p.asg.CompleteLifecycleAction(ctx, &autoscaling.CompleteLifecycleActionInput{
			AutoScalingGroupName:  awssdk.String(t.ASG),
			LifecycleHookName:     awssdk.String(t.Hook),
			LifecycleActionToken:  awssdk.String(t.Token),
			InstanceId:            awssdk.String(t.Instance),
			LifecycleActionResult: awssdk.String("CONTINUE"),
		})
		return err
	})
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "ValidationError" && strings.Contains(ae.ErrorMessage(), "No active Lifecycle Action") {
		p.log.Debug("lifecycle action no longer pending", "host", t.Instance, "hook", t.Hook)
		return nil
	}
	if err != nil {
		return fmt.Errorf("complete the lifecycle action of %s (group %q, hook %q): %w",
			t.Instance, t.ASG, t.Hook, explain(err, "autoscaling:CompleteLifecycleAction"))
	}
	return nil
}

// clip shortens s for a log line.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
