package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/providers"
)

const (
	awsDefaultBase = "http://169.254.169.254"
	awsTokenPath   = "/latest/api/token"
	awsIDPath      = "/latest/meta-data/instance-id"
	awsSpotPath    = "/latest/meta-data/spot/instance-action"
	awsRebalPath   = "/latest/meta-data/events/recommendations/rebalance"
	awsASGPath     = "/latest/meta-data/autoscaling/target-lifecycle-state"

	// awsTokenMargin: a token is replaced this long before it expires (as NTH does), so a
	// request never carries one that runs out in flight.
	awsTokenMargin = 15 * time.Second
)

// AWS watches EC2's instance metadata service (IMDSv2) for a spot interruption, a rebalance
// recommendation and an Auto Scaling scale-in of this instance. It is safe for concurrent use.
type AWS struct {
	cfg Config

	id identity

	mu       sync.Mutex // guards the token, never held across a request
	token    string
	tokenExp time.Time
}

// NewAWS returns the IMDSv2 watcher; it makes no call.
func NewAWS(cfg Config) (*AWS, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &AWS{cfg: cfg.withDefaults(awsDefaultBase, DefaultTimeout)}, nil
}

// InstanceID is this instance's ID (i-…), asked once and then remembered.
func (a *AWS) InstanceID(ctx context.Context) (string, error) {
	return a.id.get(ctx, "aws imds: instance ID", "want an instance ID such as i-0abc",
		func(ctx context.Context) (*http.Request, answer, error) { return a.get(ctx, awsIDPath) },
		func(id string) bool { return strings.HasPrefix(id, "i-") && !strings.ContainsAny(id, " \r\n\t") })
}

