package aws

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/elasticd/elasticd/providers"
)

const (
	// pricePageSize is DescribeSpotPriceHistory's page: asked for the price in effect now, the
	// API answers about one entry per type, zone and product description, so a job's few
	// types fit in one page.
	pricePageSize = 1000
	// maxPricePages bounds the pagination: 100,000 prices is far beyond any answer, and a
	// server that keeps answering with new tokens is broken.
	maxPricePages = 100
)

// linuxProducts are the product descriptions EC2 reports Linux spot prices under; which one
// depends on the account's and region's history (EC2-Classic), so both are asked for and the
// newest entry of a (type, zone) wins.
var linuxProducts = []string{"Linux/UNIX", "Linux/UNIX (Amazon VPC)"}

// SpotPrices returns the current Linux spot price, in USD per instance-hour, of each of types
// in each availability zone of the provider's region: prices[type][zone]. It is
// DescribeSpotPriceHistory from now on, which answers the price in effect now for each zone;
// where one (type, zone) has several entries the newest wins. Types and zones without a
// price, or whose newest price is not positive, are left out; a price that is not a number is
// an error naming the type and zone. No types: an empty map, and nothing is called.
//
// Each call asks the API: the driver's cost accounting caches the answer and asks again about
// hourly, and fills what the API does not answer (on-demand prices) from its price file.
// Throttles are retried like the provider's other EC2 calls, on the same backoff.
func (p *Provider) SpotPrices(ctx context.Context, types []string) (map[string]map[string]float64, error) {
	asked := slices.Sorted(slices.Values(types))
	asked = slices.Compact(asked)
	if len(asked) > 0 && asked[0] == "" {
		asked = asked[1:]
	}
	prices := map[string]map[string]float64{}
	if len(asked) == 0 {
		return prices, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("aws: %s: %w", p.pricesWhere(), err)
	}
	if err := p.clients(ctx); err != nil {
		return nil, fmt.Errorf("aws: %s: %w", p.pricesWhere(), err)
	}
	if err := p.spotPrices(ctx, asked, prices); err != nil {
		return nil, fmt.Errorf("aws: %s: %w", p.pricesWhere(), err)
	}
	return prices, nil
}

// spotPrices pages through DescribeSpotPriceHistory for the asked types (sorted, distinct)
// and fills prices with the newest entry of each (type, zone).
func (p *Provider) spotPrices(ctx context.Context, asked []string, prices map[string]map[string]float64) error {
	in := &ec2.DescribeSpotPriceHistoryInput{
		InstanceTypes:       make([]ec2types.InstanceType, len(asked)),
		ProductDescriptions: slices.Clone(linuxProducts),
		StartTime:           awssdk.Time(time.Now()),
		MaxResults:          awssdk.Int32(pricePageSize),
	}
	for i, t := range asked {
		in.InstanceTypes[i] = ec2types.InstanceType(t)
	}
	type key struct{ typ, zone string }
	type entry struct {
		price float64
		at    time.Time
	}
	newest := map[key]entry{}
	seen := map[string]bool{}
	for page := 0; page < maxPricePages; page++ {
		var out *ec2.DescribeSpotPriceHistoryOutput
		err := p.call(ctx, epEC2, maxAttempts, func(ctx context.Context) (err error) {
			out, err = p.ec2.DescribeSpotPriceHistory(ctx, in)
			return err
		})
		if err != nil {
			return explain(err, "ec2:DescribeSpotPriceHistory")
		}
		for _, sp := range out.SpotPriceHistory {
			typ, zone := string(sp.InstanceType), awssdk.ToString(sp.AvailabilityZone)
			if zone == "" {
				continue
			}
			if _, ok := slices.BinarySearch(asked, typ); !ok {
				continue // not asked for: not the caller's to see
			}
			raw := awssdk.ToString(sp.SpotPrice)
			price, err := strconv.ParseFloat(raw, 64)
			if err != nil || math.IsNaN(price) || math.IsInf(price, 0) {
				return fmt.Errorf("describe spot price history: %s in %s: price %.40q is not a number", typ, zone, raw)
			}
			k, e := key{typ, zone}, entry{price, awssdk.ToTime(sp.Timestamp)}
			// Equal timestamps (the two product descriptions) keep the higher price, so that
			// the answer does not depend on the order of the entries and does not understate
			// the cost.
			if old, ok := newest[k]; !ok || e.at.After(old.at) || e.at.Equal(old.at) && e.price > old.price {
				newest[k] = e
			}
		}
		next := awssdk.ToString(out.NextToken)
		if next == "" {
			for k, e := range newest {
				if e.price <= 0 {
					p.log.Debug("spot price not positive; left out", "type", k.typ, "zone", k.zone, "price", e.price)
					continue
				}
				if prices[k.typ] == nil {
					prices[k.typ] = map[string]float64{}
				}
				prices[k.typ][k.zone] = e.price
			}
			return nil
		}
		if seen[next] {
			return fmt.Errorf("describe spot price history: the API repeated page token %.40q", next)
		}
		seen[next] = true
		in.NextToken = awssdk.String(next)
	}
	return fmt.Errorf("describe spot price history: more than %d pages", maxPricePages)
}

// pricesWhere names the prices' origin for an error: the region, and the endpoint when
// overridden (prices are the region's, not the group's).
func (p *Provider) pricesWhere() string { return "spot prices in " + p.regionWhere() }

var _ providers.SpotPricer = (*Provider)(nil)
