package ibm

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/elasticd/elasticd/providers"
)

// Checking a job before it starts (providers.Checker). IBM Cloud has no call that answers
// "may these credentials do X" without doing X: its services decide inside themselves, with
// IAM's libraries, and IAM's public APIs (tokens and keys, policies, access groups) manage
// who holds which role without evaluating a request. So the checks prove the read
// permissions by making the reads the job makes, and name the change permissions that
// --manage-capacity needs, with the role that grants them, as not verified.

var _ providers.Checker = (*Provider)(nil)

// The IAM actions of the calls the provider makes, as IBM's "IAM roles and actions" page
// lists them for Auto Scale for VPC (service is.instance-group) and Virtual Server for VPC
// (service is.instance). The changes' action is needsUpdate's (capacity.go).
const (
	actionListGroups    = "is.instance-group.instance-group.list"   // GET /instance_groups
	actionReadGroup     = "is.instance-group.instance-group.read"   // GET the group, its managers, its memberships
	actionListInstances = "is.instance.instance.list"               // GET /instances
	actionUpdateGroup   = "is.instance-group.instance-group.update" // PATCH the group or a manager, DELETE a membership
)

// Where the fixes point.
const (
	docCredentials = "docs/providers/ibm.md, \"Credentials and permissions\""
	docSteering    = "docs/providers/ibm.md, \"Steering the group\""
	// fixViewer is the fix of a refused read.
	fixViewer = "grant the key's identity (or trusted profile) the Viewer role on %s for the instance group's resource group (" + docCredentials + ")"
	// noAskingIBM is why a change permission is not verified.
	noAskingIBM = "not verified: IBM Cloud has no call that says whether credentials may make a change without making it, and elasticd check changes nothing"
)

// Check verifies, without changing anything, what a job needs of IBM Cloud:
//   - "credentials": where they come from (Config.Authenticator, the VPC_* variables or an
//     ibm-credentials.env file, IBMCLOUD_API_KEY or IC_API_KEY) and a token from IAM (or
//     the instance's metadata service, for a trusted profile). Without one, the checks that
//     need the API are skipped.
//   - "region": the region and the VPC API endpoint the requests go to.
//   - "group": the instance group found by name or ID, its membership_count, status and
//     memberships; "group managers": its enabled managers and, with ManageCapacity, what
//     elasticd does to an enabled autoscale manager.
//   - "permission <IAM action>": the reads above, and a one-item listing of the group's
//     instances, prove is.instance-group.instance-group.list and .read and
//     is.instance.instance.list. With ManageCapacity, the three changes (membership_count,
//     an autoscale manager, a membership) are skipped, each naming the role that grants it:
//     IBM Cloud cannot be asked without making them.
//
// Its reads go through the provider's pacing like a poll's, after any poll or capacity call
// in progress.
func (p *Provider) Check(ctx context.Context, needs providers.CheckNeeds) []providers.Check {
	region := p.checkRegion()
	if !p.take(ctx) {
		why := fmt.Sprintf("not checked: %v", ctx.Err())
		return append([]providers.Check{providers.Skipped("credentials", why, ""), region}, unreached(needs, why)...)
	}
	defer p.give()

	creds := p.checkCredentials()
	out := []providers.Check{creds, region}
	if creds.Status != providers.CheckOK {
		return append(out, unreached(needs, "no credentials (see credentials)")...)
	}
	r := p.readForCheck(ctx)
	out = append(out, r.group(p.cfg), r.managers(needs))
	out = append(out, r.permissions()...)
	return append(out, changes(needs)...)
}

// unreached is every check after credentials and region, skipped for why.
func unreached(needs providers.CheckNeeds, why string) []providers.Check {
	out := []providers.Check{
		providers.Skipped("group", why, ""),
		providers.Skipped("group managers", why, ""),
	}
	for _, a := range []string{actionListGroups, actionReadGroup, actionListInstances} {
		out = append(out, providers.Skipped("permission "+a, why, ""))
	}
	return append(out, changes(needs)...)
}

