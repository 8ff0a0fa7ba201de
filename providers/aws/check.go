package aws

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/credentials/endpointcreds"
	"github.com/aws/aws-sdk-go-v2/credentials/logincreds"
	"github.com/aws/aws-sdk-go-v2/credentials/processcreds"
	"github.com/aws/aws-sdk-go-v2/credentials/ssocreds"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	asgtypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	iamtypes "github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/elasticd/elasticd/providers"
)

// Checking a job before it starts (providers.Checker): whose credentials the SDK finds and
// from where, the region and from where, the group, each IAM action the job's flags need (asked
// of IAM's policy simulator, else tried without side effects where AWS allows it), and the
// notice queue with the EventBridge rules that feed it. Nothing here changes anything.

var _ providers.Checker = (*Provider)(nil)

// The endpoints of the calls only Check makes, each resting on its own (backoff.go).
const (
	epSTS    = "sts"
	epIAM    = "iam"
	epEvents = "events"
)

// Where the docs say what to do.
const (
	docPermissions = "docs/providers/aws.md, Permissions"
	docQueue       = "docs/providers/aws.md, The notice queue and its rules"
)

// Permission is one IAM action a job needs, and what it must be granted on.
type Permission struct {
	// Action is the IAM action, "autoscaling:SetDesiredCapacity".
	Action string
	// On is the resource: OnAny for the Describe calls, which take no resource-level
	// permission; OnGroup for the group's ARN; OnQueue for the notice queue's ARN.
	On string
}

// What a Permission is granted on.
const (
	OnAny   = "*"
	OnGroup = "group"
	OnQueue = "queue"
)

// Permissions is every IAM action the provider's calls need for a job with these needs, and a
// notice queue when queue is set: the discovery calls always, the spot prices with
// needs.Prices, the queue's receive and delete and the lifecycle completion with a queue, the
// steering and claim calls of capacity.go and claim.go with needs.ManageCapacity. It is the one
// list Check asks IAM about, and what docs/providers/aws.md and terraform/aws grant.
func Permissions(needs providers.CheckNeeds, queue bool) []Permission {
	ps := []Permission{
		{"autoscaling:DescribeAutoScalingGroups", OnAny},
		{"ec2:DescribeInstances", OnAny},
	}
	if needs.Prices {
		ps = append(ps, Permission{"ec2:DescribeSpotPriceHistory", OnAny})
	}
	if queue {
		ps = append(ps,
			Permission{"sqs:ReceiveMessage", OnQueue},
			Permission{"sqs:DeleteMessage", OnQueue}, // DeleteMessageBatch is authorized as DeleteMessage
			Permission{"autoscaling:CompleteLifecycleAction", OnGroup},
		)
	}
	if needs.ManageCapacity {
		ps = append(ps,
			Permission{"autoscaling:SetDesiredCapacity", OnGroup},
			Permission{"autoscaling:UpdateAutoScalingGroup", OnGroup},
			Permission{"autoscaling:TerminateInstanceInAutoScalingGroup", OnGroup},
			Permission{"autoscaling:DescribeScalingActivities", OnAny},
			Permission{"autoscaling:CreateOrUpdateTags", OnGroup},
			Permission{"autoscaling:DeleteTags", OnGroup},
		)
	}
	return ps
}

// Check checks, without changing anything, what the job needs of AWS: the credentials and
// whose they are (sts:GetCallerIdentity), the region, the group (DescribeAutoScalingGroups),
// each permission of Permissions (iam:SimulatePrincipalPolicy, else DryRun calls and reads),
// and with a queue, the queue (sqs:GetQueueAttributes), its policy and the EventBridge rules
// that feed it (events:ListRuleNamesByTarget, events:DescribeRule). Without usable
// credentials or a region, the checks that need them are reported skipped.
func (p *Provider) Check(ctx context.Context, needs providers.CheckNeeds) []providers.Check {
	c := &checker{p: p, needs: needs}
	c.run(ctx)
	return c.out
}

// checker is one Check: what it found so far, and the lines it made.
type checker struct {
	p     *Provider
	needs providers.CheckNeeds
	out   []providers.Check

	caller   principal // whose the credentials are
	source   string    // the IAM principal whose policies are simulated; empty: none
	group    *asgtypes.AutoScalingGroup
	groupErr error
	queueARN string
}

func (c *checker) add(cs ...providers.Check) { c.out = append(c.out, cs...) }

// skipRest reports every later check skipped for one reason, once.
func (c *checker) skipRest(why string) {
	c.add(providers.Skipped("group", why, ""))
	c.add(providers.Skipped("permissions", why, ""))
	if c.p.cfg.SQSQueueURL != "" {
		c.add(providers.Skipped("notice queue", why, ""))
	}
}

