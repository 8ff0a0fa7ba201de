package aws_test

import (
	"maps"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/providers/aws"
)

// TestDocsGPUTable: the table in docs/providers/aws.md is the code's table.
func TestDocsGPUTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/providers/aws.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## How slots are decided")
	if !ok {
		t.Fatal(`docs/providers/aws.md has no "## How slots are decided" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| (`[^|]+) \\| (\\d+) \\|$")
	docs := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		n, _ := strconv.Atoi(m[2])
		for _, typ := range strings.Split(m[1], ",") {
			docs[strings.Trim(strings.TrimSpace(typ), "`")] = n
		}
	}
	if code := aws.GPUTable(); !maps.Equal(docs, code) {
		for k, v := range code {
			if docs[k] != v {
				t.Errorf("%s: code %d, docs %d", k, v, docs[k])
			}
		}
		for k, v := range docs {
			if _, ok := code[k]; !ok {
				t.Errorf("%s: in the docs (%d), not in the code", k, v)
			}
		}
	}
}
