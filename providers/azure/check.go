package azure

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/authorization/armauthorization/v2"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"

	"github.com/elasticd/elasticd/providers"
)

// Checking a job before it starts (providers.Checker): a token got as every call gets one,
// one GET of the scale set (which also says whether the subscription and the resource group
// are there), and one listing of the caller's RBAC permissions on the scale set, "Permissions
// - List For Resource", against which each action the job needs is evaluated here. Nothing
// is written: the claim tag is read from the GET.

// opPerms is the permissions listing, a key of the loop's gates.
const opPerms = "list permissions on the scale set"

// The read actions every job needs (a poll's three calls; errors.go names the same).
const (
	actionRead    = "Microsoft.Compute/virtualMachineScaleSets/read"
	actionVMsRead = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
	actionNICRead = "Microsoft.Network/networkInterfaces/read"
)

// neededAction is an RBAC action a job needs, what it is for, and the built-in role that
// has it.
type neededAction struct {
	action, why, role string
}

// neededActions are the actions the job's flags need on the scale set. The status reads of
// the capacity calls' long-running operations are not among them: ARM lets the caller that
// started an operation read it.
func neededActions(needs providers.CheckNeeds) []neededAction {
	as := []neededAction{
		{actionRead, "reads the scale set: size, priority, orchestration, tags", "Reader"},
		{actionVMsRead, "lists its VMs and their power states", "Reader"},
		{actionNICRead, "lists the VMs' network interfaces: their private IPs", "Reader"},
	}
	if needs.ManageCapacity {
		as = append(as,
			neededAction{actionWrite, "--manage-capacity: sets sku.capacity, and the " + providers.ClaimTagKey + " claim tag", "Virtual Machine Contributor"},
			neededAction{actionDelete, "--manage-capacity: deletes a VM whose GPU failed, to replace it", "Virtual Machine Contributor"})
	}
	return as
}

var _ providers.Checker = (*Provider)(nil)

// Check checks, without changing anything, what a job on this scale set needs of Azure:
//
//   - "credentials": a token for ARM from the provider's credential, where it came from
//     (environment, workload identity, managed identity, Azure CLI, …) and whose it is;
//   - "subscription", "resource group": as the flags give them, found (the GET of the scale
//     set tells which of the three is missing);
//   - "group": the scale set, its size, capacity, priority and orchestration mode;
//   - "claim", with needs.ManageCapacity: whether another driver's fresh claim tag holds it;
//   - "permission <action>": each RBAC action the job needs, evaluated against the caller's
//     permissions on the scale set; "permissions", skipped, when those cannot be listed.
//
// Without a token the rest are skipped.
func (p *Provider) Check(ctx context.Context, needs providers.CheckNeeds) []providers.Check {
	var out providers.Checks
	tok, err := p.api.token(ctx)
	if err != nil {
		out = append(out, providers.Fail("credentials", "no usable Azure credentials: "+clip(oneLine(err.Error()), 600), credentialsFix))
		return append(out, skippedAfter(needs, "needs credentials, which failed above")...)
	}
	id := principalOf(tok.Token)
	from := credentialSource(p.cfg.Credential != nil, os.Getenv, id)

	ss, gerr := callOnce(ctx, p, opScaleSet, p.api.scaleSet)
	var re *azcore.ResponseError
	if errors.As(gerr, &re) && re.StatusCode == http.StatusUnauthorized {
		code, msg := armError(re)
		out = append(out, providers.Fail("credentials",
			fmt.Sprintf("a token came from %s%s, but Azure Resource Manager rejected it: HTTP 401 %s: %s", from, id.describe(), code, msg),
			fmt.Sprintf("use an identity of the tenant of subscription %s: az login --tenant <tenant>, or AZURE_TENANT_ID; a secret or certificate that expired must be renewed", p.cfg.Subscription)))
		return append(out, skippedAfter(needs, "needs credentials that ARM accepts, which failed above")...)
	}
	out = append(out, providers.OK("credentials", "from "+from+id.describe()))

	where, found := p.checkWhere(ctx, ss, gerr)
	out = append(out, where...)
	if needs.ManageCapacity {
		if gerr != nil {
			out = append(out, providers.Skipped("claim", "the scale set could not be read", ""))
		} else {
			out = append(out, checkClaim(ss, time.Now()))
		}
	}
	if !found {
		return append(out, providers.Skipped("permissions", "not asked: there is no scale set to ask them of", ""))
	}
	return append(out, p.checkPermissions(ctx, needs, id)...)
}

