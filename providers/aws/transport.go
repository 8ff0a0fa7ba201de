package aws

import (
	"bytes"
	"io"
	"net/http"
)

// httpDoer is the SDK's HTTP client interface (aws.HTTPClient).
type httpDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// bufferedBodies sends each request body from memory. The SDK closes a request's body as soon
// as the response arrives, while Go's transport may still be reading it for a last EOF: the
// transport then sees an error, closes the connection, and the response body being read dies
// with "use of closed network connection" (aws/aws-sdk-go-v2#1825, #2737). A server that
// answers quickly makes this common; an in-process test server makes it nearly certain. A
// body held in a bytes.Reader is one Go's transport writes whole before it reads any
// response, so the window is gone. The provider's request bodies are a few hundred bytes.
type bufferedBodies struct{ next httpDoer }

func (b bufferedBodies) Do(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return b.next.Do(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	return b.next.Do(r)
}
