package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// Paths of the admin API on the driver's listener (docs/protocol.md §5).
const (
	PathPrefix = "/v1/admin/"
	PathHosts  = "/v1/admin/hosts"  // POST adds; DELETE PathHosts/{id}?force=1 removes
	PathStatus = "/v1/admin/status" // GET
	PathStop   = "/v1/admin/stop"   // POST ends the job
)

// Label keys the admin protocol's MAC (rendezvous.NewAuth), apart from the other protocols.
const Label = "elasticd admin v1"

// maxBody bounds a request body: an add-host request is a few dozen bytes.
const maxBody = 64 << 10

// AddRequest is the body of POST /v1/admin/hosts.
type AddRequest struct {
	Host  string `json:"host"`            // an address or hostname (a stopped host: also its ID)
	Slots int    `json:"slots,omitempty"` // 0: a stopped host's own count, else 1
	Force bool   `json:"force,omitempty"` // accepted for symmetry with removal; adding is never refused for --min-np
}

// StopRequest is the body of POST /v1/admin/stop.
type StopRequest struct {
	Reason string `json:"reason,omitempty"` // said in the job's last line
}

// StopAnswer is the answer to a stop: the job is ending (its workers are being stopped, and
// with --manage-capacity its groups go to zero).
type StopAnswer struct {
	Stopping bool   `json:"stopping"`
	Status   Status `json:"status"`
}

// Change is the answer to an add or a removal.
type Change struct {
	Action string `json:"action"` // "added", "restarted" (a stopped host brought back) or "removed"
	Host   Host   `json:"host"`
	Status Status `json:"status"` // right after the change: it reaches the job at the next discovery poll
}

// Status is the answer of GET /v1/admin/status: the job and its hosts as the driver and the
// overlay see them.
type Status struct {
	Generation uint64 `json:"generation"`
	WorldSize  int    `json:"world_size"`
	Phase      string `json:"phase"`
	MinNP      int    `json:"min_np"`
	MaxNP      int    `json:"max_np"`
	Resets     int    `json:"resets"`
	Hosts      []Host `json:"hosts"`
}

// Host states in Status.
const (
	StateActive  = "active"  // offered to the job and seen by it
	StatePending = "pending" // offered; the job sees it at the next discovery poll
	StateLeaving = "leaving" // the cloud is taking it away
	StateStopped = "stopped" // removed by the operator; add-host brings it back
	StateGone    = "gone"    // no longer offered (dropped by the provider); its workers are stopping
)

// Host is one host in Status.
type Host struct {
	ID               string   `json:"id"`
	Addr             string   `json:"addr"`
	Slots            int      `json:"slots"`
	State            string   `json:"state"`
	BlacklistedSlots int      `json:"blacklisted_slots"`
	Added            bool     `json:"added,omitempty"` // by the operator, not the provider
	Workers          []Worker `json:"workers"`
}

// Worker is one worker process in Status.
type Worker struct {
	ID    string `json:"id"` // HOST/SLOT, stable for the life of the job
	Slot  int    `json:"slot"`
	Rank  int    `json:"rank"`  // -1: not part of the current generation
	State string `json:"state"` // running, starting or stopping
}

// Handler serves the admin API under PathPrefix. Every request must be signed with the
// admin secret (rendezvous.Auth, keyed with Label); every answer but a 401 is signed.
type Handler struct {
	auth    *protocol.Auth
	overlay *Overlay
	status  func() *driver.Status
	log     *slog.Logger
	// releases reaches the running job to bring back quarantined slots; nil: adding a host
	// already in the job is refused.
	releases chan<- driver.Release
	// stops reaches the running job to end it (driver.Options.Stops); nil: stop is refused.
	stops chan<- string
}

