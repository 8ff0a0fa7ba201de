package launch

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/proc"
)

// freePortScript runs on the remote host in /bin/sh (read by the bootstrap, so any login shell
// works). It lists the ports in use in any state, TIME_WAIT included, from /proc/net/tcp and
// tcp6 (Linux; hex after the colon of the local address), and prints a random port of
// 20000-32767, below Linux's ephemeral range so that outgoing connections do not take it
// before rank 0 binds it. awk is POSIX (busybox has one too); the shell's PID salts the
// time-based seed so that two launches in one second differ.
const freePortScript = `cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v salt="$$" '
function hex(s,   i, n) { n = 0; s = toupper(s); for (i = 1; i <= length(s); i++) n = n * 16 + index("0123456789ABCDEF", substr(s, i, 1)) - 1; return n }
NR > 0 && $2 ~ /:/ { split($2, a, ":"); used[hex(a[length(a)])] = 1 }
END { srand(); srand(salt + int(rand() * 1000003)); for (k = 0; k < 1000; k++) { p = 20000 + int(rand() * 12768); if (!(p in used)) { print p; exit 0 } } exit 1 }'
`

// FreePort runs a short ssh session on host that picks a port no socket there uses.
func (l *sshLauncher) FreePort(ctx context.Context, host string) (int, error) {
	fail := func(err error) (int, error) { return 0, fmt.Errorf("find a free port on %s: %w", host, err) }
	if err := l.check(proc.Spec{Host: host, Command: []string{"true"}}); err != nil {
		return fail(err)
	}
	token, err := newToken()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StartTimeout+5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, l.cfg.Binary, l.args(host, bootstrap(token))...)
	cmd.Stdin = strings.NewReader(freePortScript + token + "\n")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = proc.GroupAttr()
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(errb.String()); msg != "" {
			return fail(fmt.Errorf("%w: %s", err, msg))
		}
		return fail(err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil || port <= 0 || port > 65535 {
		return fail(fmt.Errorf("the remote host answered %q, not a port", strings.TrimSpace(out.String())))
	}
	return port, nil
}
