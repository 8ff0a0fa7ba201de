package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/proc"
)

// How the remote side is kept on a leash
//
// The ssh client runs one fixed bootstrap command (the only thing in any argv), which reads a
// wrapper script from the session's stdin and evaluates it. The script carries the environment
// (so the job secret travels inside the encrypted session, never on a command line), cds to the
// directory, and starts the worker with setsid, so that the worker and everything it starts form
// one process group, apart from sshd's. The wrapper then keeps reading the session's stdin:
// "term" and "kill" lines from Stop signal the worker's group, and EOF, which arrives when the
// ssh client dies for any reason (driver SIGKILLed, ssh killed, connection dropped), makes it
// SIGTERM the group, then SIGKILL it after DisconnectGrace. When the worker's main process exits,
// the wrapper kills what is left of its group and reports the exit code on stderr, behind a
// marker that is random per launch (ssh's own exit code cannot tell the worker's 255 from a
// lost connection). It reports the worker's PID the same way once the command has been found,
// so Start returns only when the worker runs, and a host that is unreachable or refuses the key
// is an error from Start.
//
// Why not `ssh -tt`, which makes sshd send SIGHUP when the connection drops: SIGHUP reaches only
// the pty's foreground process group (not children that made their own, not processes that
// ignore SIGHUP), cannot be escalated to SIGKILL, and the pty merges stderr into stdout,
// rewrites \n as \r\n and echoes stdin back, secret included.
//
// The remote login shell may be any shell, so the bootstrap is written to parse the same way in
// sh, bash, zsh, fish and csh; everything else runs in /bin/sh. The remote host needs /bin/sh
// and setsid (util-linux; busybox has one too).
//
// Not covered: a network partition with no FIN or RST. The remote sshd then notices the dead
// client only through its ClientAliveInterval (or TCP keepalive), and only then the wrapper sees
// EOF; worker hosts should set ClientAliveInterval. The local client gives up after about 15 s
// (ServerAliveInterval 5 × ServerAliveCountMax 3), so Wait returns an error in bounded time.

// SSHConfig configures the ssh launcher. The zero value uses ssh's own defaults and
// ~/.ssh/config for port, identity and user.
type SSHConfig struct {
	Port         int    // -p; 0 = ssh's default
	IdentityFile string // -i, with IdentitiesOnly=yes; "" = ssh's default keys
	User         string // -l; "" = ssh's default
	// Options are ssh_config options ("Key=Value"), passed as -o ahead of the launcher's own,
	// so they win over its defaults (ssh takes the first value it sees).
	Options []string
	Binary  string // the ssh client; default "ssh"
	// StartTimeout bounds Start: connect, authenticate, start the command (default 30 s, as
	// Horovod's --start-timeout). Also ssh's ConnectTimeout, rounded up to whole seconds.
	StartTimeout time.Duration
	// DisconnectGrace is the time between SIGTERM and SIGKILL that a remote worker gets when its
	// connection drops (the driver died); default DefaultGrace, rounded up to whole seconds.
	DisconnectGrace time.Duration
	// Setup is POSIX sh that the remote wrapper runs after exporting the worker's environment
	// and before starting it (elasticd's Python package: python.RemoteInstall). Its variables
	// must not collide with the wrapper's (__m, __g, __S, __Z, __pid, __w, __c, __i, __l, __p, __n).
	Setup string
}

// Validate reports a configuration that cannot work. Start checks it too.
func (c SSHConfig) Validate() error {
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("ssh port %d out of range", c.Port)
	}
	if c.StartTimeout < 0 || c.DisconnectGrace < 0 {
		return errors.New("ssh timeouts must not be negative")
	}
	for _, o := range c.Options {
		if k, _, ok := strings.Cut(o, "="); !ok || k == "" || strings.HasPrefix(k, "-") {
			return fmt.Errorf("ssh option %q: want Key=Value", o)
		}
	}
	return nil
}