// NewHandler returns the API over overlay, keyed by the admin secret (at least 16 bytes).
// status returns the driver's latest snapshot (driver.StatusBoard.Load), nil before the job's
// first step; log may be nil.
func NewHandler(secret []byte, overlay *Overlay, status func() *driver.Status, log *slog.Logger) (*Handler, error) {
	auth, err := protocol.NewAuth(secret, Label, 0)
	if err != nil {
		return nil, fmt.Errorf("admin secret: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if status == nil {
		status = func() *driver.Status { return nil }
	}
	return &Handler{auth: auth, overlay: overlay, status: status, log: log}, nil
}

// ServeHTTP authenticates a request, then routes it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("read request body (limit %d bytes): %v", maxBody, err), http.StatusRequestEntityTooLarge)
		return
	}
	nonce, err := h.auth.Verify(r, body, time.Now())
	if err != nil {
		h.log.Warn("admin request refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "reason", err.Error())
		w.Header().Set("Connection", "close")
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	a := protocol.Answer{W: w, Auth: h.auth, Nonce: nonce}
	path := r.URL.Path
	switch {
	case path == PathStatus && r.Method == http.MethodGet:
		a.JSON(h.snapshot())
	case path == PathHosts && r.Method == http.MethodPost:
		h.add(a, body)
	case strings.HasPrefix(path, PathHosts+"/") && r.Method == http.MethodDelete:
		h.remove(a, r, strings.TrimPrefix(path, PathHosts+"/"))
	case path == PathStop && r.Method == http.MethodPost:
		h.stop(a, body)
	case path == PathStatus || path == PathHosts || strings.HasPrefix(path, PathHosts+"/") || path == PathStop:
		a.Error(http.StatusMethodNotAllowed, fmt.Sprintf("%s %s is not part of the admin API (GET %s, POST %s, DELETE %s/{id}, POST %s)", r.Method, path, PathStatus, PathHosts, PathHosts, PathStop))
	default:
		a.Error(http.StatusNotFound, fmt.Sprintf("no %s in the admin API (GET %s, POST %s, DELETE %s/{id}, POST %s)", path, PathStatus, PathHosts, PathHosts, PathStop))
	}
}

func (h *Handler) add(a protocol.Answer, body []byte) {
	var in AddRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		a.Error(http.StatusBadRequest, `malformed JSON body: `+err.Error()+`; want {"host": "10.0.0.5", "slots": 4}`)
		return
	}
	host := strings.TrimSpace(in.Host)
	if host == "" {
		a.Error(http.StatusBadRequest, `"host" is required: an address or hostname, e.g. 10.0.0.5`)
		return
	}
	if in.Slots < 0 || in.Slots > providers.MaxSlots {
		a.Error(http.StatusBadRequest, fmt.Sprintf(`"slots" %d: must be between 1 and %d (0: the host's own count, else 1)`, in.Slots, providers.MaxSlots))
		return
	}
	spec := host
	switch {
	case strings.Count(host, ":") > 1 && !strings.HasPrefix(host, "["):
		spec = "[" + host + "]" // a bare IPv6 address
	case strings.Contains(host, ":") && !strings.HasSuffix(host, "]"):
		a.Error(http.StatusBadRequest, fmt.Sprintf(`"host" %q: give the slot count in "slots", not after ':'`, in.Host))
		return
	}
	hs, err := providers.ParseHosts(spec, 1)
	if err != nil {
		a.Error(http.StatusBadRequest, fmt.Sprintf(`"host" %q: %s`, in.Host, strings.TrimPrefix(err.Error(), fmt.Sprintf("host list entry 1 %q: ", spec))))
		return
	}
	id := hs[0].ID
	if _, ok := findHost(h.overlay.Stopped(), host); ok {
		id = host // a stopped host named by its ID as the provider spells it
	}
	added, restarted, err := h.overlay.add(providers.Host{ID: id, Addr: hs[0].Addr, Slots: in.Slots})
	if errors.Is(err, ErrAlreadyPresent) && h.releases != nil {
		if n := h.release(added.ID); n > 0 {
			h.log.Info("admin: quarantined slots released; the job takes them back at once", "host", added.ID, "slots", n)
			a.JSON(Change{Action: "released", Host: Host{ID: added.ID, Addr: added.Addr, Slots: n}, Status: h.snapshot()})
			return
		}
	}
	if err != nil {
		answerRefusal(a, err)
		return
	}
	action := "added"
	if restarted {
		action = "restarted"
	}
	h.log.Info("admin: host "+action+"; the job takes it at the next discovery poll", "host", added.ID, "addr", added.Addr, "slots", added.Slots)
	a.JSON(Change{Action: action, Host: Host{ID: added.ID, Addr: added.Addr, Slots: added.Slots}, Status: h.snapshot()})
}

// Stops makes POST /v1/admin/stop end the running job through ch (driver.Options.Stops).
func (h *Handler) Stops(ch chan<- string) { h.stops = ch }

func (h *Handler) stop(a protocol.Answer, body []byte) {
	var in StopRequest
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			a.Error(http.StatusBadRequest, `malformed JSON body: `+err.Error()+`; want {"reason": "..."}`)
			return
		}
	}
	if len(in.Reason) > 200 || strings.ContainsAny(in.Reason, "\r\n") {
		a.Error(http.StatusBadRequest, `"reason": one line of at most 200 characters`)
		return
	}
	if h.stops == nil {
		a.Error(http.StatusServiceUnavailable, "this driver cannot be stopped through the admin API")
		return
	}
	select {
	case h.stops <- in.Reason:
	case <-time.After(5 * time.Second):
		a.Error(http.StatusServiceUnavailable, "the job did not take the stop within 5s (it is ending already?)")
		return
	}
	h.log.Warn("admin: the job is stopped by the operator", "reason", in.Reason)
	a.JSON(StopAnswer{Stopping: true, Status: h.snapshot()})
}