// checkCredentials says where the credentials come from and gets a token with them.
func (p *Provider) checkCredentials() providers.Check {
	const name = "credentials"
	fix := "set IBMCLOUD_API_KEY to an IAM API key (ibmcloud iam api-key-create), or VPC_AUTH_TYPE=vpc and " +
		"VPC_IAM_PROFILE_ID on an instance linked to a trusted profile (" + docCredentials + ")"
	if p.noKey != nil {
		detail := p.noKey.Error()
		if errors.Is(p.noKey, errNoCredentials) {
			detail = "none found: no VPC_AUTH_TYPE or VPC_APIKEY (in the environment or an ibm-credentials.env file), no IBMCLOUD_API_KEY, no IC_API_KEY"
		}
		return providers.Fail(name, detail, fix)
	}
	from := credentialSource(p.cfg)
	kind, issuer := authKind(p.auth.Authenticator)
	req, err := http.NewRequest(http.MethodGet, p.cfg.serviceURL(), nil)
	if err != nil {
		return providers.Fail(name, fmt.Sprintf("%s from %s: %v", kind, from, err), fix)
	}
	// Authenticate fetches the token (or takes the one cached) as a request's would; the
	// requests that follow reuse it.
	if err := p.auth.Authenticate(req); err != nil {
		detail := fmt.Sprintf("%s from %s: getting a token from %s: %s", kind, from, issuer, strings.TrimSuffix(err.Error(), "."))
		switch p.auth.AuthenticationType() {
		case core.AUTHTYPE_IAM:
			fix = "check the API key in " + from + ": IAM does not accept it (deleted, mistyped, or a key of another IBM Cloud); " + fix
		case core.AUTHTYPE_VPC:
			fix = "check that the instance's metadata service is enabled and that the trusted profile (VPC_IAM_PROFILE_ID or VPC_IAM_PROFILE_CRN) is linked to this instance; " + fix
		}
		return providers.Fail(name, detail, fix)
	}
	detail := fmt.Sprintf("%s from %s", kind, from)
	if issuer != "" {
		detail += "; token from " + issuer
	}
	if who := tokenSubject(req.Header.Get("Authorization")); who != "" {
		detail += ", for " + who
	}
	return providers.OK(name, detail)
}

// checkRegion says where the requests go, and why there.
func (p *Provider) checkRegion() providers.Check {
	var detail string
	switch c := p.cfg; {
	case c.Endpoint == "":
		detail = fmt.Sprintf("%s (%s); VPC API %s, the region's public endpoint", c.Region, given("--region", "ELASTICD_REGION", c.Region), c.serviceURL())
	case c.Region == "":
		detail = fmt.Sprintf("none given; VPC API %s (%s), whose region the group must be in", c.serviceURL(), given("--endpoint", "ELASTICD_ENDPOINT", c.Endpoint))
	default:
		detail = fmt.Sprintf("%s (%s); VPC API %s (%s)", c.Region, given("--region", "ELASTICD_REGION", c.Region), c.serviceURL(), given("--endpoint", "ELASTICD_ENDPOINT", c.Endpoint))
	}
	if u := os.Getenv("VPC_URL"); u != "" && strings.TrimRight(u, "/") != p.cfg.serviceURL() {
		detail += fmt.Sprintf("; VPC_URL (%s) is not used: the endpoint is --region's or --endpoint", u)
	}
	return providers.OK("region", detail)
}

// given names where a flag's value came from: its environment variable when that holds it.
func given(flag, env, value string) string {
	if os.Getenv(env) == value {
		return env
	}
	return flag
}

// checkRead is what Check's reads found: each read's error (nil: answered), and whether
// it was made.
type checkRead struct {
	groupID string
	byName  bool
	// list: GET /instance_groups; read: the first failed of GET the group, its managers and
	// its memberships; instances: GET /instances, one item.
	list, read, instances error
	readMade              bool
	state                 groupState
	members               map[string]membership
}

