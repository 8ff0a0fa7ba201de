package providers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Steering a group: beside Hosts and Notices, a cloud provider may let the driver read and
// set its group's size, hand back one instance for a replacement, and learn why the group
// failed to launch instances. Every one of these calls costs or saves real money, so the
// contract is narrow and the same for every cloud.

// GroupSize is a group's size as the cloud holds it.
type GroupSize struct {
	// Desired is the size the group is asked to keep: AWS DesiredCapacity, a GCP MIG's
	// targetSize, an Azure scale set's sku.capacity, an IBM instance group's membership_count.
	Desired int
	// Min and Max bound Desired as the cloud enforces it. Max is never raised by elasticd.
	// Clouds without a minimum report 0; clouds without a maximum report MaxUnknown.
	Min, Max int
	// Instances is how many instances the group has now, in any state.
	Instances int
	// Autoscaled names what else sets the group's size, when the cloud says ("a GCP
	// autoscaler", "the instance group manager"); empty when nothing does.
	Autoscaled string
}

// MaxUnknown is GroupSize.Max of a group whose cloud sets no maximum of its own.
const MaxUnknown = 1 << 30

func (s GroupSize) String() string {
	max := fmt.Sprint(s.Max)
	if s.Max >= MaxUnknown {
		max = "none"
	}
	return fmt.Sprintf("desired %d (min %d, max %s), %d instances", s.Desired, s.Min, max, s.Instances)
}

// FailureKind classifies a launch failure.
type FailureKind string

const (
	// NoCapacity: the cloud has no capacity of the kind asked for in the zone (spot
	// reclaimed, a stockout): AWS InsufficientInstanceCapacity, GCP ZONE_RESOURCE_POOL_EXHAUSTED,
	// Azure AllocationFailed, IBM cannot_start_capacity.
	NoCapacity FailureKind = "no-capacity"
	// Quota: the account's limit (AWS MaxSpotInstanceCountExceeded, a GCP QUOTA code).
	Quota FailureKind = "quota"
	// OtherFailure: anything else (a bad launch template, no IP space, a permission).
	OtherFailure FailureKind = "other"
)

// LaunchFailure is one failure of the group to launch an instance, as the cloud reports it.
type LaunchFailure struct {
	// ID identifies the failure across polls (a scaling activity's ID, an error's timestamp
	// and instance); the driver counts each ID once.
	ID   string
	At   time.Time
	Kind FailureKind
	// Code is the cloud's own code (InsufficientInstanceCapacity, ZONE_RESOURCE_POOL_EXHAUSTED,
	// ZonalAllocationFailed, cannot_start_capacity), Message its text, both as it gave them.
	Code    string
	Message string
	Zone    string // where known
}

// Capacity is implemented by providers whose group the driver may steer (--manage-capacity).
// Like Hosts, each method is one answer per call: the provider's Loop paces and retries it
// (Loop.Do). A call the cloud refuses for good (a permission, a validation) returns an error
// that wraps ErrRefused and names what is missing.
type Capacity interface {
	// GroupSize reads the group's size.
	GroupSize(ctx context.Context) (GroupSize, error)
	// SetDesired sets the group's desired size to n. Where n is below the group's minimum,
	// the minimum is lowered to n first (the only way a group reaches zero on AWS, or on an
	// IBM group whose manager is enabled, which SetDesired disables). n above the group's
	// maximum is refused (ErrAboveMax): elasticd never raises a maximum.
	SetDesired(ctx context.Context, n int) error
	// Replace hands one instance back to the cloud so that it launches a replacement: the
	// group's desired size stays as it was. An instance no longer in the group is not an
	// error (ErrNotInGroup is returned, which callers take as done).
	Replace(ctx context.Context, hostID string) error
	// LaunchFailures lists the group's recent launch failures, newest last: what the cloud
	// still reports (AWS's scaling activities, a MIG's errors, an IBM membership's instance
	// status reasons, an Azure scale set's failed provisioning), each classified.
	LaunchFailures(ctx context.Context) ([]LaunchFailure, error)
}

var (
	// ErrRefused marks a capacity call the cloud refused and no retry will change: permission
	// denied, a validation error. The error's text names the permission or the fix.
	ErrRefused = errors.New("refused")
	// ErrAboveMax is SetDesired asked for more than the group's maximum.
	ErrAboveMax = errors.New("above the group's maximum size")
	// ErrNotInGroup is Replace of an instance that is no longer the group's.
	ErrNotInGroup = errors.New("not in the group")
)

// Refused wraps err as a refusal of op that needs what (an IAM permission, a role, a setting):
// "op refused (needs what): err".
func Refused(op, what string, err error) error {
	if what == "" {
		return fmt.Errorf("%s %w: %w", op, ErrRefused, err)
	}
	return fmt.Errorf("%s %w (needs %s): %w", op, ErrRefused, what, err)
}

// Classify sorts a launch failure by its cloud's code and message: the codes each cloud
// documents for a stockout, then anything naming a quota or limit.
func Classify(code, message string) FailureKind {
	c := strings.ToUpper(code)
	for _, k := range noCapacityCodes {
		if strings.Contains(c, k) {
			return NoCapacity
		}
	}
	if strings.Contains(c, "QUOTA") || strings.Contains(c, "LIMITEXCEEDED") || strings.Contains(c, "MAXSPOTINSTANCECOUNTEXCEEDED") || strings.Contains(c, "OPERATIONNOTALLOWED") {
		return Quota
	}
	if code == "" {
		m := strings.ToUpper(message)
		for _, k := range noCapacityCodes {
			if strings.Contains(m, k) {
				return NoCapacity
			}
		}
		if strings.Contains(m, "QUOTA") || strings.Contains(m, "MAX SPOT INSTANCE COUNT EXCEEDED") || strings.Contains(m, "MAXSPOTINSTANCECOUNTEXCEEDED") {
			return Quota
		}
	}
	return OtherFailure
}

// noCapacityCodes are the clouds' stockout codes, upper case, as substrings: AWS
// InsufficientInstanceCapacity, InsufficientCapacity, UnfulfillableCapacity,
// SpotMaxPriceTooLow (no spot at the price); GCP ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS],
// RESOURCE_POOL_EXHAUSTED; Azure AllocationFailed, ZonalAllocationFailed,
// OverconstrainedAllocationRequest, OverconstrainedZonalAllocationRequest, SkuNotAvailable;
// IBM cannot_start_capacity, cannot_start_reservation_capacity.
var noCapacityCodes = []string{
	"INSUFFICIENTINSTANCECAPACITY", "INSUFFICIENTCAPACITY", "UNFULFILLABLECAPACITY", "SPOTMAXPRICETOOLOW",
	"RESOURCE_POOL_EXHAUSTED",
	"ALLOCATIONFAILED", "OVERCONSTRAINEDALLOCATIONREQUEST", "OVERCONSTRAINEDZONALALLOCATIONREQUEST", "SKUNOTAVAILABLE",
	"CANNOT_START_CAPACITY", "CANNOT_START_RESERVATION_CAPACITY",
}
