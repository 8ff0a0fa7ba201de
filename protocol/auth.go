package protocol

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderAnswerSignature carries an answer's signature in protocols that sign answers (Auth).
const HeaderAnswerSignature = "X-Elasticd-Answer-Signature"

const answerScheme = "ELASTICD-HMAC-SHA256-ANSWER"

// Auth is the rendezvous signing scheme (docs/protocol.md §2) keyed for another protocol that
// shares the driver's listener, such as the agents' (AgentAuthLabel). Requests are signed and
// checked exactly as rendezvous requests are. Answers are signed too, bound to the nonce of
// the request they answer, because an agent runs what the answers tell it to: a forged or
// replayed answer must not start a process. Its methods are safe for concurrent use.
type Auth struct {
	key    []byte
	window time.Duration
	nonces *nonceCache
	// since is when the server that verifies with it started: a request signed before that
	// second is refused (ReasonSignedBeforeStart). A restarted driver knows none of the
	// nonces its predecessor saw, and would otherwise take a request captured on the way to
	// it, replayed within the window. Zero for a client.
	since int64
}

// ReasonSignedBeforeStart is the 401's reason for a request signed before the server
// started. A client whose clock is behind the server's by d sees it for d seconds after the
// server starts, and should sign the request again a second later (the Go and Python
// clients do, for up to DefaultReplayWindow).
const ReasonSignedBeforeStart = "signed before this server started (a replay, or this host's clock is behind the server's)"

// SignedBeforeStart reports whether a 401's reason is ReasonSignedBeforeStart.
func SignedBeforeStart(reason string) bool { return strings.Contains(reason, ReasonSignedBeforeStart) }

// NewAuth returns an Auth for protocol label (which keeps one protocol's MAC from standing
// for another's) keyed by secret, at least 16 bytes. Requests stamped outside now±window are
// refused (0: 60 s).
func NewAuth(secret []byte, label string, window time.Duration) (*Auth, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("secret of %d bytes: must be at least 16", len(secret))
	}
	if window <= 0 {
		window = DefaultReplayWindow
	}
	now := time.Now()
	return &Auth{key: deriveKey(secret, label), window: window, nonces: newNonceCache(2*window, now), since: now.Unix()}, nil
}

// StartedAt sets when the server started (NewAuth's time by default): requests signed before
// that second are refused.
func (a *Auth) StartedAt(t time.Time) { a.since = t.Unix() }

// DefaultReplayWindow is how far a request's timestamp may be from the receiver's clock
// unless a server is configured otherwise.
const DefaultReplayWindow = 60 * time.Second

// NewSigner returns an Auth for a client of protocol label: it signs requests and checks the
// answers. Unlike NewAuth it accepts any secret (the server refuses a short one's requests), so
// a client can be built before the secret is validated elsewhere.
func NewSigner(secret []byte, label string) *Auth {
	return &Auth{key: deriveKey(secret, label), window: DefaultReplayWindow, nonces: newNonceCache(2*DefaultReplayWindow, time.Now())}
}

// Sign adds the signature headers for body to req and returns the request's nonce, which
// VerifyAnswer needs.
func (a *Auth) Sign(req *http.Request, body []byte) string {
	return signRequest(a.key, req, body)
}

// signRequest stamps req with a timestamp, a fresh nonce and the body's hash, signs them with
// key, and returns the nonce.
func signRequest(key []byte, req *http.Request, body []byte) string {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	nonce := randomHex()
	bh := bodyHash(body)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderNonce, nonce)
	req.Header.Set(HeaderBodyHash, bh)
	req.Header.Set(HeaderSignature, hex.EncodeToString(signature(key, req.Method, req.URL.RequestURI(), ts, nonce, bh)))
	return nonce
}

// Verify checks a received request: signature, timestamp, nonce (each used once) and that
// body is what was signed. It returns the request's nonce for SignAnswer. An error's text is
// a one-line reason fit for a 401 answer; it reveals nothing about the key.
func (a *Auth) Verify(r *http.Request, body []byte, now time.Time) (string, error) {
	nonce, err := a.VerifyHeaders(r, now)
	if err != nil {
		return "", err
	}
	if err := CheckBody(r, body); err != nil {
		return "", err
	}
	return hex.EncodeToString(nonce[:]), nil
}

// CheckBody checks that body is the one whose hash r's headers carry (and its signature
// covers); the error's text is fit for a 401 answer.
func CheckBody(r *http.Request, body []byte) error {
	return CheckBodyHash(r.Header.Get(HeaderBodyHash), body)
}

// CheckBodyHash is CheckBody given the value of the request's HeaderBodyHash.
func CheckBodyHash(hash string, body []byte) error {
	if !strings.EqualFold(bodyHash(body), hash) {
		return errBodyHash
	}
	return nil
}

// VerifyHeaders is Verify without the body check, for a server that authenticates a request
// before reading its body (and then calls CheckBody): signature, timestamp and nonce, which it
// records as used.
func (a *Auth) VerifyHeaders(r *http.Request, now time.Time) ([nonceBytes]byte, error) {
	return a.VerifyFields(r.Method, r.RequestURI, r.Header.Get, now)
}

