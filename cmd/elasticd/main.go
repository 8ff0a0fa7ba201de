// Command elasticd drives elastic data-parallel training on spot GPU fleets. This file wires
// the subcommands; each lives in its own file.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/urfave/cli/v2"
	"github.com/xrash/smetrics"
)

// version and commit are set at build time: -ldflags "-X main.version=v1.2.3 -X
// main.commit=SHA" (make build does). Go's own VCS stamping, where it is on, wins for the commit.
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	term := &sigterm{}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	go func() { // lives as long as the process
		for sig := range ch {
			if !term.deliver() {
				cancel(fmt.Errorf("%v signal received", sig))
			}
		}
	}()
	os.Exit(run(context.WithValue(ctx, sigtermKey{}, term), os.Args, os.Stdout, os.Stderr))
}

// sigterm says what SIGTERM means to the command being run. By default it ends the command,
// as SIGINT does. A job whose workers can outlive its driver (run --launcher agent with
// --state-dir) takes it instead as the driver's machine going away (systemd stopping the
// driver for a reboot): the driver leaves and the job goes on, for a driver started again on
// its state to take up. Ending such a job is SIGINT's, or elasticd ctl stop's.
type sigterm struct {
	mu    sync.Mutex
	leave chan struct{} // set by a job that can be left; closed by the first SIGTERM
	left  bool
}

type sigtermKey struct{}

// sigtermOf is ctx's sigterm, or nil (tests that call run directly).
func sigtermOf(ctx context.Context) *sigterm {
	s, _ := ctx.Value(sigtermKey{}).(*sigterm)
	return s
}

// leaveOn makes SIGTERM close leave instead of ending the command. It reports false where
// nothing delivers SIGTERM this way (run called without main).
func (s *sigterm) leaveOn(leave chan struct{}) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leave = leave
	return true
}

// deliver hands a SIGTERM to the job that can be left, and reports whether there was one.
func (s *sigterm) deliver() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leave == nil {
		return false
	}
	if !s.left {
		close(s.leave)
		s.left = true
	}
	return true
}

// run is main without the process: it returns the exit code (0 success, 1 failure, 2 bad
// usage) and prints failures as one line on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	err := app.RunContext(ctx, joinCooldownArgs(impliedRun(args)))
	if err == nil {
		return 0
	}
	code := 1
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		code = ec.ExitCode()
	}
	fmt.Fprintf(stderr, "elasticd: %v\n", err)
	return code
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:  "elasticd",
		Usage: "elastic data-parallel training on spot GPU fleets",
		Description: `elasticd keeps a data-parallel training job alive and cheap while machines come and go.

Start here:
   elasticd run -np 4 --min-np 2 -- ./train          an elastic job on this machine (4 slots)
   elasticd --provider aws --asg NAME -np 4 -- CMD   the same: flags before a command mean run
   elasticd check --provider aws --asg NAME ...     the same flags: credentials, permissions,
                                                    hosts, secrets checked before it starts
   elasticd agent --driver URL --agent-secret-file F  on each GPU host, for --launcher agent
   elasticd ctl add-host|remove-host|status         change a running job's hosts (admin API)
   elasticd discover --provider aws --asg NAME      the hosts a provider finds
   elasticd bench allreduce --np 4                  collectives across 4 local processes
   elasticd version                                 the version

Guides: docs/operations.md (running jobs), docs/deploy-aws.md (a cloud job from zero, with
Terraform; deploy-gcp, -azure, -ibm beside it), docs/providers/ (clouds), docs/protocol.md.

Every flag can also be set through an environment variable named ELASTICD_<FLAG>
(for example ELASTICD_NP=4); the flag's help shows the exact name.`,
		Writer:                 stdout,
		ErrWriter:              stderr,
		HideVersion:            true,
		UseShortOptionHandling: true,
		ExitErrHandler:         func(*cli.Context, error) {}, // run() reports errors once
		OnUsageError:           usageExit,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return cli.Exit(fmt.Sprintf("unknown command %q: run 'elasticd --help' for the list", c.Args().First()), 2)
			}
			return cli.ShowAppHelp(c)
		},
		Commands: []*cli.Command{
			runCommand(),
			checkCommand(),
			agentCommand(),
			ctlCommand(),
			statusCommand(),
			discoverCommand(),
			benchCommand(),
			versionCommand(),
		},
	}
	setUsageExit(app.Commands)
	return app
}

