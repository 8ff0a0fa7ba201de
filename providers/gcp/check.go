package gcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/auth"
	"cloud.google.com/go/auth/credentials"
	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"cloud.google.com/go/compute/metadata"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/cloudresourcemanager/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/elasticd/elasticd/providers"
)

// Checking a job before it starts (providers.Checker). Check finds the credentials as the
// provider's clients will (Application Default Credentials, unless Config.ClientOptions
// say otherwise) and has them give a token; reads the MIG (instanceGroupManagers.get), its
// instance template and its autoscaler; and asks Cloud Resource Manager which of the
// permissions the job needs the credentials hold on the project
// (projects.testIamPermissions, which needs no permission itself). It changes nothing.
//
// With Config.Endpoint set, the permission query goes to that same root
// (ENDPOINT/v1/projects/P:testIamPermissions): a Private Service Connect endpoint for all
// Google APIs, or a proxy in front of them, serves both APIs. One that serves only Compute
// Engine answers it with an error, and the permission lines are then skipped, saying so.

// The permissions a job needs besides those of capacity.go, and the one the group's
// instance template is read with (for the check's detail only: no job needs it).
const (
	permList       = "compute.instances.list"
	permZoneOps    = "compute.zoneOperations.get"
	permRegionOps  = "compute.regionOperations.get"
	permTemplate   = "compute.instanceTemplates.get"
	roleViewer     = "roles/compute.viewer"
	roleAdmin      = "roles/compute.instanceAdmin.v1"
	epTestIAM      = "projects.testIamPermissions"
	epTemplate     = "instanceTemplates.get"
	checkTimeout   = 15 * time.Second // each of the check's requests
	scopePrefix    = "https://www.googleapis.com/auth/"
	docPermissions = "docs/providers/gcp.md, Permissions"
	docSteering    = "docs/providers/gcp.md, Steering the group"
)

// need is one permission the job needs: what needs it, a predefined role that has it, and
// the doc section that lists it.
type need struct{ perm, usedBy, role, doc string }

// needs are the permissions the job's flags need, in the order they are reported;
// autoscalers.get is added by Check when the group has an autoscaler.
func (p *Provider) needs(n providers.CheckNeeds) []need {
	igm, ops, opsPerm := "instanceGroupManagers", "zoneOperations.get", permZoneOps
	if p.cfg.Region != "" {
		igm, ops, opsPerm = "regionInstanceGroupManagers", "regionOperations.get", permRegionOps
	}
	ns := []need{
		{permGet, igm + ".listManagedInstances (discovery)", roleViewer, docPermissions},
		{permList, "instances.list in each zone of the group (discovery)", roleViewer, docPermissions},
	}
	if n.ManageCapacity {
		ns[0].usedBy = igm + ".listManagedInstances (discovery), .get and .listErrors (--manage-capacity)"
		ns = append(ns,
			need{permUpdate, igm + ".resize and .recreateInstances (--manage-capacity)", roleAdmin, docSteering},
			need{opsPerm, ops + ", to wait for a resize or a recreate (--manage-capacity)", roleViewer, docSteering})
	}
	return ns
}

// Where Application Default Credentials come from, in the order they are looked for.
const (
	fromOptions  = "options"  // Config.ClientOptions: set in code
	fromEnv      = "env"      // GOOGLE_APPLICATION_CREDENTIALS
	fromGcloud   = "gcloud"   // gcloud's ADC file
	fromMetadata = "metadata" // the metadata server of a Compute Engine VM
)

// identity is what the check learned of the credentials.
type identity struct {
	ok      bool
	creds   *auth.Credentials // nil when Config.ClientOptions chose them
	source  string            // one of the from… constants
	path    string            // the file, for fromEnv and fromGcloud
	typ     string            // the file's "type": service_account, authorized_user, …
	email   string            // the service account, where the credentials say
	project string            // the credentials' own project, where they say
	scopes  []string          // the VM's access scopes, for fromMetadata
}