func (c *checker) run(ctx context.Context) {
	p := c.p
	ac, err := p.loadConfig(ctx)
	if err != nil {
		c.add(providers.Fail("credentials", err.Error(),
			"check that AWS_PROFILE names a profile of the AWS config file ("+configFile()+") and that the file is valid"))
		c.add(providers.Skipped("region", "the AWS configuration did not load", ""))
		c.skipRest("the AWS configuration did not load")
		return
	}
	regionLine := c.region(ac.Region)

	var creds awssdk.Credentials
	if ac.Credentials == nil {
		err = errors.New("no credential provider")
	} else {
		creds, err = ac.Credentials.Retrieve(ctx)
	}
	if err != nil {
		c.add(providers.Fail("credentials", "no usable AWS credentials: "+err.Error(),
			"set AWS_PROFILE to a profile with credentials, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "+
				"or run elasticd on an EC2 instance whose instance profile gives it a role"))
		c.add(regionLine)
		c.skipRest("no usable AWS credentials")
		return
	}
	from := credentialSource(creds.Source)
	if ac.Region == "" {
		c.add(providers.OK("credentials", from+" (whose they are was not asked: no region)"))
		c.add(regionLine)
		c.skipRest("no region")
		return
	}
	if err := p.useConfig(ac); err != nil { // the region is there: not expected
		c.add(providers.Fail("credentials", from+", but the SDK's clients could not be made: "+err.Error(), "give --region"))
		c.add(regionLine)
		c.skipRest("the SDK's clients could not be made")
		return
	}

	var id *sts.GetCallerIdentityOutput
	err = p.call(ctx, epSTS, maxAttempts, func(ctx context.Context) (err error) {
		id, err = p.sts.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		return err
	})
	if err != nil {
		why := "the credentials were not accepted"
		if code, _ := apiError(err); rejectedCodes[code] {
			c.add(providers.Fail("credentials", from+", but AWS rejected them: "+short(err),
				"renew them or use current ones of the group's account (`aws sts get-caller-identity` shows whose they are)"))
		} else {
			why = "STS could not be asked whose the credentials are"
			c.add(providers.Fail("credentials", from+", but STS could not say whose they are: "+short(err),
				"check the network path to STS in "+p.regionWhere()+" (--endpoint, AWS_ENDPOINT_URL_STS, a proxy)"))
		}
		c.add(regionLine)
		c.skipRest(why)
		return
	}
	c.caller = parsePrincipal(awssdk.ToString(id.Arn))
	c.caller.account = cmp.Or(awssdk.ToString(id.Account), c.caller.account)
	c.add(providers.OK("credentials", fmt.Sprintf("%s, as %s (account %s)", from, c.caller.arn, c.caller.account)))
	c.add(regionLine)
	switch c.caller.kind {
	case "assumed-role", "user", "role":
		c.source = c.policySource(ctx)
	}

	c.checkGroup(ctx)
	var queueLines []providers.Check
	if p.cfg.SQSQueueURL != "" {
		queueLines = c.checkQueue(ctx)
	}
	c.checkPermissions(ctx)
	if p.cfg.SQSQueueURL == "" {
		c.add(providers.Skipped("notice queue", "no --sqs-queue-url: spot interruption warnings are not read, so the job "+
			"learns of an interruption only when the instance is gone, and rolls back to its last commit",
			"give --sqs-queue-url, a queue that EventBridge rules feed ("+docQueue+")"))
	}
	c.add(queueLines...)
}

// region is the region's line: the region and where it came from.
func (c *checker) region(region string) providers.Check {
	if region == "" {
		return providers.Fail("region", "none: no --region, AWS_REGION, AWS_DEFAULT_REGION or region in the profile",
			"give --region, the group's region (us-east-1, say)")
	}
	var from string
	switch {
	case c.p.cfg.Region != "":
		from = "--region"
	case os.Getenv("AWS_REGION") == region:
		from = "AWS_REGION"
	case os.Getenv("AWS_DEFAULT_REGION") == region:
		from = "AWS_DEFAULT_REGION"
	default:
		from = fmt.Sprintf("profile %q of %s", profile(), configFile())
	}
	detail := region + ", from " + from
	if c.p.cfg.Endpoint != "" {
		detail += ", every API through " + c.p.cfg.Endpoint + " (--endpoint)"
	}
	return providers.OK("region", detail)
}

// profile is the shared config profile the SDK reads.
func profile() string {
	return cmp.Or(os.Getenv("AWS_PROFILE"), os.Getenv("AWS_DEFAULT_PROFILE"), "default")
}

// configFile is the shared config file the SDK reads.
func configFile() string { return cmp.Or(os.Getenv("AWS_CONFIG_FILE"), "~/.aws/config") }

// credentialSource says where the SDK found credentials, from their Source.
func credentialSource(src string) string {
	switch {
	case src == config.CredentialsSourceName:
		return "from the environment (AWS_ACCESS_KEY_ID)"
	case strings.HasPrefix(src, "SharedConfigCredentials"): // "SharedConfigCredentials: <file>"
		file := strings.TrimSpace(strings.TrimPrefix(src, "SharedConfigCredentials:"))
		return fmt.Sprintf("from the shared credentials file %s, profile %q", cmp.Or(file, "~/.aws/credentials"), profile())
	case src == ec2rolecreds.ProviderName:
		return "from the EC2 instance's role (instance metadata)"
	case src == stscreds.ProviderName:
		return fmt.Sprintf("by assuming the role of profile %q", profile())
	case src == stscreds.WebIdentityProviderName:
		return "from a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN)"
	case src == ssocreds.ProviderName:
		return fmt.Sprintf("from an SSO session, profile %q", profile())
	case src == processcreds.ProviderName:
		return fmt.Sprintf("from the credential_process of profile %q", profile())
	case src == endpointcreds.ProviderName:
		return "from the container credentials endpoint (ECS task role, EKS Pod Identity)"
	case src == logincreds.ProviderName:
		return fmt.Sprintf("from an `aws login` session, profile %q", profile())
	case src == "":
		return "from an unnamed source"
	}
	return "from " + src
}

// principal is the caller, as STS names it.
type principal struct {
	arn, partition, account string
	kind                    string // "assumed-role", "user", "role", "root", "federated-user"; else empty
	name                    string // the role's or user's name
}

