package bench

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
)

// ReportOptions configure Report; the arguments of `elasticd bench report`.
type ReportOptions struct {
	Files []string  // JSON lines files, read in order
	Stdin io.Reader // read when there are no Files
	Out   io.Writer // the table (nil: discarded)
}

// Report summarises JSON lines of allreduce results from several implementations and rounds
// (`bench allreduce --json` and bench/baselines/run.sh, whose lines carry an "impl" field;
// lines without one count as "elasticd") into the median time of each implementation per rank
// count and size, side by side, and how many times faster elasticd is than each other. Without
// elasticd lines there is nothing to divide by, and only the medians are printed. Lines with
// "hosts" (run.sh's HOSTS mode, `bench allreduce --netns-hosts`) make a second table, by host
// count and ranks per host.
func Report(o ReportOptions) error {
	out, _ := writers(o.Out, nil)
	var lines []reportLine
	read := func(name string, r io.Reader) error {
		sc := bufio.NewScanner(r)
		for n := 1; sc.Scan(); n++ {
			if len(sc.Bytes()) == 0 || sc.Bytes()[0] != '{' {
				continue
			}
			var l reportLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				return fmt.Errorf("%s line %d: %w", name, n, err)
			}
			if l.Impl == "" {
				l.Impl = "elasticd"
			}
			lines = append(lines, l)
		}
		return sc.Err()
	}
	if len(o.Files) == 0 && o.Stdin != nil {
		if err := read("stdin", o.Stdin); err != nil {
			return err
		}
	}
	for _, name := range o.Files {
		f, err := os.Open(name)
		if err != nil {
			return &UsageError{Msg: fmt.Sprintf("bench report: %v", err)}
		}
		err = read(name, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if len(lines) == 0 {
		return &UsageError{Msg: "bench report: no JSON result lines in the input"}
	}
	printReport(out, lines)
	return nil
}

type reportLine struct {
	Impl      string  `json:"impl"`
	SizeBytes int64   `json:"size_bytes"`
	Ranks     int     `json:"ranks"`
	MedianS   float64 `json:"median_s"`
	Hosts     int     `json:"hosts"` // 0: every rank on one machine
	PerHost   int     `json:"per_host"`
}

// printReport prints the results of one machine, then those across hosts (run.sh's HOSTS
// mode), each as its own table: the two compare different things.
func printReport(w io.Writer, lines []reportLine) {
	var local, across []reportLine
	for _, l := range lines {
		if l.Hosts > 0 {
			across = append(across, l)
		} else {
			local = append(local, l)
		}
	}
	if len(local) > 0 {
		printReportTable(w, local, false)
	}
	if len(across) > 0 {
		if len(local) > 0 {
			fmt.Fprintln(w)
		}
		printReportTable(w, across, true)
	}
}

func printReportTable(w io.Writer, lines []reportLine, acrossHosts bool) {
	type key struct {
		hosts, perHost, ranks int
		size                  int64
	}
	times := map[key]map[string][]float64{}
	var impls []string
	for _, l := range lines {
		k := key{l.Hosts, l.PerHost, l.Ranks, l.SizeBytes}
		if times[k] == nil {
			times[k] = map[string][]float64{}
		}
		times[k][l.Impl] = append(times[k][l.Impl], l.MedianS)
		if !slices.Contains(impls, l.Impl) {
			impls = append(impls, l.Impl)
		}
	}
	// elasticd first, the others in the order they appeared (run.sh's IMPLS order). Each
	// other one gets a ratio column, but only if there is an elasticd to divide by.
	var others []string
	if i := slices.Index(impls, "elasticd"); i >= 0 {
		impls = append([]string{"elasticd"}, slices.Delete(impls, i, i+1)...)
		others = impls[1:]
	}
	keys := make([]key, 0, len(times))
	for k := range times {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := cmp.Compare(a.hosts, b.hosts); c != 0 {
			return c
		}
		if c := cmp.Compare(a.perHost, b.perHost); c != 0 {
			return c
		}
		if c := cmp.Compare(a.ranks, b.ranks); c != 0 {
			return c
		}
		return cmp.Compare(a.size, b.size)
	})
	title := "median time over rounds (busbw GB/s)"
	if acrossHosts {
		title = "across hosts (network namespaces joined by veth: TCP between hosts), " + title
	}
	if others != nil {
		title += "; vs X = X's time / elasticd's time (> 1: elasticd is faster)"
	}
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "ranks\tsize\trounds\t"
	if acrossHosts {
		head = "hosts\tper host\tsize\trounds\t"
	}
	for _, im := range impls {
		head += implTitle(im, acrossHosts) + "\t"
	}
	for _, im := range others {
		head += "vs " + implTitle(im, acrossHosts) + "\t"
	}
	fmt.Fprintln(tw, head)
	for _, k := range keys {
		rounds := 0
		row := fmt.Sprintf("%d\t%s\t", k.ranks, fmtSize(k.size))
		if acrossHosts {
			row = fmt.Sprintf("%d\t%d\t%s\t", k.hosts, k.perHost, fmtSize(k.size))
		}
		cells := ""
		med := map[string]float64{}
		for _, im := range impls {
			ts := times[k][im]
			rounds = max(rounds, len(ts))
			if len(ts) == 0 {
				cells += "-\t"
				continue
			}
			m := median(ts)
			med[im] = m
			cells += fmt.Sprintf("%s (%.2f)\t", fmtDur(m), busbw(float64(k.size)/m/1e9, k.ranks))
		}
		for _, im := range others {
			if med["elasticd"] > 0 && med[im] > 0 {
				cells += fmt.Sprintf("%.2fx\t", med[im]/med["elasticd"])
			} else {
				cells += "-\t"
			}
		}
		fmt.Fprintln(tw, row+fmt.Sprint(rounds)+"\t"+cells)
	}
	tw.Flush()
}

// implTitle is the column title of an "impl" name that bench/baselines/run.sh writes; other
// names are their own title. Across hosts, run.sh's mpi-shm uses shared memory inside a host
// and TCP between hosts.
func implTitle(impl string, acrossHosts bool) string {
	switch impl {
	case "mpi-shm":
		if acrossHosts {
			return "Open MPI shm+TCP"
		}
		return "Open MPI shm"
	case "elasticd-tcp":
		return "elasticd TCP"
	case "gloo":
		return "Gloo"
	case "torch-gloo":
		return "torch Gloo"
	case "mpi":
		return "Open MPI TCP"
	}
	return impl
}
