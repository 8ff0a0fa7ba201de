package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// The checks of `elasticd agent --check`: each looks once at one thing the agent needs and says
// what it found as a providers.Check, failed with its fix. None registers with the driver,
// starts a worker or changes anything on the host.

// The checks' names, stable for scripts that read --json.
const (
	nameNVIDIA     = "NVIDIA driver"
	nameGPUs       = "GPUs"
	nameGPUHealth  = "GPU health" // a failed GPU's line is "GPU health: GPU 3"
	nameMetadata   = "metadata service"
	nameSecretFile = "agent-secret"
	nameDriver     = "driver"
	nameSecret     = "secret"
	nameClock      = "clock"
)

// ClockLimit is the most the host's clock may differ from the driver's before the clock check
// fails: the driver refuses signatures beyond protocol.DefaultReplayWindow, and clocks this far
// apart are drifting.
const ClockLimit = protocol.DefaultReplayWindow * 3 / 4

// DefaultCheckTimeout bounds each network step of a check: a connection, a request.
const DefaultCheckTimeout = 5 * time.Second

// --- the agent secret file ---

// ReadSecretFile reads the agent secret file as the agent does, its bytes without surrounding
// whitespace, and checks it: readable, long enough, and (a warning only) not readable by other
// users. The secret is nil when the check failed.
func ReadSecretFile(path string) (providers.Check, []byte) {
	if path == "" {
		return providers.Fail(nameSecretFile, "no --agent-secret-file given",
			"--agent-secret-file FILE (or ELASTICD_AGENT_SECRET_FILE): the file holding the driver's secret, e.g. /etc/elasticd/agent-secret"), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		fix := "copy the driver's --agent-secret-file to " + path + " (mode 600)"
		if errors.Is(err, fs.ErrPermission) {
			fix = "run the check as the user the agent runs as (root, under the systemd unit), or let that user read " + path
		}
		return providers.Fail(nameSecretFile, err.Error(), fix), nil
	}
	b = bytes.TrimSpace(b)
	if len(b) < protocol.MinAgentSecret {
		return providers.Fail(nameSecretFile, fmt.Sprintf("%s holds %d bytes; a secret of at least %d is needed", path, len(b), protocol.MinAgentSecret),
			"put the driver's secret in it: a copy of the driver's --agent-secret-file (a new secret: head -c 32 /dev/urandom | base64 > FILE on the driver, then copy it to every host)"), nil
	}
	detail := fmt.Sprintf("%s: %d bytes", path, len(b))
	if st, err := os.Stat(path); err == nil {
		if perm := st.Mode().Perm(); perm&0o077 != 0 {
			detail += fmt.Sprintf("; WARNING: mode %04o lets other users read it: chmod 600 %s", perm, path)
		} else {
			detail += fmt.Sprintf(", mode %04o", perm)
		}
	}
	return providers.OK(nameSecretFile, detail), b
}

// --- the driver ---

// DriverCheck is what CheckDriver asks.
type DriverCheck struct {
	// URL is --driver.
	URL string
	// Secret is the agent secret; nil when it could not be read: the driver is still asked,
	// unsigned, whether it serves the agents' protocol, and the secret check is skipped.
	Secret []byte
	// SecretFile is --agent-secret-file, for the fixes.
	SecretFile string
	// Host names this host in the driver's log.
	Host string
	// Timeout bounds the connection, then the request (default DefaultCheckTimeout).
	Timeout time.Duration
	// HTTPClient sends the request; nil: one like the agent's, without proxy.
	HTTPClient *http.Client
	// Now is this host's clock, held against the driver's (nil: time.Now).
	Now func() time.Time
}