// parsePrincipal reads arn:PARTITION:sts::ACCOUNT:assumed-role/ROLE/SESSION,
// arn:PARTITION:iam::ACCOUNT:user/PATH/NAME, arn:PARTITION:iam::ACCOUNT:root and the like.
func parsePrincipal(arn string) principal {
	pr := principal{arn: arn}
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) != 6 || parts[0] != "arn" {
		return pr
	}
	pr.partition, pr.account = parts[1], parts[4]
	res := parts[5]
	switch service := parts[2]; {
	case service == "sts" && strings.HasPrefix(res, "assumed-role/"):
		if role, _, ok := strings.Cut(strings.TrimPrefix(res, "assumed-role/"), "/"); ok {
			pr.kind, pr.name = "assumed-role", role
		}
	case service == "sts" && strings.HasPrefix(res, "federated-user/"):
		pr.kind = "federated-user"
	case service == "iam" && res == "root":
		pr.kind = "root"
	case service == "iam" && (strings.HasPrefix(res, "user/") || strings.HasPrefix(res, "role/")):
		pr.kind, _, _ = strings.Cut(res, "/")
		pr.name = res[strings.LastIndex(res, "/")+1:]
	}
	return pr
}

// checkGroup reads the group.
func (c *checker) checkGroup(ctx context.Context) {
	p := c.p
	g, err := p.describeGroup(ctx)
	c.groupErr = err
	where := fmt.Sprintf("%q in %s", p.cfg.ASG, p.regionWhere())
	switch code, _ := apiError(err); {
	case err == nil:
		c.group = &g
		s := sizeOf(g)
		detail := fmt.Sprintf("%s: desired %d (min %d, max %d), %d instance%s", where, s.Desired, s.Min, s.Max, s.Instances,
			map[bool]string{true: "s"}[s.Instances != 1])
		switch {
		case strings.EqualFold(awssdk.ToString(g.Status), "Delete in progress"):
			c.add(providers.Fail("group", detail+"; it is being deleted", "give --asg a group that is not being deleted"))
		case s.Max == 0:
			c.add(providers.Fail("group", detail+"; its maximum size is 0, so it can never have an instance (elasticd never raises it)",
				fmt.Sprintf("raise it: `aws autoscaling update-auto-scaling-group --auto-scaling-group-name %s --max-size N`", p.cfg.ASG)))
		default:
			c.add(providers.OK("group", detail))
		}
	case errors.Is(err, errGroupNotFound):
		c.add(providers.Fail("group", "no Auto Scaling group "+where,
			fmt.Sprintf("check --asg (names are case-sensitive) and --region; `aws autoscaling describe-auto-scaling-groups --region %s "+
				"--query 'AutoScalingGroups[].AutoScalingGroupName'` lists the region's groups", cmp.Or(p.region, "REGION"))))
	case deniedCodes[code]:
		c.add(providers.Fail("group", where+": the credentials may not call autoscaling:DescribeAutoScalingGroups",
			fmt.Sprintf("grant autoscaling:DescribeAutoScalingGroups on * to %s (%s)", c.grantee(), docPermissions)))
	default:
		c.add(providers.Fail("group", where+": could not read it: "+short(err),
			"check the network path to Auto Scaling in "+cmp.Or(p.region, "the region")+" (--endpoint, AWS_ENDPOINT_URL_AUTO_SCALING, a proxy)"))
	}
}

// grantee names who a fix grants to: the principal whose policies were simulated, else the caller.
func (c *checker) grantee() string {
	if c.source != "" {
		return c.source
	}
	if c.caller.kind == "assumed-role" {
		return "the role " + c.caller.name
	}
	return cmp.Or(c.caller.arn, "the credentials' principal")
}

// resource is the ARN a permission is granted on; empty when it is not known.
func (c *checker) resource(on string) string {
	switch on {
	case OnGroup:
		if c.group != nil {
			return awssdk.ToString(c.group.AutoScalingGroupARN)
		}
		return ""
	case OnQueue:
		return c.queueARN
	}
	return "*"
}

// permName is the check name of an action.
func permName(action string) string { return "permission " + action }

// checkPermissions asks IAM's policy simulator about each permission the job needs, on what
// it must be granted on; where the simulator may not be asked, it tries what can be tried
// without side effects.
func (c *checker) checkPermissions(ctx context.Context) {
	perms := Permissions(c.needs, c.p.cfg.SQSQueueURL != "")
	var ask []Permission
	for _, pm := range perms {
		if c.resource(pm.On) == "" {
			continue
		}
		ask = append(ask, pm)
	}
	var (
		results map[string]iamtypes.EvaluationResult
		why     providers.Check // the line that says why the simulator was not asked
	)
	switch c.caller.kind {
	case "root":
		c.add(providers.Skipped("permissions", "the credentials are the account's root user, which may call everything: "+
			"nothing to check, but the driver should not run as root",
			"run elasticd with a role that has the permissions of "+docPermissions))
		return
	case "assumed-role", "user", "role":
		var err error
		results, err = c.simulate(ctx, ask)
		if err != nil {
			why = c.simulateFailed(err)
		}
	default:
		why = providers.Skipped("permissions", fmt.Sprintf("IAM's policy simulator cannot be asked about %s, which is not an IAM user or role; "+
			"what can be tried without side effects is tried below", c.caller.arn), "check its permissions by hand against "+docPermissions)
	}
	if results == nil {
		c.add(why)
	}
	for _, pm := range perms {
		res := c.resource(pm.On)
		switch {
		case res == "":
			what := "the group was not read"
			if pm.On == OnQueue {
				what = "the queue's ARN is not known"
			}
			c.add(providers.Skipped(permName(pm.Action), "not asked: "+what, ""))
		case results != nil:
			c.add(c.decision(pm, res, results))
		default:
			c.add(c.probe(ctx, pm, res))
		}
	}
}