// Check verifies, without changing anything, what the job's flags need of Google Cloud, one
// line per thing: "credentials" (found, from where, as whom, and a token had with them),
// "access scopes" (on a Compute Engine VM), "project", "location", "group" (the MIG, its
// targetSize and template), "autoscaler" (when one is attached: with
// needs.ManageCapacity, one whose mode is not OFF fails), and "permission P" for each
// permission needed, as projects.testIamPermissions answers on the project ("permissions",
// skipped, when it cannot be asked). Without credentials the rest is skipped. A MIG takes
// no claim tag, so there is nothing to check of a claim.
func (p *Provider) Check(ctx context.Context, n providers.CheckNeeds) []providers.Check {
	id, out := p.checkCredentials(ctx, n)
	out = append(out, p.projectCheck(id), p.locationCheck())
	if !id.ok {
		why := "no usable credentials (see credentials)"
		return append(out, providers.Skipped("group", why, ""), providers.Skipped("permissions", why, ""))
	}

	// The permissions first: a group that cannot be read for want of one is then said once.
	ns := p.needs(n)
	ask := make([]string, 0, len(ns)+1)
	for _, x := range ns {
		ask = append(ask, x.perm)
	}
	if n.ManageCapacity {
		ask = append(ask, permAutoscaler) // reported only when the group has an autoscaler
	}
	held, notAsked := p.askPermissions(ctx, id, ask)

	group, autoscaler, attached := p.checkGroup(ctx, n, id, held)
	out = append(out, group)
	if autoscaler != nil {
		out = append(out, *autoscaler)
	}
	if attached && n.ManageCapacity {
		ns = append(ns, need{permAutoscaler, "autoscalers.get, to read the attached autoscaler's mode and maxNumReplicas (--manage-capacity)",
			roleViewer, docSteering})
	}
	if notAsked != nil {
		perms := make([]string, len(ns))
		for i, x := range ns {
			perms[i] = x.perm
		}
		return append(out, providers.Skipped("permissions",
			fmt.Sprintf("%s; not checked: %s", notAsked.why, strings.Join(perms, ", ")), notAsked.fix))
	}
	for _, x := range ns {
		name := "permission " + x.perm
		if held[x.perm] {
			out = append(out, providers.OK(name, fmt.Sprintf("held on project %q: %s", p.cfg.Project, x.usedBy)))
			continue
		}
		out = append(out, providers.Fail(name,
			fmt.Sprintf("not held on project %q; needed by %s", p.cfg.Project, x.usedBy),
			fmt.Sprintf("grant %s on project %s, e.g. with %s: gcloud projects add-iam-policy-binding %s --member %s --role %s "+
				"(or a custom role with it: %s)", x.perm, p.cfg.Project, x.role, p.cfg.Project, id.member(), x.role, x.doc)))
	}
	return out
}

// checkCredentials finds the credentials as the provider's clients will and has them give
// a token. Its checks are "credentials", and "access scopes" for a VM's service account.
func (p *Provider) checkCredentials(ctx context.Context, n providers.CheckNeeds) (identity, []providers.Check) {
	if len(p.cfg.ClientOptions) > 0 {
		return identity{ok: true, source: fromOptions}, []providers.Check{providers.OK("credentials",
			"set in code (gcp.Config.ClientOptions), not looked up in Application Default Credentials: "+
				"the calls below show whether they serve")}
	}
	id := identity{source: fromMetadata}
	if env := os.Getenv("GOOGLE_APPLICATION_CREDENTIALS"); env != "" {
		id.source, id.path = fromEnv, env
	} else if f := wellKnownFile(); readable(f) {
		id.source, id.path = fromGcloud, f
	}
	// The options the SDK gives DetectDefault for the compute clients (see computeDefaults).
	creds, err := credentials.DetectDefault(&credentials.DetectOptions{Scopes: compute.DefaultAuthScopes()})
	if err != nil {
		if id.source == fromEnv {
			return id, []providers.Check{providers.Fail("credentials",
				fmt.Sprintf("GOOGLE_APPLICATION_CREDENTIALS=%s: %s", id.path, oneLine(err)),
				"point GOOGLE_APPLICATION_CREDENTIALS at a readable service-account key or workload identity federation "+
					"file, or unset it to use gcloud's ADC file or the VM's service account (docs/providers/gcp.md, Setup)")}
		}
		detail := "none found: GOOGLE_APPLICATION_CREDENTIALS is not set, there is no gcloud ADC file (" + wellKnownFile() +
			") and no Compute Engine metadata server"
		if id.source == fromGcloud {
			detail = fmt.Sprintf("gcloud's ADC file %s: %s", id.path, oneLine(err))
		}
		return id, []providers.Check{providers.Fail("credentials", detail,
			"on a workstation run `gcloud auth application-default login`; elsewhere set GOOGLE_APPLICATION_CREDENTIALS "+
				"to a service-account key file, or run the driver on a Compute Engine VM with a service account "+
				"(docs/providers/gcp.md, Setup)")}
	}
	id.creds = creds
	id.describe(ctx)

	tctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if _, err := creds.Token(tctx); err != nil {
		return id, []providers.Check{providers.Fail("credentials",
			fmt.Sprintf("%s, but no access token could be had with them: %s", id.String(), oneLine(err)), id.tokenFix())}
	}
	id.ok = true
	out := []providers.Check{providers.OK("credentials", id.String())}
	if id.source == fromMetadata {
		out = append(out, scopesCheck(id, n))
	}
	return id, out
}

