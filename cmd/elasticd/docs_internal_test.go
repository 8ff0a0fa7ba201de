package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// The user docs that show elasticd command lines or flag tables.
func userDocs(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"../../README.md", "../../docs/*.md", "../../docs/*/*.md",
		"../../terraform/*/README.md", "../../terraform/modules/*/README.md", "../../examples/*/README.md",
		"../../examples/*/*/README.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 5 {
		t.Fatalf("found only %v: run from cmd/elasticd", files)
	}
	return files
}

// commandLine matches an elasticd command line: in a code block, or in an inline code span.
var commandLine = regexp.MustCompile("(?:^|[\\s`(])(?:[./\\w-]*bin/)?elasticd((?: +[^`#]*)?)")

// codeSpan is an inline code span of a line of prose; flagRow a flag table's row.
var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	flagRow  = regexp.MustCompile("^\\| `(--?[a-z][a-z0-9-]*)`")
)

// docFlagProblems returns, for one document's text, each elasticd command line whose
// subcommand or flags the app does not have, and each flag table row naming no flag of any
// command.
func docFlagProblems(app *cli.App, name, text string) []string {
	// An example's README tables its script's own flags, not elasticd's.
	tables := !strings.Contains(filepath.ToSlash(name), "examples/")
	var problems []string
	lines := strings.Split(text, "\n")
	inBlock := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock = !inBlock
			continue
		}
		var candidates []string
		if inBlock || strings.HasPrefix(line, "    ") {
			full := line
			for strings.HasSuffix(strings.TrimSpace(full), `\`) && i+1 < len(lines) {
				i++
				full = strings.TrimSuffix(strings.TrimSpace(full), `\`) + " " + strings.TrimSpace(lines[i])
			}
			if m := commandLine.FindStringSubmatch(full); m != nil {
				candidates = append(candidates, m[1])
			}
		} else {
			for _, span := range codeSpan.FindAllStringSubmatch(line, -1) {
				if m := commandLine.FindStringSubmatch(span[1]); m != nil {
					candidates = append(candidates, m[1])
				}
			}
			if row := flagRow.FindStringSubmatch(line); row != nil && tables {
				if !anyCommandHas(app, strings.TrimLeft(row[1], "-")) {
					problems = append(problems, fmt.Sprintf("%s:%d: flag table row %s: no command has this flag", name, i+1, row[1]))
				}
			}
		}
		for _, c := range candidates {
			if p := checkCommandLine(app, c); p != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: elasticd%s: %s", name, i+1, c, p))
			}
		}
	}
	return problems
}

// checkCommandLine checks the words after "elasticd" as the CLI would parse them: each word
// that names a subcommand of the command so far descends into it, and each flag up to a bare
// "--" (the training command's own flags follow it) must be a flag of the command it follows.
// A line of prose ("elasticd keeps ...") names no command and no flag, and passes.
func checkCommandLine(app *cli.App, rest string) string {
	var cmd *cli.Command // nil: the root
	cmds, path := app.Commands, "elasticd"
	for _, w := range strings.Fields(rest) {
		if w == "--" {
			break
		}
		if strings.HasPrefix(w, "-") && len(w) > 1 && !strings.ContainsAny(w, "<>[]|…") {
			name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if name == "h" || name == "help" || cmd == nil && name == "version" {
				continue
			}
			if cmd == nil { // the root runs a job (impliedRun): its flags are run's
				cmd, cmds, path = findCommand(app.Commands, "run"), nil, "elasticd (run)"
			}
			if !slices.ContainsFunc(cmd.Flags, func(fl cli.Flag) bool { return slices.Contains(fl.Names(), name) }) {
				return fmt.Sprintf("%s has no flag --%s", path, name)
			}
			continue
		}
		if next := findCommand(cmds, w); next != nil {
			cmd, cmds, path = next, next.Subcommands, path+" "+w
		} else if cmd == nil {
			return "" // prose, not a command line
		}
	}
	return ""
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func anyCommandHas(app *cli.App, flag string) bool {
	found := false
	walkCommands(app.Commands, "elasticd", func(_ string, c *cli.Command) {
		for _, f := range c.Flags {
			if slices.Contains(f.Names(), flag) {
				found = true
			}
		}
	})
	return found
}

// Every elasticd command line in the user docs names real subcommands and flags, and every
// flag table row a real flag: docs that drift from the code fail here.
func TestDocsNameRealFlags(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	lines := 0
	for _, f := range userDocs(t) {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(text), "\n") {
			if m := commandLine.FindStringSubmatch(l); m != nil && strings.Contains(m[1], " -") {
				lines++
			}
		}
		for _, p := range docFlagProblems(app, f, string(text)) {
			t.Error(p)
		}
	}
	if lines < 40 {
		t.Fatalf("only %d elasticd command lines with flags in the docs: are the globs right?", lines)
	}
}

func TestDocsFlagCheckCanFail(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	for _, tc := range []struct {
		doc  string
		want string // "" for no problem
	}{
		{"```sh\n./bin/elasticd run -np 4 --min-np 2 -- ./bin/train --steps 800\n```\n", ""},
		{"```sh\n./bin/elasticd run -np 4 --min-nq 2 -- ./bin/train\n```\n", "has no flag --min-nq"},
		{"```sh\nelasticd --provider aws --asg g \\\n    --regio us-east-1 -- ./train\n```\n", "elasticd (run) has no flag --regio"},
		{"Run `elasticd ctl --driver http://x add-host --bogus h` to add one.\n", "elasticd ctl add-host has no flag --bogus"},
		{"Run `elasticd ctl add-host --driver http://x h` to add one.\n", "elasticd ctl add-host has no flag --driver"},
		{"Run `elasticd ctl --driver http://x add-host h` to add one.\n", ""},
		{"```sh\ngo test ./cmd/elasticd -run TestX -v\n```\n", ""},
		{"Run `elasticd status --driver http://127.0.0.1:29400` to see it.\n", ""},
		{"| `--reset-limit` | unlimited | resets |\n", ""},
		{"| `--reset-limits` | unlimited | resets |\n", "no command has this flag"},
		{"elasticd keeps training going while hosts come and go.\n", ""},
	} {
		got := strings.Join(docFlagProblems(app, "doc.md", tc.doc), "\n")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%q:\n got %q\nwant %q", tc.doc, got, tc.want)
		}
	}
}

// Every file of the repository that a --help text names (docs/…, examples/…, dashboards/…)
// exists: help that sends a user to a missing page teaches nothing.
func TestHelpNamesRealFiles(t *testing.T) {
	var texts []string
	var out strings.Builder
	app := newApp(&out, io.Discard)
	texts = append(texts, app.Description)
	walkCommands(app.Commands, "elasticd", func(_ string, c *cli.Command) {
		texts = append(texts, c.Description, c.Usage, c.UsageText)
		for _, f := range c.Flags {
			if d, ok := f.(cli.DocGenerationFlag); ok {
				texts = append(texts, d.GetUsage())
			}
		}
	})
	path := regexp.MustCompile(`\b(?:docs|examples|dashboards|terraform|bench)/[\w./-]*[\w/]`)
	named := 0
	for _, text := range texts {
		for _, p := range path.FindAllString(text, -1) {
			named++
			if _, err := os.Stat(filepath.Join("..", "..", p)); err != nil {
				t.Errorf("help names %s: %v", p, err)
			}
		}
	}
	if named < 5 {
		t.Fatalf("help texts name only %d repository files: is the pattern right?", named)
	}
}
