package gcp_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/gcp"
	"github.com/elasticd/elasticd/providers/providertest"
)

func runCheck(t *testing.T, p *gcp.Provider, n providers.CheckNeeds) providers.Checks {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cs := providers.Checks(p.Check(ctx, n))
	for _, c := range cs {
		t.Log(c)
	}
	return cs
}

// wantCheck finds the check called name and wants its status, and each part in its detail
// and fix together.
func wantCheck(t *testing.T, cs providers.Checks, name string, status providers.CheckStatus, parts ...string) providers.Check {
	t.Helper()
	c := providertest.WantLine(t, cs, name, status)
	for _, p := range parts {
		if !strings.Contains(c.Detail+" | "+c.Fix, p) {
			t.Errorf("%s: want %q in it", c, p)
		}
	}
	if c.Status == providers.CheckFail && c.Fix == "" {
		t.Errorf("%s: a failure with no fix", c)
	}
	return c
}

func wantNoCheck(t *testing.T, cs providers.Checks, name string) {
	t.Helper()
	if _, ok := cs.Find(name); ok {
		t.Errorf("check %q listed; want none: %q", name, cs.Names())
	}
}

// wantOnlyReads fails the test for any request to the fake that is not a read: the check
// changes nothing.
func wantOnlyReads(t *testing.T, f *fakeCompute) {
	t.Helper()
	for _, r := range f.log() {
		if r.method != http.MethodGet && r.endpoint != epTestIAM {
			t.Errorf("the check made %s %s; want only reads and testIamPermissions", r.method, r.path)
		}
	}
}

const (
	permGet     = "compute.instanceGroupManagers.get"
	permList    = "compute.instances.list"
	permUpdate  = "compute.instanceGroupManagers.update"
	permZoneOps = "compute.zoneOperations.get"
	permRegOps  = "compute.regionOperations.get"
	permAS      = "compute.autoscalers.get"
)

func TestCheckAllHeld(t *testing.T) {
	for _, c := range []struct {
		dir    string
		manage bool
		perms  []string // the permission lines, in order
		asked  []string // what testIamPermissions is asked
		loc    string
	}{
		{"zonal", false, []string{permGet, permList}, []string{permGet, permList}, `zone "us-central1-a" (--zone): a zonal MIG`},
		{"zonal", true, []string{permGet, permList, permUpdate, permZoneOps},
			[]string{permGet, permList, permUpdate, permZoneOps, permAS}, `zone "us-central1-a"`},
		{"regional", true, []string{permGet, permList, permUpdate, permRegOps},
			[]string{permGet, permList, permUpdate, permRegOps, permAS}, `region "us-central1" (--region): a regional MIG`},
	} {
		t.Run(c.dir+map[bool]string{true: "/manage-capacity"}[c.manage], func(t *testing.T) {
			f := newFake(t, c.dir)
			before := f.targetSize
			cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{ManageCapacity: c.manage})
			want := []string{"credentials", "project", "location", "group"}
			for _, p := range c.perms {
				want = append(want, "permission "+p)
			}
			if got := cs.Names(); !slices.Equal(got, want) {
				t.Errorf("checks %q; want %q", got, want)
			}
			if cs.Failed() {
				t.Errorf("a check failed with every permission held")
			}
			wantCheck(t, cs, "credentials", providers.CheckOK, "gcp.Config.ClientOptions")
			wantCheck(t, cs, "project", providers.CheckOK, `"test-project" (--project)`)
			wantCheck(t, cs, "location", providers.CheckOK, c.loc)
			wantCheck(t, cs, "group", providers.CheckOK, `MIG "gpu-mig"`, fmt.Sprintf("targetSize %d,", before), "template gpu-tmpl (a3-highgpu-8g, SPOT)", "no autoscaler")
			for _, p := range c.perms {
				wantCheck(t, cs, "permission "+p, providers.CheckOK, `held on project "test-project"`)
			}
			if got := f.testIAMAsked(t); len(got) != 1 || !slices.Equal(got[0], c.asked) {
				t.Errorf("testIamPermissions asked %q; want once, %q", got, c.asked)
			}
			wantOnlyReads(t, f)
			if f.targetSize != before || len(f.recreated) > 0 {
				t.Errorf("the check changed the group: targetSize %d (was %d), recreated %v", f.targetSize, before, f.recreated)
			}
		})
	}
}

