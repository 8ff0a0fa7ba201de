package azure_test

import (
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
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/azure"
	"github.com/elasticd/elasticd/providers/providertest"
)

// The actions checked, in the order of their lines.
const (
	permRead   = "Microsoft.Compute/virtualMachineScaleSets/read"
	permVMs    = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
	permNICs   = "Microsoft.Network/networkInterfaces/read"
	permWrite  = "Microsoft.Compute/virtualMachineScaleSets/write"
	permDelete = "Microsoft.Compute/virtualMachineScaleSets/delete/action"
)

var (
	readPerms   = []string{permRead, permVMs, permNICs}
	managePerms = []string{permRead, permVMs, permNICs, permWrite, permDelete}
)

// runCheck runs Check and logs its lines; it fails the test if Check changed the scale set.
func runCheck(t *testing.T, f *fakeARM, p *azure.Provider, needs providers.CheckNeeds) providers.Checks {
	t.Helper()
	tags := f.tagsNow()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cs := providers.Checks(p.Check(ctx, needs))
	for _, c := range cs {
		t.Logf("%v", c)
	}
	if n, m := f.count(epUpdate), f.count(epDelete); n+m != 0 {
		t.Errorf("Check made %d PATCHes and %d POSTs …/delete; it must change nothing", n, m)
	}
	if got := f.tagsNow(); !maps.Equal(got, tags) {
		t.Errorf("Check changed the set's tags from %v to %v", tags, got)
	}
	return cs
}

// wantLines: the lines are exactly these names with these statuses, in this order.
func wantLines(t *testing.T, cs providers.Checks, want ...any) {
	t.Helper()
	var got, exp []string
	for _, c := range cs {
		got = append(got, c.Name+"="+string(c.Status))
	}
	for i := 0; i+1 < len(want); i += 2 {
		exp = append(exp, fmt.Sprint(want[i])+"="+string(want[i+1].(providers.CheckStatus)))
	}
	if !slices.Equal(got, exp) {
		t.Errorf("lines:\n got  %q\n want %q", got, exp)
	}
}

