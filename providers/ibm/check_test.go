package ibm_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/ibm"
	"github.com/elasticd/elasticd/providers/providertest"
)

// The names Check returns, in order: without and with --manage-capacity.
var (
	checkNames = []string{
		"credentials", "region", "group", "group managers",
		"permission is.instance-group.instance-group.list",
		"permission is.instance-group.instance-group.read",
		"permission is.instance.instance.list",
	}
	changeNames = []string{
		"permission is.instance-group.instance-group.update (update_instance_group)",
		"permission is.instance-group.instance-group.update (update_instance_group_manager)",
		"permission is.instance-group.instance-group.update (delete_instance_group_membership)",
	}
)

// runCheck runs Check and makes sure of what every check must hold: the names, in order;
// a fix on every failure; no request that changes anything.
func runCheck(t *testing.T, f *fakeVPC, p *ibm.Provider, needs providers.CheckNeeds) providers.Checks {
	t.Helper()
	cs := providers.Checks(p.Check(bounded(t), needs))
	for _, c := range cs {
		t.Logf("%s", c)
		if c.Status == providers.CheckFail && c.Fix == "" {
			t.Errorf("%s failed with no fix", c.Name)
		}
		if c.Detail == "" {
			t.Errorf("%s has no detail", c.Name)
		}
	}
	want := slices.Clone(checkNames)
	if needs.ManageCapacity {
		want = append(want, changeNames...)
	}
	if names := cs.Names(); !slices.Equal(names, want) {
		t.Errorf("checks %q; want %q", names, want)
	}
	for _, ep := range []string{epUpdateGroup, epUpdateManager, epDeleteMembership} {
		if n := f.count(ep); n != 0 {
			t.Errorf("Check made %d %s requests; it must change nothing", n, ep)
		}
	}
	return cs
}

// wantCheck fails unless the check has the status and its detail and fix, together, say
// every part.
func wantCheck(t *testing.T, cs providers.Checks, name string, status providers.CheckStatus, parts ...string) {
	t.Helper()
	c, ok := cs.Find(name)
	if !ok {
		t.Errorf("no check %q in %q", name, cs.Names())
		return
	}
	if c.Status != status {
		t.Errorf("%s: %s; want %s", name, c, status)
	}
	for _, p := range parts {
		if !strings.Contains(c.Detail+" fix: "+c.Fix, p) {
			t.Errorf("%s: %s; want it to say %q", name, c, p)
		}
	}
}