// credentialsFix is what to do when no credential gives a token.
const credentialsFix = "sign in with `az login`, give this machine a managed identity (AZURE_CLIENT_ID names a user-assigned one), " +
	"or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (docs/providers/azure.md#setup)"

// skippedAfter are the checks after the credentials', skipped for why.
func skippedAfter(needs providers.CheckNeeds, why string) []providers.Check {
	out := []providers.Check{
		providers.Skipped("subscription", why, ""),
		providers.Skipped("resource group", why, ""),
		providers.Skipped("group", why, ""),
	}
	if needs.ManageCapacity {
		out = append(out, providers.Skipped("claim", why, ""))
	}
	return append(out, providers.Skipped("permissions", why, ""))
}

// checkWhere reads the answer to the scale set's GET as the subscription, resource group and
// scale set lines; found is false when one of them is missing, so that there is no scale set
// to ask permissions of.
func (p *Provider) checkWhere(ctx context.Context, ss armcompute.VirtualMachineScaleSet, err error) (_ []providers.Check, found bool) {
	c := p.cfg
	sub := c.Subscription + " (--subscription)"
	if c.Endpoint != "" {
		sub += ", through " + c.Endpoint + " (--endpoint)"
	}
	rg := c.ResourceGroup + " (--resource-group)"
	if err == nil {
		return []providers.Check{
			providers.OK("subscription", sub),
			providers.OK("resource group", rg+", found"),
			describeSet(c.VMSS, ss),
		}, true
	}
	// unread: the scale set was not read, so neither were its subscription and resource
	// group; the permissions can still be asked.
	unread := func(why string, group providers.Check) ([]providers.Check, bool) {
		return []providers.Check{
			providers.Skipped("subscription", why, ""),
			providers.Skipped("resource group", why, ""),
			group,
		}, true
	}
	const notRead = "not verified: the scale set could not be read"
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return unread(notRead, providers.Fail("group", p.explain(ctx, opScaleSet, err).Error(),
			"ARM must be reachable from here (--endpoint, a proxy, the network); retry when it answers"))
	}
	code, msg := armError(re)
	what := fmt.Sprintf("HTTP %d %s: %s", re.StatusCode, code, msg)
	switch {
	case strings.EqualFold(code, "SubscriptionNotFound") || strings.EqualFold(code, "InvalidSubscriptionId"):
		return []providers.Check{
			providers.Fail("subscription", fmt.Sprintf("%s not found, or not visible to this identity (%s)", sub, what),
				"check --subscription: `az account list` lists the subscriptions the identity can see"),
			providers.Skipped("resource group", "the subscription was not found", ""),
			providers.Skipped("group", "the subscription was not found", ""),
		}, false
	case strings.EqualFold(code, "ResourceGroupNotFound"):
		return []providers.Check{
			providers.OK("subscription", sub),
			providers.Fail("resource group", fmt.Sprintf("%s not found (%s)", rg, what),
				"check --resource-group and --subscription: `az group list --subscription "+c.Subscription+"` lists its resource groups"),
			providers.Skipped("group", "the resource group was not found", ""),
		}, false
	case re.StatusCode == http.StatusNotFound:
		return []providers.Check{
			providers.OK("subscription", sub),
			providers.OK("resource group", rg+", found"),
			providers.Fail("group", fmt.Sprintf("scale set %q not found in resource group %s (%s)", c.VMSS, c.ResourceGroup, what),
				"check --vmss, --resource-group and --subscription: `az vmss list --resource-group "+c.ResourceGroup+
					" --subscription "+c.Subscription+" --query [].name` lists the resource group's scale sets"),
		}, false
	case re.StatusCode == http.StatusForbidden:
		return unread("not verified: reading the scale set was refused",
			providers.Fail("group", fmt.Sprintf("reading scale set %q was refused (%s)", c.VMSS, what),
				"grant the identity "+actionRead+" on the scale set, its resource group or the subscription "+
					"(the built-in Reader role has it; see the permission lines and docs/providers/azure.md#permissions)"))
	}
	return unread(notRead, providers.Fail("group", p.explain(ctx, opScaleSet, err).Error(),
		"retry when ARM answers (a throttled subscription is answered again after its Retry-After)"))
}