// policySource is the ARN of the IAM principal whose policies decide what the credentials may
// do: for an assumed role, the role (iam:GetRole gives its ARN with its path; without it, the
// ARN is made from its name, which is right unless the role has a path).
func (c *checker) policySource(ctx context.Context) string {
	pr := c.caller
	if pr.kind != "assumed-role" {
		return pr.arn
	}
	var out *iam.GetRoleOutput
	err := c.p.call(ctx, epIAM, maxAttempts, func(ctx context.Context) (err error) {
		out, err = c.p.iam.GetRole(ctx, &iam.GetRoleInput{RoleName: awssdk.String(pr.name)})
		return err
	})
	if err == nil && out.Role != nil && awssdk.ToString(out.Role.Arn) != "" {
		return awssdk.ToString(out.Role.Arn)
	}
	c.p.log.Debug("iam:GetRole refused; the role's ARN is made from its name", "role", pr.name, "error", err)
	return fmt.Sprintf("arn:%s:iam::%s:role/%s", pr.partition, pr.account, pr.name)
}

// maxSimulatePages bounds the simulator's pagination; a job needs a dozen actions.
const maxSimulatePages = 20

// simulate asks iam:SimulatePrincipalPolicy about each permission on its resource, one call
// per resource. The results are keyed by action and the resource asked about.
func (c *checker) simulate(ctx context.Context, ask []Permission) (map[string]iamtypes.EvaluationResult, error) {
	byRes := map[string][]string{}
	var order []string
	for _, pm := range ask {
		res := c.resource(pm.On)
		if byRes[res] == nil {
			order = append(order, res)
		}
		byRes[res] = append(byRes[res], pm.Action)
	}
	results := map[string]iamtypes.EvaluationResult{}
	for _, res := range order {
		in := &iam.SimulatePrincipalPolicyInput{
			PolicySourceArn: awssdk.String(c.source),
			ActionNames:     byRes[res],
			ResourceArns:    []string{res},
		}
		seen := map[string]bool{}
		for page := 0; ; page++ {
			if page == maxSimulatePages {
				return nil, fmt.Errorf("simulate principal policy: more than %d pages", maxSimulatePages)
			}
			var out *iam.SimulatePrincipalPolicyOutput
			err := c.p.call(ctx, epIAM, maxAttempts, func(ctx context.Context) (err error) {
				out, err = c.p.iam.SimulatePrincipalPolicy(ctx, in)
				return err
			})
			if err != nil {
				return nil, err
			}
			for _, r := range out.EvaluationResults {
				results[awssdk.ToString(r.EvalActionName)+" "+res] = r
			}
			next := awssdk.ToString(out.Marker)
			if !out.IsTruncated || next == "" {
				break
			}
			if seen[next] {
				return nil, fmt.Errorf("simulate principal policy: the API repeated marker %.40q", next)
			}
			seen[next] = true
			in.Marker = awssdk.String(next)
		}
	}
	return results, nil
}

// simulateFailed is the line that says why the simulator gave no answer.
func (c *checker) simulateFailed(err error) providers.Check {
	const rest = "; what can be tried without side effects is tried below"
	switch code, msg := apiError(err); {
	case deniedCodes[code]:
		return providers.Skipped("permissions", fmt.Sprintf("the credentials may not call iam:SimulatePrincipalPolicy on %s, "+
			"which asks IAM what they may do%s", c.source, rest),
			fmt.Sprintf("grant iam:SimulatePrincipalPolicy (and iam:GetRole) on %s to it for a full check, or check its policies by hand against %s",
				c.source, docPermissions))
	case code == "NoSuchEntity":
		return providers.Skipped("permissions", fmt.Sprintf("IAM knows no principal %s (%s)%s", c.source, msg, rest),
			"grant iam:GetRole on the role, so that the check finds the role's ARN with its path")
	default:
		return providers.Skipped("permissions", "IAM's policy simulator gave no answer: "+short(err)+rest,
			"check its policies by hand against "+docPermissions)
	}
}