// iamProvider is a provider of the fake's group that gets its credentials as a user would,
// from VPC_AUTH_TYPE, VPC_APIKEY and VPC_AUTH_URL (the fake IAM iam).
func iamProvider(t *testing.T, f *fakeVPC, iamURL, key string, cfg ibm.Config) *ibm.Provider {
	t.Helper()
	clearCredentials(t)
	t.Setenv("VPC_AUTH_TYPE", "iam")
	t.Setenv("VPC_APIKEY", key)
	t.Setenv("VPC_AUTH_URL", iamURL)
	cfg.InstanceGroup = cmpOr(cfg.InstanceGroup, groupName)
	cfg.Region = cmpOr(cfg.Region, "us-south")
	cfg.Endpoint = f.base
	p, err := ibm.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func TestCheckAllFine(t *testing.T) {
	f := newFake(t, instances(3)...)
	iam := newIAMAs(t, "iam-ServiceId-5c3f0a2e", "aa2432b1fa4d4ace891e9b80fc104e34")
	t.Setenv("ELASTICD_REGION", "")
	cs := runCheck(t, f, iamProvider(t, f, iam.URL, "good-key", ibm.Config{}), providers.CheckNeeds{ManageCapacity: true})

	wantCheck(t, cs, "credentials", providers.CheckOK, "an IAM API key from the environment (VPC_AUTH_TYPE, VPC_APIKEY, VPC_AUTH_URL)",
		"token from "+iam.URL, "for iam-ServiceId-5c3f0a2e in account aa2432b1fa4d4ace891e9b80fc104e34")
	wantCheck(t, cs, "region", providers.CheckOK, "us-south (--region)", f.base+" (--endpoint)")
	wantCheck(t, cs, "group", providers.CheckOK, `"gpu-spot" found by name (ID r006-ig-gpu-spot)`,
		"membership_count 3", "status healthy", "3 memberships (3 healthy)")
	wantCheck(t, cs, "group managers", providers.CheckOK, "none enabled", "which elasticd sets (0 to 1000")
	wantCheck(t, cs, "permission is.instance-group.instance-group.list", providers.CheckOK, "GET /instance_groups answered")
	wantCheck(t, cs, "permission is.instance-group.instance-group.read", providers.CheckOK, "GET /instance_groups/{id}, its managers and its memberships answered")
	wantCheck(t, cs, "permission is.instance.instance.list", providers.CheckOK, "GET /instances answered")
	for _, name := range changeNames {
		wantCheck(t, cs, name, providers.CheckSkipped, "IBM Cloud has no call that says whether credentials may make a change without making it",
			"the Editor role on Auto Scale for VPC (is.instance-group)", `docs/providers/ibm.md, "Steering the group"`)
	}
	wantCheck(t, cs, changeNames[0], providers.CheckSkipped, "PATCH /instance_groups/{id} (membership_count)")
	wantCheck(t, cs, changeNames[1], providers.CheckSkipped, "PATCH /instance_groups/{id}/managers/{id}")
	wantCheck(t, cs, changeNames[2], providers.CheckSkipped, "DELETE /instance_groups/{id}/memberships/{id}", "Virtual Server for VPC (is.instance)")

	// The reads a job makes, each once: the lookup, the group, its managers, its memberships,
	// one instance of it.
	for _, ep := range []string{epGroups, epGroup, epManagers, epMemberships, epInstances} {
		if n := f.count(ep); n != 1 {
			t.Errorf("%d %s requests; want 1", n, ep)
		}
	}
	if r := f.requests(epInstances); len(r) == 1 && (!strings.Contains(r[0].query, "limit=1&") && !strings.HasSuffix(r[0].query, "limit=1") ||
		!strings.Contains(r[0].query, "instance_group_membership.instance_group.id="+groupID)) {
		t.Errorf("GET /instances?%s; want one instance of the group (limit=1, instance_group_membership.instance_group.id)", r[0].query)
	}
}

// TestCheckWithoutManageCapacity: no change permission is listed, and an enabled autoscale
// manager is said to set the size, not to be disabled.
func TestCheckWithoutManageCapacity(t *testing.T) {
	f := newFake(t, instances(2)...)
	f.update(func(f *fakeVPC) { f.managers = []fakeManager{autoscaler(1, 8)} })
	cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{})
	wantCheck(t, cs, "credentials", providers.CheckOK, "no authentication from the program (Config.Authenticator)")
	wantCheck(t, cs, "group managers", providers.CheckOK, `autoscale manager "gpu-autoscaler" enabled (min 1, max 8): it sets the group's size`)
	if d := providertest.CheckLine(t, cs, "group managers").Detail; strings.Contains(d, "disable") {
		t.Errorf("group managers: %q; without --manage-capacity nothing is disabled", d)
	}
}

// TestCheckAutoscaleManager: with --manage-capacity, an enabled autoscale manager is said to
// be disabled at the first resize, with the maximum before and after; Check leaves it
// enabled.
func TestCheckAutoscaleManager(t *testing.T) {
	f := newFake(t, instances(2)...)
	f.update(func(f *fakeVPC) {
		f.managers = []fakeManager{autoscaler(1, 8), {ID: "r006-igm-nightly", Name: "nightly", Type: "scheduled", Enabled: true}}
	})
	cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{ManageCapacity: true})
	wantCheck(t, cs, "group managers", providers.CheckOK,
		`autoscale manager "gpu-autoscaler" enabled (min 1, max 8)`, "elasticd disables it at its first resize", "leaves it disabled",
		"a size above 8 is refused while it is enabled", "the group's maximum is 1000",
		`scheduled manager "nightly" enabled`, "elasticd does not disable it")
	f.update(func(f *fakeVPC) {
		if !f.managers[0].Enabled {
			t.Error("Check disabled the autoscale manager")
		}
	})
}

// TestCheckGroupByID: an ID given to --instance-group is found as an ID.
func TestCheckGroupByID(t *testing.T) {
	f := newFake(t, instances(1)...)
	cs := runCheck(t, f, f.provider(t, ibm.Config{InstanceGroup: groupID}), providers.CheckNeeds{})
	wantCheck(t, cs, "group", providers.CheckOK, `"r006-ig-gpu-spot" found by ID (ID r006-ig-gpu-spot)`, "1 membership (1 healthy)")
}

func TestCheckMissingGroup(t *testing.T) {
	f := newFake(t, instances(2)...)
	cs := runCheck(t, f, f.provider(t, ibm.Config{InstanceGroup: "gpu-spto", Region: "eu-de"}), providers.CheckNeeds{ManageCapacity: true})
	wantCheck(t, cs, "group", providers.CheckFail, `instance group "gpu-spto" (region eu-de at `, "not found among the 2 instance groups",
		"give --instance-group the group's name or ID", "--region the group's region", "Viewer role on Auto Scale for VPC")
	wantCheck(t, cs, "group managers", providers.CheckSkipped, "could not be read")
	// The listing answered: only the group is missing.
	wantCheck(t, cs, "permission is.instance-group.instance-group.list", providers.CheckOK)
	wantCheck(t, cs, "permission is.instance-group.instance-group.read", providers.CheckSkipped, "the group was not found")
	wantCheck(t, cs, "permission is.instance.instance.list", providers.CheckOK)
	if n := f.count(epGroup) + f.count(epManagers) + f.count(epMemberships); n != 0 {
		t.Errorf("%d requests of a group not found", n)
	}
}