// CheckDriver checks, without registering, that the driver at URL can be reached (nameDriver),
// accepts the secret (nameSecret: a signed GET of the registry's check endpoint, whose answer
// must be signed with the same secret), and keeps a clock close enough to this host's for the
// signatures (nameClock). It returns those three lines, in that order.
func CheckDriver(ctx context.Context, dc DriverCheck) providers.Checks {
	timeout := cmp.Or(dc.Timeout, DefaultCheckTimeout)
	now := dc.Now
	if now == nil {
		now = time.Now
	}
	secretFile := cmp.Or(dc.SecretFile, "--agent-secret-file")
	out := func(driver, secret, clock providers.Check) providers.Checks {
		return providers.Checks{driver, secret, clock}
	}
	notAsked := func(driver providers.Check, why string) providers.Checks {
		return out(driver, providers.Skipped(nameSecret, why, ""), providers.Skipped(nameClock, why, ""))
	}

	const urlFix = "--driver http://DRIVER_IP:29400 (or ELASTICD_DRIVER): the driver's address and the port of its --listen"
	u, err := url.Parse(dc.URL)
	switch {
	case dc.URL == "":
		return notAsked(providers.Fail(nameDriver, "no --driver given", urlFix), "no driver to ask")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
		return notAsked(providers.Fail(nameDriver, fmt.Sprintf("--driver %q is not an http(s) URL with a host", dc.URL), urlFix), "no driver to ask")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	addr := net.JoinHostPort(u.Hostname(), port)

	// A connection first: "unreachable" is the commonest failure, and its fix is the network's.
	dctx, cancel := context.WithTimeout(ctx, timeout)
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return notAsked(providers.Fail(nameDriver, fmt.Sprintf("%s unreachable: %s", addr, dialReason(err, port, timeout)),
			fmt.Sprintf("start the driver (elasticd run --launcher agent) listening on port %s of %s (its --listen; :29400 by default with --launcher agent), let TCP %s in from this host (the driver's security group or firewall), and check that --driver names the driver's address",
				port, u.Hostname(), port)), "the driver is unreachable")
	}
	conn.Close()

	hc := dc.HTTPClient
	if hc == nil {
		hc = checkClient(timeout)
	}
	target := strings.TrimRight(dc.URL, "/") + protocol.AgentPathCheck
	if dc.Host != "" {
		target += "?host=" + url.QueryEscape(dc.Host)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, target, nil)
	if err != nil {
		return notAsked(providers.Fail(nameDriver, err.Error(), urlFix), "no driver to ask")
	}
	var auth *protocol.Auth
	var nonce string
	if dc.Secret != nil {
		auth = protocol.NewSigner(dc.Secret, protocol.AgentAuthLabel)
		nonce = auth.Sign(req, nil)
	}
	sent := now()
	resp, err := hc.Do(req)
	if err != nil {
		return notAsked(providers.Fail(nameDriver, fmt.Sprintf("%s accepts connections but gave no HTTP answer within %v: %v", addr, timeout, unwrapURLError(err)),
			"--driver must be the driver's plain-http address and --listen port (http://DRIVER_IP:29400), not another service's"), "the driver did not answer")
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	rtt := now().Sub(sent)
	if err != nil {
		return notAsked(providers.Fail(nameDriver, fmt.Sprintf("%s: reading the answer: %v", addr, err), urlFix), "the driver did not answer")
	}
	reason := protocol.ErrorReason(body)
	speaks := resp.Header.Get(protocol.HeaderAgentsProtocol)
	signed := resp.Header.Get(protocol.HeaderAnswerSignature) != ""
	answered := fmt.Sprintf("%s answers in %v", u.Host, rtt.Round(100*time.Microsecond))
	clock := dateClock(resp.Header, sent, rtt)
	copyFix := fmt.Sprintf("%s must hold the driver's secret: copy the driver's --agent-secret-file (Terraform writes the same /etc/elasticd/agent-secret on both)", secretFile)

	switch {
	case signed && auth != nil:
		if err := auth.VerifyAnswer(resp.Header, nonce, resp.StatusCode, body); err != nil {
			return out(providers.OK(nameDriver, answered),
				providers.Fail(nameSecret, "the driver's answer is not signed with this secret: "+err.Error(), copyFix), clock)
		}
		secret := providers.OK(nameSecret, "the driver accepts this secret, and signs its answers with it")
		switch resp.StatusCode {
		case http.StatusOK:
			var ans protocol.AgentCheckAnswer
			if err := json.Unmarshal(body, &ans); err != nil {
				return out(providers.OK(nameDriver, answered+": an answer this agent cannot read: "+err.Error()), secret, clock)
			}
			what := "elasticd " + cmp.Or(ans.Version, "(version not given)")
			if ans.JobID != "" {
				what += ", job " + ans.JobID
			}
			if !ans.Time.IsZero() {
				clock = skewCheck(ans.Time.Sub(sent.Add(rtt/2)), rtt/2+time.Millisecond, "by its answer's clock")
			}
			if ans.Protocol != protocol.AgentProtocolVersion {
				return out(providers.Fail(nameDriver, fmt.Sprintf("%s: %s speaks the agents' protocol version %d, this agent version %d: it would refuse this agent's registration", answered, what, ans.Protocol, protocol.AgentProtocolVersion),
					"run the agents and the driver from the same elasticd release"), secret, clock)
			}
			return out(providers.OK(nameDriver, answered+": "+what), secret, clock)
		case http.StatusNotFound:
			return out(providers.Fail(nameDriver, answered+": a release older than this agent, which does not say its version; it speaks an older agents' protocol and would refuse this agent's registration",
				"run the agents and the driver from the same elasticd release"), secret, clock)
		case http.StatusServiceUnavailable:
			return out(providers.OK(nameDriver, answered+", but is shutting down: "+reason), secret, clock)
		}
		return out(providers.OK(nameDriver, fmt.Sprintf("%s with %d: %s", answered, resp.StatusCode, reason)), secret, clock)

	case resp.StatusCode == http.StatusUnauthorized && speaks != "":
		driver := providers.OK(nameDriver, fmt.Sprintf("%s, as the agents' protocol (version %s)", answered, speaks))
		switch {
		case auth == nil:
			return out(driver, providers.Skipped(nameSecret, "no secret to send (see "+nameSecretFile+")", ""), clock)
		case strings.HasPrefix(reason, "timestamp outside the replay window"):
			if clock.Status != providers.CheckFail {
				clock = providers.Fail(nameClock, "the driver refuses the request's time: "+reason, clockFix)
			}
			return out(driver, providers.Skipped(nameSecret, "the driver refused the request's time before checking its signature", ""), clock)
		}
		return out(driver, providers.Fail(nameSecret, "the driver refuses this secret ("+reason+")", copyFix), clock)

	case resp.StatusCode == http.StatusUnauthorized:
		// The rendezvous of a driver without --launcher agent refuses the agents' signature
		// as a wrong secret, and so does an older registry.
		driver := providers.OK(nameDriver, fmt.Sprintf("%s, but refuses (%s) without naming the agents' protocol", answered, reason))
		if auth == nil {
			return out(driver, providers.Skipped(nameSecret, "no secret to send (see "+nameSecretFile+")", ""), clock)
		}
		return out(driver, providers.Fail(nameSecret, "the driver refuses this agent's signed request ("+reason+")",
			"start the driver with --launcher agent --agent-secret-file FILE if it runs without; and "+copyFix), clock)
	}
	return notAsked(providers.Fail(nameDriver, fmt.Sprintf("%s answers %d (%s), not as the agents' protocol: not an elasticd driver serving agents", addr, resp.StatusCode, reason),
		"--driver must be the address and --listen port of the driver, started with --launcher agent (http://DRIVER_IP:29400)"), "the driver does not serve the agents' protocol there")
}

const clockFix = "keep both clocks synced by NTP (timedatectl set-ntp true, or chrony; on EC2 the Amazon Time Sync Service at 169.254.169.123)"

// skewCheck judges the driver's clock minus this host's, known within precision.
func skewCheck(skew, precision time.Duration, how string) providers.Check {
	abs := skew.Abs()
	if abs > ClockLimit+precision {
		side := "behind"
		if skew < 0 {
			side = "ahead of"
		}
		return providers.Fail(nameClock, fmt.Sprintf("this host's clock is %v %s the driver's (%s); the driver refuses signatures beyond %v", abs.Round(time.Second), side, how, protocol.DefaultReplayWindow), clockFix)
	}
	return providers.OK(nameClock, fmt.Sprintf("within %v of the driver's (%s; signatures allow %v)", max(abs, precision).Round(time.Millisecond), how, protocol.DefaultReplayWindow))
}

// dateClock judges the clocks by the answer's Date header, which has whole seconds.
func dateClock(h http.Header, sent time.Time, rtt time.Duration) providers.Check {
	at, err := http.ParseTime(h.Get("Date"))
	if err != nil {
		return providers.Skipped(nameClock, "the driver's answer carries no Date to compare clocks with", "")
	}
	return skewCheck(at.Add(500*time.Millisecond).Sub(sent.Add(rtt/2)), time.Second+rtt/2, "by its answer's Date header")
}

// dialReason words a failed connection for the detail line.
func dialReason(err error, port string, timeout time.Duration) string {
	var dns *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens on port " + port + " there (" + err.Error() + ")"
	case errors.As(err, &dns):
		return "the name does not resolve (" + err.Error() + ")"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Sprintf("no answer within %v: a firewall or security group dropping the packets? (%v)", timeout, err)
	}
	return err.Error()
}