// describe fills in the type, account and project that the credentials' file (or, on a VM,
// the metadata server) gives.
func (id *identity) describe(ctx context.Context) {
	if id.source == fromMetadata {
		id.typ = "compute"
		mctx, cancel := context.WithTimeout(ctx, checkTimeout)
		defer cancel()
		id.email, _ = metadata.EmailWithContext(mctx, "default")
		id.project, _ = metadata.ProjectIDWithContext(mctx)
		id.scopes, _ = metadata.ScopesWithContext(mctx, "default")
		return
	}
	var f struct {
		Type             string `json:"type"`
		ClientEmail      string `json:"client_email"`
		ProjectID        string `json:"project_id"`
		QuotaProjectID   string `json:"quota_project_id"`
		ImpersonationURL string `json:"service_account_impersonation_url"`
	}
	if json.Unmarshal(id.creds.JSON(), &f) != nil {
		return
	}
	id.typ, id.email, id.project = f.Type, f.ClientEmail, f.ProjectID
	if id.project == "" {
		id.project = f.QuotaProjectID
	}
	// …/projects/-/serviceAccounts/EMAIL:generateAccessToken
	if _, rest, ok := strings.Cut(f.ImpersonationURL, "/serviceAccounts/"); ok && id.email == "" {
		id.email, _, _ = strings.Cut(rest, ":")
	}
}

// String is the credentials in a line: who, from where.
func (id identity) String() string {
	var who string
	switch id.typ {
	case "service_account":
		who = fmt.Sprintf("service account %s (a key)", id.email)
	case "authorized_user":
		who = "a user's credentials (gcloud auth application-default login)"
	case "impersonated_service_account":
		who = fmt.Sprintf("service account %s, impersonated", id.email)
	case "external_account":
		who = "workload identity federation"
		if id.email != "" {
			who += ", as service account " + id.email
		}
	case "compute":
		who = "the VM's service account"
		if id.email != "" {
			who += " " + id.email
		}
	case "":
		who = "credentials of no known type"
	default:
		who = id.typ + " credentials"
		if id.email != "" {
			who += " for " + id.email
		}
	}
	switch id.source {
	case fromEnv:
		return who + ", from GOOGLE_APPLICATION_CREDENTIALS (" + id.path + ")"
	case fromGcloud:
		return who + ", from gcloud's ADC file (" + id.path + ")"
	default:
		return who + ", from the Compute Engine metadata server"
	}
}

// member is the credentials as an IAM policy member, for a fix line.
func (id identity) member() string {
	switch {
	case id.email != "":
		return "serviceAccount:" + id.email
	case id.typ == "authorized_user":
		return "user:YOUR-EMAIL"
	}
	return "MEMBER"
}

