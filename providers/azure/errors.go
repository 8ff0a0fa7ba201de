package azure

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
)

// apiError is a failed call told in one line, with what to fix; it wraps the SDK's error,
// whose own text is a multi-line dump of the response.
type apiError struct {
	msg       string
	err       error
	throttled bool
}

func (e *apiError) Error() string   { return e.msg }
func (e *apiError) Unwrap() error   { return e.err }
func (e *apiError) Is(t error) bool { return e.throttled && t == ErrThrottled }

// explain turns the error of call op into one that names the scale set, its resource group
// and subscription, and says what to fix when the cause is known.
func (p *Provider) explain(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%v)", cerr, err)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	var ce *credentialError
	if errors.As(err, &ce) {
		return &apiError{err: err, msg: fmt.Sprintf("%s: no usable Azure credentials: %s; "+
			"sign in with `az login`, give this machine a managed identity (AZURE_CLIENT_ID names a user-assigned one), "+
			"or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET",
			op, clip(oneLine(ce.err.Error()), 600))}
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return gated(fmt.Errorf("%s: %w", op, err))
	}
	code, msg := armError(re)
	what := fmt.Sprintf("HTTP %d", re.StatusCode)
	if code != "" {
		what += " " + code
	}
	if msg != "" {
		what += ": " + msg
	}
	e := &apiError{err: err}
	c := p.cfg
	switch {
	case re.StatusCode == http.StatusUnauthorized:
		e.msg = fmt.Sprintf("%s: the credentials were rejected (%s); check that the identity "+
			"belongs to the tenant of subscription %q (AZURE_TENANT_ID) and that its secret or token is current",
			op, what, c.Subscription)
	case re.StatusCode == http.StatusForbidden:
		e.msg = fmt.Sprintf("%s: access denied (%s); give the identity the Reader role on resource group %q, "+
			"or a role with Microsoft.Compute/virtualMachineScaleSets/read, Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read "+
			"and Microsoft.Network/networkInterfaces/read (see docs/providers/azure.md)",
			op, what, c.ResourceGroup)
	case strings.EqualFold(code, "SubscriptionNotFound") || strings.EqualFold(code, "InvalidSubscriptionId"):
		e.msg = fmt.Sprintf("subscription %q not found (%s): check --subscription, and that the identity has access to it",
			c.Subscription, what)
	case strings.EqualFold(code, "ResourceGroupNotFound"):
		e.msg = fmt.Sprintf("resource group %q not found in subscription %q (%s): check --resource-group and --subscription",
			c.ResourceGroup, c.Subscription, what)
	case re.StatusCode == http.StatusNotFound:
		e.msg = fmt.Sprintf("scale set %q not found in resource group %q of subscription %q (%s): check --vmss, --resource-group and --subscription",
			c.VMSS, c.ResourceGroup, c.Subscription, what)
	case re.StatusCode == http.StatusTooManyRequests:
		e.throttled = true
		e.msg = fmt.Sprintf("%s: throttled by Azure Resource Manager (%s); backing off", op, what)
	default:
		e.msg = fmt.Sprintf("%s: %s", op, what)
	}
	return e
}

// armError reads ARM's error body, {"error":{"code","message"}} (some resource providers
// leave out the "error" level).
func armError(re *azcore.ResponseError) (code, msg string) {
	code = re.ErrorCode
	if re.RawResponse == nil {
		return code, ""
	}
	body, err := runtime.Payload(re.RawResponse)
	if err != nil || len(body) == 0 {
		return code, ""
	}
	type detail struct{ Code, Message string }
	var b struct {
		Error *detail
		detail
	}
	if json.Unmarshal(body, &b) != nil {
		return code, clip(oneLine(string(body)), 200)
	}
	d := b.detail
	if b.Error != nil {
		d = *b.Error
	}
	return cmp.Or(code, d.Code), clip(oneLine(d.Message), 300)
}

// oneLine joins the lines of s, for an error that fits a log line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// clip shortens s to at most n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