// decision is the line of one simulated permission.
func (c *checker) decision(pm Permission, res string, results map[string]iamtypes.EvaluationResult) providers.Check {
	name := permName(pm.Action)
	r, ok := results[pm.Action+" "+res]
	if !ok {
		return providers.Skipped(name, "IAM's policy simulator gave no result for it on "+res, "check it by hand against "+docPermissions)
	}
	on := "on " + res
	grant := fmt.Sprintf("grant %s %s to %s (%s)", pm.Action, on, c.source, docPermissions)
	switch r.EvalDecision {
	case iamtypes.PolicyEvaluationDecisionTypeAllowed:
		return providers.OK(name, "allowed "+on)
	case iamtypes.PolicyEvaluationDecisionTypeExplicitDeny:
		var ids []string
		for _, s := range r.MatchedStatements {
			if id := awssdk.ToString(s.SourcePolicyId); id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		by := "a policy"
		if len(ids) > 0 {
			by = "policy " + strings.Join(ids, ", ")
		}
		return providers.Fail(name, fmt.Sprintf("denied %s by an explicit Deny in %s", on, by),
			fmt.Sprintf("remove %s from the Deny statement of %s that applies to %s (a Deny overrides every Allow)", pm.Action, by, c.source))
	}
	// implicitDeny: no statement allows it, or a boundary or an organization's policy does not.
	switch {
	case r.OrganizationsDecisionDetail != nil && !r.OrganizationsDecisionDetail.AllowedByOrganizations:
		return providers.Fail(name, "not allowed "+on+": a service control policy of the AWS organization does not allow it",
			"ask the organization's administrators to allow "+pm.Action+" in its service control policies")
	case r.PermissionsBoundaryDecisionDetail != nil && !r.PermissionsBoundaryDecisionDetail.AllowedByPermissionsBoundary:
		return providers.Fail(name, "not allowed "+on+": the permissions boundary of "+c.source+" does not allow it",
			"allow "+pm.Action+" in the permissions boundary of "+c.source)
	case len(r.MissingContextValues) > 0:
		keys := strings.Join(r.MissingContextValues, ", ")
		return providers.Skipped(name, fmt.Sprintf("not verified %s: the policies' conditions need %s, which a simulation cannot know", on, keys),
			fmt.Sprintf("check by hand that the conditions on %s hold for %s, or %s", keys, res, grant))
	}
	return providers.Fail(name, fmt.Sprintf("not allowed %s: no policy of %s allows it", on, c.source), grant)
}

// probe checks one permission without the simulator, where a call without side effects
// proves it: the group's read (already made), EC2's DryRun, a read of one scaling activity.
// The rest cannot be tried without acting, and are reported skipped.
func (c *checker) probe(ctx context.Context, pm Permission, res string) providers.Check {
	p := c.p
	name := permName(pm.Action)
	grant := fmt.Sprintf("grant %s on %s to %s (%s)", pm.Action, res, c.grantee(), docPermissions)
	denied := func(how string) providers.Check {
		return providers.Fail(name, "not allowed: "+how+" was refused", grant)
	}
	var err error
	var how string
	switch pm.Action {
	case "autoscaling:DescribeAutoScalingGroups":
		err, how = c.groupErr, "reading the group"
		if errors.Is(err, errGroupNotFound) {
			err = nil // the call was answered
		}
	case "ec2:DescribeInstances":
		how = "a DryRun DescribeInstances"
		err = p.call(ctx, epEC2, maxAttempts, func(ctx context.Context) error {
			_, err := p.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{DryRun: awssdk.Bool(true)})
			return dryRunAnswer(err)
		})
	case "ec2:DescribeSpotPriceHistory":
		how = "a DryRun DescribeSpotPriceHistory"
		err = p.call(ctx, epEC2, maxAttempts, func(ctx context.Context) error {
			_, err := p.ec2.DescribeSpotPriceHistory(ctx, &ec2.DescribeSpotPriceHistoryInput{DryRun: awssdk.Bool(true)})
			return dryRunAnswer(err)
		})
	case "autoscaling:DescribeScalingActivities":
		how = "reading one scaling activity"
		err = p.call(ctx, epASG, maxAttempts, func(ctx context.Context) error {
			_, err := p.asg.DescribeScalingActivities(ctx, &autoscaling.DescribeScalingActivitiesInput{
				AutoScalingGroupName: awssdk.String(p.cfg.ASG), MaxRecords: awssdk.Int32(1),
			})
			return err
		})
	default:
		service, _, _ := strings.Cut(pm.Action, ":")
		why := "Auto Scaling has no dry run: only the change itself would tell"
		if service == "sqs" {
			why = "SQS has no dry run, and a receive would hide the queue's messages from the driver"
		}
		return providers.Skipped(name, "not verified without iam:SimulatePrincipalPolicy: "+why,
			fmt.Sprintf("make sure %s is granted on %s to %s (%s)", pm.Action, res, c.grantee(), docPermissions))
	}
	switch code, _ := apiError(err); {
	case err == nil:
		return providers.OK(name, "allowed: "+how+" was answered")
	case deniedCodes[code]:
		return denied(how)
	}
	return providers.Skipped(name, how+" failed, which says nothing about the permission: "+short(err), "")
}

// dryRunAnswer reads the answer to a DryRun call: DryRunOperation means it would have
// succeeded (nil), UnauthorizedOperation that the permission is missing (the error).
func dryRunAnswer(err error) error {
	if code, _ := apiError(err); code == "DryRunOperation" {
		return nil
	}
	if err == nil {
		return errors.New("the API ignored DryRun")
	}
	return err
}

