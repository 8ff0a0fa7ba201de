package providers

import (
	"context"
	"fmt"
	"strings"
)

// Checking a job before it starts (`elasticd check`): a cloud provider says, one line per
// thing that can be wrong, whether its credentials resolve, its group exists and each
// permission the job's flags need is granted, without changing anything. The command adds
// the checks every provider shares (hosts and their slots, prices, secrets, the listen
// address) and prints them.

// CheckStatus is a check's outcome.
type CheckStatus string

const (
	// CheckOK: verified.
	CheckOK CheckStatus = "ok"
	// CheckFail: verified wrong; the job would fail or lose a capability. Fix says what to do.
	CheckFail CheckStatus = "fail"
	// CheckSkipped: not verified, and Detail says why (the cloud cannot be asked without
	// acting, a check an earlier failure made moot, a flag not given).
	CheckSkipped CheckStatus = "skipped"
)

// Check is one line of `elasticd check`.
type Check struct {
	// Name is what was checked, short and stable: "credentials", "region", "group",
	// "permission autoscaling:SetDesiredCapacity", "notice queue", "notice rule".
	Name   string      `json:"name"`
	Status CheckStatus `json:"status"`
	// Detail is what was found, in a line: "from the environment (AWS_ACCESS_KEY_ID), as
	// arn:aws:iam::123456789012:role/elasticd-driver", "desired 2 (min 0, max 8), 2 instances".
	Detail string `json:"detail"`
	// Fix, for a failure (and a skip a person can act on), is the exact remedy: the
	// permission to grant and on what, the flag to give, the doc section to read.
	Fix string `json:"fix,omitempty"`
}

// OK, Fail and Skipped make a Check.
func OK(name, detail string) Check { return Check{Name: name, Status: CheckOK, Detail: detail} }

// Fail is a failed check with its fix.
func Fail(name, detail, fix string) Check {
	return Check{Name: name, Status: CheckFail, Detail: detail, Fix: fix}
}

// Skipped is a check not made: detail says why, fix (optional) what a person can do instead.
func Skipped(name, detail, fix string) Check {
	return Check{Name: name, Status: CheckSkipped, Detail: detail, Fix: fix}
}

func (c Check) String() string {
	s := fmt.Sprintf("%s %s: %s", c.Status, c.Name, c.Detail)
	if c.Fix != "" {
		s += " (fix: " + c.Fix + ")"
	}
	return s
}

// CheckNeeds is what the job's flags ask of the cloud, beyond finding the group's hosts
// (which every job needs): each provider turns it into the permissions it checks.
type CheckNeeds struct {
	// ManageCapacity: --manage-capacity, so Capacity's calls (read and set the size, hand an
	// instance back, read launch failures) and, where the cloud has them, the claim's tag
	// calls (Claimer).
	ManageCapacity bool
	// Prices: the cost accounting asks the cloud's spot prices (SpotPricer), where it has them.
	Prices bool
}

// Checker is implemented by providers that can check, without side effects, what a job
// needs of their cloud. Check returns every line it could make: it does not stop at the
// first failure unless the rest depend on it (no credentials: the group cannot be read), and
// marks what it could not ask as skipped, saying why. It never changes the group, its tags or
// anything else; read calls, permission queries (AWS iam:SimulatePrincipalPolicy, GCP
// testIamPermissions, Azure's permissions of a resource) and calls that only ask (DryRun)
// are all it makes. Checks that every provider shares (hosts and slots, prices) are the
// caller's.
type Checker interface {
	Check(ctx context.Context, needs CheckNeeds) []Check
}

// Checks are a list of Check.
type Checks []Check

// Failed reports whether any check failed.
func (cs Checks) Failed() bool {
	for _, c := range cs {
		if c.Status == CheckFail {
			return true
		}
	}
	return false
}

// Find is the first check named name, and whether there is one.
func (cs Checks) Find(name string) (Check, bool) {
	for _, c := range cs {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// Names are the checks' names, in order: what a test lists when a line it wants is missing.
func (cs Checks) Names() []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Name
	}
	return out
}

// Prefixed names every check as part of what: "fallback group" + "permission x" is
// "fallback group: permission x".
func (cs Checks) Prefixed(what string) Checks {
	out := make(Checks, len(cs))
	for i, c := range cs {
		c.Name = what + ": " + c.Name
		out[i] = c
	}
	return out
}

// MissingList is the names in want that have is missing, in want's order, joined for a fix
// line: "autoscaling:SetDesiredCapacity, autoscaling:DeleteTags".
func MissingList(want []string, has func(string) bool) string {
	var miss []string
	for _, w := range want {
		if !has(w) {
			miss = append(miss, w)
		}
	}
	return strings.Join(miss, ", ")
}
