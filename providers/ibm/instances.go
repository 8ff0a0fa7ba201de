package ibm

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/common"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/go-openapi/strfmt"
)

// The group's instances are listed at every poll (a spot reclaim shows only in an instance's
// status), and the VPC API can neither leave fields out of a listing nor filter it by
// status. The SDK decodes each instance whole, twice over (into raw JSON per field, then into
// its models): 1 GB of garbage a poll of 10,000 instances. listInstances asks exactly what
// ListInstances asks (the same path, query, headers, through the same client) and decodes the
// answer once, into the fields the provider reads.

// instancePage is one page of GET /instances, as far as the provider reads it.
type instancePage struct {
	Instances []leanInstance `json:"instances"`
	Next      *struct {
		Href *string `json:"href"`
	} `json:"next"`
}

// leanInstance is what the provider reads of an instance.
type leanInstance struct {
	ID                      *string                         `json:"id"`
	Status                  *string                         `json:"status"`
	StatusReasons           []vpcv1.InstanceStatusReason    `json:"status_reasons"`
	LifecycleState          *string                         `json:"lifecycle_state"`
	Zone                    *vpcv1.ZoneReference            `json:"zone"`
	Profile                 *vpcv1.InstanceProfileReference `json:"profile"`
	CreatedAt               *strfmt.DateTime                `json:"created_at"`
	Availability            *vpcv1.InstanceAvailability     `json:"availability"`
	Gpu                     *vpcv1.InstanceGpu              `json:"gpu"`
	InstanceGroupMembership *struct {
		InstanceGroup *struct {
			ID *string `json:"id"`
		} `json:"instance_group"`
	} `json:"instance_group_membership"`
	PrimaryNetworkAttachment *leanAttachment `json:"primary_network_attachment"`
	PrimaryNetworkInterface  *leanAttachment `json:"primary_network_interface"`
}

type leanAttachment struct {
	PrimaryIP *struct {
		Address *string `json:"address"`
	} `json:"primary_ip"`
}

// instance is in as the SDK's model, with the fields the provider reads.
func (in *leanInstance) instance() *vpcv1.Instance {
	out := &vpcv1.Instance{
		ID: in.ID, Status: in.Status, StatusReasons: in.StatusReasons, LifecycleState: in.LifecycleState,
		Zone: in.Zone, Profile: in.Profile, CreatedAt: in.CreatedAt, Availability: in.Availability, Gpu: in.Gpu,
	}
	if m := in.InstanceGroupMembership; m != nil && m.InstanceGroup != nil {
		out.InstanceGroupMembership = &vpcv1.InstanceGroupMembershipReferenceInstanceContext{InstanceGroup: &vpcv1.InstanceGroupReference{ID: m.InstanceGroup.ID}}
	}
	if a := in.PrimaryNetworkAttachment; a != nil && a.PrimaryIP != nil {
		out.PrimaryNetworkAttachment = &vpcv1.InstanceNetworkAttachmentReference{PrimaryIP: &vpcv1.ReservedIPReference{Address: a.PrimaryIP.Address}}
	}
	if a := in.PrimaryNetworkInterface; a != nil && a.PrimaryIP != nil {
		out.PrimaryNetworkInterface = &vpcv1.NetworkInterfaceInstanceContextReference{PrimaryIP: &vpcv1.ReservedIPReference{Address: a.PrimaryIP.Address}}
	}
	return out
}

// listInstances fetches one page of the group's instances from start (nil: the first), as
// vpcv1.VpcV1.ListInstancesWithContext with InstanceGroupMembershipInstanceGroupID, Start and
// Limit would, and returns them with the next page's start (nil after the last).
func (p *Provider) listInstances(ctx context.Context, start *string) ([]leanInstance, *string, *core.DetailedResponse, error) {
	vpc := p.vpc
	b := core.NewRequestBuilder(core.GET).WithContext(ctx)
	b.EnableGzipCompression = vpc.GetEnableGzipCompression()
	if _, err := b.ResolveRequestURL(vpc.Service.Options.URL, `/instances`, nil); err != nil {
		return nil, nil, nil, err
	}
	for name, value := range common.GetSdkHeaders("vpc", "V1", "ListInstances") {
		b.AddHeader(name, value)
	}
	b.AddHeader("Accept", "application/json")
	b.AddQuery("version", fmt.Sprint(*vpc.Version))
	b.AddQuery("generation", fmt.Sprint(*vpc.Generation))
	if start != nil {
		b.AddQuery("start", *start)
	}
	b.AddQuery("limit", fmt.Sprint(pageLimit))
	b.AddQuery("instance_group_membership.instance_group.id", p.groupID)
	req, err := b.Build()
	if err != nil {
		return nil, nil, nil, err
	}
	var page instancePage
	//elasticd:sdkcall vpcv1.ListInstancesWithContext (its request, made here: the permissions it needs)
	resp, err := vpc.Service.Request(req, &page)
	if err != nil {
		return nil, nil, resp, err
	}
	if page.Instances == nil {
		return nil, nil, resp, errors.New("the reply has no instances array")
	}
	var next *string
	if page.Next != nil {
		if next, err = core.GetQueryParam(page.Next.Href, "start"); err != nil {
			return nil, nil, resp, fmt.Errorf("the reply's next page: %w", err)
		}
	}
	return page.Instances, next, resp, nil
}