// checkQueue reads the queue's ARN, policy and the rules that feed it. It returns its lines,
// which come after the permissions'; the queue's ARN is known to those.
func (c *checker) checkQueue(ctx context.Context) []providers.Check {
	p := c.p
	qurl := p.cfg.SQSQueueURL
	c.queueARN = queueARN(qurl, c.caller.partition, p.region)
	var out *sqs.GetQueueAttributesOutput
	err := p.call(ctx, epSQS, maxAttempts, func(ctx context.Context) (err error) {
		out, err = p.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
			QueueUrl:       awssdk.String(qurl),
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn, sqstypes.QueueAttributeNamePolicy, sqstypes.QueueAttributeNameKmsMasterKeyId},
		})
		return err
	})
	var lines []providers.Check
	var policy *string
	switch code, _ := apiError(err); {
	case err == nil:
		c.queueARN = cmp.Or(out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)], c.queueARN)
		detail := "reachable: " + c.queueARN
		switch key := out.Attributes[string(sqstypes.QueueAttributeNameKmsMasterKeyId)]; key {
		case "":
		case "alias/aws/sqs":
			// Its key policy cannot be changed to let EventBridge use it.
			lines = append(lines, providers.Fail("notice queue", detail+"; encrypted with the AWS managed key alias/aws/sqs, "+
				"which EventBridge may not use: no notice will arrive",
				"encrypt the queue with SQS-managed encryption (SqsManagedSseEnabled), or with a customer managed key whose policy lets "+
					"events.amazonaws.com use kms:GenerateDataKey and kms:Decrypt ("+docQueue+")"))
		default:
			detail += fmt.Sprintf("; encrypted with KMS key %s, whose policy must let events.amazonaws.com use kms:GenerateDataKey and kms:Decrypt, "+
				"and the driver kms:Decrypt", key)
		}
		if len(lines) == 0 {
			lines = append(lines, providers.OK("notice queue", detail))
		}
		pol, ok := out.Attributes[string(sqstypes.QueueAttributeNamePolicy)]
		policy = &pol
		if !ok {
			policy = new(string)
		}
	case noQueueCodes[code]:
		lines = append(lines, providers.Fail("notice queue", fmt.Sprintf("no queue at %s in %s", qurl, p.regionWhere()),
			"check --sqs-queue-url; the queue must be in the group's region ("+docQueue+")"))
		c.queueARN = ""
		return append(lines, providers.Skipped("notice rules", "the queue was not found", ""))
	case deniedCodes[code]:
		lines = append(lines, providers.Skipped("notice queue", "the credentials may not call sqs:GetQueueAttributes, which only this check needs: "+
			"the queue's existence and policy are not checked",
			fmt.Sprintf("grant sqs:GetQueueAttributes on %s for this check, or `aws sqs get-queue-attributes --queue-url %s --attribute-names Policy`",
				cmp.Or(c.queueARN, "the queue"), qurl)))
	default:
		lines = append(lines, providers.Fail("notice queue", "could not read "+qurl+": "+short(err),
			"check --sqs-queue-url and the network path to SQS (--endpoint, AWS_ENDPOINT_URL_SQS, a proxy)"))
		return append(lines, providers.Skipped("notice rules", "the queue could not be read", ""))
	}
	if c.queueARN == "" {
		return append(lines, providers.Skipped("notice rules", "the queue's ARN is not known: --sqs-queue-url is not https://sqs.REGION.amazonaws.com/ACCOUNT/NAME", ""))
	}
	rules, rulesLine := c.checkRules(ctx)
	switch {
	case policy == nil:
		lines = append(lines, providers.Skipped("notice queue policy", "the queue's policy could not be read", ""))
	default:
		lines = append(lines, c.checkPolicy(*policy, rules))
	}
	return append(lines, rulesLine)
}

// queueARN makes the queue's ARN from its URL, https://sqs.REGION.amazonaws.com/ACCOUNT/NAME;
// empty when the URL's path is not /ACCOUNT/NAME.
func queueARN(qurl, partition, region string) string {
	u, err := url.Parse(qurl)
	if err != nil {
		return ""
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return ""
	}
	if r, ok := queueRegion(u.Host); ok {
		region = r
	}
	return fmt.Sprintf("arn:%s:sqs:%s:%s:%s", cmp.Or(partition, "aws"), region, parts[0], parts[1])
}

// eventKind is an event the queue may be fed, as an EventBridge pattern matches it.
type eventKind struct {
	what, source, detailType string
}

var (
	spotEvents = eventKind{"spot interruption warnings", "aws.ec2", "EC2 Spot Instance Interruption Warning"}
	// optionalEvents are mentioned when a rule sends them.
	optionalEvents = []eventKind{
		{"rebalance recommendations", "aws.ec2", "EC2 Instance Rebalance Recommendation"},
		{"state changes", "aws.ec2", "EC2 Instance State-change Notification"},
		{"scale-in lifecycle actions", "aws.autoscaling", "EC2 Instance-terminate Lifecycle Action"},
		{"AWS Health events", "aws.health", "AWS Health Event"},
	}
)

// rule is an EventBridge rule that targets the queue.
type rule struct {
	name, arn string
	enabled   bool
	spot      bool
	sends     []string // the optional events it sends
}

// maxRulePages bounds ListRuleNamesByTarget's pagination (100 names a page).
const maxRulePages = 20

// checkRules finds the rules of the default event bus that target the queue; the line says
// whether one that is enabled sends spot interruption warnings. rules is nil when they could
// not be listed.
func (c *checker) checkRules(ctx context.Context) ([]rule, providers.Check) {
	const name = "notice rules"
	p := c.p
	in := &eventbridge.ListRuleNamesByTargetInput{TargetArn: awssdk.String(c.queueARN)}
	var names []string
	seen := map[string]bool{}
	for page := 0; ; page++ {
		if page == maxRulePages {
			return nil, providers.Skipped(name, fmt.Sprintf("more than %d pages of rules target the queue", maxRulePages), "")
		}
		var out *eventbridge.ListRuleNamesByTargetOutput
		err := p.call(ctx, epEvents, maxAttempts, func(ctx context.Context) (err error) {
			out, err = p.events.ListRuleNamesByTarget(ctx, in)
			return err
		})
		if err != nil {
			return nil, c.rulesFailed("events:ListRuleNamesByTarget", err)
		}
		names = append(names, out.RuleNames...)
		next := awssdk.ToString(out.NextToken)
		if next == "" || seen[next] {
			break
		}
		seen[next] = true
		in.NextToken = awssdk.String(next)
	}
	rules := []rule{}
	for _, n := range names {
		var out *eventbridge.DescribeRuleOutput
		err := p.call(ctx, epEvents, maxAttempts, func(ctx context.Context) (err error) {
			out, err = p.events.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: awssdk.String(n)})
			return err
		})
		if code, _ := apiError(err); code == "ResourceNotFoundException" {
			continue // deleted since it was listed
		} else if err != nil {
			return nil, c.rulesFailed("events:DescribeRule", err)
		}
		r := rule{name: n, arn: awssdk.ToString(out.Arn),
			enabled: out.State == ebtypes.RuleStateEnabled || out.State == ebtypes.RuleStateEnabledWithAllCloudtrailManagementEvents}
		var pattern map[string]any
		if json.Unmarshal([]byte(awssdk.ToString(out.EventPattern)), &pattern) == nil && pattern != nil {
			r.spot = matches(pattern, spotEvents)
			for _, k := range optionalEvents {
				if matches(pattern, k) {
					r.sends = append(r.sends, k.what)
				}
			}
		}
		rules = append(rules, r)
	}
	return rules, rulesLine(rules, c.queueARN, p.cfg.ASG)
}