// impliedRun makes the root command run a job, as the product's usage line says
// (elasticd --provider aws --asg my-gpu-asg -np 4 -- python3 train.py): arguments that start
// with a flag other than help are `run`'s. `elasticd run ...` stays the explicit form.
func impliedRun(args []string) []string {
	if len(args) < 2 || !strings.HasPrefix(args[1], "-") {
		return args
	}
	switch strings.TrimLeft(args[1], "-") {
	case "h", "help":
		return args
	case "version":
		return append([]string{args[0], "version"}, args[2:]...)
	}
	return append([]string{args[0], "run"}, args[1:]...)
}

// usageExit makes a flag that does not parse exit 2, like every other bad input. An unknown
// flag's message suggests the command's closest flag, and names the commands that have it.
func usageExit(c *cli.Context, err error, _ bool) error {
	msg := strings.Replace(err.Error(), "for flag -", "for flag --", 1)
	msg = strings.Replace(msg, "not defined: -", "not defined: --", 1)
	if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: "); ok && c != nil {
		msg += flagHint(c, strings.TrimLeft(name, "-"))
	}
	return cli.Exit(msg, 2)
}

// flagHint is what to say after "flag provided but not defined": the nearest flag of the
// command being run, and the other commands that define the flag as typed.
func flagHint(c *cli.Context, name string) string {
	var flags []cli.Flag
	if c.Command != nil && c.Command.Name != "" {
		flags = c.Command.Flags
	} else if c.App != nil {
		flags = c.App.Flags
	}
	path := []string{"elasticd"}
	for _, x := range slices.Backward(c.Lineage()) {
		if x.Command != nil && x.Command.Name != "" && path[len(path)-1] != x.Command.Name {
			path = append(path, x.Command.Name)
		}
	}
	here := strings.Join(path, " ")
	var hint []string
	if near := nearestFlag(flags, name); near != "" {
		hint = append(hint, fmt.Sprintf("did you mean --%s?", near))
	}
	var others []string
	if c.App != nil {
		walkCommands(c.App.Commands, "elasticd", func(path string, cmd *cli.Command) {
			if path == here || cmd.Hidden {
				return
			}
			for _, f := range cmd.Flags {
				if slices.Contains(f.Names(), name) {
					others = append(others, "'"+path+"'")
					return
				}
			}
		})
	}
	if len(others) > 0 {
		hint = append(hint, fmt.Sprintf("--%s is a flag of %s", name, strings.Join(others, ", ")))
	}
	if len(hint) == 0 {
		return fmt.Sprintf(" (see '%s --help')", here)
	}
	return " (" + strings.Join(hint, "; ") + ")"
}

// walkCommands calls fn with each command's full name ("elasticd bench allreduce").
func walkCommands(cmds []*cli.Command, prefix string, fn func(string, *cli.Command)) {
	for _, cmd := range cmds {
		path := prefix + " " + cmd.Name
		fn(path, cmd)
		walkCommands(cmd.Subcommands, path, fn)
	}
}

// nearestFlag is the flag name closest to name (an edit distance of at most a third of its
// length, at least 1), or "".
func nearestFlag(flags []cli.Flag, name string) string {
	best, bestD := "", max(1, len(name)/3)+1
	for _, f := range flags {
		for _, n := range f.Names() {
			if d := smetrics.WagnerFischer(n, name, 1, 1, 1); d < bestD && n != name {
				best, bestD = n, d
			}
		}
	}
	return best
}

func setUsageExit(cmds []*cli.Command) {
	for _, c := range cmds {
		if c.OnUsageError == nil {
			c.OnUsageError = usageExit
		}
		setUsageExit(c.Subcommands)
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version, commit and Go toolchain",
		Action: func(c *cli.Context) error {
			commit, modified := commit, ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					switch {
					case s.Key == "vcs.revision":
						commit = s.Value
					case s.Key == "vcs.modified" && s.Value == "true":
						modified = " (modified)"
					}
				}
			}
			fmt.Fprintf(c.App.Writer, "elasticd %s\ncommit %s%s\n%s %s/%s\n", version, commit, modified, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}

// usageError is a bad flag value: exit code 2 and a one-line message naming the flag.
func usageError(flag, format string, args ...any) error {
	return cli.Exit(fmt.Sprintf("--%s: %s", flag, fmt.Sprintf(format, args...)), 2)
}