// readForCheck makes the reads of a job: the group looked up afresh, then read with its
// managers and memberships, then one of its instances listed. Each needs the one before,
// but the instances listing, which needs only the credentials.
func (p *Provider) readForCheck(ctx context.Context) checkRead {
	var r checkRead
	// Looked up afresh, so that the listing's permission is proven even when a poll already
	// found the group.
	p.groupID = ""
	r.list = p.resolve(ctx)
	if r.list == nil {
		r.groupID, r.byName = p.groupID, p.groupID != p.cfg.InstanceGroup
		r.readMade = true
		r.state, r.read = p.readGroup(ctx)
		if r.read == nil {
			r.members, r.read = p.memberships(ctx)
			r.read = p.groupGone(r.read)
		}
	}
	r.instances = p.call(ctx, opInstances, "list the group's instances", func() (*core.DetailedResponse, error) {
		opts := &vpcv1.ListInstancesOptions{Limit: core.Int64Ptr(1)}
		if r.groupID != "" {
			opts.InstanceGroupMembershipInstanceGroupID = &r.groupID
		}
		_, resp, err := p.api.ListInstancesWithContext(ctx, opts)
		return resp, err
	})
	return r
}

// apiFailed reports whether err is a request that failed, rather than a lookup that found no
// group, or several: resolve wraps the former (with "looking the group up"), not the latter.
func apiFailed(err error) bool { return err != nil && errors.Unwrap(err) != nil }

// fixFor is the fix of a failed read: the role for a refusal, the credentials for a token
// the API refused, else the flags that say where the API is.
func fixFor(err error, service string) string {
	switch statusOf(err) {
	case http.StatusForbidden:
		return fmt.Sprintf(fixViewer, service)
	case http.StatusUnauthorized:
		return "use credentials of the group's account that IBM accepts: check the API key (IBMCLOUD_API_KEY, VPC_APIKEY) or the trusted profile (" + docCredentials + ")"
	}
	return "check --region or --endpoint, that this machine reaches the VPC API, and try again (a throttled or failing API passes)"
}

// group is the "group" line.
func (r checkRead) group(cfg Config) providers.Check {
	const name = "group"
	switch {
	case statusOf(r.list) == http.StatusForbidden:
		return providers.Skipped(name, "the credentials may not list instance groups (see permission "+actionListGroups+")", "")
	case apiFailed(r.list):
		return providers.Fail(name, r.list.Error(), fixFor(r.list, "Auto Scale for VPC (is.instance-group)"))
	case r.list != nil:
		return providers.Fail(name, fmt.Sprintf("instance group %q (%s): %v", cfg.InstanceGroup, cfg.where(), r.list),
			"give --instance-group the group's name or ID as `ibmcloud is instance-groups` lists it, and --region the group's region; "+
				"a listing shows only the groups the credentials may read, so the key's identity needs the Viewer role on Auto Scale for VPC for the group ("+docCredentials+")")
	}
	how := "by ID"
	if r.byName {
		how = "by name"
	}
	found := fmt.Sprintf("%q found %s (ID %s)", cfg.InstanceGroup, how, r.groupID)
	switch {
	case statusOf(r.read) == http.StatusForbidden:
		return providers.OK(name, found+"; its details could not be read (see permission "+actionReadGroup+")")
	case r.read != nil:
		return providers.Fail(name, found+"; reading it: "+r.read.Error(), fixFor(r.read, "Auto Scale for VPC (is.instance-group)"))
	}
	detail := fmt.Sprintf("%s: membership_count %d, status %s, %s", found, r.state.desired, r.state.status, memberCounts(r.members))
	switch r.state.status {
	case vpcv1.InstanceGroupStatusDeletingConst:
		return providers.Fail(name, detail, "the group is being deleted: give --instance-group another group")
	case vpcv1.InstanceGroupStatusUnhealthyConst:
		detail += " (unhealthy: some members fail their health checks, or cannot be made; see the group in the console)"
	}
	return providers.OK(name, detail)
}

// memberCounts is "3 memberships (2 healthy, 1 pending)".
func memberCounts(members map[string]membership) string {
	by := make(map[string]int)
	for _, m := range members {
		by[m.status]++
	}
	s := fmt.Sprintf("%d memberships", len(members))
	if len(members) == 1 {
		s = "1 membership"
	}
	if len(by) == 0 {
		return s
	}
	var parts []string
	for _, st := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%d %s", by[st], st))
	}
	return s + " (" + strings.Join(parts, ", ") + ")"
}