// tokenFix is what to do when the credentials give no token.
func (id identity) tokenFix() string {
	switch {
	case id.source == fromMetadata:
		return "check that the VM has a service account (gcloud compute instances describe VM --format 'value(serviceAccounts)') " +
			"and that the metadata server answers; or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key"
	case id.typ == "service_account":
		return fmt.Sprintf("the key may have been deleted or its service account disabled: make a new key "+
			"(gcloud iam service-accounts keys create KEY.json --iam-account %s) and point GOOGLE_APPLICATION_CREDENTIALS at it", id.email)
	case id.typ == "authorized_user":
		return "log in again: gcloud auth application-default login"
	}
	return "renew the credentials in " + id.path + " or point GOOGLE_APPLICATION_CREDENTIALS at a service-account key"
}

// scopesCheck is the VM's access scopes: they bound what its service account may do
// whatever IAM grants. Discovery needs compute.readonly, compute or cloud-platform;
// --manage-capacity compute or cloud-platform.
func scopesCheck(id identity, n providers.CheckNeeds) providers.Check {
	if id.scopes == nil {
		return providers.Skipped("access scopes", "the metadata server did not give the VM's access scopes", "")
	}
	has := map[string]bool{}
	short := make([]string, 0, len(id.scopes))
	for _, s := range id.scopes {
		has[strings.TrimPrefix(s, scopePrefix)] = true
		short = append(short, strings.TrimPrefix(s, scopePrefix))
	}
	list := strings.Join(short, ", ")
	full := has["cloud-platform"] || has["compute"]
	fix := "stop the VM and give it the cloud-platform scope, so that IAM alone decides: gcloud compute instances " +
		"set-service-account VM --zone ZONE --service-account " + id.email + " --scopes cloud-platform (docs/providers/gcp.md, Setup)"
	switch {
	case n.ManageCapacity && !full:
		return providers.Fail("access scopes", "the VM's access scopes ("+list+") do not let it change the group: "+
			"--manage-capacity needs compute or cloud-platform", fix)
	case !full && !has["compute.readonly"]:
		return providers.Fail("access scopes", "the VM's access scopes ("+list+") do not let it read Compute Engine: "+
			"discovery needs compute.readonly, compute or cloud-platform", fix)
	}
	return providers.OK("access scopes", list)
}

func (p *Provider) projectCheck(id identity) providers.Check {
	d := fmt.Sprintf("%q (--project)", p.cfg.Project)
	if id.project != "" && id.project != p.cfg.Project {
		d += fmt.Sprintf("; the credentials are of project %q", id.project)
	}
	return providers.OK("project", d)
}

func (p *Provider) locationCheck() providers.Check {
	if p.cfg.Region != "" {
		return providers.OK("location", fmt.Sprintf("region %q (--region): a regional MIG", p.cfg.Region))
	}
	return providers.OK("location", fmt.Sprintf("zone %q (--zone): a zonal MIG", p.cfg.Zone))
}

// notAsked says why the permissions could not be asked, and what a person can do instead.
type notAsked struct{ why, fix string }