// describeSet is the scale set's line: size, capacity, priority, orchestration; a Flexible
// set fails, since a poll would.
func describeSet(name string, ss armcompute.VirtualMachineScaleSet) providers.Check {
	size, capacity := "size unknown", "capacity unknown"
	if ss.SKU != nil {
		if deref(ss.SKU.Name) != "" {
			size = *ss.SKU.Name
		}
		if ss.SKU.Capacity != nil {
			capacity = fmt.Sprintf("capacity %d", *ss.SKU.Capacity)
		}
	}
	priority := "Regular"
	mode := "Uniform" // an answer that names none is taken as Uniform, as a poll takes it
	if pr := ss.Properties; pr != nil {
		if pr.VirtualMachineProfile != nil && pr.VirtualMachineProfile.Priority != nil {
			priority = string(*pr.VirtualMachineProfile.Priority)
		}
		if pr.OrchestrationMode != nil {
			mode = string(*pr.OrchestrationMode)
		}
	}
	if strings.EqualFold(priority, string(armcompute.VirtualMachinePriorityTypesLow)) {
		priority = "Low (Spot)"
	}
	detail := fmt.Sprintf("scale set %s (--vmss) in %s: %s, %s, %s priority, %s orchestration",
		name, deref(ss.Location), size, capacity, priority, mode)
	if err := uniform(ss); err != nil {
		return providers.Fail("group", detail+": "+err.Error(), "--vmss of a Uniform scale set (docs/providers/azure.md#setup)")
	}
	return providers.OK("group", detail)
}

// checkClaim reads the scale set's claim tag, as a driver would before it steers the set.
// Check cannot tell this job's own claim from another's: a job taken up again on its
// --state-dir while its old driver still runs is the case the claim guards against anyway.
func checkClaim(ss armcompute.VirtualMachineScaleSet, now time.Time) providers.Check {
	v := deref(ss.Tags[providers.ClaimTagKey])
	if v == "" {
		return providers.OK("claim", "no "+providers.ClaimTagKey+" tag: no other elasticd driver steers the scale set")
	}
	c, err := providers.ParseClaim(v)
	if err != nil {
		return providers.OK("claim", fmt.Sprintf("the %s tag holds %q, which is not a claim: the job takes it over", providers.ClaimTagKey, v))
	}
	if !now.Before(c.Lapses()) {
		return providers.OK("claim", fmt.Sprintf("last claimed by %s; that claim lapsed at %s: the job takes it over",
			c, c.Lapses().UTC().Format(time.RFC3339)))
	}
	return providers.Fail("claim",
		fmt.Sprintf("held by another driver: %s, until %s unless it refreshes it; this job would not steer the scale set",
			c, c.Lapses().UTC().Format(time.RFC3339)),
		fmt.Sprintf("stop that driver (on host %s) and wait for its claim to lapse (%v), or run this job without --manage-capacity; "+
			"one driver steers one scale set", c.Host, providers.ClaimLapse))
}

// checkPermissions lists the caller's permissions on the scale set and evaluates each
// action the job needs against them: one line per action.
func (p *Provider) checkPermissions(ctx context.Context, needs providers.CheckNeeds, id principal) []providers.Check {
	want := neededActions(needs)
	perms, err := collect(ctx, p, opPerms, p.api.permissions())
	if err != nil {
		var names []string
		for _, w := range want {
			names = append(names, w.action)
		}
		not := "; not verified: " + strings.Join(names, ", ")
		var re *azcore.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusForbidden {
			code, msg := armError(re)
			return []providers.Check{providers.Skipped("permissions",
				fmt.Sprintf("the identity may not list its own permissions on the scale set (HTTP 403 %s: %s)%s", code, msg, not),
				"grant Microsoft.Authorization/permissions/read on the scale set or its resource group: the Reader role has it (*/read), "+
					"and so does Virtual Machine Contributor (Microsoft.Authorization/*/read); or check the actions by hand (docs/providers/azure.md#permissions)")}
		}
		return []providers.Check{providers.Skipped("permissions", p.explain(ctx, opPerms, err).Error()+not, "")}
	}
	scope := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s",
		p.cfg.Subscription, p.cfg.ResourceGroup, p.cfg.VMSS)
	assignee := id.oid
	if assignee == "" {
		assignee = "<principal ID>"
	}
	var out []providers.Check
	for _, w := range want {
		name := "permission " + w.action
		by, deniedBy := granted(perms, w.action)
		if by != "" {
			out = append(out, providers.OK(name, fmt.Sprintf("granted on the scale set (by %q): %s", by, w.why)))
			continue
		}
		detail := "not granted on scale set " + p.cfg.VMSS + ": " + w.why
		if deniedBy != "" {
			detail = fmt.Sprintf("not granted on scale set %s: excluded by the notActions %q of the role that allows it; %s", p.cfg.VMSS, deniedBy, w.why)
		}
		out = append(out, providers.Fail(name, detail, fmt.Sprintf(
			"grant %s on the scale set (or its resource group), e.g. with the built-in %s role: "+
				"az role assignment create --assignee %s --role %q --scope %s (docs/providers/azure.md#permissions)",
			w.action, w.role, assignee, w.role, scope)))
	}
	return out
}

