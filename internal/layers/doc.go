// Package layers holds the test that keeps elasticd's import graph layered (docs/architecture.md):
// no package imports one from a layer above its own, and the driver's and the workers' sides
// meet only in package protocol (and proc), never by importing each other. It has no code of its
// own; `go test ./internal/layers` checks the graph that `go list -deps` reports.
package layers