// askPermissions asks projects.testIamPermissions which of perms the credentials hold on
// the project; when it cannot be asked, it says why.
func (p *Provider) askPermissions(ctx context.Context, id identity, perms []string) (map[string]bool, *notAsked) {
	skipped := func(why, fix string) (map[string]bool, *notAsked) {
		return nil, &notAsked{why, fix}
	}
	if id.source == fromMetadata && id.scopes != nil && !slices.ContainsFunc(id.scopes, func(s string) bool {
		s = strings.TrimPrefix(s, scopePrefix)
		return s == "cloud-platform" || s == "cloud-platform.read-only"
	}) {
		return skipped("the VM's access scopes lack cloud-platform, which projects.testIamPermissions needs",
			"see access scopes; or compare the permissions with gcloud projects get-iam-policy "+p.cfg.Project+" ("+docPermissions+")")
	}
	var opts []option.ClientOption
	where := "cloudresourcemanager.googleapis.com"
	if p.cfg.Endpoint != "" {
		// The root as the compute clients take it; the trailing slash keeps a path in it.
		opts = append(opts, option.WithEndpoint(p.cfg.Endpoint+"/"))
		where = p.cfg.Endpoint
	}
	if id.creds != nil {
		opts = append(opts, option.WithAuthCredentials(id.creds))
	}
	opts = append(opts, p.cfg.ClientOptions...)
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	svc, err := cloudresourcemanager.NewService(cctx, opts...)
	if err != nil {
		return skipped("the Cloud Resource Manager client could not be made: "+oneLine(err), "")
	}
	var resp *cloudresourcemanager.TestIamPermissionsResponse
	err = p.loop.Call(cctx, epTestIAM, func(ctx context.Context) (err error) {
		resp, err = svc.Projects.TestIamPermissions(p.cfg.Project,
			&cloudresourcemanager.TestIamPermissionsRequest{Permissions: perms}).Context(ctx).Do()
		return err
	})
	if err != nil {
		why := fmt.Sprintf("projects.testIamPermissions at %s failed: %s", where, apiMessage(err))
		fix := "compare the permissions with gcloud projects get-iam-policy " + p.cfg.Project + " (" + docPermissions + ")"
		var ge *googleapi.Error
		switch {
		case reason(err) == "SERVICE_DISABLED" || reason(err) == "accessNotConfigured":
			fix = "enable the Cloud Resource Manager API in the credentials' project (gcloud services enable " +
				"cloudresourcemanager.googleapis.com), or " + fix
		case strings.Contains(strings.ToLower(apiMessage(err)), "quota project"):
			fix = "set a quota project for your ADC (gcloud auth application-default set-quota-project " + p.cfg.Project + "), or " + fix
		case errors.As(err, &ge) && ge.Code == http.StatusForbidden:
			why = fmt.Sprintf("projects.testIamPermissions was refused (%s)", apiMessage(err))
			fix = "check --project, or " + fix
		case p.cfg.Endpoint != "":
			fix = "--endpoint must serve Cloud Resource Manager too for the permissions to be asked (a Private Service " +
				"Connect endpoint for all Google APIs does); or " + fix
		}
		return skipped(why, fix)
	}
	held := map[string]bool{}
	for _, h := range resp.Permissions {
		held[h] = true
	}
	return held, nil
}

// checkGroup reads the MIG, its template and its autoscaler. It returns the "group" line,
// the "autoscaler" line when one is attached, and whether one is. held is what
// testIamPermissions said (nil when it could not be asked).
func (p *Provider) checkGroup(ctx context.Context, n providers.CheckNeeds, id identity, held map[string]bool) (group providers.Check, as *providers.Check, attached bool) {
	if held != nil && !held[permGet] {
		return providers.Skipped("group", "cannot be read without "+permGet+" (see its permission line)", ""), nil, false
	}
	loc, other := "--zone", "a regional MIG takes --region instead of --zone"
	if p.cfg.Region != "" {
		loc, other = "--region", "a zonal MIG takes --zone instead of --region"
	}
	cctx, cancel := context.WithTimeout(ctx, 3*checkTimeout)
	defer cancel()
	var igm *computepb.InstanceGroupManager
	var tmpl string
	var asCheck *providers.Check
	err := p.withAPI(cctx, func(api computeAPI) error {
		err := p.loop.Call(cctx, epGet, func(ctx context.Context) (err error) {
			igm, err = api.getGroup(ctx)
			return err
		})
		if err != nil {
			return err
		}
		tmpl = p.describeTemplate(cctx, api, igm)
		if url := igm.GetStatus().GetAutoscaler(); url != "" {
			c := p.checkAutoscaler(cctx, api, n, lastSegment(url), held)
			asCheck = &c
		}
		return nil
	})
	if err != nil {
		var ge *googleapi.Error
		code := 0
		if errors.As(err, &ge) {
			code = ge.Code
		}
		switch {
		case code == http.StatusNotFound:
			return providers.Fail("group", fmt.Sprintf("%s was not found (HTTP 404)", p.where),
				fmt.Sprintf("check --mig, --project and %s (%s); gcloud compute instance-groups managed list --project %s "+
					"lists the project's groups and their locations", loc, other, p.cfg.Project)), nil, false
		case code == http.StatusUnauthorized:
			return providers.Fail("group", "the credentials were refused (HTTP 401): "+apiMessage(err), id.tokenFix()), nil, false
		case code == http.StatusForbidden && (reason(err) == "SERVICE_DISABLED" || reason(err) == "accessNotConfigured"):
			return providers.Fail("group", "the Compute Engine API is not enabled: "+apiMessage(err),
				"gcloud services enable compute.googleapis.com --project "+p.cfg.Project), nil, false
		case code == http.StatusForbidden && !rateLimited(ge):
			return providers.Fail("group", "cannot be read, permission denied: "+apiMessage(err),
				fmt.Sprintf("grant %s on project %s (e.g. %s: %s)", permGet, p.cfg.Project, roleViewer, docPermissions)), nil, false
		}
		return providers.Fail("group", "cannot be read: "+apiMessage(err),
			"check --endpoint and the network, and run the check again"), nil, false
	}
	d := fmt.Sprintf("MIG %q: targetSize %d, %d managed instances", igm.GetName(), igm.GetTargetSize(), instancesOf(igm.GetCurrentActions()))
	if tmpl != "" {
		d += ", " + tmpl
	}
	if asCheck == nil {
		d += ", no autoscaler"
	} else {
		d += ", an autoscaler attached"
	}
	return providers.OK("group", d), asCheck, asCheck != nil
}