// TestCheckDeletingGroup: a group being deleted cannot run a job.
func TestCheckDeletingGroup(t *testing.T) {
	f := newFake(t, instances(2)...)
	f.update(func(f *fakeVPC) { f.status = "deleting" })
	cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{})
	wantCheck(t, cs, "group", providers.CheckFail, "status deleting", "give --instance-group another group")
}

func TestCheckCredentials(t *testing.T) {
	needs := providers.CheckNeeds{ManageCapacity: true}
	// unreached: every check that needs the API is skipped, and no request was made.
	unreached := func(t *testing.T, f *fakeVPC, cs providers.Checks) {
		t.Helper()
		wantCheck(t, cs, "region", providers.CheckOK, "us-south")
		for _, name := range checkNames[2:] {
			wantCheck(t, cs, name, providers.CheckSkipped, "no credentials (see credentials)")
		}
		for _, name := range changeNames {
			wantCheck(t, cs, name, providers.CheckSkipped, "the Editor role")
		}
		if n := f.total(); n != 0 {
			t.Errorf("%d API requests without credentials", n)
		}
	}
	t.Run("NoAPIKey", func(t *testing.T) {
		clearCredentials(t)
		t.Setenv("VPC_ID", "r006-unrelated") // not a credential
		f := newFake(t, instances(2)...)
		p, err := ibm.New(ibm.Config{InstanceGroup: groupName, Region: "us-south", Endpoint: f.base})
		if err != nil {
			t.Fatal(err)
		}
		cs := runCheck(t, f, p, needs)
		wantCheck(t, cs, "credentials", providers.CheckFail, "none found", "IBMCLOUD_API_KEY", "IC_API_KEY",
			"set IBMCLOUD_API_KEY to an IAM API key", "VPC_IAM_PROFILE_ID", `docs/providers/ibm.md, "Credentials and permissions"`)
		unreached(t, f, cs)
	})
	t.Run("Refused", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		iam := newIAM(t)
		cs := runCheck(t, f, iamProvider(t, f, iam.URL, "not-a-key", ibm.Config{}), needs)
		wantCheck(t, cs, "credentials", providers.CheckFail, "an IAM API key from the environment (VPC_AUTH_TYPE, VPC_APIKEY, VPC_AUTH_URL)",
			"getting a token from "+iam.URL, "Provided API key could not be found",
			"check the API key in the environment (VPC_AUTH_TYPE, VPC_APIKEY, VPC_AUTH_URL): IAM does not accept it")
		unreached(t, f, cs)
	})
	t.Run("CredentialsFile", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		iam := newIAM(t)
		clearCredentials(t)
		file := filepath.Join(t.TempDir(), "ibm-credentials.env")
		if err := os.WriteFile(file, []byte("# elasticd\nVPC_AUTH_TYPE=iam\nVPC_APIKEY=good-key\nVPC_AUTH_URL="+iam.URL+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("IBM_CREDENTIALS_FILE", file)
		p, err := ibm.New(ibm.Config{InstanceGroup: groupName, Region: "us-south", Endpoint: f.base})
		if err != nil {
			t.Fatal(err)
		}
		cs := runCheck(t, f, p, needs)
		wantCheck(t, cs, "credentials", providers.CheckOK, "an IAM API key from the credentials file "+file, "token from "+iam.URL)
		wantCheck(t, cs, "group", providers.CheckOK, "membership_count 2")
	})
	t.Run("RefusedByTheAPI", func(t *testing.T) {
		// IAM gave a token that the VPC API does not take (401): the lookup fails, once.
		f := newFake(t, instances(2)...)
		f.stick(epGroups, &reply{status: http.StatusUnauthorized, file: "error_unauthorized.json"})
		cs := runCheck(t, f, f.provider(t, ibm.Config{}), needs)
		wantCheck(t, cs, "group", providers.CheckFail, "HTTP 401", "use credentials of the group's account that IBM accepts")
		wantCheck(t, cs, "permission is.instance-group.instance-group.list", providers.CheckSkipped, "not known")
		wantCheck(t, cs, "permission is.instance-group.instance-group.read", providers.CheckSkipped, "could not be listed")
	})
}