// rulesFailed is the line of a rules check that could not be made.
func (c *checker) rulesFailed(action string, err error) providers.Check {
	const name = "notice rules"
	how := fmt.Sprintf("`aws events list-rule-names-by-target --target-arn %s`", c.queueARN)
	if code, _ := apiError(err); deniedCodes[code] {
		return providers.Skipped(name, "the credentials may not call "+action+", which only this check needs: which EventBridge rules feed the queue is not checked",
			"grant events:ListRuleNamesByTarget and events:DescribeRule for this check, or list them with "+how)
	}
	return providers.Skipped(name, "EventBridge could not be asked which rules feed the queue: "+short(err), "list them with "+how)
}

// rulesLine says whether the rules send spot interruption warnings to the queue.
func rulesLine(rules []rule, queue, group string) providers.Check {
	const name = "notice rules"
	create := fmt.Sprintf("create one: `aws events put-rule --name elasticd-%s-spot --event-pattern "+
		`'{"source":["aws.ec2"],"detail-type":["EC2 Spot Instance Interruption Warning","EC2 Instance Rebalance Recommendation"]}'`+
		"` and `aws events put-targets --rule elasticd-%s-spot --targets Id=queue,Arn=%s`, or use the Terraform module terraform/aws (%s)",
		group, group, queue, docQueue)
	var spot, disabled, others []string
	also := map[string][]string{}
	var kinds []string
	for _, r := range rules {
		switch {
		case !r.enabled && r.spot:
			disabled = append(disabled, r.name)
		case !r.enabled:
		case r.spot:
			spot = append(spot, r.name)
		default:
			others = append(others, r.name)
		}
		if !r.enabled {
			continue
		}
		for _, k := range r.sends {
			if also[k] == nil {
				kinds = append(kinds, k)
			}
			also[k] = append(also[k], r.name)
		}
	}
	switch {
	case len(rules) == 0:
		return providers.Fail(name, "the queue is fed by no EventBridge rule: no spot notice will arrive", create)
	case len(spot) > 0:
		detail := "spot interruption warnings from rule " + strings.Join(spot, ", ")
		for _, k := range kinds {
			detail += fmt.Sprintf("; %s from %s", k, strings.Join(also[k], ", "))
		}
		if len(disabled) > 0 {
			detail += "; disabled: " + strings.Join(disabled, ", ")
		}
		return providers.OK(name, detail)
	case len(disabled) > 0:
		return providers.Fail(name, fmt.Sprintf("rule %s would send spot interruption warnings but is DISABLED: no spot notice will arrive",
			strings.Join(disabled, ", ")),
			fmt.Sprintf("enable it: `aws events enable-rule --name %s`", disabled[0]))
	}
	var names []string
	for _, r := range rules {
		names = append(names, r.name)
	}
	return providers.Fail(name, fmt.Sprintf("rules %s feed the queue, but none that is enabled matches EC2 Spot Instance Interruption Warning "+
		"(source aws.ec2): no spot notice will arrive", strings.Join(names, ", ")), create)
}

// matches reports whether an EventBridge pattern matches events of kind k, by their source
// and detail-type (a field the pattern does not name matches anything). Values are matched
// exactly or by prefix and wildcard; any other matcher counts as no match.
func matches(pattern map[string]any, k eventKind) bool {
	return matchField(pattern["source"], k.source) && matchField(pattern["detail-type"], k.detailType)
}

func matchField(v any, value string) bool {
	if v == nil {
		return true
	}
	list, ok := v.([]any)
	if !ok {
		return false
	}
	for _, m := range list {
		switch m := m.(type) {
		case string:
			if m == value {
				return true
			}
		case map[string]any:
			if pre, ok := m["prefix"].(string); ok && strings.HasPrefix(value, pre) {
				return true
			}
			if w, ok := m["wildcard"].(string); ok && wildcard(w, value, false) {
				return true
			}
		}
	}
	return false
}

// wildcard matches s against pattern, in which * is any run of characters and, with
// question, ? is any one character.
func wildcard(pattern, s string, question bool) bool {
	for len(pattern) > 0 {
		switch {
		case pattern[0] == '*':
			pattern = strings.TrimLeft(pattern, "*")
			if pattern == "" {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if wildcard(pattern, s[i:], question) {
					return true
				}
			}
			return false
		case s == "":
			return false
		case question && pattern[0] == '?' || pattern[0] == s[0]:
			pattern, s = pattern[1:], s[1:]
		default:
			return false
		}
	}
	return s == ""
}