// describeTemplate is the group's instance template, with its machine type and provisioning
// model when the template can be read (compute.instanceTemplates.get, which no job needs).
func (p *Provider) describeTemplate(ctx context.Context, api computeAPI, igm *computepb.InstanceGroupManager) string {
	url := igm.GetInstanceTemplate()
	if url == "" {
		for _, v := range igm.GetVersions() {
			if url = v.GetInstanceTemplate(); url != "" {
				break
			}
		}
	}
	if url == "" {
		return "no instance template"
	}
	d := "template " + lastSegment(url)
	a, ok := api.(*sdkAPI)
	if !ok {
		return d
	}
	var t *computepb.InstanceTemplate
	err := p.loop.Call(ctx, epTemplate, func(ctx context.Context) (err error) {
		t, err = a.getTemplate(ctx, url)
		return err
	})
	if err != nil {
		var ge *googleapi.Error
		if errors.As(err, &ge) && ge.Code == http.StatusForbidden {
			return d + " (not read: " + permTemplate + " is not held, and no job needs it)"
		}
		return d + " (not read: " + apiMessage(err) + ")"
	}
	props := t.GetProperties()
	var more []string
	if mt := props.GetMachineType(); mt != "" {
		more = append(more, lastSegment(mt))
	}
	s := props.GetScheduling()
	switch {
	case s.GetProvisioningModel() != "":
		more = append(more, s.GetProvisioningModel())
	case s.GetPreemptible():
		more = append(more, "preemptible")
	}
	if len(more) > 0 {
		d += " (" + strings.Join(more, ", ") + ")"
	}
	return d
}

// getTemplate reads an instance template, global or regional, by its URL: one request,
// through a client made for it from the provider's HTTP client.
func (a *sdkAPI) getTemplate(ctx context.Context, url string) (*computepb.InstanceTemplate, error) {
	parts := strings.Split(resourcePath(url), "/") // projects/P/global/instanceTemplates/T or projects/P/regions/R/instanceTemplates/T
	mk := context.WithoutCancel(ctx)
	switch {
	case len(parts) == 5 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "instanceTemplates":
		c, err := compute.NewInstanceTemplatesRESTClient(mk, a.opts...)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.Get(ctx, &computepb.GetInstanceTemplateRequest{Project: parts[1], InstanceTemplate: parts[4]}, noRetry)
	case len(parts) == 6 && parts[0] == "projects" && parts[2] == "regions" && parts[4] == "instanceTemplates":
		c, err := compute.NewRegionInstanceTemplatesRESTClient(mk, a.opts...)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.Get(ctx, &computepb.GetRegionInstanceTemplateRequest{Project: parts[1], Region: parts[3], InstanceTemplate: parts[5]}, noRetry)
	}
	return nil, fmt.Errorf("unexpected template URL %q", url)
}