// granted evaluates action against the union of permissions as Azure RBAC does: it is
// granted when one entry's actions match it and none of that entry's notActions do. by is
// the matching pattern; deniedBy, when not granted, a notActions pattern that took it away.
// Deny assignments are not in this answer (the listing does not return them).
func granted(perms []*armauthorization.Permission, action string) (by, deniedBy string) {
	for _, pm := range perms {
		if pm == nil {
			continue
		}
		allow := firstMatch(pm.Actions, action)
		if allow == "" {
			continue
		}
		if deny := firstMatch(pm.NotActions, action); deny != "" {
			deniedBy = deny
			continue
		}
		return allow, ""
	}
	return "", deniedBy
}

func firstMatch(patterns []*string, action string) string {
	for _, p := range patterns {
		if p != nil && actionMatches(*p, action) {
			return *p
		}
	}
	return ""
}

// actionMatches reports whether pattern, an RBAC action, names action. Azure compares
// actions without regard to case, and a "*" stands for any run of characters, "/" included:
// "*", "*/read", "Microsoft.Compute/*", "Microsoft.Authorization/*/read".
func actionMatches(pattern, action string) bool {
	pat, act := strings.ToLower(pattern), strings.ToLower(action)
	parts := strings.Split(pat, "*")
	if len(parts) == 1 {
		return pat == act
	}
	if !strings.HasPrefix(act, parts[0]) {
		return false
	}
	act = act[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(act, mid)
		if i < 0 {
			return false
		}
		act = act[i+len(mid):]
	}
	return len(act) >= len(last) && strings.HasSuffix(act, last)
}

// principal is whose a token is, from its claims.
type principal struct {
	user        string // upn, unique_name or preferred_username: a person signed in
	app         string // appid (or azp): the application the token was issued to
	oid, tenant string
	mirid       string // xms_mirid: the managed identity's resource ID
}

// principalOf reads an access token's claims. The token is not verified: that is ARM's to
// do, and the claims only say, in the credentials line, who the job will act as. A token
// that is not a JWT says nothing.
func principalOf(token string) principal {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return principal{}
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return principal{}
	}
	var c struct {
		UPN               string `json:"upn"`
		UniqueName        string `json:"unique_name"`
		PreferredUsername string `json:"preferred_username"`
		AppID             string `json:"appid"`
		AZP               string `json:"azp"`
		OID               string `json:"oid"`
		TID               string `json:"tid"`
		IDType            string `json:"idtyp"`
		MIRID             string `json:"xms_mirid"`
	}
	if json.Unmarshal(b, &c) != nil {
		return principal{}
	}
	id := principal{app: c.AppID, oid: c.OID, tenant: c.TID, mirid: c.MIRID}
	if id.app == "" {
		id.app = c.AZP
	}
	if c.IDType != "app" {
		for _, u := range []string{c.UPN, c.UniqueName, c.PreferredUsername} {
			if u != "" {
				id.user = u
				break
			}
		}
	}
	return id
}

