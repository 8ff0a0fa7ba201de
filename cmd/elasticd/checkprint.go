package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/elasticd/elasticd/providers"
)

// printChecks prints the lines of `elasticd check` and `elasticd agent --check`: one line per
// check, "✔ NAME: DETAIL", "✘ NAME: DETAIL" followed by "  fix: FIX", "- NAME: skipped:
// DETAIL" (with its fix line when a skip has one); or, asJSON, one object
// {"ok": bool, "checks": [{"name", "status", "detail", "fix"}]}, ok when no check failed.
func printChecks(w io.Writer, cs providers.Checks, asJSON bool) error {
	if asJSON {
		doc := struct {
			OK     bool             `json:"ok"`
			Checks providers.Checks `json:"checks"`
		}{!cs.Failed(), cs}
		if doc.Checks == nil {
			doc.Checks = providers.Checks{}
		}
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false) // details quote commands: 2>&1, <file>
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	var b strings.Builder
	for _, c := range cs {
		// A detail or fix of several lines stays under its check.
		detail, fix := indent(c.Detail), indent(c.Fix)
		switch c.Status {
		case providers.CheckOK:
			fmt.Fprintf(&b, "✔ %s: %s\n", c.Name, detail)
		case providers.CheckFail:
			fmt.Fprintf(&b, "✘ %s: %s\n", c.Name, detail)
		case providers.CheckSkipped:
			fmt.Fprintf(&b, "- %s: skipped: %s\n", c.Name, detail)
		default:
			fmt.Fprintf(&b, "? %s: %s: %s\n", c.Name, c.Status, detail)
		}
		if fix != "" && c.Status != providers.CheckOK {
			fmt.Fprintf(&b, "  fix: %s\n", fix)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func indent(s string) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
