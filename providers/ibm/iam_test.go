package ibm_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

// newIAM is a fake IAM token service (POST /identity/token, grant type apikey): the key
// "good-key" gets a token; any other gets IAM's "API key could not be found" reply.
func newIAM(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/identity/token" || r.ParseForm() != nil ||
			r.PostForm.Get("grant_type") != "urn:ibm:params:oauth:grant-type:apikey" {
			http.Error(w, "unexpected token request "+r.Method+" "+r.URL.String(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.PostForm.Get("apikey") != "good-key" {
			body, err := os.ReadFile("testdata/iam_bad_api_key.json")
			if err != nil {
				t.Errorf("fake IAM: %v", err)
			}
			w.WriteHeader(http.StatusBadRequest)
			w.Write(body)
			return
		}
		now := time.Now().Unix()
		seg := func(v any) string {
			b, _ := json.Marshal(v)
			return base64.RawURLEncoding.EncodeToString(b)
		}
		jwt := seg(map[string]string{"alg": "RS256", "typ": "JWT"}) + "." + seg(map[string]int64{"iat": now, "exp": now + 3600}) + ".c2lnbmF0dXJl"
		fmt.Fprintf(w, `{"access_token":%q,"refresh_token":"not-used","token_type":"Bearer","expires_in":3600,"expiration":%d,"scope":"ibm openid"}`, jwt, now+3600)
	}))
	t.Cleanup(srv.Close)
	return srv
}