func unwrapURLError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

// checkClient is the agent's client with every step bounded by timeout and no connection kept.
func checkClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil, // as the agent: the driver is on the cluster's own network
			DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
			TLSHandshakeTimeout:   timeout,
			ResponseHeaderTimeout: timeout,
			DisableKeepAlives:     true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// --- the metadata service ---

// MetadataCheck is what CheckMetadata asks.
type MetadataCheck struct {
	// Kind is the watcher the agent would run: aws, gcp, azure or none. Auto says --metadata
	// auto chose it.
	Kind string
	Auto bool
	// BaseURL is --metadata-url ("" for the cloud's own).
	BaseURL string
	// ID is the watcher's own call for the host's name (InstanceID, VMName), and Notices the
	// watcher, polled once.
	ID      func(context.Context) (string, error)
	Notices providers.Noticer
	// Timeout bounds the whole check (default 3×DefaultCheckTimeout: the ID, then a poll).
	Timeout time.Duration
}

// CheckMetadata asks the metadata service what the agent asks it: the host's name, then one
// poll of its interruption notices, with the watcher's own calls (IMDSv2's token and
// instance-id; GCP's instance id with Metadata-Flavor; Azure's VM name and Scheduled Events).
func CheckMetadata(ctx context.Context, mc MetadataCheck) providers.Check {
	if mc.Kind == "none" {
		detail := "--metadata none: this host's interruption notices are not watched"
		if mc.Auto {
			detail = "--metadata auto: this machine's DMI vendor names no cloud, so the agent watches no metadata service"
		}
		return providers.Skipped(nameMetadata, detail, "on a cloud, name it (--metadata aws, gcp or azure) so that the job leaves a host before the cloud takes it")
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(mc.Timeout, 3*DefaultCheckTimeout))
	defer cancel()
	where := map[string]string{"aws": "EC2's IMDSv2", "gcp": "Compute Engine's metadata server", "azure": "Azure's IMDS"}[mc.Kind]
	if mc.BaseURL != "" {
		where += " at " + mc.BaseURL
	}
	fix := map[string]string{
		"aws":   "on EC2, the instance's metadata options must let the agent use IMDSv2: http-endpoint enabled, and a hop limit of 2 or more if the agent runs in a container (aws ec2 modify-instance-metadata-options --instance-id ID --http-endpoint enabled --http-tokens required --http-put-response-hop-limit 2); not on EC2: --metadata none",
		"gcp":   "on Compute Engine, metadata.google.internal must resolve and answer from this host with no proxy in the way (NO_PROXY); not on GCP: --metadata none",
		"azure": "on Azure, IMDS at 169.254.169.254 must answer with no proxy in the way (NO_PROXY); the first Scheduled Events request of a VM can take two minutes: check again then; not on Azure: --metadata none",
	}[mc.Kind]
	if mc.BaseURL != "" {
		fix = "check --metadata-url " + mc.BaseURL + "; " + fix
	}
	name := map[string]string{"aws": "instance", "gcp": "instance", "azure": "VM"}[mc.Kind]
	id, err := mc.ID(ctx)
	if err != nil {
		return providers.Fail(nameMetadata, fmt.Sprintf("%s: no %s name: %v", where, name, err), fix)
	}
	notices, err := mc.Notices.Notices(ctx)
	if err != nil {
		return providers.Fail(nameMetadata, fmt.Sprintf("%s: %s %s, but polling its notices failed: %v", where, name, id, err), fix)
	}
	polled := map[string]string{
		"aws":   "token, instance ID, and the spot, rebalance and lifecycle endpoints read",
		"gcp":   "instance ID, preemption and maintenance endpoints read (Metadata-Flavor: Google)",
		"azure": "VM name and Scheduled Events read",
	}[mc.Kind]
	detail := fmt.Sprintf("%s answers: %s %s; %s", where, name, id, polled)
	if len(notices) == 0 {
		detail += "; no notice now"
	}
	for _, n := range notices {
		detail += fmt.Sprintf("; a notice now: %s (%s)", n.Detail, n.Kind)
		if !n.Deadline.IsZero() {
			detail += " at " + n.Deadline.UTC().Format(time.RFC3339)
		}
	}
	return providers.OK(nameMetadata, detail)
}

