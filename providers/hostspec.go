package providers

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// MaxSlots bounds the slot count of one host, so that a typo such as "gpu-1:40000000" is an
// error rather than a request for forty million workers.
const MaxSlots = 4096

// entryHelp is appended to every host[:slots] syntax error: say what is allowed, not only what
// is wrong.
const entryHelp = "want host[:slots]: a hostname, an IPv4 address or a bracketed IPv6 address, " +
	"and slots a positive integer (e.g. gpu-1:4, 10.0.0.2:8, [fd00::2]:8)"

// ParseHosts parses a -H list, "host[:slots],...", into hosts whose ID and Addr are the host.
// An entry without ":slots" gets defaultSlots. Hostnames are lower-cased and IPv6 addresses
// written in their canonical form (and without brackets in Addr), so one host cannot appear
// twice under two spellings; a host listed twice is an error, as is an empty entry or list.
func ParseHosts(spec string, defaultSlots int) ([]Host, error) {
	if err := checkSlots(defaultSlots); err != nil {
		return nil, fmt.Errorf("default slots: %w", err)
	}
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("host list is empty; " + entryHelp)
	}
	entries := strings.Split(spec, ",")
	hosts := make([]Host, 0, len(entries))
	seen := make(map[string]int, len(entries)) // host ID → 1-based entry number
	for i, e := range entries {
		n := i + 1
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, fmt.Errorf("host list entry %d is empty (a stray comma?); %s", n, entryHelp)
		}
		h, err := parseEntry(e, defaultSlots)
		if err != nil {
			return nil, fmt.Errorf("host list entry %d %q: %w; %s", n, e, err, entryHelp)
		}
		if first, dup := seen[h.ID]; dup {
			return nil, fmt.Errorf("host list entry %d %q: host %s is already entry %d; list each host once", n, e, h.ID, first)
		}
		seen[h.ID] = n
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// parseEntry parses one trimmed, non-empty host[:slots]. Its errors say what is wrong with the
// entry; the caller names the entry and appends entryHelp.
func parseEntry(s string, defaultSlots int) (Host, error) {
	var host, slots string
	hasSlots := false
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Host{}, errors.New("'[' without a closing ']'")
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return Host{}, fmt.Errorf("%q in brackets is not an IPv6 address", s[1:end])
		}
		host = a.String()
		rest := s[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return Host{}, fmt.Errorf("unexpected %q after ']'", rest)
			}
			slots, hasSlots = rest[1:], true
		}
	} else {
		if strings.Count(s, ":") > 1 {
			return Host{}, errors.New("an IPv6 address must be in brackets")
		}
		host, slots, hasSlots = strings.Cut(s, ":")
		h, err := canonicalHost(host)
		if err != nil {
			return Host{}, err
		}
		host = h
	}
	n := defaultSlots
	if hasSlots {
		v, err := parseSlots(slots)
		if err != nil {
			return Host{}, err
		}
		n = v
	}
	return Host{ID: host, Addr: host, Slots: n}, nil
}

// canonicalHost checks a hostname or IPv4 address and returns it lower-cased (DNS names are
// case-insensitive). A name made only of digits and dots must be a valid IPv4 address.
func canonicalHost(h string) (string, error) {
	if h == "" {
		return "", errors.New("the host is empty")
	}
	if len(h) > 253 {
		return "", fmt.Errorf("the host is %d characters long; at most 253 are allowed", len(h))
	}
	numeric := true
	for _, label := range strings.Split(h, ".") {
		if label == "" {
			return "", fmt.Errorf("host %q has an empty label (a leading, trailing or doubled dot)", h)
		}
		if len(label) > 63 {
			return "", fmt.Errorf("host %q has a label longer than 63 characters", h)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "", fmt.Errorf("host %q has a label that starts or ends with '-'", h)
		}
		for _, c := range []byte(label) {
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '_':
				numeric = false
			default:
				return "", fmt.Errorf("host %q contains %q; letters, digits, '-', '_' and '.' are allowed", h, rune(c))
			}
		}
	}
	if numeric {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is4() {
			return "", fmt.Errorf("%q is not a valid IPv4 address", h)
		}
		return a.String(), nil
	}
	return strings.ToLower(h), nil
}

func parseSlots(s string) (int, error) {
	if s == "" {
		return 0, errors.New("nothing after ':' (give a slot count, or drop the ':')")
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("slots %q is not a positive integer", s)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > MaxSlots {
		return 0, fmt.Errorf("slots %s is more than %d", s, MaxSlots)
	}
	if n == 0 {
		return 0, errors.New("slots 0: a host needs at least one slot")
	}
	return n, nil
}

func checkSlots(n int) error {
	if n < 1 || n > MaxSlots {
		return fmt.Errorf("slots %d: must be between 1 and %d", n, MaxSlots)
	}
	return nil
}