func TestCheckMissingPermission(t *testing.T) {
	t.Run("update with --manage-capacity", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.grant(permUpdate)
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{ManageCapacity: true})
		wantCheck(t, cs, "permission "+permUpdate, providers.CheckFail, `not held on project "test-project"`,
			"instanceGroupManagers.resize and .recreateInstances",
			"grant compute.instanceGroupManagers.update on project test-project", "roles/compute.instanceAdmin.v1",
			"gcloud projects add-iam-policy-binding test-project", "Steering the group")
		wantCheck(t, cs, "group", providers.CheckOK)
		wantCheck(t, cs, "permission "+permGet, providers.CheckOK)
		wantCheck(t, cs, "permission "+permZoneOps, providers.CheckOK)
		if n := len(slices.DeleteFunc(slices.Clone(cs), func(c providers.Check) bool { return c.Status != providers.CheckFail })); n != 1 {
			t.Errorf("%d failures; want 1, the permission", n)
		}
		wantOnlyReads(t, f)
	})
	t.Run("update without --manage-capacity", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.grant(permUpdate)
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{})
		if cs.Failed() {
			t.Error("a read-only job needs no update permission")
		}
		wantNoCheck(t, cs, "permission "+permUpdate)
	})
	t.Run("the discovery permissions", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.grant(permGet, permList)
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{})
		wantCheck(t, cs, "permission "+permGet, providers.CheckFail, "listManagedInstances", "roles/compute.viewer", "Permissions")
		wantCheck(t, cs, "permission "+permList, providers.CheckFail, "instances.list", "roles/compute.viewer")
		// The group cannot be read for the same cause: said once, by the permission's line.
		wantCheck(t, cs, "group", providers.CheckSkipped, permGet)
		if n := f.calls(epGroup); n != 0 {
			t.Errorf("the group was asked for %d times, knowing the permission missing", n)
		}
	})
	t.Run("the operations of a regional group", func(t *testing.T) {
		f := newFake(t, "regional")
		f.grant(permRegOps)
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{ManageCapacity: true})
		wantCheck(t, cs, "permission "+permRegOps, providers.CheckFail, "regionOperations.get", "roles/compute.viewer")
	})
}

func TestCheckPermissionQueryFails(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.change(func(f *fakeCompute) { f.iamRefusal = "denied" })
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{ManageCapacity: true})
		wantCheck(t, cs, "permissions", providers.CheckSkipped, "projects.testIamPermissions was refused",
			"HTTP 403: The caller does not have permission", "not checked: "+permGet+", "+permList+", "+permUpdate+", "+permZoneOps+" |",
			"gcloud projects get-iam-policy test-project")
		wantCheck(t, cs, "group", providers.CheckOK, `MIG "gpu-mig": targetSize 9, 11 managed instances`)
		if cs.Failed() {
			t.Error("a permission query refused is a skip, not a failure")
		}
		for _, c := range cs {
			if strings.HasPrefix(c.Name, "permission ") {
				t.Errorf("%s listed though no permission could be asked", c)
			}
		}
	})
	t.Run("refused, and the group denied", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.change(func(f *fakeCompute) { f.iamRefusal = "denied" })
		f.grant(permGet)
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{})
		wantCheck(t, cs, "group", providers.CheckFail, "permission denied: HTTP 403: ",
			"Required 'compute.instanceGroupManagers.get' permission", "grant compute.instanceGroupManagers.get", "roles/compute.viewer")
		wantCheck(t, cs, "permissions", providers.CheckSkipped)
	})
	t.Run("the API not enabled", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.change(func(f *fakeCompute) { f.iamRefusal = "disabled" })
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{})
		wantCheck(t, cs, "permissions", providers.CheckSkipped, "has not been used in project",
			"gcloud services enable cloudresourcemanager.googleapis.com")
	})
	t.Run("an endpoint that serves Compute Engine only", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.script(epTestIAM, reply{status: 404, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Not Found</html>")})
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{})
		wantCheck(t, cs, "permissions", providers.CheckSkipped, "at "+f.srv.URL+" failed", "--endpoint must serve Cloud Resource Manager")
	})
}

