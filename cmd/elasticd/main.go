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
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code (0 success, 1 failure, 2 bad
// usage) and prints failures as one line on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	err := app.RunContext(ctx, joinCooldownArgs(args))
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
   elasticd agent --driver URL --agent-secret-file F  on each GPU host, for --launcher agent
   elasticd ctl add-host|remove-host|status         change a running job's hosts (admin API)
   elasticd discover --provider aws --asg NAME      the hosts a provider finds
   elasticd bench allreduce --np 4                  collectives across 4 local processes
   elasticd version                                 the version

Guides: docs/operations.md (running jobs), docs/providers/ (clouds), docs/protocol.md.

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

// usageExit makes a flag that does not parse exit 2, like every other bad input.
func usageExit(_ *cli.Context, err error, _ bool) error {
	msg := strings.Replace(err.Error(), "for flag -", "for flag --", 1)
	msg = strings.Replace(msg, "not defined: -", "not defined: --", 1)
	return cli.Exit(msg, 2)
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
			commit, modified := "unknown", ""
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
