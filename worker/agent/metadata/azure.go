package metadata

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
)

const (
	azureDefaultBase = "http://169.254.169.254"
	azureEventsPath  = "/metadata/scheduledevents?api-version=2020-07-01"
	azureNamePath    = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
)

// Azure watches the Scheduled Events service for events that take this VM away. It is safe
// for concurrent use.
type Azure struct {
	cfg Config

	name identity
}

// NewAzure returns the Scheduled Events watcher; it makes no call.
func NewAzure(cfg Config) (*Azure, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Azure{cfg: cfg.withDefaults(azureDefaultBase, DefaultTimeout)}, nil
}

// VMName is this VM's name, as Scheduled Events lists it in Resources; asked once.
func (a *Azure) VMName(ctx context.Context) (string, error) {
	return a.name.get(ctx, "azure imds: VM name", "want the VM's name",
		func(ctx context.Context) (*http.Request, answer, error) {
			return a.send(ctx, http.MethodGet, azureNamePath, nil)
		},
		func(name string) bool {
			return name != "" && len(name) <= 80 && !strings.ContainsAny(name, " \r\n\t{}<>\"")
		})
}

type azureEvent struct {
	EventID      string   `json:"EventId"`
	EventType    string   `json:"EventType"`
	ResourceType string   `json:"ResourceType"`
	Resources    []string `json:"Resources"`
	EventStatus  string   `json:"EventStatus"`
	NotBefore    string   `json:"NotBefore"`
	Description  string   `json:"Description"`
	EventSource  string   `json:"EventSource"`
}

// Notices lists the scheduled events once and returns those about this VM: Preempt is an
// interruption, Terminate a scale-in, Reboot, Redeploy and Freeze maintenance. Notice.ID is
// the EventId (Ack takes it back); Deadline is NotBefore, zero once the event has started.
// Events of other types are skipped (logged at debug); an event about this VM that cannot be
// read is an error, returned with the notices that could be.
func (a *Azure) Notices(ctx context.Context) ([]providers.Notice, error) {
	name, err := a.VMName(ctx)
	if err != nil {
		return nil, err
	}
	req, ans, err := a.send(ctx, http.MethodGet, azureEventsPath, nil)
	if err != nil {
		return nil, fmt.Errorf("azure scheduled events: %w", err)
	}
	var doc struct {
		DocumentIncarnation *int         `json:"DocumentIncarnation"`
		Events              []azureEvent `json:"Events"`
	}
	if ans.status != http.StatusOK {
		return nil, fmt.Errorf("azure scheduled events: %w", unexpected(req, ans, "want 200"))
	}
	if err := json.Unmarshal(ans.body, &doc); err != nil || doc.DocumentIncarnation == nil {
		return nil, fmt.Errorf("azure scheduled events: %w", unexpected(req, ans, `want {"DocumentIncarnation":…,"Events":[…]}`))
	}
	var notices []providers.Notice
	var errs []error
	for _, ev := range doc.Events {
		if !mentions(ev.Resources, name) {
			continue
		}
		var kind providers.NoticeKind
		switch ev.EventType {
		case "Preempt":
			kind = providers.Interruption
		case "Terminate":
			kind = providers.ScaleIn
		case "Reboot", "Redeploy", "Freeze":
			kind = providers.Maintenance
		default:
			a.cfg.Logger.Debug("scheduled event of an unknown type skipped", "provider", "azure", "host", name, "event", ev.EventID, "type", ev.EventType)
			continue
		}
		if ev.EventID == "" {
			errs = append(errs, fmt.Errorf("azure scheduled events: %s event for %s has no EventId", ev.EventType, name))
			continue
		}
		var deadline time.Time
		if ev.NotBefore != "" {
			deadline, err = time.Parse(time.RFC1123, ev.NotBefore)
			if err != nil {
				errs = append(errs, fmt.Errorf("azure scheduled events: event %s: NotBefore %q is not RFC 1123", ev.EventID, ev.NotBefore))
				continue
			}
		}
		detail := fmt.Sprintf("Azure scheduled event %s (%s, %s)", ev.EventType, ev.EventStatus, ev.EventSource)
		if ev.Description != "" {
			detail += ": " + ev.Description
		}
		notices = append(notices, providers.Notice{
			ID:       ev.EventID,
			HostID:   name,
			Kind:     kind,
			Deadline: deadline,
			Detail:   detail,
			Token:    ev.EventID,
		})
	}
	return notices, errors.Join(errs...)
}

// mentions reports whether resources names this VM; Azure names are case-insensitive.
func mentions(resources []string, name string) bool {
	for _, r := range resources {
		if strings.EqualFold(r, name) {
			return true
		}
	}
	return false
}

// Ack tells Azure that this VM is ready for the events (its workers have left), so they may
// start before NotBefore. It does nothing when given no IDs.
func (a *Azure) Ack(ctx context.Context, eventIDs ...string) error {
	if len(eventIDs) == 0 {
		return nil
	}
	type start struct {
		EventID string `json:"EventId"`
	}
	var body struct {
		StartRequests []start `json:"StartRequests"`
	}
	for _, id := range eventIDs {
		if id == "" {
			return errors.New("azure scheduled events: ack: empty event ID")
		}
		body.StartRequests = append(body.StartRequests, start{id})
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("azure scheduled events: ack: %w", err)
	}
	req, ans, err := a.send(ctx, http.MethodPost, azureEventsPath, b)
	if err != nil {
		return fmt.Errorf("azure scheduled events: ack %s: %w", strings.Join(eventIDs, ","), err)
	}
	if ans.status < 200 || ans.status > 299 {
		return fmt.Errorf("azure scheduled events: ack %s: %w", strings.Join(eventIDs, ","), unexpected(req, ans, "want 2xx"))
	}
	return nil
}

// CompleteNotice acknowledges the notice's event (providers.NoticeCompleter).
func (a *Azure) CompleteNotice(ctx context.Context, n providers.Notice) error {
	return a.Ack(ctx, n.ID)
}

func (a *Azure) send(ctx context.Context, method, path string, body []byte) (*http.Request, answer, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.cfg.BaseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, answer{}, err
	}
	req.Header.Set("Metadata", "true")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	ans, err := do(a.cfg.Client, req)
	return req, ans, err
}