// Releases makes adding a host that is already in the job bring back its quarantined
// (flapping) slots, through the running job's channel (driver.Options.Releases).
func (h *Handler) Releases(ch chan<- driver.Release) { h.releases = ch }

// release asks the job to release host's quarantined slots; 0 when none, or when the job does
// not answer in time (it has ended).
func (h *Handler) release(host string) int {
	reply := make(chan int, 1)
	select {
	case h.releases <- driver.Release{Host: host, Reply: reply}:
	case <-time.After(5 * time.Second):
		return 0
	}
	select {
	case n := <-reply:
		return n
	case <-time.After(5 * time.Second):
		return 0
	}
}

func (h *Handler) remove(a protocol.Answer, r *http.Request, id string) {
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			a.Error(http.StatusBadRequest, fmt.Sprintf("force=%q: want 1 or 0", v))
			return
		}
		force = b
	}
	if id == "" || strings.Contains(id, "/") {
		a.Error(http.StatusBadRequest, fmt.Sprintf("host %q: want DELETE %s/{id} with one host ID or address", id, PathHosts))
		return
	}
	removed, err := h.overlay.remove(id, force)
	if err != nil {
		answerRefusal(a, err)
		return
	}
	h.log.Info("admin: host removed; its workers leave at their next commit once discovery drops it", "host", removed.ID, "addr", removed.Addr, "slots", removed.Slots, "forced", force)
	a.JSON(Change{Action: "removed", Host: Host{ID: removed.ID, Addr: removed.Addr, Slots: removed.Slots}, Status: h.snapshot()})
}

// snapshot joins the driver's view (what the job runs) with the overlay's (what it is offered).
func (h *Handler) snapshot() Status {
	var s Status
	d := h.status()
	if d == nil {
		d = &driver.Status{Phase: "starting"}
	}
	s.Generation, s.WorldSize, s.Phase, s.MinNP, s.MaxNP, s.Resets = d.Generation, d.WorldSize, d.Phase, d.MinNP, d.MaxNP, d.Resets
	seen := map[string]driver.HostStatus{}
	for _, dh := range d.Hosts {
		seen[dh.ID] = dh
	}
	added := map[string]bool{}
	for _, ah := range h.overlay.Added() {
		added[ah.ID] = true
	}
	index := map[string]int{}
	put := func(x Host) {
		index[x.ID] = len(s.Hosts)
		s.Hosts = append(s.Hosts, x)
	}
	for _, c := range h.overlay.Current() {
		x := Host{ID: c.ID, Addr: c.Addr, Slots: c.Slots, State: StatePending, Added: added[c.ID], Workers: []Worker{}}
		if dh, ok := seen[c.ID]; ok {
			x.State, x.BlacklistedSlots = StateActive, dh.Blacklisted
		}
		if c.Leaving || seen[c.ID].Leaving {
			x.State = StateLeaving
		}
		put(x)
	}
	for _, st := range h.overlay.Stopped() {
		put(Host{ID: st.ID, Addr: st.Addr, Slots: st.Slots, State: StateStopped, Workers: []Worker{}})
	}
	for _, w := range d.Workers {
		i, ok := index[w.Host]
		if !ok {
			x := Host{ID: w.Host, State: StateGone, Workers: []Worker{}}
			if dh, ok := seen[w.Host]; ok {
				x.Addr, x.Slots = dh.Addr, dh.Slots
			}
			put(x)
			i = index[w.Host]
		}
		s.Hosts[i].Workers = append(s.Hosts[i].Workers, Worker{ID: w.ID, Slot: w.Slot, Rank: w.Rank, State: w.State})
	}
	for i := range s.Hosts {
		slices.SortFunc(s.Hosts[i].Workers, func(a, b Worker) int { return a.Slot - b.Slot })
	}
	return s
}

// answerRefusal answers an Overlay refusal: 404 unknown host, 409 a conflict with the job's
// state, 503 hosts not discovered yet.
func answerRefusal(a protocol.Answer, err error) {
	switch {
	case errors.Is(err, ErrUnknownHost):
		a.Error(http.StatusNotFound, err.Error())
	case errors.Is(err, ErrAlreadyPresent), errors.Is(err, ErrAlreadyStopped), errors.Is(err, ErrBelowMinNP):
		a.Error(http.StatusConflict, err.Error())
	case errors.Is(err, ErrBadHost):
		a.Error(http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrNotDiscovered):
		a.Error(http.StatusServiceUnavailable, err.Error())
	default:
		a.Error(http.StatusInternalServerError, err.Error())
	}
}