func TestCheckGroupNotFound(t *testing.T) {
	for _, c := range []struct{ dir, flag, other string }{
		{"zonal", "--zone", "a regional MIG takes --region instead of --zone"},
		{"regional", "--region", "a zonal MIG takes --zone instead of --region"},
	} {
		t.Run(c.dir, func(t *testing.T) {
			f := newFake(t, c.dir)
			cs := runCheck(t, f.provider(t, func(cfg *gcp.Config) { cfg.MIG = "no-such-mig" }), providers.CheckNeeds{ManageCapacity: true})
			wantCheck(t, cs, "group", providers.CheckFail, `MIG "no-such-mig" (project "test-project"`, "was not found (HTTP 404)",
				"check --mig, --project and "+c.flag, c.other, "gcloud compute instance-groups managed list --project test-project")
			wantCheck(t, cs, "permission "+permGet, providers.CheckOK) // the permissions are the project's
			wantNoCheck(t, cs, "autoscaler")
		})
	}
}

func TestCheckAutoscaler(t *testing.T) {
	for _, c := range []struct {
		name   string
		mode   string
		manage bool
		status providers.CheckStatus
		parts  []string
	}{
		{"on, managed", "ON", true, providers.CheckFail, []string{`"gpu-mig-as" is attached, mode ON (min 1, max 8)`,
			"--manage-capacity cannot steer", "update-autoscaling gpu-mig --zone us-central1-a --project test-project --mode off",
			"stop-autoscaling", "run without --manage-capacity"}},
		{"mode left out (ON), managed", "", true, providers.CheckFail, []string{"mode ON"}},
		{"scale out only, managed", "ONLY_SCALE_OUT", true, providers.CheckFail, []string{"mode ONLY_SCALE_OUT"}},
		{"off, managed", "OFF", true, providers.CheckOK, []string{"mode OFF", "up to its maxNumReplicas 8"}},
		{"on, read only", "ON", false, providers.CheckOK, []string{"mode ON", "without --manage-capacity elasticd only reads"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, "zonal")
			f.autoscaler = autoscaler(c.mode, 1, 8)
			cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{ManageCapacity: c.manage})
			wantCheck(t, cs, "group", providers.CheckOK, "an autoscaler attached")
			wantCheck(t, cs, "autoscaler", c.status, c.parts...)
			if c.manage {
				wantCheck(t, cs, "permission "+permAS, providers.CheckOK, "autoscalers.get")
			} else {
				wantNoCheck(t, cs, "permission "+permAS)
			}
			wantOnlyReads(t, f)
		})
	}
	t.Run("not readable, managed", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.autoscaler = autoscaler("OFF", 0, 8)
		f.grant(permAS)
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{ManageCapacity: true})
		wantCheck(t, cs, "autoscaler", providers.CheckSkipped, `"gpu-mig-as" is attached`, "without "+permAS)
		wantCheck(t, cs, "permission "+permAS, providers.CheckFail, "roles/compute.viewer")
		if n := f.calls(epAutoscaler); n != 0 {
			t.Errorf("the autoscaler was asked for %d times, knowing the permission missing", n)
		}
	})
	t.Run("no autoscaler, managed", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.grant(permAS) // not needed without one
		cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{ManageCapacity: true})
		wantNoCheck(t, cs, "autoscaler")
		wantNoCheck(t, cs, "permission "+permAS)
		if cs.Failed() {
			t.Error("a group without an autoscaler needs no compute.autoscalers.get")
		}
	})
}