// describe is ", as <who> (object <oid>, tenant <tid>)", or "" when the token said nothing.
func (id principal) describe() string {
	var who string
	switch {
	case id.mirid != "" && strings.Contains(strings.ToLower(id.mirid), "/userassignedidentities/"):
		who = "user-assigned managed identity " + path.Base(id.mirid)
	case id.mirid != "":
		who = "the system-assigned managed identity of " + path.Base(id.mirid)
	case id.user != "":
		who = id.user
	case id.app != "":
		who = "application " + id.app
	}
	var ids []string
	if id.oid != "" {
		ids = append(ids, "object "+id.oid)
	}
	if id.tenant != "" {
		ids = append(ids, "tenant "+id.tenant)
	}
	switch {
	case who == "" && len(ids) == 0:
		return ""
	case who == "":
		return ", as " + strings.Join(ids, ", ")
	case len(ids) == 0:
		return ", as " + who
	}
	return ", as " + who + " (" + strings.Join(ids, ", ") + ")"
}

// azureCLIApp is the application ID of the Azure CLI, to which its users' tokens are issued.
const azureCLIApp = "04b07795-8ddb-461a-bbee-02f9e1bf7b46"

// credentialSource says where the provider's credential got its token. DefaultAzureCredential
// does not say which of its sources answered, so this follows its order: the environment
// and workload identity are used whenever they are configured (a failure there ends the
// chain), AZURE_TOKEN_CREDENTIALS narrows the chain, and past those the token's claims tell
// a managed identity from a developer's sign-in.
func credentialSource(given bool, getenv func(string) string, id principal) string {
	if given {
		return "the credential given in azure.Config"
	}
	const (
		env = 1 << iota
		wi
		mi
		dev
	)
	sel := env | wi | mi | dev
	narrowed := ""
	switch atc := getenv("AZURE_TOKEN_CREDENTIALS"); strings.ToLower(atc) {
	case "":
	case "prod":
		sel, narrowed = env|wi|mi, atc
	case "dev":
		sel, narrowed = dev, atc
	case "environmentcredential":
		sel, narrowed = env, atc
	case "workloadidentitycredential":
		sel, narrowed = wi, atc
	case "managedidentitycredential":
		sel, narrowed = mi, atc
	case "azureclicredential":
		return "the Azure CLI (az login; AZURE_TOKEN_CREDENTIALS=" + atc + ")"
	case "azuredeveloperclicredential":
		return "the Azure Developer CLI (azd auth login; AZURE_TOKEN_CREDENTIALS=" + atc + ")"
	case "azurepowershellcredential":
		return "Azure PowerShell (Connect-AzAccount; AZURE_TOKEN_CREDENTIALS=" + atc + ")"
	}
	note := ""
	if narrowed != "" {
		note = "; AZURE_TOKEN_CREDENTIALS=" + narrowed
	}
	set := func(k string) bool { return getenv(k) != "" }
	if sel&env != 0 && set("AZURE_TENANT_ID") && set("AZURE_CLIENT_ID") {
		switch {
		case set("AZURE_CLIENT_SECRET"):
			return "the environment (AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET" + note + ")"
		case set("AZURE_CLIENT_CERTIFICATE_PATH"):
			return "the environment (AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_CERTIFICATE_PATH" + note + ")"
		case set("AZURE_USERNAME") && set("AZURE_PASSWORD"):
			return "the environment (AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_USERNAME, AZURE_PASSWORD" + note + ")"
		}
	}
	if sel&wi != 0 && set("AZURE_FEDERATED_TOKEN_FILE") && set("AZURE_CLIENT_ID") && set("AZURE_TENANT_ID") {
		return "workload identity (AZURE_FEDERATED_TOKEN_FILE" + note + ")"
	}
	switch {
	case sel&mi != 0 && id.mirid != "":
		return "a managed identity (this machine's" + note + ")"
	case sel&dev != 0 && id.app == azureCLIApp:
		return "the Azure CLI (az login" + note + ")"
	case sel&dev != 0 && id.user != "":
		return "a developer sign-in (Azure CLI, Azure Developer CLI or Azure PowerShell" + note + ")"
	case sel == mi:
		return "a managed identity (this machine's" + note + ")"
	case sel == dev:
		return "a developer sign-in (Azure CLI, Azure Developer CLI or Azure PowerShell" + note + ")"
	}
	return "DefaultAzureCredential: a managed identity or a developer sign-in (Azure CLI, Azure Developer CLI, Azure PowerShell), " +
		"which the token does not tell" + note
}