// checkPolicy says whether the queue's policy lets EventBridge send to it: an Allow of
// sqs:SendMessage on the queue to the service events.amazonaws.com (or to anyone), and no
// unconditional Deny of it. Where the Allow is conditional on aws:SourceArn, the rules that
// send spot warnings must match it.
func (c *checker) checkPolicy(doc string, rules []rule) providers.Check {
	const name = "notice queue policy"
	fix := fmt.Sprintf("give the queue a policy that allows events.amazonaws.com sqs:SendMessage on %s (%s)", c.queueARN, docQueue)
	if doc == "" {
		return providers.Fail(name, "the queue has no access policy: EventBridge may not send to it, and no notice will arrive", fix)
	}
	var pol struct{ Statement json.RawMessage }
	if err := json.Unmarshal([]byte(doc), &pol); err != nil {
		return providers.Skipped(name, "the queue's policy is not JSON: "+err.Error(), fix)
	}
	var stmts []policyStatement
	if err := json.Unmarshal(pol.Statement, &stmts); err != nil {
		var one policyStatement
		if err := json.Unmarshal(pol.Statement, &one); err != nil {
			return providers.Skipped(name, "the queue's policy has statements this check cannot read: "+err.Error(), fix)
		}
		stmts = []policyStatement{one}
	}
	var allows []policyStatement
	for _, s := range stmts {
		if !s.applies(c.queueARN) {
			continue
		}
		switch {
		case strings.EqualFold(s.Effect, "Deny") && len(s.Condition) == 0:
			return providers.Fail(name, fmt.Sprintf("statement %s denies events.amazonaws.com sqs:SendMessage on the queue: no notice will arrive",
				cmp.Or(s.Sid, "(no Sid)")), "remove that Deny; "+fix)
		case strings.EqualFold(s.Effect, "Allow"):
			allows = append(allows, s)
		}
	}
	if len(allows) == 0 {
		return providers.Fail(name, "the queue's policy does not let events.amazonaws.com send to it (sqs:SendMessage): no notice will arrive", fix)
	}
	var conditional []string // the rule ARNs conditions admit
	for _, s := range allows {
		arns, other := s.sourceArns()
		if len(arns) == 0 {
			detail := fmt.Sprintf("lets events.amazonaws.com send (statement %s)", cmp.Or(s.Sid, "(no Sid)"))
			if other {
				detail += ", under conditions this check does not evaluate"
			}
			return providers.OK(name, detail)
		}
		conditional = append(conditional, arns...)
	}
	// Every Allow names the rules that may send: the rules that send spot warnings must be among them.
	var admitted, refused []string
	for _, r := range rules {
		if !r.enabled || !r.spot {
			continue
		}
		if slices.ContainsFunc(conditional, func(pat string) bool { return wildcard(pat, r.arn, true) }) {
			admitted = append(admitted, r.name)
		} else {
			refused = append(refused, r.name+" ("+r.arn+")")
		}
	}
	switch {
	case len(refused) > 0 && len(admitted) == 0:
		return providers.Fail(name, fmt.Sprintf("lets events.amazonaws.com send only for rules %s, which rule %s is not: its notices will not arrive",
			strings.Join(conditional, ", "), strings.Join(refused, ", ")),
			"add the rule's ARN to the policy's aws:SourceArn condition ("+docQueue+")")
	case len(admitted) > 0:
		return providers.OK(name, "lets events.amazonaws.com send for rule "+strings.Join(admitted, ", "))
	}
	return providers.OK(name, "lets events.amazonaws.com send for rules "+strings.Join(conditional, ", "))
}

// policyStatement is one statement of a resource policy, as much of it as checkPolicy reads.
type policyStatement struct {
	Sid       string
	Effect    string
	Principal json.RawMessage
	Action    stringList
	Resource  stringList
	Condition map[string]map[string]stringList
}

// applies reports whether the statement is about events.amazonaws.com (or anyone) sending to
// the queue.
func (s policyStatement) applies(queue string) bool {
	return s.toEventBridge() &&
		slices.ContainsFunc(s.Action, func(a string) bool { return wildcard(strings.ToLower(a), "sqs:sendmessage", true) }) &&
		(len(s.Resource) == 0 || slices.ContainsFunc(s.Resource, func(r string) bool { return wildcard(r, queue, true) }))
}

// toEventBridge: the principal is "*", {"AWS": "*"} or {"Service": "events.amazonaws.com"}.
func (s policyStatement) toEventBridge() bool {
	var one string
	if json.Unmarshal(s.Principal, &one) == nil {
		return one == "*"
	}
	var m map[string]stringList
	if json.Unmarshal(s.Principal, &m) != nil {
		return false
	}
	return slices.Contains(m["Service"], "events.amazonaws.com") || slices.Contains(m["AWS"], "*")
}

// sourceArns are the rule ARNs (patterns) an aws:SourceArn condition admits, and whether the
// statement has other conditions.
func (s policyStatement) sourceArns() (arns []string, other bool) {
	for op, keys := range s.Condition {
		for key, vals := range keys {
			if strings.EqualFold(key, "aws:SourceArn") && slices.Contains([]string{"arnlike", "arnequals", "stringlike", "stringequals"}, strings.ToLower(op)) {
				arns = append(arns, vals...)
				continue
			}
			other = true
		}
	}
	return arns, other
}

// stringList is a policy's string or list of strings.
type stringList []string

func (l *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*l = stringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*l = many
	return nil
}

// short is an error in a line: the API's code and message when it answered, else the error.
func short(err error) string {
	if code, msg := apiError(err); code != "" {
		return code + ": " + msg
	}
	return err.Error()
}