// NewSSH returns a Launcher that runs each worker on Spec.Host through the ssh client, with the
// environment sent over the session's stdin. See the comment above SSHConfig for how the remote
// worker is made to die with its connection. The exit code is the one the remote shell reports:
// a worker killed by signal N there reads as exit 128+N.
func NewSSH(cfg SSHConfig) proc.Launcher {
	if cfg.Binary == "" {
		cfg.Binary = "ssh"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if cfg.DisconnectGrace <= 0 {
		cfg.DisconnectGrace = proc.DefaultGrace
	}
	return &sshLauncher{cfg: cfg}
}

const (
	// stopAckTimeout is how long Stop waits, after telling the wrapper to SIGKILL the worker,
	// for the connection to report the exit before it cuts the connection.
	stopAckTimeout = 5 * time.Second
	// exitLinger bounds how long the ssh client may stay after the worker's exit status has
	// arrived: a remote process that left the worker's group (setsid) can hold the session open.
	exitLinger = 2 * time.Second
)

type sshLauncher struct{ cfg SSHConfig }

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (l *sshLauncher) Start(ctx context.Context, s proc.Spec) (proc.Process, error) {
	fail := func(err error) (proc.Process, error) {
		return nil, fmt.Errorf("start %s on %s: %w", s.Name, s.Host, err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	if err := l.check(s); err != nil {
		return fail(err)
	}
	dir := s.Dir
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fail(err)
		}
		dir = wd
	}
	token, err := newToken()
	if err != nil {
		return fail(err)
	}
	grace := int(math.Ceil(l.cfg.DisconnectGrace.Seconds()))
	script := wrapperScript(token, s.Env, l.cfg.Setup, dir, s.Command, grace)

	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	cmd := exec.Command(l.cfg.Binary, l.args(s.Host, bootstrap(token))...)
	cmd.Stdin = stdinR
	cmd.SysProcAttr = proc.GroupAttr()
	stdout, stderr := s.Stdout, s.Stderr
	if proc.SameWriter(stdout, stderr) {
		w := proc.NewLockedWriter(stdout)
		stdout, stderr = w, w
	}
	filter := newMarkerFilter(token, stderr)
	p, err := proc.StartGroup(cmd, stdout, filter)
	stdinR.Close()
	if err != nil {
		stdinW.Close()
		return fail(err)
	}
	sp := &sshProcess{g: p, host: s.Host, filter: filter, stdin: stdinW}
	go p.Reap(sp.closeStdin)

	written := make(chan error, 1)
	go func() {
		_, err := io.WriteString(stdinW, script+token+"\n")
		written <- err
	}()
	timer := time.NewTimer(l.cfg.StartTimeout)
	defer timer.Stop()
	var cause error
	select {
	case <-filter.started:
	case <-p.Done():
	case <-ctx.Done():
		cause = ctx.Err()
	case <-timer.C:
		cause = fmt.Errorf("not started within %v (connect, authenticate, find the command)", l.cfg.StartTimeout)
	}
	select {
	case <-filter.started:
		<-written // the wrapper has read all of it
		sp.supervised = make(chan struct{})
		go func() {
			defer close(sp.supervised)
			sp.supervise(ctx)
		}()
		return sp, nil
	default:
	}
	// Cutting the connection is enough: a wrapper that got this far sees EOF and kills the group.
	p.Signal(syscall.SIGKILL)
	<-p.Done()
	<-written
	return fail(filter.startError(cause, p.Status()))
}

func (l *sshLauncher) check(s proc.Spec) error {
	if s.Host == "" || strings.HasPrefix(s.Host, "-") || strings.ContainsAny(s.Host, " \t\r\n") {
		return fmt.Errorf("bad host %q", s.Host)
	}
	if len(s.Command) == 0 {
		return errors.New("empty command")
	}
	for _, kv := range s.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !envKey.MatchString(k) {
			return fmt.Errorf("environment entry %q: want KEY=VALUE with KEY a shell name", strings.SplitN(kv, "=", 2)[0])
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("environment entry %s: value contains NUL", k)
		}
	}
	return l.cfg.Validate()
}

func (l *sshLauncher) args(host, remote string) []string {
	var a []string
	for _, o := range l.cfg.Options {
		a = append(a, "-o", o)
	}
	a = append(a, "-T",
		"-o", "BatchMode=yes",
		"-o", "PasswordAuthentication=no",
		// As Horovod, accept any host key: spot hosts come and go. And as Ray's launcher, keep
		// no record: a replaced instance at a reused address would otherwise get a page of
		// "REMOTE HOST IDENTIFICATION HAS CHANGED" on every worker's stderr.
		"-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null",
		"-o", "LogLevel=ERROR",
		"-o", "ControlPath=none", // a shared master connection would outlive this client
		"-o", "ConnectTimeout="+strconv.Itoa(int(math.Ceil(l.cfg.StartTimeout.Seconds()))),
		"-o", "ServerAliveInterval=5",
		"-o", "ServerAliveCountMax=3",
	)
	if l.cfg.Port != 0 {
		a = append(a, "-p", strconv.Itoa(l.cfg.Port))
	}
	if l.cfg.IdentityFile != "" {
		a = append(a, "-i", l.cfg.IdentityFile, "-o", "IdentitiesOnly=yes")
	}
	if l.cfg.User != "" {
		a = append(a, "-l", l.cfg.User)
	}
	return append(a, "--", host, remote)
}