// jwt is an unsigned access token with claims, as the credential under test hands it out.
func jwt(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"typ":"JWT","alg":"RS256","kid":"test"}`)) + "." + enc(b) + ".c2lnbmF0dXJl"
}

// tokenCred hands out one token, counting how often it was asked and for what.
type tokenCred struct {
	tok    string
	scopes []string
}

func (c *tokenCred) GetToken(_ context.Context, o policy.TokenRequestOptions) (azcore.AccessToken, error) {
	c.scopes = append(c.scopes, o.Scopes...)
	return azcore.AccessToken{Token: c.tok, ExpiresOn: time.Now().Add(time.Hour)}, nil
}

const (
	testOID    = "6f1c2d3e-0000-4000-8000-00000000beef"
	testTenant = "72f988bf-86f1-41af-91ab-2d7cd011db47"
)

// TestCheckAllGranted: an identity with "*" (Owner, Contributor) passes every check, one line
// per action, with the scale set described, and Check changes nothing.
func TestCheckAllGranted(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
	p := f.provider(t)
	cs := runCheck(t, f, p, providers.CheckNeeds{ManageCapacity: true})
	wantLines(t, cs,
		"credentials", providers.CheckOK, "subscription", providers.CheckOK, "resource group", providers.CheckOK,
		"group", providers.CheckOK, "claim", providers.CheckOK,
		"permission "+permRead, providers.CheckOK, "permission "+permVMs, providers.CheckOK,
		"permission "+permNICs, providers.CheckOK, "permission "+permWrite, providers.CheckOK,
		"permission "+permDelete, providers.CheckOK)
	providertest.Contains(t, "group", providertest.CheckLine(t, cs, "group").Detail, "scale set gpus (--vmss) in eastus", "Standard_ND96asr_v4", "capacity 2", "Spot priority", "Uniform orchestration")
	providertest.Contains(t, "subscription", providertest.CheckLine(t, cs, "subscription").Detail, f.sub+" (--subscription)", f.srv.URL+" (--endpoint)")
	providertest.Contains(t, "resource group", providertest.CheckLine(t, cs, "resource group").Detail, "ml-rg (--resource-group), found")
	providertest.Contains(t, "credentials", providertest.CheckLine(t, cs, "credentials").Detail, "the credential given in azure.Config")
	providertest.Contains(t, "write", providertest.CheckLine(t, cs, "permission "+permWrite).Detail, `by "*"`, "--manage-capacity")
	if n := f.count(epPerms); n != 1 {
		t.Errorf("%d permission listings; want 1", n)
	}
	if u := f.last(epPerms); u == nil || u.Query().Get("api-version") != "2022-04-01" ||
		!strings.EqualFold(u.Path, "/subscriptions/"+f.sub+"/resourcegroups/ml-rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpus/providers/Microsoft.Authorization/permissions") {
		t.Errorf("the permissions request went to %v", u)
	}

	// Without --manage-capacity: the read actions only, and no claim line.
	cs = runCheck(t, f, p, providers.CheckNeeds{})
	wantLines(t, cs,
		"credentials", providers.CheckOK, "subscription", providers.CheckOK, "resource group", providers.CheckOK,
		"group", providers.CheckOK,
		"permission "+permRead, providers.CheckOK, "permission "+permVMs, providers.CheckOK, "permission "+permNICs, providers.CheckOK)
}

// TestCheckPermissions evaluates each action against the listing as Azure RBAC does:
// wildcards anywhere, no regard to case, notActions taking away only what their own entry
// grants, entries from every page.
func TestCheckPermissions(t *testing.T) {
	ok, fail := providers.CheckOK, providers.CheckFail
	for _, c := range []struct {
		name  string
		pages [][]fakePerm
		want  map[string]providers.CheckStatus // by action; the rest of managePerms are ok
		says  map[string]string                // by action: what its detail says
	}{
		{name: "narrower wildcards (Virtual Machine Contributor)", pages: [][]fakePerm{{{Actions: []string{
			"Microsoft.Authorization/*/read", "Microsoft.Compute/availabilitySets/*", "Microsoft.Compute/locations/*",
			"Microsoft.Compute/virtualMachines/*", "Microsoft.Compute/virtualMachineScaleSets/*", "Microsoft.Network/networkInterfaces/*"}}}},
			says: map[string]string{permWrite: `by "Microsoft.Compute/virtualMachineScaleSets/*"`, permNICs: `by "Microsoft.Network/networkInterfaces/*"`}},
		{name: "reads only (Reader)", pages: [][]fakePerm{{{Actions: []string{"*/read"}}}},
			want: map[string]providers.CheckStatus{permWrite: fail, permDelete: fail},
			says: map[string]string{permRead: `by "*/read"`, permWrite: `--role "Virtual Machine Contributor"`}},
		{name: "other case", pages: [][]fakePerm{{{Actions: []string{"microsoft.compute/virtualmachinescalesets/*", "MICROSOFT.NETWORK/NETWORKINTERFACES/READ"}}}}},
		{name: "a wildcard inside", pages: [][]fakePerm{{{Actions: []string{"Microsoft.Compute/*/read", "Microsoft.Network/*/read", "Microsoft.Compute/*/delete/action"}}}},
			want: map[string]providers.CheckStatus{permWrite: fail}},
		{name: "an action in notActions", pages: [][]fakePerm{{{Actions: []string{"*"}, NotActions: []string{"Microsoft.Compute/virtualMachineScaleSets/delete/action"}}}},
			want: map[string]providers.CheckStatus{permDelete: fail},
			says: map[string]string{permDelete: `excluded by the notActions "Microsoft.Compute/virtualMachineScaleSets/delete/action"`}},
		{name: "a wildcard in notActions", pages: [][]fakePerm{{{Actions: []string{"*"}, NotActions: []string{"Microsoft.Compute/*/write", "*/delete/action"}}}},
			want: map[string]providers.CheckStatus{permWrite: fail, permDelete: fail}},
		{name: "notActions of another entry take nothing away", pages: [][]fakePerm{{
			{Actions: []string{"*"}, NotActions: []string{"Microsoft.Compute/virtualMachineScaleSets/*"}},
			{Actions: []string{"Microsoft.Compute/virtualMachineScaleSets/write", "Microsoft.Compute/virtualMachineScaleSets/delete/action",
				"Microsoft.Compute/virtualMachineScaleSets/read", "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"}}}}},
		{name: "a missing action", pages: [][]fakePerm{{{Actions: []string{permRead, permVMs, permNICs, permWrite}}}},
			want: map[string]providers.CheckStatus{permDelete: fail},
			says: map[string]string{permDelete: "not granted on scale set gpus"}},
		{name: "a prefix is not a wildcard", pages: [][]fakePerm{{{Actions: []string{permRead, permVMs, permNICs, "Microsoft.Compute/virtualMachineScaleSets/write/*", "Microsoft.Compute/virtualMachineScaleSets/delete"}}}},
			want: map[string]providers.CheckStatus{permWrite: fail, permDelete: fail}},
		{name: "nothing", pages: [][]fakePerm{{}},
			want: map[string]providers.CheckStatus{permRead: fail, permVMs: fail, permNICs: fail, permWrite: fail, permDelete: fail},
			says: map[string]string{permRead: `--role "Reader"`}},
		{name: "entries on two pages", pages: [][]fakePerm{{{Actions: []string{"*/read"}}}, {{Actions: []string{"Microsoft.Compute/virtualMachineScaleSets/*"}}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			f.setPermissions(c.pages...)
			p := f.provider(t, func(cfg *azure.Config) {
				cfg.Credential = &tokenCred{tok: jwt(map[string]any{"oid": testOID, "tid": testTenant, "appid": "a1b2", "idtyp": "app"})}
			})
			cs := runCheck(t, f, p, providers.CheckNeeds{ManageCapacity: true})
			for _, a := range managePerms {
				l := providertest.CheckLine(t, cs, "permission "+a)
				want := ok
				if s, ok := c.want[a]; ok {
					want = s
				}
				if l.Status != want {
					t.Errorf("%s: %s; want %s", a, l, want)
				}
				if l.Status == providers.CheckFail {
					providertest.Contains(t, a+" fix", l.Fix, "grant "+a, "az role assignment create --assignee "+testOID,
						"--scope /subscriptions/"+f.sub+"/resourceGroups/ml-rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpus")
				}
				if s := c.says[a]; s != "" {
					providertest.Contains(t, a, l.Detail+" "+l.Fix, s)
				}
			}
			if n := f.count(epPerms); n != len(c.pages) {
				t.Errorf("%d permission requests; want %d, one per page", n, len(c.pages))
			}
			if want := len(c.want) > 0; cs.Failed() != want {
				t.Errorf("Failed() = %v; want %v", cs.Failed(), want)
			}
		})
	}
}

// TestCheckPermissionsRefused: an identity that may not list its own permissions gets one
// line that says so, skipped with the fix, not a failure per action.
func TestCheckPermissionsRefused(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.queue(epPerms, reply{status: http.StatusForbidden, file: "error_authorization_failed_action.json",
		data: map[string]any{"Action": "Microsoft.Authorization/permissions/read"}})
	cs := runCheck(t, f, f.provider(t), providers.CheckNeeds{ManageCapacity: true})
	wantLines(t, cs,
		"credentials", providers.CheckOK, "subscription", providers.CheckOK, "resource group", providers.CheckOK,
		"group", providers.CheckOK, "claim", providers.CheckOK, "permissions", providers.CheckSkipped)
	l := providertest.CheckLine(t, cs, "permissions")
	providertest.Contains(t, "permissions", l.Detail, "may not list its own permissions", "HTTP 403 AuthorizationFailed", "not verified: "+strings.Join(managePerms, ", "))
	providertest.Contains(t, "permissions fix", l.Fix, "Microsoft.Authorization/permissions/read", "Reader")
	if cs.Failed() {
		t.Error("a refused permission listing failed the check; it is a check not made")
	}
}

// TestCheckPermissionsMalformed: a listing that is not one is said, skipped.
func TestCheckPermissionsUnreadable(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.queue(epPerms, reply{status: http.StatusOK, raw: []byte(`{"nextLink":null}`)})
	cs := runCheck(t, f, f.provider(t), providers.CheckNeeds{})
	l := providertest.CheckLine(t, cs, "permissions")
	if l.Status != providers.CheckSkipped {
		t.Fatalf("permissions: %v; want skipped", l)
	}
	providertest.Contains(t, "permissions", l.Detail, `no "value" list`, "not verified: "+strings.Join(readPerms, ", "))
}

// TestCheckWhere: a missing scale set, resource group or subscription fails its own line
// with the flag to check, and what depends on it is skipped.
func TestCheckWhere(t *testing.T) {
	skip, ok, fail := providers.CheckSkipped, providers.CheckOK, providers.CheckFail
	for _, c := range []struct {
		name string
		edit func(*azure.Config)
		want []any
		fix  string
	}{
		{"missing scale set", func(c *azure.Config) { c.VMSS = "gpus-old" },
			[]any{"credentials", ok, "subscription", ok, "resource group", ok, "group", fail, "claim", skip, "permissions", skip},
			"check --vmss, --resource-group and --subscription"},
		{"missing resource group", func(c *azure.Config) { c.ResourceGroup = "ml" },
			[]any{"credentials", ok, "subscription", ok, "resource group", fail, "group", skip, "claim", skip, "permissions", skip},
			"check --resource-group and --subscription"},
		{"missing subscription", func(c *azure.Config) { c.Subscription = "00000000-0000-0000-0000-000000000000" },
			[]any{"credentials", ok, "subscription", fail, "resource group", skip, "group", skip, "claim", skip, "permissions", skip},
			"check --subscription"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			cs := runCheck(t, f, f.provider(t, c.edit), providers.CheckNeeds{ManageCapacity: true})
			wantLines(t, cs, c.want...)
			for _, l := range cs {
				if l.Status == fail {
					providertest.Contains(t, l.Name+" fix", l.Fix, c.fix)
				}
			}
			if n := f.count(epPerms); n != 0 {
				t.Errorf("%d permission listings of a scale set that is not there", n)
			}
		})
	}
	t.Run("not found says ResourceNotFound", func(t *testing.T) {
		f := newFake(t)
		cs := runCheck(t, f, f.provider(t, func(c *azure.Config) { c.VMSS = "gpus-old" }), providers.CheckNeeds{})
		providertest.Contains(t, "group", providertest.CheckLine(t, cs, "group").Detail, `scale set "gpus-old" not found`, "ResourceNotFound")
	})
}

// TestCheckReadRefused: a scale set the identity may not read fails the group line with the
// role to grant, and the permission lines say which reads are missing.
func TestCheckReadRefused(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.queue(epSet, reply{status: http.StatusForbidden, file: "error_authorization_failed.json"})
	f.setPermissions([]fakePerm{{Actions: []string{"Microsoft.Authorization/*/read"}}})
	cs := runCheck(t, f, f.provider(t), providers.CheckNeeds{})
	wantLines(t, cs,
		"credentials", providers.CheckOK, "subscription", providers.CheckSkipped, "resource group", providers.CheckSkipped,
		"group", providers.CheckFail,
		"permission "+permRead, providers.CheckFail, "permission "+permVMs, providers.CheckFail, "permission "+permNICs, providers.CheckFail)
	providertest.Contains(t, "group", providertest.CheckLine(t, cs, "group").Detail, `reading scale set "gpus" was refused`, "HTTP 403 AuthorizationFailed")
	providertest.Contains(t, "group fix", providertest.CheckLine(t, cs, "group").Fix, permRead, "Reader")
}

// TestCheckFlexible: a Flexible scale set fails the group line, since a poll would.
func TestCheckFlexible(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.setScaleSet(setSpec{SKU: "Standard_ND96isr_H100_v5", Priority: "Regular", Mode: "Flexible"})
	cs := runCheck(t, f, f.provider(t), providers.CheckNeeds{})
	l := providertest.CheckLine(t, cs, "group")
	if l.Status != providers.CheckFail {
		t.Fatalf("group: %v; want failed", l)
	}
	providertest.Contains(t, "group", l.Detail, "Standard_ND96isr_H100_v5", "Regular priority", "Flexible orchestration", "Uniform scale sets only")
}

// TestCheckNoCredentials: without a token, the credentials line fails with how to provide
// one, the rest are skipped, and nothing is asked of ARM.
func TestCheckNoCredentials(t *testing.T) {
	t.Run("the credential fails", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"))
		cred := &azfake.TokenCredential{}
		cred.SetError(errors.New("ManagedIdentityCredential: no managed identity endpoint is available"))
		cs := runCheck(t, f, f.provider(t, func(c *azure.Config) { c.Credential = cred }), providers.CheckNeeds{ManageCapacity: true})
		wantNoCredentials(t, f, cs, "no managed identity endpoint")
	})
	// DefaultAzureCredential, as elasticd makes it, with only the Azure CLI in its chain and
	// no az on PATH.
	t.Run("DefaultAzureCredential finds none", func(t *testing.T) {
		t.Setenv("AZURE_TOKEN_CREDENTIALS", "AzureCLICredential")
		t.Setenv("PATH", t.TempDir())
		f := newFake(t, vm("0", "10.0.0.4"))
		cs := runCheck(t, f, f.provider(t, func(c *azure.Config) { c.Credential = nil }), providers.CheckNeeds{ManageCapacity: true})
		wantNoCredentials(t, f, cs, "AzureCLICredential")
	})
}

func wantNoCredentials(t *testing.T, f *fakeARM, cs providers.Checks, says string) {
	t.Helper()
	skip := providers.CheckSkipped
	wantLines(t, cs, "credentials", providers.CheckFail, "subscription", skip, "resource group", skip, "group", skip, "claim", skip, "permissions", skip)
	l := providertest.CheckLine(t, cs, "credentials")
	providertest.Contains(t, "credentials", l.Detail, "no usable Azure credentials", says)
	providertest.Contains(t, "credentials fix", l.Fix, "az login", "managed identity", "AZURE_CLIENT_SECRET")
	if n := f.count(""); n != 0 {
		t.Errorf("%d requests to ARM without a token", n)
	}
}

// TestCheckTokenRejected: a token ARM refuses (another tenant's) fails the credentials line
// once, and the rest are skipped.
func TestCheckTokenRejected(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.queue(epSet, reply{status: http.StatusUnauthorized, raw: []byte(`{"error":{"code":"InvalidAuthenticationTokenTenant","message":"The access token is from the wrong issuer 'https://sts.windows.net/` + testTenant + `/'. It must match the tenant 'https://sts.windows.net/0c2d3e4f-0000-4000-8000-000000000001/' associated with this subscription. Please use the authority (URL) 'https://login.windows.net/0c2d3e4f-0000-4000-8000-000000000001' to get the token."}}`),
		header: map[string]string{"WWW-Authenticate": `Bearer authorization_uri="https://login.windows.net/0c2d3e4f-0000-4000-8000-000000000001", error="invalid_token", error_description="The access token is from the wrong issuer."`}})
	cs := runCheck(t, f, f.provider(t), providers.CheckNeeds{})
	skip := providers.CheckSkipped
	wantLines(t, cs, "credentials", providers.CheckFail, "subscription", skip, "resource group", skip, "group", skip, "permissions", skip)
	l := providertest.CheckLine(t, cs, "credentials")
	providertest.Contains(t, "credentials", l.Detail, "rejected", "InvalidAuthenticationTokenTenant")
	providertest.Contains(t, "credentials fix", l.Fix, "az login --tenant", "AZURE_TENANT_ID")
}

// TestCheckClaim: with --manage-capacity, another driver's fresh claim tag fails the claim
// line, naming the driver; a lapsed claim or a tag that is not one is taken over.
func TestCheckClaim(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name, tag string
		want      providers.CheckStatus
		says      string
	}{
		{"none", "", providers.CheckOK, "no elasticd-driver tag"},
		{"fresh", providers.GroupClaim{Owner: "ffee0011", Host: "driver-2", At: now.Add(-30 * time.Second)}.Value(),
			providers.CheckFail, "held by another driver: job ffee0011 on host driver-2"},
		{"lapsed", providers.GroupClaim{Owner: "ffee0011", Host: "driver-2", At: now.Add(-providers.ClaimLapse - time.Minute)}.Value(),
			providers.CheckOK, "lapsed"},
		{"not a claim", "someone's note", providers.CheckOK, "not a claim"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, vm("0", "10.0.0.4"))
			if c.tag != "" {
				f.setTag(providers.ClaimTagKey, c.tag)
			}
			cs := runCheck(t, f, f.provider(t), providers.CheckNeeds{ManageCapacity: true})
			l := providertest.CheckLine(t, cs, "claim")
			if l.Status != c.want {
				t.Fatalf("claim: %v; want %s", l, c.want)
			}
			providertest.Contains(t, "claim", l.Detail, c.says)
			if l.Status == providers.CheckFail {
				providertest.Contains(t, "claim fix", l.Fix, "stop that driver (on host driver-2)", "without --manage-capacity")
			}
			if cs.Failed() != (c.want == providers.CheckFail) {
				t.Errorf("Failed() = %v", cs.Failed())
			}
		})
	}
}

// TestCheckCredentialSource: the credentials line says where the token came from and whose
// it is, for the Azure CLI (through DefaultAzureCredential, as elasticd makes it, with a
// stand-in az on PATH) and for a credential given in the Config, and the token is asked
// for ARM's audience.
func TestCheckCredentialSource(t *testing.T) {
	t.Run("Azure CLI", func(t *testing.T) {
		tok := jwt(map[string]any{"upn": "alice@contoso.com", "unique_name": "alice@contoso.com", "appid": "04b07795-8ddb-461a-bbee-02f9e1bf7b46",
			"idtyp": "user", "oid": testOID, "tid": testTenant})
		bin := fakeAz(t, tok)
		t.Setenv("AZURE_TOKEN_CREDENTIALS", "AzureCLICredential")
		t.Setenv("PATH", bin)
		f := newFake(t, vm("0", "10.0.0.4"))
		cs := runCheck(t, f, f.provider(t, func(c *azure.Config) { c.Credential = nil }), providers.CheckNeeds{})
		l := providertest.CheckLine(t, cs, "credentials")
		if l.Status != providers.CheckOK {
			t.Fatalf("credentials: %v", l)
		}
		providertest.Contains(t, "credentials", l.Detail, "from the Azure CLI (az login", "as alice@contoso.com (object "+testOID+", tenant "+testTenant+")")
		args, err := os.ReadFile(filepath.Join(bin, "args"))
		if err != nil || !strings.Contains(string(args), "--resource https://management.core.windows.net/") {
			t.Errorf("az was run with %q (%v); want a token for ARM's audience", args, err)
		}
	})
	t.Run("managed identity", func(t *testing.T) {
		mirid := "/subscriptions/" + "0b1f6471-1bf0-4dda-aec3-cb9272f09590" + "/resourceGroups/ml-rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/elasticd-driver"
		cred := &tokenCred{tok: jwt(map[string]any{"appid": "0d1e2f3a-0000-4000-8000-000000000002", "idtyp": "app", "oid": testOID, "tid": testTenant, "xms_mirid": mirid})}
		f := newFake(t, vm("0", "10.0.0.4"))
		cs := runCheck(t, f, f.provider(t, func(c *azure.Config) { c.Credential = cred }), providers.CheckNeeds{})
		providertest.Contains(t, "credentials", providertest.CheckLine(t, cs, "credentials").Detail, "the credential given in azure.Config", "as user-assigned managed identity elasticd-driver")
		if len(cred.scopes) == 0 || cred.scopes[0] != "https://management.core.windows.net//.default" {
			t.Errorf("token asked for scopes %q; want ARM's, as the SDK asks it", cred.scopes)
		}
	})
}

// fakeAz writes an az that prints tok as `az account get-access-token -o json` does, and
// records its arguments in args beside it; it uses shell builtins only, as PATH holds it alone.
func fakeAz(t *testing.T, tok string) string {
	t.Helper()
	dir := t.TempDir()
	out, _ := json.Marshal(map[string]any{
		"accessToken": tok, "expiresOn": time.Now().Add(time.Hour).Format("2006-01-02 15:04:05.000000"),
		"expires_on": time.Now().Add(time.Hour).Unix(), "subscription": "0b1f6471-1bf0-4dda-aec3-cb9272f09590",
		"tenant": testTenant, "tokenType": "Bearer",
	})
	script := "#!/bin/sh\necho \"$@\" > '" + filepath.Join(dir, "args") + "'\nprintf '%s\\n' '" + string(out) + "'\n"
	if err := os.WriteFile(filepath.Join(dir, "az"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCheckUnreachable: when ARM does not answer, the group line fails once with why, and
// what could not be asked is skipped, not failed again.
func TestCheckUnreachable(t *testing.T) {
	t.Parallel() // the SDK retries each request twice, half a second apart
	f := newFake(t, vm("0", "10.0.0.4"))
	f.failEvery(reply{status: http.StatusInternalServerError, raw: []byte(`{"error":{"code":"InternalServerError","message":"Encountered internal server error."}}`)})
	cs := runCheck(t, f, f.provider(t), providers.CheckNeeds{ManageCapacity: true})
	skip := providers.CheckSkipped
	wantLines(t, cs, "credentials", providers.CheckOK, "subscription", skip, "resource group", skip, "group", providers.CheckFail, "claim", skip, "permissions", skip)
	providertest.Contains(t, "group", providertest.CheckLine(t, cs, "group").Detail, "get scale set: HTTP 500 InternalServerError")
	providertest.Contains(t, "permissions", providertest.CheckLine(t, cs, "permissions").Detail, "HTTP 500 InternalServerError", "not verified: "+strings.Join(managePerms, ", "))
}