func TestCheckTemplateNotReadable(t *testing.T) {
	f := newFake(t, "zonal")
	f.grant("compute.instanceTemplates.get")
	cs := runCheck(t, f.provider(t, nil), providers.CheckNeeds{})
	wantCheck(t, cs, "group", providers.CheckOK, "template gpu-tmpl (not read: compute.instanceTemplates.get is not held, and no job needs it)")
	if cs.Failed() {
		t.Error("the template is detail: not reading it fails nothing")
	}
}

// adc makes Application Default Credentials come from nowhere but what the test sets: no
// gcloud file in HOME, no GOOGLE_APPLICATION_CREDENTIALS, no metadata server.
func adc(t *testing.T) (home string) {
	home = t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("APPDATA", home)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("GCE_METADATA_HOST", "")
	t.Setenv("GOOGLE_CLOUD_QUOTA_PROJECT", "")
	return home
}

func withADC(c *gcp.Config) { c.ClientOptions = nil }

func TestCheckNoCredentials(t *testing.T) {
	// A key file that is not there: the search stops at it, as it does for a poll.
	f := newFake(t, "zonal")
	adc(t)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "missing-key.json"))
	cs := runCheck(t, f.provider(t, withADC), providers.CheckNeeds{ManageCapacity: true})
	if want := []string{"credentials", "project", "location", "group", "permissions"}; !slices.Equal(cs.Names(), want) {
		t.Errorf("checks %q; want %q", cs.Names(), want)
	}
	wantCheck(t, cs, "credentials", providers.CheckFail, "GOOGLE_APPLICATION_CREDENTIALS=", "missing-key.json",
		"service-account key", "unset it")
	wantCheck(t, cs, "project", providers.CheckOK)
	wantCheck(t, cs, "location", providers.CheckOK)
	wantCheck(t, cs, "group", providers.CheckSkipped, "no usable credentials")
	wantCheck(t, cs, "permissions", providers.CheckSkipped, "no usable credentials")
	if n := f.calls(""); n != 0 {
		t.Errorf("%d API requests without credentials; want 0", n)
	}
}

func TestCheckCredentialsRefused(t *testing.T) {
	// A key that the token endpoint no longer takes (deleted): found, but it gives no token.
	f := newFake(t, "zonal")
	adc(t)
	key := f.serviceAccountKey(t, t.TempDir())
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", key)
	f.change(func(f *fakeCompute) { f.tokenError = true })
	cs := runCheck(t, f.provider(t, withADC), providers.CheckNeeds{})
	wantCheck(t, cs, "credentials", providers.CheckFail, "service account "+testAccount+" (a key), from GOOGLE_APPLICATION_CREDENTIALS ("+key+")",
		"no access token", "invalid_grant", "gcloud iam service-accounts keys create KEY.json --iam-account "+testAccount)
	wantCheck(t, cs, "group", providers.CheckSkipped)
	wantCheck(t, cs, "permissions", providers.CheckSkipped)
	if n := f.calls(""); n != 0 {
		t.Errorf("%d API requests with credentials that give no token; want 0", n)
	}
}