func newToken() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "elasticd-" + hex.EncodeToString(b), nil
}

// bootstrap is the remote command: it reads lines from stdin up to the line token and evaluates
// them. Inside its single quotes there is nothing that sh, bash, zsh, fish or csh would read
// differently.
func bootstrap(token string) string {
	return `exec /bin/sh -c '__n=$(printf "\n."); __n=${__n%.}; __p=; ` +
		`while IFS= read -r __l; do if [ "$__l" = ` + token + ` ]; then eval "$__p"; exit; fi; __p=$__p$__l$__n; done; ` +
		`exit 125'`
}

// wrapperScript is what the bootstrap evaluates. Its own variables start with __, so that they
// do not collide with the worker's environment, and the tools it needs are found before that
// environment (which may set PATH) is exported.
func wrapperScript(token string, env []string, setup, dir string, argv []string, grace int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "__m=%s __g=%d\n", token, grace)
	b.WriteString(`__S=$(command -v setsid) || { echo "setsid not found (util-linux)" >&2; echo "$__m exit 127" >&2; exit 127; }` + "\n")
	b.WriteString(`__Z=$(command -v sleep)` + "\n")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	if setup != "" {
		b.WriteString(strings.TrimSuffix(setup, "\n") + "\n")
	}
	fmt.Fprintf(&b, "cd -- %s || { echo \"$__m exit 1\" >&2; exit 1; }\n", shellQuote(dir))
	b.WriteString("set --")
	for _, a := range argv {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString("\n" + wrapperBody)
	return b.String()
}

// wrapperBody runs the command "$@" (see the comment above SSHConfig). fd 3 keeps the session's
// stdin for the watcher, since sh gives background jobs /dev/null as stdin unless told otherwise.
const wrapperBody = `exec 3<&0
"$__S" /bin/sh -c 'command -v "$1" >/dev/null || { printf "%s: command not found\n" "$1" >&2; exit 127; }
echo "$0 started $$" >&2; exec "$@"' "$__m" "$@" </dev/null 3<&- &
__pid=$!
(
	while IFS= read -r __c; do
		case $__c in
		term) kill -s TERM -- -"$__pid" ;;
		kill) kill -s KILL -- -"$__pid" ;;
		esac
	done
	kill -s TERM -- -"$__pid" || exit 0
	__i=0
	while [ "$__i" -lt "$__g" ] && kill -s 0 -- -"$__pid"; do "$__Z" 1; __i=$((__i + 1)); done
	kill -s KILL -- -"$__pid"
) <&3 >/dev/null 2>&1 &
__w=$!
exec 3<&-
wait "$__pid" 2>/dev/null
__rc=$?
kill -s KILL -- -"$__pid" 2>/dev/null
kill -s KILL "$__w" 2>/dev/null
echo "$__m exit $__rc" >&2
exit "$__rc"
`

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

type sshProcess struct {
	g        *proc.Group
	host     string
	filter   *markerFilter
	termOnce sync.Once
	cut      atomic.Bool // Stop cut the connection before the exit status arrived
	// supervised is closed when supervise has returned: Wait waits for it, so that no
	// goroutine of the process outlives Wait.
	supervised chan struct{}

	stdinMu sync.Mutex
	stdin   *os.File // nil once the ssh client is gone
}

func (p *sshProcess) PID() int { return p.g.PID() }

// RemotePID is the worker's PID on its host, which is also its process group's ID there.
func (p *sshProcess) RemotePID() int { return p.filter.remotePID }

func (p *sshProcess) Wait() (proc.ExitStatus, error) {
	<-p.g.Done()
	<-p.supervised
	if p.filter.isExited {
		return proc.ExitStatus{Code: p.filter.code}, nil
	}
	st := p.g.Status()
	if p.cut.Load() {
		return st, fmt.Errorf("ssh %s: no answer %v after SIGKILL was sent; connection cut, remote exit status unknown", p.host, stopAckTimeout)
	}
	msg := ""
	if p.filter.tail != "" {
		msg = ": " + p.filter.tail
	}
	return st, fmt.Errorf("ssh %s: connection lost before the worker exited (ssh %v)%s", p.host, st, msg)
}

func (p *sshProcess) Stop(grace time.Duration) {
	p.termOnce.Do(func() { p.send("term") })
	if p.g.WaitDone(grace) {
		return
	}
	p.send("kill")
	if p.g.WaitDone(stopAckTimeout) {
		return
	}
	p.cut.Store(true)
	p.g.Signal(syscall.SIGKILL) // the wrapper sees EOF and kills the group itself
	<-p.g.Done()
}