// TestCheckDenied: a read the credentials may not make fails its permission's line, with
// the role that grants it; what needs it is skipped, not failed again.
func TestCheckDenied(t *testing.T) {
	forbidden := &reply{status: http.StatusForbidden, file: "error_forbidden.json"}
	t.Run("ListGroups", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.stick(epGroups, forbidden)
		cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{})
		wantCheck(t, cs, "permission is.instance-group.instance-group.list", providers.CheckFail, "GET /instance_groups refused", "HTTP 403",
			"the Viewer role on Auto Scale for VPC (is.instance-group)")
		wantCheck(t, cs, "group", providers.CheckSkipped, "may not list instance groups")
		wantCheck(t, cs, "permission is.instance-group.instance-group.read", providers.CheckSkipped, "could not be listed")
	})
	t.Run("ReadGroup", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.stick(epGroup, forbidden)
		cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{ManageCapacity: true})
		wantCheck(t, cs, "permission is.instance-group.instance-group.read", providers.CheckFail, "refused", "HTTP 403",
			"the Viewer role on Auto Scale for VPC (is.instance-group)")
		wantCheck(t, cs, "group", providers.CheckOK, "found by name", "could not be read")
		wantCheck(t, cs, "permission is.instance-group.instance-group.list", providers.CheckOK)
	})
	t.Run("ListMemberships", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.stick(epMemberships, forbidden)
		cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{})
		wantCheck(t, cs, "permission is.instance-group.instance-group.read", providers.CheckFail, "HTTP 403")
	})
	t.Run("ListInstances", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.stick(epInstances, forbidden)
		cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{})
		wantCheck(t, cs, "permission is.instance.instance.list", providers.CheckFail, "GET /instances refused",
			"the Viewer role on Virtual Server for VPC (is.instance)")
		wantCheck(t, cs, "group", providers.CheckOK, "membership_count 2")
	})
}

// TestCheckAPIDown: a VPC API that fails is the group's failure, said once; the permissions
// are not known.
func TestCheckAPIDown(t *testing.T) {
	f := newFake(t, instances(2)...)
	f.stick(epGroups, &reply{status: http.StatusInternalServerError, file: "error_internal.json"})
	f.stick(epInstances, &reply{status: http.StatusInternalServerError, file: "error_internal.json"})
	cs := runCheck(t, f, f.provider(t, ibm.Config{}), providers.CheckNeeds{})
	wantCheck(t, cs, "group", providers.CheckFail, "HTTP 500", "check --region or --endpoint")
	wantCheck(t, cs, "permission is.instance-group.instance-group.list", providers.CheckSkipped, "not known")
	wantCheck(t, cs, "permission is.instance.instance.list", providers.CheckSkipped, "not known")
	failed := 0
	for _, c := range cs {
		if c.Status == providers.CheckFail {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d checks failed; want the group's alone", failed)
	}
}

// TestCheckRegion: where the region and the endpoint came from, and a VPC_URL that is not
// used.
func TestCheckRegion(t *testing.T) {
	f := newFake(t, instances(1)...)
	t.Setenv("ELASTICD_REGION", "jp-tok")
	t.Setenv("VPC_URL", "https://us-south.iaas.cloud.ibm.com/v1")
	cs := runCheck(t, f, f.provider(t, ibm.Config{Region: "jp-tok"}), providers.CheckNeeds{})
	wantCheck(t, cs, "region", providers.CheckOK, "jp-tok (ELASTICD_REGION)", f.base+" (--endpoint)", "VPC_URL (https://us-south.iaas.cloud.ibm.com/v1) is not used")

	// No region: the endpoint alone says where the API is.
	p, err := ibm.New(ibm.Config{InstanceGroup: groupName, Endpoint: f.base + "/", Authenticator: &core.NoAuthAuthenticator{}})
	if err != nil {
		t.Fatal(err)
	}
	cs = runCheck(t, f, p, providers.CheckNeeds{})
	wantCheck(t, cs, "region", providers.CheckOK, "none given; VPC API "+f.base+" (--endpoint)")
	wantCheck(t, cs, "group", providers.CheckOK, "found by name")
}

// TestCheckCancelled: a check whose context has ended makes no request.
func TestCheckCancelled(t *testing.T) {
	f := newFake(t, instances(1)...)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cs := providers.Checks(f.provider(t, ibm.Config{}).Check(ctx, providers.CheckNeeds{ManageCapacity: true}))
	for _, c := range cs {
		switch {
		case c.Name == "region" && c.Status == providers.CheckOK:
		case strings.HasPrefix(c.Name, "permission "+"is.instance-group.instance-group.update"):
			if c.Status != providers.CheckSkipped {
				t.Errorf("%s; want it skipped", c)
			}
		case c.Status != providers.CheckSkipped || !strings.Contains(c.Detail, "context canceled"):
			t.Errorf("%s; want it skipped for the context", c)
		}
	}
	if want := append(slices.Clone(checkNames), changeNames...); !slices.Equal(cs.Names(), want) {
		t.Errorf("checks %q; want %q", cs.Names(), want)
	}
	if n := f.total(); n != 0 {
		t.Errorf("%d requests after the context ended", n)
	}
}
