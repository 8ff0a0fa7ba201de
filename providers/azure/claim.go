package azure

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"

	"github.com/elasticd/elasticd/providers"
)

// The scale set's claim (providers.Claimer) is one of its tags, providers.ClaimTagKey. The
// set's GET brings its tags; a PATCH of "tags" replaces them all, so each write sends the
// tags just read with the claim's changed: a tag someone adds between the two is lost, which
// is why the claim is written only when it must be (a start, a refresh every check). The
// PATCH is the set's write (Microsoft.Compute/virtualMachineScaleSets/write), the action that
// setting its capacity needs already.

// Endpoint of the tag PATCH, a key of the loop's gates.
const opTags = "update scale set tags"

var _ providers.Claimer = (*Provider)(nil)

// Claim claims the scale set for c.Owner (providers.ClaimTag): a GET of the set, and unless
// another driver's claim holds, a PATCH of its tags and a GET back.
func (p *Provider) Claim(ctx context.Context, c providers.GroupClaim) (*providers.GroupClaim, error) {
	return providers.ClaimTag(ctx, &setTag{p: p}, c)
}

// Unclaim removes the set's claim when owner holds it: a GET, then a PATCH of its tags.
func (p *Provider) Unclaim(ctx context.Context, owner string) error {
	return providers.UnclaimTag(ctx, &setTag{p: p}, owner)
}

// setTag is the scale set's claim tag (providers.TagStore) for one Claim or Unclaim: tags are
// the set's tags as last read, which a write keeps.
type setTag struct {
	p    *Provider
	tags map[string]*string
}

func (s *setTag) ReadTag(ctx context.Context) (string, error) {
	p := s.p
	ss, err := callOnce(ctx, p, opScaleSet, p.api.scaleSet)
	if err != nil {
		return "", p.loop.Errorf("%w", p.explain(ctx, opScaleSet, err))
	}
	s.tags = ss.Tags
	return deref(ss.Tags[providers.ClaimTagKey]), nil
}

func (s *setTag) WriteTag(ctx context.Context, value string) error {
	tags := maps.Clone(s.tags)
	if tags == nil {
		tags = map[string]*string{}
	}
	tags[providers.ClaimTagKey] = &value
	return s.patch(ctx, tags)
}

func (s *setTag) DeleteTag(ctx context.Context) error {
	if _, ok := s.tags[providers.ClaimTagKey]; !ok {
		return nil
	}
	tags := maps.Clone(s.tags)
	delete(tags, providers.ClaimTagKey)
	return s.patch(ctx, tags)
}

// patch replaces the set's tags with tags.
func (s *setTag) patch(ctx context.Context, tags map[string]*string) error {
	p := s.p
	err := p.loop.Do(ctx, opTags, func(ctx context.Context) error {
		err := p.api.setTags(p.retryContext(ctx), tags, p.lroEvery)
		return p.tagError(ctx, err)
	})
	if err != nil {
		return gated(err)
	}
	s.tags = tags
	return nil
}

// tagError maps the error of a tag PATCH: forbidden is refused for want of the set's write;
// another 400 (a tag ARM does not take, the set's 50 tags) is refused as it is; an operation
// that failed after ARM took the PATCH is an error; the rest is explained as a read's.
func (p *Provider) tagError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return p.explain(ctx, opTags, err)
	}
	var le *lroError
	if errors.As(err, &le) {
		return &apiError{err: err, msg: fmt.Sprintf("%s: the operation failed: %v", opTags, oneLine(le.Error()))}
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return p.explain(ctx, opTags, err)
	}
	code, msg := armError(re)
	what := &apiError{err: err, msg: fmt.Sprintf("HTTP %d %s: %s", re.StatusCode, code, msg)}
	switch re.StatusCode {
	case http.StatusForbidden:
		return providers.Refused(opTags, actionWrite+" on the scale set; the Virtual Machine Contributor role has it", what)
	case http.StatusBadRequest:
		return providers.Refused(opTags, "", what)
	}
	return p.explain(ctx, opTags, err)
}
