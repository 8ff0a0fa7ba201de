package aws

import (
	"errors"
	"fmt"
	"strings"

	"github.com/aws/smithy-go"
)

// Error codes that mean the credentials are wrong or stale, and that they lack a permission.
var (
	rejectedCodes = map[string]bool{
		"InvalidClientTokenId": true, "UnrecognizedClientException": true, "AuthFailure": true,
		"SignatureDoesNotMatch": true, "InvalidAccessKeyId": true, "InvalidSignatureException": true,
		"ExpiredToken": true, "ExpiredTokenException": true, "RequestExpired": true,
		"MissingAuthenticationToken": true, "IncompleteSignature": true, "InvalidSecurity": true,
	}
	deniedCodes = map[string]bool{
		"AccessDenied": true, "AccessDeniedException": true, "UnauthorizedOperation": true,
		"UnauthorizedAccess": true, "KMS.AccessDeniedException": true,
	}
	noQueueCodes = map[string]bool{
		"QueueDoesNotExist": true, "AWS.SimpleQueueService.NonExistentQueue": true,
	}
)

// explain adds what to fix to the errors a user can fix: no credentials, rejected credentials,
// a missing permission (action is the IAM action of the call), a missing queue.
func explain(err error, action string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var ae smithy.APIError
	code := ""
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	switch {
	case strings.Contains(msg, "get identity:") || strings.Contains(msg, "failed to refresh cached credentials"):
		return fmt.Errorf("%w; no usable AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "+
			"or run the driver on an instance whose IAM role it may use", err)
	case rejectedCodes[code]:
		return fmt.Errorf("%w; AWS rejected the credentials: check that they are current and of the group's account "+
			"(`aws sts get-caller-identity` shows whose they are)", err)
	case deniedCodes[code]:
		return fmt.Errorf("%w; the credentials may not call %s: grant it to the driver's IAM role (docs/providers/aws.md lists what it needs)", err, action)
	case noQueueCodes[code]:
		return fmt.Errorf("%w; check --sqs-queue-url and that the queue is in the group's region", err)
	}
	return err
}