func TestCheckCredentialsFound(t *testing.T) {
	for _, c := range []struct {
		name string
		put  func(t *testing.T, f *fakeCompute, home string) string // where the key is
		from string
	}{
		{"GOOGLE_APPLICATION_CREDENTIALS", func(t *testing.T, f *fakeCompute, home string) string {
			key := f.serviceAccountKey(t, t.TempDir())
			t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", key)
			return key
		}, "from GOOGLE_APPLICATION_CREDENTIALS ("},
		{"gcloud's file", func(t *testing.T, f *fakeCompute, home string) string {
			dir := filepath.Join(home, ".config", "gcloud")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			key := filepath.Join(dir, "application_default_credentials.json")
			if err := os.Rename(f.serviceAccountKey(t, dir), key); err != nil {
				t.Fatal(err)
			}
			return key
		}, "from gcloud's ADC file ("},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, "zonal")
			key := c.put(t, f, adc(t))
			var mu sync.Mutex
			auth := map[string]string{} // endpoint → Authorization
			f.change(func(f *fakeCompute) {
				f.onRequest = func(r *http.Request) {
					mu.Lock()
					defer mu.Unlock()
					auth[r.URL.Path] = r.Header.Get("Authorization")
				}
			})
			cs := runCheck(t, f.provider(t, withADC), providers.CheckNeeds{ManageCapacity: true})
			if cs.Failed() {
				t.Error("a check failed")
			}
			wantCheck(t, cs, "credentials", providers.CheckOK, "service account "+testAccount+" (a key), "+c.from+key+")")
			wantCheck(t, cs, "project", providers.CheckOK, `"test-project" (--project); the credentials are of project "sa-project"`)
			wantCheck(t, cs, "permission "+permUpdate, providers.CheckOK)
			mu.Lock()
			defer mu.Unlock()
			if len(auth) < 3 {
				t.Errorf("requests %v; want the group, its template and testIamPermissions", auth)
			}
			for path, a := range auth {
				if a != "Bearer ya29.test-token" {
					t.Errorf("%s: Authorization %q; want the key's token", path, a)
				}
			}
		})
	}
}

func TestCheckMetadataServer(t *testing.T) {
	const (
		cloudPlatform = "https://www.googleapis.com/auth/cloud-platform"
		computeRW     = "https://www.googleapis.com/auth/compute"
		computeRO     = "https://www.googleapis.com/auth/compute.readonly"
	)
	t.Run("cloud-platform", func(t *testing.T) {
		f := newFake(t, "zonal")
		adc(t)
		newMetadata(t, cloudPlatform, "https://www.googleapis.com/auth/logging.write")
		cs := runCheck(t, f.provider(t, withADC), providers.CheckNeeds{ManageCapacity: true})
		if want := []string{"credentials", "access scopes", "project", "location", "group"}; !slices.Equal(cs.Names()[:5], want) {
			t.Errorf("checks %q; want them to start %q", cs.Names(), want)
		}
		wantCheck(t, cs, "credentials", providers.CheckOK, "the VM's service account "+testAccount+", from the Compute Engine metadata server")
		wantCheck(t, cs, "access scopes", providers.CheckOK, "cloud-platform, logging.write")
		wantCheck(t, cs, "permission "+permUpdate, providers.CheckOK)
		if cs.Failed() {
			t.Error("a check failed")
		}
	})
	t.Run("compute.readonly, managed", func(t *testing.T) {
		f := newFake(t, "zonal")
		adc(t)
		newMetadata(t, computeRO)
		cs := runCheck(t, f.provider(t, withADC), providers.CheckNeeds{ManageCapacity: true})
		wantCheck(t, cs, "access scopes", providers.CheckFail, "(compute.readonly) do not let it change the group",
			"set-service-account VM --zone ZONE --service-account "+testAccount+" --scopes cloud-platform")
		wantCheck(t, cs, "permissions", providers.CheckSkipped, "lack cloud-platform")
		if n := f.calls(epTestIAM); n != 0 {
			t.Errorf("testIamPermissions asked %d times with a token that cannot ask it", n)
		}
	})
	t.Run("compute, read only", func(t *testing.T) {
		f := newFake(t, "zonal")
		adc(t)
		newMetadata(t, computeRW)
		cs := runCheck(t, f.provider(t, withADC), providers.CheckNeeds{})
		wantCheck(t, cs, "access scopes", providers.CheckOK, "compute")
		wantCheck(t, cs, "group", providers.CheckOK)
	})
	t.Run("no compute scope", func(t *testing.T) {
		f := newFake(t, "zonal")
		adc(t)
		newMetadata(t, "https://www.googleapis.com/auth/devstorage.read_only")
		cs := runCheck(t, f.provider(t, withADC), providers.CheckNeeds{})
		wantCheck(t, cs, "access scopes", providers.CheckFail, "do not let it read Compute Engine")
	})
}