// VerifyFields is VerifyHeaders given a request's method, its target as sent (path and
// query, escaped) and a lookup of its headers: for a request that arrived inside another
// (a batch), with no http.Request of its own.
func (a *Auth) VerifyFields(method, target string, header func(string) string, now time.Time) ([nonceBytes]byte, error) {
	nonce, err := checkSignature(a.key, method, target, header, now, a.window)
	if err == nil && a.since != 0 {
		// checkSignature parsed it: a well-formed decimal.
		if sec, _ := strconv.ParseInt(header(HeaderTimestamp), 10, 64); sec < a.since {
			return nonce, authError(ReasonSignedBeforeStart)
		}
	}
	if err == nil && !a.nonces.add(nonce, now) {
		err = authError("replayed request: nonce already used")
	}
	return nonce, err
}

// SignAnswer sets the signature of an answer with status and body to the request whose nonce
// Verify returned. Call it before WriteHeader.
func (a *Auth) SignAnswer(h http.Header, nonce string, status int, body []byte) {
	h.Set(HeaderAnswerSignature, hex.EncodeToString(answerSignature(a.key, nonce, status, body)))
}

// VerifyAnswer checks that an answer with status and body was signed by a holder of the key
// for the request whose nonce Sign returned.
func (a *Auth) VerifyAnswer(h http.Header, nonce string, status int, body []byte) error {
	got, err := hex.DecodeString(h.Get(HeaderAnswerSignature))
	if err != nil || len(got) != sha256.Size {
		return errors.New("answer without a valid " + HeaderAnswerSignature + " header (not signed by the server, or signed with another secret)")
	}
	if !hmac.Equal(got, answerSignature(a.key, nonce, status, body)) {
		return errors.New("answer signature does not match: the answer was altered, or it comes from a driver with a different secret")
	}
	return nil
}

// answerSignature is HMAC-SHA256(key, scheme \n nonce \n status \n bodyHash).
func answerSignature(key []byte, nonce string, status int, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(answerScheme + "\n" + nonce + "\n" + strconv.Itoa(status) + "\n" + bodyHash(body)))
	return m.Sum(nil)
}

// IsAuthError reports whether err is a refusal of Verify (an answer of 401).
func IsAuthError(err error) bool {
	var ae authError
	return errors.As(err, &ae) || errors.Is(err, errBodyHash)
}

// Reply is a signed answer Exchange received.
type Reply struct {
	Status int
	Body   []byte
	Reason string // the body's first line, trimmed: the one-line reason of an error answer
}

// UnsignedError is an answer without a signature: a 401 from a server that could not check
// the request (wrong secret, clocks apart), or an answer from something that is not the
// protocol's server. Callers word it for their own secret flag.
type UnsignedError struct {
	Status int
	Reason string
}

func (e *UnsignedError) Error() string {
	return fmt.Sprintf("unsigned answer %d: %s", e.Status, e.Reason)
}

// Exchange sends one signed request: in (nil: no body) as JSON to method url, over hc, under
// ctx. It reads at most limit bytes of the answer and checks the answer's signature. Errors:
// hc's own (*url.Error: nothing was answered), *UnsignedError, a signature that does not
// match, or an answer longer than limit.
func (a *Auth) Exchange(ctx context.Context, hc *http.Client, method, url string, in any, limit int64) (Reply, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return Reply{}, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return Reply{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	nonce := a.Sign(req, body)
	resp, err := hc.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return Reply{}, fmt.Errorf("read the answer: %w", err)
	}
	if int64(len(data)) > limit {
		return Reply{}, fmt.Errorf("%s %s: answer longer than %d bytes", method, req.URL.Path, limit)
	}
	r := Reply{Status: resp.StatusCode, Body: data, Reason: ErrorReason(data)}
	if resp.Header.Get(HeaderAnswerSignature) == "" {
		return r, &UnsignedError{Status: r.Status, Reason: r.Reason}
	}
	if err := a.VerifyAnswer(resp.Header, nonce, resp.StatusCode, data); err != nil {
		return r, fmt.Errorf("%s %s: %w", method, req.URL.Path, err)
	}
	return r, nil
}

// Answer writes signed answers to one request that Verify accepted.
type Answer struct {
	W     http.ResponseWriter
	Auth  *Auth
	Nonce string // Verify's
}

// Write signs and writes an answer; contentType "" sets none.
func (a Answer) Write(status int, contentType string, body []byte) {
	a.Auth.SignAnswer(a.W.Header(), a.Nonce, status, body)
	if contentType != "" {
		a.W.Header().Set("Content-Type", contentType)
	}
	a.W.WriteHeader(status)
	a.W.Write(body)
}

// JSON answers 200 with v.
func (a Answer) JSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		a.Error(http.StatusInternalServerError, err.Error())
		return
	}
	a.Write(http.StatusOK, "application/json", append(b, '\n'))
}

// Error answers status with msg on one line.
func (a Answer) Error(status int, msg string) {
	a.Write(status, "text/plain; charset=utf-8", []byte(OneLine(msg)+"\n"))
}

// ErrorReason is the one-line reason of an error answer's body: its first line, trimmed.
func ErrorReason(b []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// OneLine puts a message on one line, for a plain-text answer a client reads the first line of.
func OneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// NewReportID returns a random ID for a report (see StateReport.ReportID), or a nonce.
func NewReportID() string { return randomHex() }

func randomHex() string {
	var b [nonceBytes]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