// --- NVML and the GPUs ---

// GPUHost is what CheckGPUs judges.
type GPUHost struct {
	// Inventory is gpu.Inspect's.
	Inventory gpu.Inventory
	// PCI are the NVIDIA devices on the PCI bus (gpu.NVIDIAPCI); PCIErr why they could not
	// be listed.
	PCI    []gpu.PCIDevice
	PCIErr error
	// Visible is the agent's CUDA_VISIBLE_DEVICES, and VisibleSet whether it is set at all.
	Visible    string
	VisibleSet bool
	// Slots is --slots (0: one per GPU).
	Slots int
}

// CheckGPUs judges NVML (nameNVIDIA), the GPUs and the slots the agent would offer
// (nameGPUs, CUDA_VISIBLE_DEVICES and --slots applied as the agent applies them), and their
// health (nameGPUHealth, or a failed line per GPU, "GPU health: GPU 3": what the GPU monitor
// counts as failed, read from NVML's counters).
func CheckGPUs(h GPUHost) providers.Checks {
	inv := h.Inventory
	var pciGPUs []string
	for _, d := range h.PCI {
		if d.IsGPU() {
			pciGPUs = append(pciGPUs, d.Address)
		}
	}
	onBus := fmt.Sprintf("%d NVIDIA %s on the PCI bus (%s)", len(pciGPUs), plural(len(pciGPUs), "GPU"), list(pciGPUs, 4))
	noGPUs := "the agent offers --slots, or the driver's count"
	if h.Slots > 0 {
		noGPUs = fmt.Sprintf("the agent offers --slots %d", h.Slots)
	}
	notLoaded := func(nvidia providers.Check) providers.Checks {
		why := "NVML is not loaded (see " + nameNVIDIA + ")"
		return providers.Checks{nvidia, providers.Skipped(nameGPUs, why+": "+noGPUs, ""), providers.Skipped(nameGPUHealth, why, "")}
	}
	switch {
	case inv.Loaded:
	case h.PCIErr != nil:
		return notLoaded(providers.Skipped(nameNVIDIA, inv.Why+"; whether this machine has NVIDIA GPUs is unknown: "+h.PCIErr.Error(), ""))
	case len(pciGPUs) == 0:
		detail := "no NVIDIA GPU on this machine's PCI bus (vendor " + gpu.NVIDIAVendor + "): a CPU host"
		if inv.Unsupported {
			detail += " (and this elasticd, built without cgo, cannot read GPUs)"
		}
		return notLoaded(providers.Skipped(nameNVIDIA, detail, ""))
	case inv.Unsupported:
		return notLoaded(providers.Fail(nameNVIDIA, inv.Why+", but this machine has "+onBus,
			"install elasticd's release build for linux, which has cgo, or build it with CGO_ENABLED=1 and a C compiler"))
	case inv.Missing && strings.Contains(inv.Why, "kernel driver"):
		return notLoaded(providers.Fail(nameNVIDIA, inv.Why+", and this machine has "+onBus,
			"load the NVIDIA kernel module: reboot after installing the driver, or modprobe nvidia; `dmesg | grep -i nvrm` says why it did not load (a kernel updated without the module rebuilt, Secure Boot refusing an unsigned module)"))
	case inv.Missing:
		return notLoaded(providers.Fail(nameNVIDIA, inv.Why+", but this machine has "+onBus+": an image without the NVIDIA driver",
			"use an image with the NVIDIA driver (AWS Deep Learning AMI, GCP Deep Learning VM image, Azure's NVIDIA GPU driver extension), or install it (Ubuntu: apt-get install nvidia-driver-550-server, then reboot); `nvidia-smi` must list the GPUs before the agent starts"))
	default:
		return notLoaded(providers.Fail(nameNVIDIA, inv.Why+"; this machine has "+onBus,
			"`nvidia-smi` shows the same failure: reinstall the NVIDIA driver that matches the kernel and reboot"))
	}

	versions := []string{"driver " + cmp.Or(inv.DriverVersion, "?"), "NVML " + cmp.Or(inv.NVMLVersion, "?")}
	if inv.CUDAVersion != "" {
		versions = append(versions, "CUDA "+inv.CUDAVersion)
	}
	out := providers.Checks{providers.OK(nameNVIDIA, "NVML loaded: "+strings.Join(versions, ", "))}
	if inv.Why != "" {
		return append(out,
			providers.Fail(nameGPUs, inv.Why+": the agent would run without GPUs", "`nvidia-smi -q` shows the GPU NVML fails on: reset it (nvidia-smi -r -i N) or reboot; if it stays broken, hand the host back (terminate the instance, so that its group replaces it)"),
			providers.Skipped(nameGPUHealth, "NVML cannot list the GPUs", ""))
	}
	gpus := inv.GPUs()
	if len(inv.Devices) == 0 {
		if len(pciGPUs) > 0 {
			return append(out,
				providers.Fail(nameGPUs, "NVML lists no GPU, but this machine has "+onBus, "`nvidia-smi` should list them: a driver too old for these GPUs, or GPUs bound to another driver (vfio-pci)"),
				providers.Skipped(nameGPUHealth, "no GPU", ""))
		}
		return append(out, providers.Skipped(nameGPUs, "NVML lists no GPU: "+noGPUs, ""), providers.Skipped(nameGPUHealth, "no GPU", ""))
	}

	// What the agent offers: as runAgent narrows gpu.Open's list.
	offered, narrowed := gpus, false
	var gpusCheck providers.Check
	v := strings.TrimSpace(h.Visible)
	switch {
	case h.VisibleSet && v == "":
		offered, narrowed = nil, true
	case h.VisibleSet && len(gpus) > 0:
		vis, err := VisibleGPUs(gpuList(gpus), h.Visible)
		if err != nil {
			gpusCheck = providers.Fail(nameGPUs, err.Error()+": the agent would refuse to start (exit 2)",
				"list GPUs that `nvidia-smi -L` shows (indices or UUIDs) in CUDA_VISIBLE_DEVICES, unset it to offer every GPU, or set it empty to offer none")
		} else {
			offered, narrowed = vis.GPUs(), true
		}
	}
	if gpusCheck.Name == "" {
		detail := fmt.Sprintf("%d %s", len(inv.Devices), plural(len(inv.Devices), "GPU"))
		if len(gpus) > 0 {
			detail += ": " + models(inv.Devices)
		}
		var lostIdx []string
		for _, d := range inv.Devices {
			if d.Lost() {
				lostIdx = append(lostIdx, strconv.Itoa(d.Index))
			}
		}
		if len(lostIdx) > 0 {
			detail += fmt.Sprintf(" (lost, left out: GPU %s)", strings.Join(lostIdx, ", "))
		}
		switch {
		case narrowed && len(offered) == 0:
			detail += "; CUDA_VISIBLE_DEVICES=" + h.Visible + " offers none: " + noGPUs
		case narrowed:
			idx := make([]string, len(offered))
			for i, g := range offered {
				idx[i] = strconv.Itoa(g.Index)
			}
			detail += fmt.Sprintf("; CUDA_VISIBLE_DEVICES=%s offers GPU %s", h.Visible, strings.Join(idx, ", "))
		case len(offered) == 0:
			detail += "; the agent offers none: " + noGPUs
		default:
			detail += fmt.Sprintf("; the agent offers all %d", len(offered))
		}
		switch {
		case h.Slots > 0:
			detail += fmt.Sprintf(", as --slots %d", h.Slots)
		case len(offered) > 0:
			detail += fmt.Sprintf(", as %d %s", len(offered), plural(len(offered), "slot"))
		}
		gpusCheck = providers.OK(nameGPUs, detail)
		if len(pciGPUs) > len(inv.Devices) {
			gpusCheck = providers.Fail(nameGPUs, fmt.Sprintf("NVML lists %d %s, but this machine has %s: a GPU the driver does not serve (fallen off the bus?); %s",
				len(inv.Devices), plural(len(inv.Devices), "GPU"), onBus, detail), handBack)
		}
	}
	out = append(out, gpusCheck)

	// Health: a failed GPU the agent offers fails; one it does not offer is only reported.
	isOffered := map[int]bool{}
	for _, g := range offered {
		isOffered[g.Index] = true
	}
	var health providers.Checks
	for _, d := range inv.Devices {
		if len(d.Faults) == 0 {
			continue
		}
		name := fmt.Sprintf("%s: GPU %d", nameGPUHealth, d.Index)
		what := make([]string, len(d.Faults))
		for i, f := range d.Faults {
			what[i] = f.Detail
		}
		detail := strings.Join(what, "; ")
		if d.UUID != "" {
			detail = fmt.Sprintf("%s (%s): %s", d.UUID, d.Model, detail)
		}
		if narrowed && !isOffered[d.Index] {
			health = append(health, providers.Skipped(name, "not offered (CUDA_VISIBLE_DEVICES): "+detail, ""))
			continue
		}
		health = append(health, providers.Fail(name, detail, faultFix(d)))
	}
	if !health.Failed() {
		ok := fmt.Sprintf("%d %s: no uncorrectable ECC errors, no memory pages or rows waiting for a reset, none lost", len(offered), plural(len(offered), "GPU"))
		if len(offered) == 0 {
			ok = "no GPU offered"
		}
		health = append(providers.Checks{providers.OK(nameGPUHealth, ok)}, health...)
	}
	return append(out, health...)
}