// checkAutoscaler is the "autoscaler" line: with --manage-capacity an autoscaler whose mode
// is not OFF fails, as SetDesired refuses to resize against it.
func (p *Provider) checkAutoscaler(ctx context.Context, api computeAPI, n providers.CheckNeeds, name string, held map[string]bool) providers.Check {
	if n.ManageCapacity && held != nil && !held[permAutoscaler] {
		return providers.Skipped("autoscaler", fmt.Sprintf("%q is attached; its mode cannot be read without %s (see its permission line)",
			name, permAutoscaler), "")
	}
	var as *computepb.Autoscaler
	err := p.loop.Call(ctx, epAutoscaler, func(ctx context.Context) (err error) {
		as, err = api.getAutoscaler(ctx, name)
		return err
	})
	if err != nil {
		if n.ManageCapacity {
			return providers.Fail("autoscaler", fmt.Sprintf("%q is attached and cannot be read: %s", name, apiMessage(err)),
				fmt.Sprintf("grant %s on project %s (e.g. %s): --manage-capacity reads its mode before a resize (%s)",
					permAutoscaler, p.cfg.Project, roleViewer, docSteering))
		}
		return providers.OK("autoscaler", fmt.Sprintf("%q is attached (not read: %s); it sizes the group, "+
			"which elasticd only reads without --manage-capacity", name, apiMessage(err)))
	}
	pol := as.GetAutoscalingPolicy()
	mode := pol.GetMode()
	if mode == "" {
		mode = "ON" // the API's default
	}
	d := fmt.Sprintf("%q is attached, mode %s (min %d, max %d)", name, mode, pol.GetMinNumReplicas(), pol.GetMaxNumReplicas())
	switch {
	case !n.ManageCapacity:
		return providers.OK("autoscaler", d+"; without --manage-capacity elasticd only reads the group")
	case mode != "OFF":
		flag := "--zone " + p.cfg.Zone
		if p.cfg.Region != "" {
			flag = "--region " + p.cfg.Region
		}
		return providers.Fail("autoscaler", d+": it sets the group's size and ignores or rejects a resize, so --manage-capacity cannot steer the group",
			fmt.Sprintf("set its mode to OFF (gcloud compute instance-groups managed update-autoscaling %s %s --project %s --mode off) "+
				"or remove it (… stop-autoscaling), or run without --manage-capacity (%s)", p.cfg.MIG, flag, p.cfg.Project, docSteering))
	}
	return providers.OK("autoscaler", fmt.Sprintf("%s: elasticd sizes the group, up to its maxNumReplicas %d", d, pol.GetMaxNumReplicas()))
}

// wellKnownFile is gcloud's ADC file, where Application Default Credentials look for it
// (cloud.google.com/go/auth: %APPDATA%\gcloud on Windows, else $HOME/.config/gcloud).
func wellKnownFile() string {
	const name = "application_default_credentials.json"
	if runtime.GOOS == "windows" {
		return filepath.Join(os.Getenv("APPDATA"), "gcloud", name)
	}
	home := os.Getenv("HOME")
	if home == "" {
		if u, err := user.Current(); err == nil {
			home = u.HomeDir
		}
	}
	return filepath.Join(home, ".config", "gcloud", name)
}

func readable(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// apiMessage is an API error in a line: "HTTP 403: message" when the API said why.
func apiMessage(err error) string {
	var ge *googleapi.Error
	if errors.As(err, &ge) && ge.Message != "" {
		return fmt.Sprintf("HTTP %d: %s", ge.Code, oneLine(errors.New(ge.Message)))
	}
	return oneLine(err)
}

// reason is the API error's reason: its ErrorInfo's, else its first errors[].reason.
func reason(err error) string {
	var ae *apierror.APIError
	if errors.As(err, &ae) && ae.Reason() != "" {
		return ae.Reason()
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) && len(ge.Errors) > 0 {
		return ge.Errors[0].Reason
	}
	return ""
}

// oneLine is err's text with its line breaks folded, for a check's detail.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

var _ providers.Checker = (*Provider)(nil)