// Notices asks the three endpoints once. A 404 from an endpoint means it has nothing to
// announce. An endpoint that fails does not hide the others' notices: they are returned
// together with an error naming each endpoint that failed.
func (a *AWS) Notices(ctx context.Context) ([]providers.Notice, error) {
	host, err := a.InstanceID(ctx)
	if err != nil {
		return nil, err
	}
	var notices []providers.Notice
	var errs []error
	for _, check := range []func(context.Context, string) (*providers.Notice, error){a.spot, a.rebalance, a.scaleIn} {
		n, err := check(ctx, host)
		if err != nil {
			errs = append(errs, fmt.Errorf("aws imds: %w", err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if n != nil {
			notices = append(notices, *n)
		}
	}
	return notices, errors.Join(errs...)
}

func (a *AWS) spot(ctx context.Context, host string) (*providers.Notice, error) {
	req, ans, err := a.get(ctx, awsSpotPath)
	if err != nil || ans.status == http.StatusNotFound {
		return nil, err
	}
	var doc struct {
		Action string `json:"action"`
		Time   string `json:"time"`
	}
	if ans.status != http.StatusOK {
		return nil, unexpected(req, ans, "want 200 or 404")
	}
	if err := json.Unmarshal(ans.body, &doc); err != nil || doc.Action == "" {
		return nil, unexpected(req, ans, `want {"action":…,"time":…}`)
	}
	at, err := time.Parse(time.RFC3339, doc.Time)
	if err != nil {
		return nil, unexpected(req, ans, "time is not RFC 3339")
	}
	return &providers.Notice{
		ID:       bodyID("aws", host, awsSpotPath, ans.body),
		HostID:   host,
		Kind:     providers.Interruption,
		Deadline: at,
		Detail:   "EC2 spot instance-action " + doc.Action,
	}, nil
}

func (a *AWS) rebalance(ctx context.Context, host string) (*providers.Notice, error) {
	req, ans, err := a.get(ctx, awsRebalPath)
	if err != nil || ans.status == http.StatusNotFound {
		return nil, err
	}
	var doc struct {
		NoticeTime string `json:"noticeTime"`
	}
	if ans.status != http.StatusOK {
		return nil, unexpected(req, ans, "want 200 or 404")
	}
	if err := json.Unmarshal(ans.body, &doc); err != nil || doc.NoticeTime == "" {
		return nil, unexpected(req, ans, `want {"noticeTime":…}`)
	}
	if _, err := time.Parse(time.RFC3339, doc.NoticeTime); err != nil {
		return nil, unexpected(req, ans, "noticeTime is not RFC 3339")
	}
	// A recommendation has no deadline: the instance may run for hours yet.
	return &providers.Notice{
		ID:     bodyID("aws", host, awsRebalPath, ans.body),
		HostID: host,
		Kind:   providers.Rebalance,
		Detail: "EC2 rebalance recommendation issued " + doc.NoticeTime,
	}, nil
}

func (a *AWS) scaleIn(ctx context.Context, host string) (*providers.Notice, error) {
	req, ans, err := a.get(ctx, awsASGPath)
	// 404: the group has no instance lifecycle metadata (not in a group, or no hook).
	if err != nil || ans.status == http.StatusNotFound {
		return nil, err
	}
	state := strings.TrimSpace(string(ans.body))
	if ans.status != http.StatusOK || state == "" || strings.ContainsAny(state, " \r\n\t{<") {
		return nil, unexpected(req, ans, "want a lifecycle state such as InService")
	}
	if state != "Terminated" {
		return nil, nil
	}
	return &providers.Notice{
		ID:     bodyID("aws", host, awsASGPath, ans.body),
		HostID: host,
		Kind:   providers.ScaleIn,
		Detail: "Auto Scaling target lifecycle state Terminated",
	}, nil
}

// get sends an IMDSv2 GET; a 401 (the token expired or was revoked early) costs one new
// token and one retry.
func (a *AWS) get(ctx context.Context, path string) (*http.Request, answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.cfg.BaseURL+path, nil)
	if err != nil {
		return nil, answer{}, err
	}
	for attempt := 0; ; attempt++ {
		tok, err := a.sessionToken(ctx, attempt > 0)
		if err != nil {
			return req, answer{}, err
		}
		req.Header.Set("X-aws-ec2-metadata-token", tok)
		ans, err := do(a.cfg.Client, req)
		if err != nil {
			return req, answer{}, err
		}
		if ans.status == http.StatusUnauthorized && attempt == 0 {
			a.cfg.Logger.Debug("IMDSv2 token refused; getting a new one", "provider", "aws", "path", path)
			continue
		}
		return req, ans, nil
	}
}

// sessionToken returns the cached token, or a new one when it is about to expire or force
// is set (the service refused it).
func (a *AWS) sessionToken(ctx context.Context, force bool) (string, error) {
	now := a.cfg.Now()
	a.mu.Lock()
	tok, exp := a.token, a.tokenExp
	a.mu.Unlock()
	if !force && tok != "" && now.Before(exp) {
		return tok, nil
	}
	ttl := int(a.cfg.TokenTTL / time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, a.cfg.BaseURL+awsTokenPath, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
	ans, err := do(a.cfg.Client, req)
	if err != nil {
		return "", fmt.Errorf("IMDSv2 token: %w", err)
	}
	tok = strings.TrimSpace(string(ans.body))
	if ans.status != http.StatusOK || tok == "" || strings.ContainsAny(tok, " \r\n\t") {
		return "", fmt.Errorf("IMDSv2 token: %w", unexpected(req, ans, "want a session token"))
	}
	// The service may grant less than asked; it says how much in the same header.
	if s := ans.header.Get("X-aws-ec2-metadata-token-ttl-seconds"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 && n < ttl {
			ttl = n
		}
	}
	life := time.Duration(ttl) * time.Second
	margin := min(awsTokenMargin, life/4)
	a.mu.Lock()
	a.token, a.tokenExp = tok, now.Add(life-margin)
	a.mu.Unlock()
	return tok, nil
}