func (p *sshProcess) send(line string) {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		// Fails only when the client is gone or stuck, which Stop sees by waiting.
		p.stdin.SetWriteDeadline(time.Now().Add(time.Second))
		p.stdin.WriteString(line + "\n")
	}
}

func (p *sshProcess) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	p.stdin.Close()
	p.stdin = nil
}

// supervise stops the process when ctx is cancelled, and ends an ssh client that lingers after
// the exit status has arrived. It returns once the process has exited.
func (p *sshProcess) supervise(ctx context.Context) {
	exited := p.filter.exited
	var linger <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			p.Stop(proc.DefaultGrace)
			return
		case <-exited:
			exited = nil
			t := time.NewTimer(exitLinger)
			defer t.Stop()
			linger = t.C
		case <-linger:
			linger = nil
			p.g.Signal(syscall.SIGKILL)
		case <-p.g.Done():
			return
		}
	}
}

// markerFilter passes the remote stderr on to w (nil discards), taking out the wrapper's marker
// lines. Until the started marker it holds the lines back, for Start's error message. Only the
// stderr copier writes to it; its fields are read after the channels are closed or after the
// process is done.
type markerFilter struct {
	token []byte
	w     io.Writer
	buf   []byte // partial line

	early     []string // lines before the started marker (the last few)
	tail      string   // the last line passed on, for Wait's error message
	remotePID int
	code      int
	isStarted bool
	isExited  bool
	started   chan struct{}
	exited    chan struct{}
}

func newMarkerFilter(token string, w io.Writer) *markerFilter {
	return &markerFilter{
		token:   []byte(token),
		w:       w,
		started: make(chan struct{}),
		exited:  make(chan struct{}),
	}
}

func (f *markerFilter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			f.buf = append(f.buf, b...)
			if len(f.buf) > proc.MaxLine { // pass on all but what could be the start of a marker
				k := len(f.buf) - len(f.token)
				f.pass(f.buf[:k])
				f.buf = append(f.buf[:0], f.buf[k:]...)
			}
			break
		}
		f.buf = append(f.buf, b[:i+1]...)
		f.line(f.buf)
		f.buf = f.buf[:0]
		b = b[i+1:]
	}
	return n, nil
}

// Flush passes on a last line that has no newline, then flushes w.
func (f *markerFilter) Flush() error {
	if len(f.buf) > 0 {
		f.line(f.buf)
		f.buf = f.buf[:0]
	}
	if fl, ok := f.w.(interface{ Flush() error }); ok {
		return fl.Flush()
	}
	return nil
}

func (f *markerFilter) line(line []byte) {
	i := bytes.Index(line, f.token)
	if i < 0 {
		f.pass(line)
		return
	}
	if i > 0 {
		f.pass(line[:i]) // the worker's last line, which had no newline
	}
	fields := strings.Fields(string(line[i+len(f.token):]))
	if len(fields) != 2 {
		return
	}
	n, err := strconv.Atoi(fields[1])
	if err != nil {
		return
	}
	switch {
	case fields[0] == "started" && !f.isStarted:
		f.remotePID, f.isStarted = n, true
		for _, l := range f.early {
			f.write([]byte(l))
		}
		f.early = nil
		close(f.started)
	case fields[0] == "exit" && !f.isExited:
		f.code, f.isExited = n, true
		close(f.exited)
	}
}

func (f *markerFilter) pass(b []byte) {
	if t := strings.TrimSpace(string(b)); t != "" {
		f.tail = t
		if len(f.tail) > 200 {
			f.tail = f.tail[:200]
		}
	}
	if !f.isStarted {
		f.early = append(f.early, string(b))
		if len(f.early) > 20 {
			f.early = f.early[1:]
		}
		return
	}
	f.write(b)
}

func (f *markerFilter) write(b []byte) {
	if f.w != nil {
		f.w.Write(b)
	}
}

// startError says why the command did not start: cause, or else how the wrapper or ssh
// exited; then what they said.
func (f *markerFilter) startError(cause error, st proc.ExitStatus) error {
	switch {
	case cause != nil:
	case f.isExited:
		cause = fmt.Errorf("command did not start (exit %d)", f.code)
	case st.Code == 255:
		cause = errors.New("ssh failed (exit 255)")
	default:
		cause = fmt.Errorf("remote shell failed (%v)", st)
	}
	var said []string
	for _, l := range f.early {
		if t := strings.TrimSpace(l); t != "" {
			said = append(said, t)
		}
	}
	if len(said) == 0 {
		return cause
	}
	return fmt.Errorf("%w: %s", cause, strings.Join(said, "; "))
}