const handBack = "hand the host back: terminate this instance, so that its group replaces it"

// faultFix is the remedy for a failed GPU, for its worst fault.
func faultFix(d gpu.Device) string {
	kinds := map[string]string{}
	for _, f := range d.Faults {
		kinds[f.Kind] = f.Detail
	}
	reset := fmt.Sprintf("reset the GPU (nvidia-smi -r -i %d, with nothing running on it) or reboot", d.Index)
	switch {
	case kinds[gpu.KindLost] != "":
		return handBack + "; on your own hardware, reboot, and replace the GPU if it is lost again. Meanwhile the agent leaves the GPU out"
	case strings.Contains(kinds[gpu.KindRowRemap], "failed"):
		return handBack + "; on your own hardware, replace the GPU: it has no spare memory rows left"
	case kinds[gpu.KindECC] != "":
		return handBack + "; on your own hardware, " + reset + ", and replace the GPU if the errors come back"
	}
	return reset + " to retire the memory, or " + handBack
}

// models sums the GPUs that are not lost up by model and memory: "8 × NVIDIA A100-SXM4-40GB
// (40 GiB)".
func models(all []gpu.Device) string {
	var devs []gpu.Device
	for _, d := range all {
		if !d.Lost() {
			devs = append(devs, d)
		}
	}
	var parts []string
	for i := 0; i < len(devs); {
		j := i
		for j < len(devs) && devs[j].Model == devs[i].Model && devs[j].MemoryBytes == devs[i].MemoryBytes {
			j++
		}
		m := cmp.Or(devs[i].Model, "unknown model")
		if devs[i].MemoryBytes > 0 {
			m += fmt.Sprintf(" (%.0f GiB)", float64(devs[i].MemoryBytes)/(1<<30))
		}
		parts = append(parts, fmt.Sprintf("%d × %s", j-i, m))
		i = j
	}
	return strings.Join(parts, ", ")
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// list joins at most n of s, and says how many more.
func list(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(" and %d more", len(s)-n)
}

// gpuList is a fixed inventory, for VisibleGPUs.
type gpuList []gpu.GPU

func (l gpuList) GPUs() []gpu.GPU { return l }

func (l gpuList) Watch(ctx context.Context, _ chan<- gpu.Event) error {
	<-ctx.Done()
	return nil
}