// managers is the "group managers" line: what else sets the group's size, and what
// --manage-capacity does to it.
func (r checkRead) managers(needs providers.CheckNeeds) providers.Check {
	const name = "group managers"
	if !r.readMade || r.read != nil {
		return providers.Skipped(name, "the group could not be read (see group)", "")
	}
	g := r.state
	var parts []string
	if m := g.scaler; m != nil {
		s := fmt.Sprintf("autoscale manager %q enabled (min %d, max %d)", m.name, m.min, m.max)
		if needs.ManageCapacity {
			s += fmt.Sprintf(": with --manage-capacity elasticd disables it at its first resize, as IBM requires before membership_count is set, "+
				"and leaves it disabled (turn it back on yourself after the job); a size above %d is refused while it is enabled, "+
				"and once it is disabled the group's maximum is %d, the API's limit", m.max, maxMembershipCount)
		} else {
			s += ": it sets the group's size, and elasticd runs on the members it keeps"
		}
		parts = append(parts, s)
	}
	if g.scheduled != "" {
		s := fmt.Sprintf("scheduled manager %q enabled: its actions set the group's size at their times", g.scheduled)
		if needs.ManageCapacity {
			s += ", over elasticd's; elasticd does not disable it"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		s := "none enabled: the group's size is its membership_count"
		if needs.ManageCapacity {
			s += fmt.Sprintf(", which elasticd sets (0 to %d, the API's limit)", maxMembershipCount)
		}
		parts = append(parts, s)
	}
	return providers.OK(name, strings.Join(parts, "; "))
}

// permissions are the read permissions, as the reads answered.
func (r checkRead) permissions() []providers.Check {
	line := func(action, calls, service string, err error, made, seeGroup bool, notMade string) providers.Check {
		name := "permission " + action
		switch {
		case !made:
			return providers.Skipped(name, notMade, "")
		case err == nil:
			return providers.OK(name, calls+" answered")
		case statusOf(err) == http.StatusForbidden:
			return providers.Fail(name, calls+" refused: "+err.Error(), fmt.Sprintf(fixViewer, service))
		}
		if seeGroup {
			return providers.Skipped(name, "not known: the request failed (see group)", "")
		}
		return providers.Skipped(name, "not known: "+err.Error(), "")
	}
	listErr := r.list
	if !apiFailed(listErr) {
		listErr = nil // the listing answered; the group was not in it
	}
	readMissing := "the group was not found (see group)"
	if apiFailed(r.list) {
		readMissing = "the instance groups could not be listed (see group)"
	}
	return []providers.Check{
		line(actionListGroups, "GET /instance_groups", "Auto Scale for VPC (is.instance-group)", listErr, true, true, ""),
		line(actionReadGroup, "GET /instance_groups/{id}, its managers and its memberships", "Auto Scale for VPC (is.instance-group)", r.read, r.readMade, true, readMissing),
		line(actionListInstances, "GET /instances", "Virtual Server for VPC (is.instance)", r.instances, true, false, ""),
	}
}

// changes are the permissions --manage-capacity needs, none of which can be verified.
func changes(needs providers.CheckNeeds) []providers.Check {
	if !needs.ManageCapacity {
		return nil
	}
	fix := "grant the Editor role on Auto Scale for VPC (is.instance-group) for the instance group (" + docSteering + ")"
	return []providers.Check{
		providers.Skipped("permission "+actionUpdateGroup+" (update_instance_group)",
			noAskingIBM+"; elasticd sets the group's size with PATCH /instance_groups/{id} (membership_count)", fix),
		providers.Skipped("permission "+actionUpdateGroup+" (update_instance_group_manager)",
			noAskingIBM+"; elasticd disables an enabled autoscale manager with PATCH /instance_groups/{id}/managers/{id} before its first resize", fix),
		providers.Skipped("permission "+actionUpdateGroup+" (delete_instance_group_membership)",
			noAskingIBM+"; elasticd replaces a broken member with DELETE /instance_groups/{id}/memberships/{id}, which deletes its instance too",
			"grant the Editor role on Auto Scale for VPC (is.instance-group) for the instance group, and on Virtual Server for VPC (is.instance) for its instances ("+docSteering+")"),
	}
}

// credentialSource says where authenticator (config.go) found the credentials, in its order.
func credentialSource(cfg Config) string {
	if cfg.Authenticator != nil {
		return "the program (Config.Authenticator)"
	}
	props, _ := core.GetServiceProperties(vpcv1.DefaultServiceName)
	if props["AUTH_TYPE"] != "" || props["AUTHTYPE"] != "" || props["APIKEY"] != "" {
		// The SDK takes the first credentials file it finds, if it holds any VPC_ line, and
		// only then the environment.
		if f := credentialsFile(); f != "" && holdsVPC(f) {
			return "the credentials file " + f
		}
		var set []string
		for _, k := range []string{"VPC_AUTH_TYPE", "VPC_AUTHTYPE", "VPC_APIKEY", "VPC_IAM_PROFILE_ID", "VPC_IAM_PROFILE_CRN", "VPC_IAM_PROFILE_NAME", "VPC_AUTH_URL"} {
			if os.Getenv(k) != "" {
				set = append(set, k)
			}
		}
		if len(set) > 0 {
			return "the environment (" + strings.Join(set, ", ") + ")"
		}
		return "VCAP_SERVICES"
	}
	for _, name := range apiKeyVars {
		if strings.TrimSpace(os.Getenv(name)) != "" {
			return name
		}
	}
	return "nowhere known"
}

// credentialsFile is the file the SDK reads: $IBM_CREDENTIALS_FILE, else ibm-credentials.env
// in the working directory, else in the home directory; "" when none is there.
func credentialsFile() string {
	var paths []string
	if f := os.Getenv(core.IBM_CREDENTIAL_FILE_ENVVAR); f != "" {
		paths = append(paths, f)
	}
	if dir, err := os.Getwd(); err == nil {
		paths = append(paths, filepath.Join(dir, core.DEFAULT_CREDENTIAL_FILE_NAME))
	}
	paths = append(paths, filepath.Join(core.UserHomeDir(), core.DEFAULT_CREDENTIAL_FILE_NAME))
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// holdsVPC reports whether a credentials file has a VPC_ setting.
func holdsVPC(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, _, ok := strings.Cut(strings.TrimSpace(s.Text()), "=")
		if ok && strings.HasPrefix(k, "VPC_") && len(k) > len("VPC_") {
			return true
		}
	}
	return false
}

// authKind names the kind of credentials and who issues their tokens ("" when none does).
func authKind(a core.Authenticator) (kind, issuer string) {
	switch a := a.(type) {
	case *core.IamAuthenticator:
		return "an IAM API key", cmp.Or(a.URL, "https://iam.cloud.ibm.com")
	case *core.VpcInstanceAuthenticator:
		return "a trusted profile through the instance's metadata service", cmp.Or(a.URL, "http://169.254.169.254")
	case *core.ContainerAuthenticator:
		return "a trusted profile with a compute resource token", cmp.Or(a.URL, "https://iam.cloud.ibm.com")
	case *core.NoAuthAuthenticator:
		return "no authentication", ""
	}
	return "credentials of type " + a.AuthenticationType(), "their issuer"
}

// tokenSubject is who an IAM access token is for, from its claims: "iam-ServiceId-… in
// account …"; "" when the header holds no such token.
func tokenSubject(header string) string {
	token, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return ""
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return ""
	}
	var claims struct {
		IAMID   string `json:"iam_id"`
		Sub     string `json:"sub"`
		Account struct {
			BSS string `json:"bss"`
		} `json:"account"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return ""
	}
	who := cmp.Or(claims.IAMID, claims.Sub)
	if who == "" {
		return ""
	}
	if claims.Account.BSS != "" {
		who += " in account " + claims.Account.BSS
	}
	return who
}
